// Token sampling for one request: temperature, top-k, top-p, min-p, repetition penalty,
// seeded and reproducible. A Sampler belongs to one request (its RNG state is per request),
// so its choices do not depend on what else is batched with it.
#ifndef RIDGESERVE_ENGINE_SAMPLING_SAMPLER_H_
#define RIDGESERVE_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"

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

// Greedy choice: the first index of the largest logit (ties go to the lowest token id). NaNs are
// never chosen; with no logit above -inf, 0.
int32_t Argmax(std::span<const float> logits);
// log_softmax(logits)[token] in double (SampleResult::logprob; the eval tools' NLL).
double LogSoftmaxAt(std::span<const float> logits, int32_t token);
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

struct SampleResult {
  int32_t token = -1;
  // log-softmax of the chosen token under the unmodified logits; 0 unless params.logprobs
  float logprob = 0.0f;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  const SamplingParams& params() const { return params_; }

  // `logits` has vocab_size entries; `context` is prompt + generated ids so far (used by the
  // repetition penalty). Deterministic given the seed and the sequence of calls. The
  // repetition penalty is applied to `logits` in place and undone before returning (the
  // logits hold their original bits again), so a step costs O(context), not a vocabulary copy.
  SampleResult Sample(std::span<float> logits, std::span<const int32_t> context);

  // True when `token` ends the request: in stop_token_ids, or in `eog_ids` unless ignore_eos.
  bool IsStop(int32_t token, std::span<const int32_t> eog_ids) const;

 private:
  // Draws from the filtered, tempered distribution over `logits` (already penalized).
  int32_t Draw(std::span<const float> logits);
  // Penalizes every distinct id of `context` in `logits`, remembering the originals in
  // penalized_; RestorePenalized puts them back.
  void ApplyRepetitionPenalty(std::span<float> logits, std::span<const int32_t> context);
  void RestorePenalized(std::span<float> logits);

  SamplingParams params_;
  // The standard fixes mt19937_64's output sequence, so a seed replays the same tokens on
  // every platform; the uniform draw is derived from its bits by hand for the same reason.
  std::mt19937_64 rng_;
  std::vector<std::pair<int32_t, float>> penalized_;   // (id, original logit) of this step
  std::vector<bool> is_penalized_;                     // (vocab) false between steps
  std::vector<std::pair<float, int32_t>> candidates_;  // (vocab) (logit or weight, token id)
  std::vector<float> weights_;                         // (vocab) unfiltered draws' weights
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_SAMPLING_SAMPLER_H_
