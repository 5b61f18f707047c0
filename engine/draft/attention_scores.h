// Pieces SpecPC and SpecKV score and select with (engine/draft/spec_pc.h, spec_kv.h).
#ifndef RIDGESERVE_ENGINE_DRAFT_ATTENTION_SCORES_H_
#define RIDGESERVE_ENGINE_DRAFT_ATTENTION_SCORES_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv/paged_kv_cache.h"

namespace ridgeserve {

// probs[j] = softmax_j(q · keys[j] * scale) for j < count, in float; key j starts at
// keys + j * key_stride, `dim` wide.
void AttentionProbabilities(const float* q, const float* keys, size_t key_stride, int32_t count,
                            int32_t dim, float scale, float* probs);

// Centred 1-D max-pool of non-negative scores: out[i] = max of scores over
// [i - (kernel-1)/2, i + kernel/2] (zero padding outside).
std::vector<float> CentredMaxPool(std::span<const float> scores, int32_t kernel);

// Positions of `scores` by decreasing score, ties by lower position first (all of them).
std::vector<int32_t> ByDecreasingScore(std::span<const float> scores);

// Layer l's keys and values of a sequence's places [0, count), widened to f32: [count, kv_dim]
// each, read block by block from `blocks`.
void ReadSequenceKv(const PagedKvCache& cache, Backend& backend, std::span<const int32_t> blocks,
                    int32_t layer, int32_t count, std::vector<float>& keys,
                    std::vector<float>& values);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_DRAFT_ATTENTION_SCORES_H_
