// Sampler tests. Distributions are checked against a naive double-precision reference of the
// documented pipeline (penalty → temperature → top-k → top-p → min-p → renormalize), written
// here with full sorts and no shortcuts; draws are checked by empirical frequencies.
#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/philox.h"

namespace ridgeserve {
namespace {

// Sample on a copy of `logits` (Sample penalizes in place and restores).
SampledToken SampleCopy(Sampler& sampler, std::vector<float> logits,
                        std::span<const int32_t> context) {
  return sampler.Sample(logits, context);
}

using ::testing::HasSubstr;

// Probabilities over the whole vocab after every filter, in double.
std::vector<double> ReferenceDistribution(const std::vector<float>& logits,
                                          const std::vector<int32_t>& context,
                                          const SamplingParams& params) {
  const size_t vocab = logits.size();
  std::vector<double> x(logits.begin(), logits.end());
  for (int32_t id : std::set<int32_t>(context.begin(), context.end())) {
    const double p = params.repetition_penalty;
    x[id] = x[id] > 0 ? x[id] / p : x[id] * p;
  }
  std::vector<double> probs(vocab, 0.0);
  if (params.temperature == 0.0f) {
    size_t best = 0;
    for (size_t i = 0; i < vocab; ++i) {
      if (x[i] > x[best]) best = i;
    }
    probs[best] = 1.0;
    return probs;
  }
  for (double& v : x) v /= params.temperature;

  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  size_t kept = vocab;
  if (params.top_k > 0) kept = std::min<size_t>(kept, params.top_k);

  auto softmax_of_kept = [&] {
    std::vector<double> p(kept);
    double sum = 0.0;
    for (size_t i = 0; i < kept; ++i) sum += p[i] = std::exp(x[order[i]] - x[order[0]]);
    for (double& v : p) v /= sum;
    return p;
  };
  if (params.top_p < 1.0f) {
    const std::vector<double> p = softmax_of_kept();
    double cumulative = 0.0;
    for (size_t i = 0; i < kept; ++i) {
      cumulative += p[i];
      if (cumulative >= params.top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  std::vector<double> p = softmax_of_kept();
  const double floor = params.min_p * p[0];
  double sum = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    if (p[i] >= floor) sum += probs[order[i]] = p[i];
  }
  for (double& v : probs) v /= sum;
  return probs;
}

std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::vector<float> RandomLogits(size_t vocab, uint64_t seed, float scale) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = normal(gen);
  return logits;
}

SamplingParams Seeded(uint64_t seed) {
  SamplingParams params;
  params.seed = seed;
  params.has_seed = true;
  return params;
}

// Draws `draws` tokens and compares frequencies with the reference: every token within 1.5%
// absolute, tokens the reference excludes never drawn, and a chi-square bound (p ~ 1e-5 for
// the small supports used here).
void ExpectFrequenciesMatch(const std::vector<float>& logits, const std::vector<int32_t>& context,
                            const SamplingParams& params, int draws = 20000) {
  const std::vector<double> expected = ReferenceDistribution(logits, context, params);
  Sampler sampler(params);
  std::vector<int> counts(logits.size(), 0);
  std::vector<float> x = logits;  // penalized in place by Sample, restored after
  for (int i = 0; i < draws; ++i) {
    const int32_t token = sampler.Sample(x, context).token;
    ASSERT_EQ(std::memcmp(x.data(), logits.data(), sizeof(float) * x.size()), 0)
        << "Sample left the logits changed";
    ASSERT_GE(token, 0);
    ASSERT_LT(token, static_cast<int32_t>(logits.size()));
    ++counts[token];
  }
  double chi_square = 0.0;
  int support = 0;
  for (size_t t = 0; t < logits.size(); ++t) {
    const double frequency = static_cast<double>(counts[t]) / draws;
    SCOPED_TRACE(testing::Message() << "token " << t);
    if (expected[t] == 0.0) {
      EXPECT_EQ(counts[t], 0);
      continue;
    }
    EXPECT_NEAR(frequency, expected[t], 0.015);
    const double e = expected[t] * draws;
    chi_square += (counts[t] - e) * (counts[t] - e) / e;
    ++support;
  }
  EXPECT_LT(chi_square, 12.0 + 3.0 * support) << "support " << support;
}

TEST(ValidateSamplingParamsTest, AcceptsDefaultsAndBoundaries) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_p = 1.0f;
  params.top_k = 0;
  params.min_p = 1.0f;
  params.repetition_penalty = 0.5f;
  params.stop_token_ids = {0, 2};
  EXPECT_TRUE(ValidateSamplingParams(params).ok());
}

TEST(ValidateSamplingParamsTest, ErrorsNameTheField) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string field;
    void (*mutate)(SamplingParams&, float nan, float inf);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p, float, float) { p.temperature = -1.0f; }},
      {"temperature", [](SamplingParams& p, float nan, float) { p.temperature = nan; }},
      {"temperature", [](SamplingParams& p, float, float inf) { p.temperature = inf; }},
      {"top_p", [](SamplingParams& p, float, float) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p, float, float) { p.top_p = 1.01f; }},
      {"top_p", [](SamplingParams& p, float nan, float) { p.top_p = nan; }},
      {"top_k", [](SamplingParams& p, float, float) { p.top_k = -1; }},
      {"min_p", [](SamplingParams& p, float, float) { p.min_p = -0.1f; }},
      {"min_p", [](SamplingParams& p, float, float) { p.min_p = 1.5f; }},
      {"min_p", [](SamplingParams& p, float nan, float) { p.min_p = nan; }},
      {"repetition_penalty", [](SamplingParams& p, float, float) { p.repetition_penalty = 0; }},
      {"repetition_penalty", [](SamplingParams& p, float, float) { p.repetition_penalty = -1.0f; }},
      {"repetition_penalty",
       [](SamplingParams& p, float, float inf) { p.repetition_penalty = inf; }},
      {"stop_token_ids[1]",
       [](SamplingParams& p, float, float) {
         p.stop_token_ids = {2, -5};
       }},
  };
  for (const Case& c : cases) {
    SamplingParams params;
    c.mutate(params, nan, inf);
    const absl::Status status = ValidateSamplingParams(params);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(status.message(), HasSubstr(c.field));
  }
}

