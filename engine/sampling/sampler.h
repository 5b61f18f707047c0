// Token sampling for one request: temperature, top-k, top-p, min-p, repetition penalty,
// seeded and reproducible (Philox, counter-based: kernels/philox.h). A Sampler belongs to one
// request, so its choices do not depend on what else is batched with it.
#ifndef RIDGESERVE_ENGINE_SAMPLING_SAMPLER_H_
#define RIDGESERVE_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/sample.h"

namespace ridgeserve {

// Defaults follow vLLM / OpenAI: temperature 1, all filters off. temperature == 0 is greedy.
struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // 0 = off
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; 1 = off (HF/vLLM semantics over prompt + output)
  uint64_t seed = 0;
  bool has_seed = false;  // without a seed, seeded from std::random_device
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // Compute SampleResult::logprob (a log-softmax pass over the vocabulary, so only when a
  // request asks for logprobs).
  bool logprobs = false;
};

// log_softmax(logits), every entry (accumulated in double).
std::vector<float> LogSoftmax(std::span<const float> logits);

// How far a distribution q is from p, both given as log-softmax vectors of one vocabulary:
// KL(p ‖ q) = Σ p (log p − log q) in nats (in double; a q of -inf where p > 0 gives +inf),
// and whether their most likely tokens (Argmax) are the same.
struct DistributionGap {
  double kl = 0;
  bool top1_agree = false;
};
DistributionGap CompareDistributions(std::span<const float> p_logprobs,
                                     std::span<const float> q_logprobs);

// InvalidArgument naming the field ("temperature must be >= 0, got -1").
absl::Status ValidateSamplingParams(const SamplingParams& params);

// A request's sampling state: its parameters, its key and how many draws it has made. The
// draw itself is RowSampler's (kernels/sample.h), on the host here or on a backend
// (Backend::Sample) from the spec Next gives; either way the n-th draw of a request uses the
// n-th uniform of its seed, whatever it is batched with.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  const SamplingParams& params() const { return params_; }

  // The spec of this request's next draw, from logits row `row` (penalty range left empty:
  // the caller places the ids).
  SampleSpec Next(int32_t row);

  // Next, then the draw on the host. `context` is prompt + generated ids so far (used by the
  // repetition penalty). `logits` hold their original bits again on return.
  SampledToken Sample(std::span<float> logits, std::span<const int32_t> context);

  // True when `token` ends the request: in stop_token_ids, or in `eog_ids` unless ignore_eos.
  bool IsStop(int32_t token, std::span<const int32_t> eog_ids) const;

 private:
  SamplingParams params_;
  uint64_t key_ = 0;    // params.seed, or from std::random_device without one
  uint64_t draws_ = 0;  // draws made
  RowSampler row_sampler_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_SAMPLING_SAMPLER_H_
