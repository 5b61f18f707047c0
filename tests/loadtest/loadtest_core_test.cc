// The load generator's server-free parts: length distributions, arrival processes (moments
// against the gamma distribution's closed form), the loopback check, the statistics
// (percentiles against numpy's linear-interpolation definition, goodput, errors by code) and
// the prefill mix (--mode_share parsing, each block holding the shares exactly).
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "loadtest/arrival_process.h"
#include "loadtest/length_distribution.h"
#include "loadtest/stats.h"
#include "loadtest/target.h"
#include "loadtest/workload.h"

namespace ridgeserve::loadtest {
namespace {

TEST(LengthDistribution, ParsesEveryForm) {
  std::mt19937_64 rng(1);
  auto fixed = LengthDistribution::Parse("prompt_tokens", "fixed:48", 1);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->Sample(rng), 48);
  EXPECT_EQ(fixed->ToString(), "fixed:48");
  auto bare = LengthDistribution::Parse("prompt_tokens", "7", 1);
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->ToString(), "fixed:7");

  auto uniform = LengthDistribution::Parse("prompt_tokens", "uniform:3:6", 1);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(uniform->Sample(rng));
  EXPECT_EQ(seen, (std::set<int32_t>{3, 4, 5, 6}));
  EXPECT_EQ(uniform->Max(), 6);

  auto list = LengthDistribution::Parse("output_tokens", "list:8,64,16", 1);
  ASSERT_TRUE(list.ok()) << list.status();
  seen.clear();
  for (int i = 0; i < 300; ++i) seen.insert(list->Sample(rng));
  EXPECT_EQ(seen, (std::set<int32_t>{8, 16, 64}));
  EXPECT_EQ(list->Max(), 64);
  EXPECT_EQ(list->ToString(), "list:8,64,16");
}

TEST(LengthDistribution, RejectsMalformedSpecsNamingTheFlag) {
  for (const char* spec : {"", "fixed:", "fixed:1:2", "uniform:5", "uniform:9:3",
                           "list:", "list:4,x", "normal:3", "0", "uniform:0:4"}) {
    auto d = LengthDistribution::Parse("prompt_tokens", spec, 1);
    EXPECT_FALSE(d.ok()) << spec;
    if (!d.ok()) {
      EXPECT_NE(d.status().message().find("--prompt_tokens"), std::string::npos);
    }
  }
}

// Gamma(shape k, scale 1/(rate k)): mean 1/rate, coefficient of variation 1/sqrt(k).
TEST(ArrivalProcess, GammaMomentsMatchTheRateAndBurstiness) {
  for (double burstiness : {0.25, 1.0, 4.0}) {
    ArrivalProcess arrivals(/*rate=*/5.0, burstiness, /*seed=*/7);
    const int n = 40000;
    double sum = 0, sum_sq = 0;
    for (int i = 0; i < n; ++i) {
      const double x = arrivals.NextInterval();
      ASSERT_GE(x, 0);
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / n;
    const double cv = std::sqrt(sum_sq / n - mean * mean) / mean;
    EXPECT_NEAR(mean, 0.2, 0.2 * 0.04) << "burstiness " << burstiness;
    EXPECT_NEAR(cv, 1 / std::sqrt(burstiness), 0.06 / std::sqrt(burstiness))
        << "burstiness " << burstiness;
  }
}

TEST(ArrivalProcess, SameSeedSameArrivals) {
  ArrivalProcess a(2.0, 0.5, 11), b(2.0, 0.5, 11), c(2.0, 0.5, 12);
  bool differs = false;
  for (int i = 0; i < 10; ++i) {
    const double x = a.NextInterval();
    EXPECT_EQ(x, b.NextInterval());
    differs |= x != c.NextInterval();
  }
  EXPECT_TRUE(differs);
}

TEST(CheckTarget, LoopbackOnlyUnlessAllowed) {
  for (const char* t : {"127.0.0.1:50051", "127.1.2.3:1", "localhost:9", "[::1]:50051"}) {
    EXPECT_TRUE(CheckTarget(t, false).ok()) << t;
  }
  for (const char* t : {"10.0.0.1:50051", "example.com:443", "[2001:db8::1]:80", "0.0.0.0:5"}) {
    EXPECT_EQ(CheckTarget(t, false).code(), absl::StatusCode::kInvalidArgument) << t;
    EXPECT_TRUE(CheckTarget(t, true).ok()) << t;
  }
  for (const char* t :
       {"127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":50051", "::1:50051", "localhost:http"}) {
    EXPECT_EQ(CheckTarget(t, true).code(), absl::StatusCode::kInvalidArgument) << t;
  }
}

// numpy.percentile([1, 2, 3, 4, 10], q): rank q/100 * 4, linear between neighbours.
TEST(Stats, PercentilesInterpolateLikeNumpy) {
  const std::vector<double> v = {1, 2, 3, 4, 10};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 3);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 4 + 0.6 * 6);   // rank 3.6
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 4 + 0.96 * 6);  // rank 3.96
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 10);
  const LatencyStats s = Describe({10, 4, 1, 3, 2});  // unsorted input
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 4);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_DOUBLE_EQ(s.p95, 4 + 0.8 * 6);
  EXPECT_EQ(Describe({}).count, 0);
}

