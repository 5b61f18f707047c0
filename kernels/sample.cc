#include "kernels/sample.h"

#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/philox.h"

namespace ridgeserve {
namespace {

using Candidate = std::pair<float, int32_t>;

// Higher logit first; equal logits by lower id. A total order (for non-NaN logits), so the
// kept set and its order do not depend on the standard library's sort algorithm.
bool Before(const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Length of the top-p nucleus: the shortest prefix of the candidates ranked by Before (by
// logit) whose weights weight(logit) sum to >= `threshold` (top_p * total weight), at least
// one. On return that prefix leads `candidates`, sorted by Before. Rather than sorting the
// whole vocabulary (~15 ms for 152k), it selects and sorts a growing prefix: the nucleus is
// usually tens of tokens.
template <typename Weight>
size_t NucleusSize(std::span<Candidate> candidates, double threshold, const Weight& weight) {
  size_t k = std::min<size_t>(candidates.size(), 64);
  for (;;) {
    std::nth_element(candidates.begin(), candidates.begin() + k, candidates.end(), Before);
    std::sort(candidates.begin(), candidates.begin() + k, Before);
    double cumulative = 0.0;
    for (size_t i = 0; i < k; ++i) {
      cumulative += weight(candidates[i].first);
      if (cumulative >= threshold) return i + 1;
    }
    if (k == candidates.size()) return k;
    k = std::min(candidates.size(), 4 * k);
  }
}

// Inverse CDF over candidates 0..n-1 whose weights weight(i) sum to `total` in this order: the
// first whose cumulative weight passes u * total, or, when rounding leaves the target at the
// very top, the last with any weight.
template <typename Weight>
size_t InverseCdf(size_t n, double total, double u, const Weight& weight) {
  const double target = u * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += weight(i);
    if (target < cumulative) return i;
  }
  for (size_t i = n; i-- > 0;) {
    if (weight(i) > 0.0f) return i;
  }
  return 0;
}

}  // namespace

double LogSumExp(std::span<const float> logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - max);
  return max + std::log(sum);
}

double LogSoftmaxAt(std::span<const float> logits, int32_t token) {
  return logits[token] - LogSumExp(logits);
}

int32_t Argmax(std::span<const float> logits) {
  // kChains independent chains of 8 lanes, each lane holding the largest value it has seen and
  // the first index holding it (-inf and -1 before any: a value enters only by being larger,
  // so a NaN never does); then the largest value over the lanes, the lowest index among equals.
  // Independent chains, because greedy decoding scans every sampled row's whole vocabulary.
  constexpr int kChains = 4;
  constexpr int64_t kStride = 8 * kChains;
  const float* x = logits.data();
  const int64_t n = static_cast<int64_t>(logits.size());
  const float neg_inf = -std::numeric_limits<float>::infinity();
  __m256 best[kChains];
  __m256i where[kChains];
  __m256i index[kChains];
  for (int c = 0; c < kChains; ++c) {
    best[c] = _mm256_set1_ps(neg_inf);
    where[c] = _mm256_set1_epi32(-1);
    index[c] =
        _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * c));
  }
  const __m256i stride = _mm256_set1_epi32(kStride);
  int64_t i = 0;
  for (; i + kStride <= n; i += kStride) {
    for (int c = 0; c < kChains; ++c) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * c);
      const __m256 larger = _mm256_cmp_ps(v, best[c], _CMP_GT_OQ);
      best[c] = _mm256_blendv_ps(best[c], v, larger);
      where[c] = _mm256_blendv_epi8(where[c], index[c], _mm256_castps_si256(larger));
      index[c] = _mm256_add_epi32(index[c], stride);
    }
  }
  float best_value = neg_inf;
  int64_t best_index = -1;
  for (int c = 0; c < kChains; ++c) {
    alignas(32) float values[8];
    alignas(32) int32_t at[8];
    _mm256_store_ps(values, best[c]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(at), where[c]);
    for (int lane = 0; lane < 8; ++lane) {
      if (at[lane] < 0) continue;
      if (values[lane] > best_value || (values[lane] == best_value && at[lane] < best_index)) {
        best_value = values[lane];
        best_index = at[lane];
      }
    }
  }
  // The tail's indices are above every lane's: only a larger value replaces the best.
  for (; i < n; ++i) {
    if (x[i] > best_value) {
      best_value = x[i];
      best_index = i;
    }
  }
  return best_index < 0 ? 0 : static_cast<int32_t>(best_index);
}

