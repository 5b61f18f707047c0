// Drawing a token from a row of logits: the definition Backend::Sample computes. The CPU
// backend runs this code; the CUDA backend (kernels/cuda/sample.h) computes the same
// definition on the device, agreeing except where rounding decides (a target within
// rounding of a cumulative boundary).
//
// For a row with logits x over the vocabulary and its SampleSpec:
//   1. Repetition penalty (HF / vLLM): each distinct id of the penalty list within the
//      vocabulary gets x / penalty if x > 0, else x * penalty.
//   2. temperature == 0: the first index of the largest logit (Argmax).
//   3. Otherwise the candidates, ranked by logit, highest first, equal logits by lower id:
//      top-k keeps the first k; with max the largest logit, weights w = exp((x - max) / T)
//      (float); top-p keeps the shortest ranked prefix whose weights sum (double, in rank
//      order) to >= top_p * the kept total; min-p keeps those with w >= min_p. The draw is
//      u = DrawUniform(seed, draw) (kernels/philox.h) and the first candidate whose cumulative
//      weight (double) exceeds u * total, walking in rank order when top-k or top-p is on and
//      in id order otherwise.
//   4. logprob (when asked): log-softmax of the chosen token under the unpenalized logits, in
//      double.
#ifndef RIDGESERVE_KERNELS_SAMPLE_H_
#define RIDGESERVE_KERNELS_SAMPLE_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kernels/sample_spec.h"

namespace ridgeserve {

// Greedy choice: the first index of the largest logit (ties go to the lowest token id). NaNs
// are never chosen; with no logit above -inf, 0.
int32_t Argmax(std::span<const float> logits);
// log Σ exp(logits) in double, shifted by the maximum.
double LogSumExp(std::span<const float> logits);
// log_softmax(logits)[token] in double.
double LogSoftmaxAt(std::span<const float> logits, int32_t token);

// Draws rows one at a time, reusing vocabulary-sized scratch between rows.
class RowSampler {
 public:
  // `logits` are modified during the call and hold their original bits again on return (the
  // penalty is applied in place and undone, so a row costs no vocabulary copy).
  SampledToken Sample(std::span<float> logits, const SampleSpec& spec,
                      std::span<const int32_t> penalty_ids);

 private:
  using Candidate = std::pair<float, int32_t>;  // (logit or weight, token id)
  int32_t Draw(std::span<const float> logits, const SampleSpec& spec);
  void ApplyRepetitionPenalty(std::span<float> logits, float penalty, std::span<const int32_t> ids);
  void RestorePenalized(std::span<float> logits);

  std::vector<std::pair<int32_t, float>> penalized_;  // (id, original logit) of this row
  std::vector<bool> is_penalized_;                    // (vocab) false between rows
  std::vector<Candidate> candidates_;                 // (vocab)
  std::vector<float> weights_;                        // (vocab) unfiltered draws' weights
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_SAMPLE_H_
