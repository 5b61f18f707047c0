#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ridgeserve {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view rule, auto value) {
  return absl::InvalidArgumentError(absl::StrCat(field, " must be ", rule, ", got ", value));
}

}  // namespace

std::vector<float> LogSoftmax(std::span<const float> logits) {
  const double shift = LogSumExp(logits);
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(logits[i] - shift);
  return out;
}

DistributionGap CompareDistributions(std::span<const float> p_logprobs,
                                     std::span<const float> q_logprobs) {
  assert(p_logprobs.size() == q_logprobs.size());
  double kl = 0;
  for (size_t i = 0; i < p_logprobs.size(); ++i) {
    const double lp = p_logprobs[i];
    const double p = std::exp(lp);
    if (p > 0) kl += p * (lp - static_cast<double>(q_logprobs[i]));
  }
  // Rounding can leave a tiny negative sum for equal distributions.
  return {kl > 0 ? kl : 0, Argmax(p_logprobs) == Argmax(q_logprobs)};
}

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  // Comparisons are written so that NaN fails them.
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature)) {
    return FieldError("temperature", ">= 0 and finite", params.temperature);
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return FieldError("top_p", "in (0, 1]", params.top_p);
  }
  if (params.top_k < 0) return FieldError("top_k", ">= 0 (0 = off)", params.top_k);
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {
    return FieldError("min_p", "in [0, 1]", params.min_p);
  }
  if (!(params.repetition_penalty > 0.0f) || !std::isfinite(params.repetition_penalty)) {
    return FieldError("repetition_penalty", "> 0 and finite", params.repetition_penalty);
  }
  for (size_t i = 0; i < params.stop_token_ids.size(); ++i) {
    if (params.stop_token_ids[i] < 0) {
      return FieldError(absl::StrCat("stop_token_ids[", i, "]"), ">= 0", params.stop_token_ids[i]);
    }
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  if (params_.has_seed) {
    key_ = params_.seed;
  } else {
    std::random_device device;
    key_ = (static_cast<uint64_t>(device()) << 32) | device();
  }
}

SampleSpec Sampler::Next(int32_t row) {
  return {.row = row,
          .temperature = params_.temperature,
          .top_k = params_.top_k,
          .top_p = params_.top_p,
          .min_p = params_.min_p,
          .repetition_penalty = params_.repetition_penalty,
          .seed = key_,
          .draw = draws_++,
          .logprob = params_.logprobs ? 1 : 0};
}

SampledToken Sampler::Sample(std::span<float> logits, std::span<const int32_t> context) {
  return row_sampler_.Sample(logits, Next(0), context);
}

bool Sampler::IsStop(int32_t token, std::span<const int32_t> eog_ids) const {
  if (std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) !=
      params_.stop_token_ids.end()) {
    return true;
  }
  return !params_.ignore_eos && std::find(eog_ids.begin(), eog_ids.end(), token) != eog_ids.end();
}

}  // namespace ridgeserve