// Argmax against the definition on vectors of every length up to 100 and a vocabulary's:
// repeated maxima (the first wins), NaNs (never chosen), -inf, all NaN and all -inf (0).
TEST(SamplerTest, ArgmaxIsTheFirstLargestSkippingNaN) {
  const auto reference = [](const std::vector<float>& x) {
    int32_t best = -1;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!std::isnan(x[i]) && x[i] > -std::numeric_limits<float>::infinity() &&
          (best < 0 || x[i] > x[best])) {
        best = static_cast<int32_t>(i);
      }
    }
    return best < 0 ? 0 : best;
  };
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-3, 3);  // few distinct values: many ties
  std::uniform_int_distribution<int> kind(0, 19);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<size_t> lengths;
  for (size_t n = 1; n <= 100; ++n) lengths.push_back(n);
  lengths.push_back(49152);
  lengths.push_back(49155);
  for (size_t n : lengths) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(n);
      for (float& v : x) {
        const int k = kind(rng);
        v = k == 0 ? nan : k == 1 ? -inf : static_cast<float>(small(rng));
      }
      if (trial == 0) std::fill(x.begin(), x.end(), nan);
      if (trial == 1) std::fill(x.begin(), x.end(), -inf);
      if (trial == 2) x[n - 1] = 100.0f;  // the maximum in the scalar tail
      if (trial == 3) x[0] = nan;
      ASSERT_EQ(Argmax(x), reference(x)) << "length " << n << " trial " << trial;
    }
  }
}

TEST(SamplerTest, GreedyPicksArgmax) {
  std::vector<float> logits = RandomLogits(49152, 1, 3.0f);
  const int32_t argmax =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  SamplingParams params = Seeded(1);
  params.temperature = 0.0f;
  params.top_k = 5;  // Filters do not matter when greedy.
  params.top_p = 0.1f;
  Sampler sampler(params);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sampler.Sample(logits, {}).token, argmax);
}

TEST(SamplerTest, GreedyTieGoesToLowestId) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 3.0f, 1.0f, 3.0f, 3.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  EXPECT_EQ(Sampler(params).Sample(logits, {}).token, 3);
}