RequestRecord Ok(PrefillKind mode, double ttft, double tpot, int32_t out) {
  RequestRecord r;
  r.mode = mode;
  r.status_name = "OK";
  r.ttft_s = ttft;
  r.tpot_s = tpot;
  r.output_tokens = out;
  r.server_prompt_tokens = 100;
  r.e2e_s = ttft + tpot * (out - 1);
  for (int i = 1; i < out; ++i) r.itl_s.push_back(tpot);
  return r;
}

RequestRecord Failed(const char* code_name, int32_t code) {
  RequestRecord r;
  r.status_code = code;
  r.status_name = code_name;
  return r;
}

TEST(Stats, SummaryCountsGoodputAndErrorsByMode) {
  std::vector<RequestRecord> records = {
      Ok(PrefillKind::kExact, 0.5, 0.02, 5),      // misses the TTFT SLO
      Ok(PrefillKind::kExact, 0.1, 0.02, 5),      // good
      Ok(PrefillKind::kRidgeFill, 0.1, 0.09, 5),  // misses the TPOT SLO
      Ok(PrefillKind::kRidgeFill, 0.2, -1, 1),    // one token: no TPOT, good
      Failed("RESOURCE_EXHAUSTED", 8),
      Failed("RESOURCE_EXHAUSTED", 8),
      Failed("DEADLINE_EXCEEDED", 4)};
  records[4].mode = PrefillKind::kRidgeFill;
  std::vector<const RequestRecord*> ptrs;
  for (const RequestRecord& r : records) ptrs.push_back(&r);
  const Slo slo{/*ttft_s=*/0.3, /*tpot_s=*/0.05};
  const auto by_mode = SummarizeByMode(ptrs, /*duration_s=*/2.0, slo);
  ASSERT_EQ(by_mode.size(), 3u);
  const GroupSummary& all = by_mode.at("all");
  EXPECT_EQ(all.num_requests, 7);
  EXPECT_EQ(all.num_ok, 4);
  EXPECT_EQ(all.num_errors, 3);
  EXPECT_EQ(all.errors_by_code.at("RESOURCE_EXHAUSTED"), 2);
  EXPECT_EQ(all.errors_by_code.at("DEADLINE_EXCEEDED"), 1);
  EXPECT_EQ(all.num_good, 2);
  EXPECT_DOUBLE_EQ(all.goodput, 1.0);
  EXPECT_DOUBLE_EQ(all.request_throughput, 2.0);
  EXPECT_EQ(all.output_tokens, 16);
  EXPECT_DOUBLE_EQ(all.total_token_throughput, (400 + 16) / 2.0);
  EXPECT_EQ(all.ttft.count, 4);
  EXPECT_EQ(all.tpot.count, 3);
  EXPECT_EQ(all.itl.count, 12);
  EXPECT_EQ(by_mode.at("exact").num_requests, 4);
  EXPECT_EQ(by_mode.at("ridgefill").num_requests, 3);
  EXPECT_EQ(by_mode.at("ridgefill").errors_by_code.at("RESOURCE_EXHAUSTED"), 1);
  EXPECT_DOUBLE_EQ(by_mode.at("exact").ttft.mean, 0.3);
  // No SLO: every successful request is good.
  EXPECT_EQ(Summarize(ptrs, 2.0, Slo{}).num_good, 4);
}

TEST(ModeShare, ParsesModesAndRejectsBadMixesNamingTheFlag) {
  absl::StatusOr<ModeShares> mix = ParseModeShare("exact=0.5,ridgefill=0.25,spec_pc=0.25");
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_EQ(*mix, (ModeShares{0.5, 0.25, 0.25, 0}));
  mix = ParseModeShare("spec_pc=1");
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_EQ(*mix, (ModeShares{0, 0, 1, 0}));
  mix = ParseModeShare("spec_kv=0.2,exact=0.4,spec_pc=0.2,ridgefill=0.2");
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_EQ(*mix, (ModeShares{0.4, 0.2, 0.2, 0.2}));
  for (const char* bad :
       {"", "exact", "exact=0.5", "exact=0.5,spec_pc=0.6", "exact=2,spec_pc=-1", "speckv=1",
        "exact=0.5,exact=0.5", "exact=half,spec_pc=0.5", "spec_kv=0.5,spec_kv=0.5"}) {
    absl::StatusOr<ModeShares> refused = ParseModeShare(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find("--mode_share"), std::string::npos)
        << refused.status();
  }
}

