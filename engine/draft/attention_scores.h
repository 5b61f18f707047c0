// Pieces SpecPC and SpecKV select with (engine/draft/spec_pc.h, spec_kv.h); the scores they
// select from are Backend::AttentionScores'.
#ifndef RIDGESERVE_ENGINE_DRAFT_ATTENTION_SCORES_H_
#define RIDGESERVE_ENGINE_DRAFT_ATTENTION_SCORES_H_

#include <cstdint>
#include <span>
#include <vector>

namespace ridgeserve {

// Centred 1-D max-pool of non-negative scores: out[i] = max of scores over
// [i - (kernel-1)/2, i + kernel/2] (zero padding outside).
std::vector<float> CentredMaxPool(std::span<const float> scores, int32_t kernel);

// Positions of `scores` by decreasing score, ties by lower position first (all of them).
std::vector<int32_t> ByDecreasingScore(std::span<const float> scores);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_DRAFT_ATTENTION_SCORES_H_