TEST(SamplerTest, TopKOneIsGreedyAtAnyTemperature) {
  std::vector<float> logits = RandomLogits(1000, 2, 1.0f);
  logits[700] = logits[200] = 5.0f;  // A tie at the top: the lower id wins, as in greedy.
  for (float temperature : {0.01f, 0.7f, 1.0f, 5.0f, 1000.0f}) {
    SamplingParams params = Seeded(3);
    params.temperature = temperature;
    params.top_k = 1;
    Sampler sampler(params);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(sampler.Sample(logits, {}).token, 200) << temperature;
  }
}

TEST(SamplerTest, PlainSamplingMatchesSoftmax) {
  std::vector<float> logits = LogitsOf({0.4, 0.3, 0.15, 0.1, 0.05});
  ExpectFrequenciesMatch(logits, {}, Seeded(10));
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  std::vector<float> logits = LogitsOf({0.4, 0.3, 0.15, 0.1, 0.05});
  for (float temperature : {0.5f, 2.0f}) {
    SCOPED_TRACE(temperature);
    SamplingParams params = Seeded(11);
    params.temperature = temperature;
    ExpectFrequenciesMatch(logits, {}, params);
  }
}

TEST(SamplerTest, TopKKeepsKMostLikely) {
  // Out of id order so that the kept set is not a prefix of ids.
  std::vector<float> logits = LogitsOf({0.05, 0.3, 0.1, 0.4, 0.15});
  SamplingParams params = Seeded(12);
  params.top_k = 3;
  ExpectFrequenciesMatch(logits, {}, params);  // Tokens 3, 1, 4 renormalized over 0.85.
}

TEST(SamplerTest, TopPKeepsNucleus) {
  // Sorted cumulative: 0.4, 0.7, 0.85 >= 0.8: the nucleus is tokens 0, 3, 2.
  std::vector<float> logits = LogitsOf({0.4, 0.05, 0.15, 0.3, 0.1});
  SamplingParams params = Seeded(13);
  params.top_p = 0.8f;
  const std::vector<double> expected = ReferenceDistribution(logits, {}, params);
  EXPECT_NEAR(expected[0], 0.4 / 0.85, 1e-6);
  EXPECT_EQ(expected[1], 0.0);
  ExpectFrequenciesMatch(logits, {}, params);
}

TEST(SamplerTest, TopPNucleusOfHundredsOfTokens) {
  // A flat distribution: the nucleus is hundreds of tokens, past the sampler's first
  // partial selection. Tokens just outside it must never be drawn.
  std::vector<float> logits = RandomLogits(3000, 21, 1.0f);
  SamplingParams params = Seeded(21);
  params.top_p = 0.3f;
  const std::vector<double> expected = ReferenceDistribution(logits, {}, params);
  const auto nucleus =
      std::count_if(expected.begin(), expected.end(), [](double p) { return p > 0; });
  EXPECT_GT(nucleus, 100);
  ExpectFrequenciesMatch(logits, {}, params);
}

TEST(SamplerTest, TinyTopPKeepsTheTopToken) {
  std::vector<float> logits = LogitsOf({0.2, 0.3, 0.25, 0.25});
  SamplingParams params = Seeded(14);
  params.top_p = 0.01f;
  Sampler sampler(params);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sampler.Sample(logits, {}).token, 1);
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  // min_p 0.2 of max 0.5 is 0.1: tokens 3 (0.03) and 4 (0.05) go.
  std::vector<float> logits = LogitsOf({0.12, 0.3, 0.5, 0.03, 0.05});
  SamplingParams params = Seeded(15);
  params.min_p = 0.2f;
  ExpectFrequenciesMatch(logits, {}, params);
}