SampledToken RowSampler::Sample(std::span<float> logits, const SampleSpec& spec,
                                std::span<const int32_t> penalty_ids) {
  assert(!logits.empty());
  const bool penalize = spec.repetition_penalty != 1.0f && !penalty_ids.empty();
  if (penalize) ApplyRepetitionPenalty(logits, spec.repetition_penalty, penalty_ids);
  const int32_t token = spec.temperature == 0.0f ? Argmax(logits) : Draw(logits, spec);
  if (penalize) RestorePenalized(logits);
  return {.token = token,
          .logprob = spec.logprob != 0 ? static_cast<float>(LogSoftmaxAt(logits, token)) : 0.0f};
}

void RowSampler::ApplyRepetitionPenalty(std::span<float> logits, float penalty,
                                        std::span<const int32_t> ids) {
  is_penalized_.resize(logits.size(), false);
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size() || is_penalized_[id]) continue;
    // Each distinct id once, from its original logit.
    is_penalized_[id] = true;
    const float v = logits[id];
    penalized_.emplace_back(id, v);
    logits[id] = v > 0.0f ? v / penalty : v * penalty;
  }
}

void RowSampler::RestorePenalized(std::span<float> logits) {
  for (const auto& [id, original] : penalized_) {
    logits[id] = original;
    is_penalized_[id] = false;
  }
  penalized_.clear();
}

int32_t RowSampler::Draw(std::span<const float> logits, const SampleSpec& spec) {
  const double u = DrawUniform(spec.seed, spec.draw);
  // Weights relative to the most likely token: w = p / p_max = exp((logit - max) / T).
  const float temperature = spec.temperature;
  const bool top_k = spec.top_k > 0 && static_cast<size_t>(spec.top_k) < logits.size();
  if (!top_k && spec.top_p >= 1.0f && spec.min_p <= 0.0f) {
    // No filter: every token is a candidate, in id order, straight from the logits.
    const float max = logits[Argmax(logits)];
    weights_.resize(logits.size());
    double total = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
      weights_[i] = std::exp((logits[i] - max) / temperature);
      total += weights_[i];
    }
    return static_cast<int32_t>(
        InverseCdf(weights_.size(), total, u, [this](size_t i) { return weights_[i]; }));
  }

  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates_[i] = {logits[i], static_cast<int32_t>(i)};
  }
  std::span<Candidate> kept(candidates_);
  // Dividing by the temperature keeps the order of the logits, so top-k selects on the raw
  // logits and the temperature enters the weights below.
  if (top_k) {
    std::nth_element(kept.begin(), kept.begin() + spec.top_k, kept.end(), Before);
    kept = kept.first(spec.top_k);
  }
  // Before puts the highest logit first, so its min_element is the maximum.
  const float max = std::min_element(kept.begin(), kept.end(), Before)->first;
  const auto weight = [max, temperature](float logit) {
    return std::exp((logit - max) / temperature);
  };
  // The candidates are ranked by their logits, weights taken from the logits where needed:
  // two logits whose weights round to the same float keep their logits' order.
  if (spec.top_p < 1.0f) {
    double total = 0.0;
    for (const Candidate& c : kept) total += weight(c.first);
    kept = kept.first(NucleusSize(kept, spec.top_p * total, weight));
  } else if (top_k) {
    // nth_element leaves the kept set in an order of the library's choosing; sorting it
    // makes the draw below the same on every platform.
    std::sort(kept.begin(), kept.end(), Before);
  }
  for (Candidate& c : kept) c.first = weight(c.first);
  if (spec.min_p > 0.0f) {
    // p >= min_p * p_max is w >= min_p; the most likely token has w == 1 and stays.
    // remove_if keeps the order of the rest.
    const float min_p = spec.min_p;
    kept = kept.first(std::remove_if(kept.begin(), kept.end(),
                                     [min_p](const Candidate& c) { return c.first < min_p; }) -
                      kept.begin());
  }
  double total = 0.0;
  for (const Candidate& c : kept) total += c.first;
  // In id order, unless top-k or top-p sorted them (highest first).
  return kept[InverseCdf(kept.size(), total, u, [&kept](size_t i) { return kept[i].first; })]
      .second;
}

}  // namespace ridgeserve
