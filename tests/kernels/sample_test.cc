// The draw's building blocks: Philox against NumPy, and the CPU backend's Sample (the
// distributions themselves are tested in tests/sampling/sampler_test.cc).
#include "kernels/sample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/philox.h"
#include "tests/kernels/kernel_test_util.h"

namespace ridgeserve {
namespace {

// Expected words from NumPy 2's numpy.random.Philox(key=K, counter=C - 1).random_raw(4) (its
// generator increments the counter before each block); the first two are also Random123's
// known-answer vectors for philox4x64-10.
TEST(PhiloxTest, MatchesNumpy) {
  struct Case {
    Philox4x64 counter;
    uint64_t key0, key1;
    Philox4x64 want;
  };
  const uint64_t ones = ~uint64_t{0};
  const Case cases[] = {
      {{{0, 0, 0, 0}},
       0,
       0,
       {{0x16554d9eca36314cull, 0xdb20fe9d672d0fdcull, 0xd7e772cee186176bull,
         0x7e68b68aec7ba23bull}}},
      {{{ones, ones, ones, ones}},
       ones,
       ones,
       {{0x87b092c3013fe90bull, 0x438c3c67be8d0224ull, 0x9cc7d7c69cd777b6ull,
         0xa09caebf594f0ba0ull}}},
      {{{0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0x452821e638d01377ull,
         0xbe5466cf34e90c6cull}},
       0xa4093822299f31d0ull,
       0x082efa98ec4e6c89ull,
       {{0x31af060e8179cdecull, 0x1461b7726a3f0ca8ull, 0xf4b81aadeadfc52aull,
         0x0066c4279df32e41ull}}},
  };
  for (const Case& c : cases) {
    const Philox4x64 got = Philox4x64_10(c.counter, c.key0, c.key1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], c.want.v[i]) << "word " << i;
  }
  // DrawUniform(seed, n): the first word of block (n, 0, 0, 0) under key (seed, 0), top 53 bits.
  EXPECT_EQ(DrawUniform(20240607, 0), 0.9536821962726946);  // word 0xf4248433c4c7fb53
  EXPECT_EQ(DrawUniform(20240607, 1), 0.6386220350914678);
  EXPECT_EQ(DrawUniform(20240607, 999), 0.8561474231966463);
}

// A batch drawn on two threads gives each row the token it gets alone, and the logits are
// left as they were.
TEST(CpuSampleTest, BatchedRowsDrawWhatEachDrawsAlone) {
  const int32_t rows = 24, vocab = 2000;
  std::vector<float> logits = testing::RandomFloats(size_t{rows} * vocab, 3, -8.0f, 8.0f);
  const std::vector<float> original = logits;
  std::vector<int32_t> penalty_ids;
  const std::vector<SampleSpec> specs = testing::MixedSampleSpecs(rows, penalty_ids);
  auto backend = CreateCpuBackend(2);
  std::vector<SampledToken> batched(specs.size());
  backend->Sample(logits.data(), vocab, specs, penalty_ids, batched.data());
  EXPECT_EQ(logits, original);
  RowSampler alone;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SampleSpec& s = specs[i];
    const SampledToken want =
        alone.Sample(std::span<float>(logits).subspan(size_t(s.row) * vocab, vocab), s,
                     std::span<const int32_t>(penalty_ids)
                         .subspan(s.penalty_begin, s.penalty_end - s.penalty_begin));
    EXPECT_EQ(batched[i].token, want.token) << "spec " << i;
    EXPECT_EQ(batched[i].logprob, want.logprob) << "spec " << i;
  }
}

// Greedy with a penalty picks the argmax of the penalized row, and the log-probability is that
// of the unpenalized row, both computed here from the definition.
TEST(CpuSampleTest, GreedyPenaltyAndLogprobFollowTheDefinition) {
  const int32_t vocab = 1000;
  std::vector<float> logits = testing::RandomFloats(vocab, 9, -8.0f, 8.0f);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < vocab; ++i) {
    if (logits[i] > 6.0f) ids.push_back(i);  // penalize the strongest logits
  }
  ids.push_back(ids.front());  // a repeat is penalized once
  ASSERT_GT(ids.size(), 3u);
  SampleSpec s;
  s.temperature = 0.0f;
  s.repetition_penalty = 2.0f;
  s.penalty_end = static_cast<int32_t>(ids.size());
  s.logprob = 1;
  int32_t want = -1;
  double best = -INFINITY, max = -INFINITY, sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) {
    const bool penalized = std::find(ids.begin(), ids.end(), i) != ids.end();
    const double v = penalized ? (logits[i] > 0 ? logits[i] / 2.0f : logits[i] * 2.0f) : logits[i];
    if (v > best) best = v, want = i;
    max = std::max<double>(max, logits[i]);
  }
  for (float x : logits) sum += std::exp(x - max);
  auto backend = CreateCpuBackend(1);
  SampledToken got;
  backend->Sample(logits.data(), vocab, std::span(&s, 1), ids, &got);
  EXPECT_EQ(got.token, want);
  EXPECT_NEAR(got.logprob, logits[want] - (max + std::log(sum)), 1e-5);
}

// Candidates rank by logit: two logits whose weights round to the same float (here both
// 1.0f at temperature 100) keep their logits' order, so the higher one (id 1) comes first in
// the inverse CDF and takes every draw with u < 1/2.
TEST(CpuSampleTest, RankIsByLogitEvenWhereWeightsTie) {
  std::vector<float> logits = {1.0f, std::nextafter(1.0f, 2.0f), -10.0f};
  for (float top_p : {1.0f, 0.999f}) {
    SampleSpec s;
    s.temperature = 100.0f;
    s.top_k = 2;
    s.top_p = top_p;
    s.seed = 5;
    RowSampler sampler;
    for (uint64_t draw = 0; draw < 200; ++draw) {
      s.draw = draw;
      const int32_t want = DrawUniform(s.seed, draw) < 0.5 ? 1 : 0;
      ASSERT_EQ(sampler.Sample(logits, s, {}).token, want) << "top_p " << top_p << " draw " << draw;
    }
  }
}

}  // namespace
}  // namespace ridgeserve