TEST(SamplerTest, AllFiltersTogether) {
  std::vector<float> logits = LogitsOf({0.02, 0.2, 0.05, 0.25, 0.03, 0.15, 0.1, 0.08, 0.07, 0.05});
  SamplingParams params = Seeded(16);
  params.temperature = 0.8f;
  params.top_k = 6;
  params.top_p = 0.9f;
  params.min_p = 0.12f;
  params.repetition_penalty = 1.3f;
  ExpectFrequenciesMatch(logits, {3, 6, 3}, params);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.repetition_penalty = 2.0f;
  Sampler sampler(params);
  // Positive: 3.0 / 2 = 1.5 beats 1.4; applied twice it would be 0.75 and lose.
  EXPECT_EQ(SampleCopy(sampler, {3.0f, 1.4f, -5.0f}, std::vector<int32_t>{0, 0}).token, 0);
  EXPECT_EQ(SampleCopy(sampler, {3.0f, 1.6f, -5.0f}, std::vector<int32_t>{0}).token, 1);
  // Negative: -1.0 * 2 = -2.0 falls below -1.9 (dividing would have raised it to -0.5).
  EXPECT_EQ(SampleCopy(sampler, {-1.0f, -1.9f, -5.0f}, std::vector<int32_t>{0}).token, 1);
  EXPECT_EQ(SampleCopy(sampler, {-1.0f, -2.1f, -5.0f}, std::vector<int32_t>{0}).token, 0);

  // A penalty below 1 favours repeats: -1.0 * 0.5 = -0.5 beats -0.6; 1.0 / 0.5 = 2.0 beats 1.9.
  params.repetition_penalty = 0.5f;
  Sampler boost(params);
  EXPECT_EQ(SampleCopy(boost, {-0.6f, -1.0f}, std::vector<int32_t>{1}).token, 1);
  EXPECT_EQ(SampleCopy(boost, {1.9f, 1.0f}, std::vector<int32_t>{1}).token, 1);
}

TEST(SamplerTest, RepetitionPenaltyShapesTheDistribution) {
  std::vector<float> logits = {1.0f, 0.5f, -0.5f, 0.2f, -1.0f};
  SamplingParams params = Seeded(17);
  params.repetition_penalty = 1.8f;
  ExpectFrequenciesMatch(logits, {0, 2, 2}, params);
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedDifferent) {
  std::vector<float> logits = RandomLogits(1000, 4, 1.0f);
  SamplingParams params = Seeded(42);
  params.top_p = 0.95f;
  auto sequence = [&](const SamplingParams& p) {
    Sampler sampler(p);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 300; ++i) tokens.push_back(sampler.Sample(logits, {}).token);
    return tokens;
  };
  EXPECT_EQ(sequence(params), sequence(params));
  EXPECT_NE(sequence(params), sequence(Seeded(43)));
  SamplingParams unseeded;
  unseeded.top_p = 0.95f;
  EXPECT_NE(sequence(unseeded), sequence(unseeded));
}

// The draw is the documented portable scheme: the n-th draw's u = (Philox4x64-10 at counter
// (n, 0, 0, 0) under key (seed, 0), first word >> 11) * 2^-53, inverse CDF over the kept
// tokens, in id order without top-k/top-p and highest first with them (not in whatever order
// nth_element left). DrawUniform is checked against NumPy's Philox in
// tests/kernels/sample_test.cc, so this pins the sequence on every platform.
TEST(SamplerTest, DrawIsInverseCdfOfPhilox) {
  std::vector<float> logits = RandomLogits(50, 5, 1.5f);
  for (int32_t top_k : {0, 10}) {
    SCOPED_TRACE(top_k);
    SamplingParams params = Seeded(20240607);
    params.top_k = top_k;
    const std::vector<double> probs = ReferenceDistribution(logits, {}, params);
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    if (top_k > 0) {
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
      order.resize(top_k);
    }
    Sampler sampler(params);
    for (int i = 0; i < 1000; ++i) {
      const double u = DrawUniform(20240607, i);
      size_t j = 0;
      for (double cumulative = probs[order[0]]; u >= cumulative && j + 1 < order.size();) {
        cumulative += probs[order[++j]];
      }
      ASSERT_EQ(sampler.Sample(logits, {}).token, order[j]) << "draw " << i;
    }
  }
}