// The modes of `n` requests from a factory over a synthetic corpus.
std::vector<PrefillKind> Modes(const ModeShares& shares, int n, uint64_t seed) {
  TokenCorpus corpus;
  corpus.ids.resize(64);
  std::iota(corpus.ids.begin(), corpus.ids.end(), 10);
  WorkloadOptions options{.prompt_tokens = *LengthDistribution::Parse("p", "fixed:16", 1),
                          .output_tokens = *LengthDistribution::Parse("o", "fixed:4", 1)};
  options.mode_share = shares;
  options.spec_pc_budget = 96;
  options.spec_kv_budget = 128;
  options.seed = seed;
  absl::StatusOr<RequestFactory> factory = RequestFactory::Create(options, corpus);
  EXPECT_TRUE(factory.ok()) << factory.status();
  std::vector<PrefillKind> modes;
  for (int i = 0; i < n; ++i) {
    const PlannedRequest p = factory->Next();
    const v1::PrefillOptions& prefill = p.request.prefill();
    switch (p.mode) {
      case PrefillKind::kExact:
        EXPECT_EQ(prefill.mode(), v1::PrefillOptions::EXACT);
        break;
      case PrefillKind::kRidgeFill:
        EXPECT_EQ(prefill.mode(), v1::PrefillOptions::RIDGEFILL);
        break;
      case PrefillKind::kSpecPc:
        EXPECT_EQ(prefill.mode(), v1::PrefillOptions::SPEC_PC);
        EXPECT_EQ(prefill.spec_pc().budget(), 96);
        break;
      case PrefillKind::kSpecKv:
        EXPECT_EQ(prefill.mode(), v1::PrefillOptions::SPEC_KV);
        EXPECT_EQ(prefill.spec_kv().budget(), 128);
        break;
    }
    modes.push_back(p.mode);
  }
  return modes;
}

TEST(ModeShare, EveryBlockHoldsTheSharesExactly) {
  const std::vector<PrefillKind> modes = Modes({0.5, 0.25, 0.25, 0}, 40, 7);
  for (size_t block = 0; block < modes.size(); block += 4) {
    std::map<PrefillKind, int> count;
    for (size_t i = block; i < block + 4; ++i) ++count[modes[i]];
    EXPECT_EQ(count[PrefillKind::kExact], 2) << "block at " << block;
    EXPECT_EQ(count[PrefillKind::kRidgeFill], 1) << "block at " << block;
    EXPECT_EQ(count[PrefillKind::kSpecPc], 1) << "block at " << block;
  }
  EXPECT_EQ(modes, Modes({0.5, 0.25, 0.25, 0}, 40, 7));  // seeded
  EXPECT_NE(modes, Modes({0.5, 0.25, 0.25, 0}, 40, 8));
  // All four modes: every 5 requests have 2 exact and one of each other.
  const std::vector<PrefillKind> four = Modes({0.4, 0.2, 0.2, 0.2}, 40, 3);
  for (size_t block = 0; block < four.size(); block += 5) {
    std::map<PrefillKind, int> count;
    for (size_t i = block; i < block + 5; ++i) ++count[four[i]];
    EXPECT_EQ(count[PrefillKind::kExact], 2) << "block at " << block;
    for (PrefillKind kind : {PrefillKind::kRidgeFill, PrefillKind::kSpecPc, PrefillKind::kSpecKv}) {
      EXPECT_EQ(count[kind], 1) << PrefillKindName(kind) << " in the block at " << block;
    }
  }
  // Shares no block under 20 holds: blocks of 20 with the shares rounded (9, 5.5 and 5.5: the
  // left-over request to the largest remainder, the lower mode on a tie).
  const std::vector<PrefillKind> rounded = Modes({0.45, 0.275, 0.275, 0}, 20, 1);
  std::map<PrefillKind, int> count;
  for (PrefillKind kind : rounded) ++count[kind];
  EXPECT_EQ(count[PrefillKind::kExact], 9);
  EXPECT_EQ(count[PrefillKind::kRidgeFill], 6);
  EXPECT_EQ(count[PrefillKind::kSpecPc], 5);
}

}  // namespace
}  // namespace ridgeserve::loadtest