TEST(SamplerTest, LogprobIsLogSoftmaxOfOriginalLogits) {
  std::vector<float> logits = RandomLogits(49152, 6, 3.0f);
  double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float v : logits) sum += std::exp(v - max);
  const double log_z = max + std::log(sum);

  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams filtered = Seeded(7);
  filtered.temperature = 0.5f;
  filtered.top_k = 40;
  filtered.top_p = 0.9f;
  filtered.repetition_penalty = 1.5f;
  const std::vector<int32_t> context = {1, 2, 3, 100, 2000};
  for (SamplingParams params : {greedy, filtered, Seeded(8)}) {
    params.logprobs = true;
    Sampler sampler(params);
    for (int i = 0; i < 5; ++i) {
      const SampledToken result = sampler.Sample(logits, context);
      EXPECT_NEAR(result.logprob, logits[result.token] - log_z, 1e-4);
    }
  }
  // Not asked for: no pass over the vocabulary, and the same token.
  EXPECT_EQ(Sampler(greedy).Sample(logits, context).logprob, 0.0f);
  SamplingParams asked = greedy;
  asked.logprobs = true;
  EXPECT_EQ(Sampler(greedy).Sample(logits, context).token,
            Sampler(asked).Sample(logits, context).token);
}

TEST(SamplerTest, LargeVocabTopKStaysInTopK) {
  std::vector<float> logits = RandomLogits(152000, 9, 2.0f);
  std::vector<float> sorted = logits;
  std::nth_element(sorted.begin(), sorted.begin() + 49, sorted.end(), std::greater<>());
  const float kth = sorted[49];
  SamplingParams params = Seeded(9);
  params.top_k = 50;
  params.top_p = 0.9f;
  params.temperature = 1.5f;
  Sampler sampler(params);
  for (int i = 0; i < 50; ++i) EXPECT_GE(logits[sampler.Sample(logits, {}).token], kth);
}

// CompareDistributions against distributions whose KL is known in closed form.
std::vector<float> LogOf(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

TEST(CompareDistributionsTest, KlOfTwoPointDistributions) {
  // KL((0.5, 0.5) ‖ (0.9, 0.1)) = 0.5 ln(0.5 / 0.9) + 0.5 ln(0.5 / 0.1).
  const DistributionGap c = CompareDistributions(LogOf({0.5, 0.5}), LogOf({0.9, 0.1}));
  EXPECT_NEAR(c.kl, 0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(5.0), 1e-6);
  EXPECT_NEAR(c.kl, 0.5108256, 1e-6);
  EXPECT_TRUE(c.top1_agree);  // a tie: both pick the lower id
  // The other direction differs: KL is not symmetric.
  EXPECT_NEAR(CompareDistributions(LogOf({0.9, 0.1}), LogOf({0.5, 0.5})).kl,
              0.9 * std::log(1.8) + 0.1 * std::log(0.2), 1e-6);
}

TEST(CompareDistributionsTest, EqualDistributionsHaveNoDivergence) {
  const std::vector<float> p = LogOf({0.7, 0.2, 0.1});
  const DistributionGap c = CompareDistributions(p, p);
  EXPECT_EQ(c.kl, 0.0);
  EXPECT_TRUE(c.top1_agree);
}

TEST(CompareDistributionsTest, TopOneDisagreementAndZeroMass) {
  // Exact puts no mass on token 2 (log 0 = -inf): that term is 0, not NaN.
  std::vector<float> exact = LogOf({0.6, 0.4, 1.0});
  exact[2] = -INFINITY;
  const DistributionGap c = CompareDistributions(exact, LogOf({0.3, 0.5, 0.2}));
  EXPECT_NEAR(c.kl, 0.6 * std::log(2.0) + 0.4 * std::log(0.8), 1e-6);
  EXPECT_FALSE(c.top1_agree);
}

TEST(SamplerTest, IsStop) {
  SamplingParams params;
  params.stop_token_ids = {7, 9};
  const std::vector<int32_t> eog = {2};
  Sampler sampler(params);
  EXPECT_TRUE(sampler.IsStop(7, eog));
  EXPECT_TRUE(sampler.IsStop(2, eog));
  EXPECT_FALSE(sampler.IsStop(3, eog));
  params.ignore_eos = true;
  Sampler ignoring(params);
  EXPECT_FALSE(ignoring.IsStop(2, eog));
  EXPECT_TRUE(ignoring.IsStop(9, eog));
}

}  // namespace
}  // namespace ridgeserve
