// MixCalibrationStats against weighted moments computed directly from the rows of the two
// populations (long double, no centring tricks); OnlineCalibrator's background thread on a
// small synthetic model (rows taken from two threads while a third reads the status, a
// re-solve handed over, the checkpoint restored), which is what make test-sanitize runs under
// TSan for its locking.
#include "engine/ridgefill/online_calibration.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/llama.h"
#include "engine/ridgefill/map_file.h"
#include "engine/ridgefill/stats_file.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/ridgefill/file_bytes.h"
#include "tests/ridgefill/synthetic_model.h"

namespace ridgeserve {
namespace {

constexpr int64_t kDim = 6, kTargetDim = 4;

struct Population {
  std::vector<float> x;  // [n, kDim]
  std::vector<float> y;  // [n, kTargetDim]
  int64_t n = 0;
};

// Rows around `offset` (a different mean per population) with a target linear in x.
Population Make(int64_t n, float offset, float slope, uint64_t seed) {
  Population p;
  p.n = n;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < kDim; ++j) p.x.push_back(offset * (j % 2) + (1 + j) * g(rng));
    for (int64_t j = 0; j < kTargetDim; ++j) {
      p.y.push_back(slope * p.x[i * kDim + j] + 0.1f * g(rng) + offset);
    }
  }
  return p;
}

CalibrationStats Accumulate(const Population& p, HoldoutOptions holdout) {
  CalibrationAccumulator acc(kDim, {kTargetDim}, holdout);
  const float* ys[] = {p.y.data()};
  EXPECT_TRUE(acc.AddRows(p.x.data(), p.n, ys).ok());
  return acc.Finish();
}

// The training rows of p (those the accumulator did not hold out) with weight w each.
struct Weighted {
  const Population* p;
  std::vector<bool> held;
  long double w;
};

// Σ w (a_i − ā)(b_i − b̄)ᵀ over all rows of all populations, ā, b̄ the weighted means; a, b
// select x or y columns. Scaled by `scale`.
std::vector<long double> Moment(const std::vector<Weighted>& pops, bool a_is_y, bool b_is_y,
                                long double scale) {
  const int64_t da = a_is_y ? kTargetDim : kDim, db = b_is_y ? kTargetDim : kDim;
  auto value = [](const Population& p, bool is_y, int64_t i, int64_t j) -> long double {
    return is_y ? p.y[i * kTargetDim + j] : p.x[i * kDim + j];
  };
  std::vector<long double> ma(da, 0), mb(db, 0);
  long double total = 0;
  for (const Weighted& q : pops) {
    for (int64_t i = 0; i < q.p->n; ++i) {
      if (q.held[i]) continue;
      total += q.w;
      for (int64_t j = 0; j < da; ++j) ma[j] += q.w * value(*q.p, a_is_y, i, j);
      for (int64_t j = 0; j < db; ++j) mb[j] += q.w * value(*q.p, b_is_y, i, j);
    }
  }
  for (auto& v : ma) v /= total;
  for (auto& v : mb) v /= total;
  std::vector<long double> m(da * db, 0);
  for (const Weighted& q : pops) {
    for (int64_t i = 0; i < q.p->n; ++i) {
      if (q.held[i]) continue;
      for (int64_t r = 0; r < da; ++r) {
        for (int64_t c = 0; c < db; ++c) {
          m[r * db + c] += scale * q.w * (value(*q.p, a_is_y, i, r) - ma[r]) *
                           (value(*q.p, b_is_y, i, c) - mb[c]);
        }
      }
    }
  }
  return m;
}

std::vector<bool> HeldRows(const CalibrationStats& s, int64_t n) {
  std::vector<bool> held(n, false);
  for (int64_t i : s.holdout_row_index) held[i] = true;
  return held;
}

void ExpectNear(const std::vector<double>& got, const std::vector<long double>& want,
                const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  long double scale = 0;
  for (long double v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], static_cast<double>(want[i]), 1e-9 * static_cast<double>(scale))
        << what << " element " << i;
  }
}

TEST(MixCalibrationStatsTest, EqualsTheWeightedMomentsOfBothPopulations) {
  const Population base = Make(700, 5.0f, 1.0f, 1), served = Make(300, -2.0f, -0.5f, 2);
  const CalibrationStats b = Accumulate(base, {0, 1});
  const CalibrationStats s = Accumulate(served, {10, 1000});
  ASSERT_EQ(s.holdout_rows, 30);
  for (double beta : {0.0, 0.25, 0.5, 0.9, 1.0}) {
    SCOPED_TRACE(beta);
    auto mixed = MixCalibrationStats(b, s, beta);
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    const long double n_b = b.rows, n_s = s.rows, n = n_b + n_s;
    const std::vector<Weighted> pops = {{&base, HeldRows(b, base.n), (1 - beta) / n_b},
                                        {&served, HeldRows(s, served.n), beta / n_s}};
    EXPECT_EQ(mixed->rows, b.rows + s.rows);
    ExpectNear(mixed->gram, Moment(pops, false, false, n), "G");
    ExpectNear(mixed->targets[0].cross, Moment(pops, true, false, n), "C");
    // Means: the weighted means.
    for (int64_t j = 0; j < kDim; ++j) {
      EXPECT_NEAR(mixed->mean[j], (1 - beta) * b.mean[j] + beta * s.mean[j], 1e-12);
    }
    // Held-out rows are the served population's.
    EXPECT_EQ(mixed->holdout_row_index, s.holdout_row_index);
    EXPECT_EQ(mixed->holdout_x, s.holdout_x);
    EXPECT_EQ(mixed->targets[0].holdout_y, s.targets[0].holdout_y);
  }
  // β = 0 is the base moments; β = 1 the served ones (scaled to the mixed row count).
  auto only_base = MixCalibrationStats(b, s, 0.0);
  ASSERT_TRUE(only_base.ok());
  for (size_t i = 0; i < b.gram.size(); ++i) {
    EXPECT_NEAR(only_base->gram[i], b.gram[i] * (1000.0 - 30) / b.rows,
                1e-9 * std::fabs(b.gram[i]) + 1e-9);
  }
}

TEST(MixCalibrationStatsTest, RefusesMismatchedShapesAndShares) {
  const CalibrationStats b = Accumulate(Make(50, 1, 1, 3), {0, 1});
  const CalibrationStats s = Accumulate(Make(50, 1, 1, 4), {10, 100});
  EXPECT_EQ(MixCalibrationStats(b, s, 1.5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MixCalibrationStats(b, s, -0.1).status().code(), absl::StatusCode::kInvalidArgument);
  CalibrationAccumulator other(kDim, {kTargetDim + 1}, {0, 1});
  EXPECT_EQ(MixCalibrationStats(b, other.Finish(), 0.5).status().code(),
            absl::StatusCode::kInvalidArgument);
  // No served rows: the base moments as they are.
  auto no_served = MixCalibrationStats(b, CalibrationAccumulator(kDim, {kTargetDim}).Finish(), 0.5);
  ASSERT_TRUE(no_served.ok());
  EXPECT_EQ(no_served->gram, b.gram);
  EXPECT_EQ(no_served->mean, b.mean);
}

// The synthetic model (synthetic_model.h) with only what the calibrator reads (attention norm
// and the QKV projection), maps of split 1 (targets: layers 3 and 4), pre_norm.
class OnlineCalibratorTest : public ::testing::Test {
 protected:
  static constexpr int32_t kLayers = testing_synthetic::kLayers,
                           kHidden = testing_synthetic::kHidden,
                           kKvHeads = testing_synthetic::kKvHeads,
                           kHeadDim = testing_synthetic::kHeadDim;
  static constexpr int32_t kSplit = 1;
  static constexpr int64_t kResolveRows = 40;

  void SetUp() override {
    backend_ = CreateCpuBackend(1);
    ModelWeights w;
    std::mt19937 rng(7);
    std::normal_distribution<float> g;
    auto random = [&](size_t n, float offset) {
      std::vector<float> v(n);
      for (float& x : v) x = offset + 0.1f * g(rng);
      return v;
    };
    const int64_t qkv_rows = testing_synthetic::kQDim + 2 * testing_synthetic::kKvDim;
    for (int32_t l = 0; l < kLayers; ++l) {
      LayerWeights lw;
      lw.attn_norm = Upload(random(kHidden, 1.0f));
      lw.wqkv = testing_synthetic::Pack(
          *backend_, random(static_cast<size_t>(qkv_rows) * kHidden, 0.0f), qkv_rows, kHidden);
      lw.bqkv = Upload(random(qkv_rows, 0.0f));
      w.layers.push_back(std::move(lw));
    }
    model_ = std::make_unique<LlamaModel>(testing_synthetic::Config(), std::move(w), *backend_);
    fingerprint_ = {0x5eed, "synthetic", kLayers, kHidden};
    shipped_.model = fingerprint_;
    shipped_.num_kv_heads = kKvHeads;
    shipped_.head_dim = kHeadDim;
    shipped_.kind = MapTarget::kPreNorm;
    shipped_.splits.emplace_back().split_layer = kSplit;
    dir_ = testing_files::TempPath("online_calibrator_", "dir");
    std::filesystem::create_directories(dir_);
    options_.checkpoint_path = dir_ + "/stats.rfstats";
    options_.maps_path = dir_ + "/maps.rfmap";
    options_.resolve_rows = kResolveRows;
    options_.max_pending_rows = 16;
    options_.holdout = {10, 256};
    base_path_ = dir_ + "/base.rfstats";
    WriteBaseStats();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  DeviceBuffer Upload(const std::vector<float>& v) {
    return testing_synthetic::Upload(*backend_, v);
  }

  // Residual rows at each captured depth ([depth][n, hidden]): a shared component plus noise,
  // so consecutive depths are correlated as a residual stream's are.
  static std::vector<std::vector<float>> States(size_t depths, int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> g;
    std::vector<std::vector<float>> states(depths);
    for (int64_t i = 0; i < n * kHidden; ++i) {
      const float shared = g(rng);
      for (auto& s : states) s.push_back(shared + 0.3f * g(rng));
    }
    return states;
  }

  // The shipped statistics: 300 rows through the calibrate tool's accumulators.
  void WriteBaseStats() {
    SplitStatistics stats(*model_, {kSplit}, {MapTarget::kPreNorm}, options_.holdout);
    const auto states = States(stats.depths().size(), 300, 1);
    ASSERT_TRUE(stats.Add(states, 0, 300, 1).ok());
    const CalibrationAccumulator& acc = stats.accumulator(0, 0);
    StatsSet set{fingerprint_, MapTarget::kPreNorm, {}};
    set.splits.push_back({kSplit, acc.total_rows(), acc.holdout_stride(), acc.Finish()});
    ASSERT_TRUE(WriteStatsFile(base_path_, set).ok());
  }

  std::unique_ptr<OnlineCalibrator> Create() {
    auto c = OnlineCalibrator::Create(*model_, fingerprint_, shipped_, base_path_, options_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Polls `c`'s status until `done` holds (the background thread runs at nice 19).
  template <typename F>
  static OnlineCalibrationStatus WaitFor(const OnlineCalibrator& c, F done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    OnlineCalibrationStatus s = c.status();
    while (!done(s) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      s = c.status();
    }
    EXPECT_TRUE(done(s)) << "timed out: " << s.rows << " rows, " << s.pending_rows << " pending";
    return s;
  }
  static bool Drained(const OnlineCalibrationStatus& s) {
    return s.pending_rows == 0 && s.rows + s.dropped_rows == s.offered_rows;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  ModelFingerprint fingerprint_;
  MapSet shipped_;
  std::string dir_, base_path_;
  OnlineCalibrationOptions options_;
};

TEST_F(OnlineCalibratorTest, TakesRowsFromThreadsResolvesAndRestoresTheCheckpoint) {
  std::unique_ptr<OnlineCalibrator> c = Create();
  ASSERT_NE(c, nullptr);
  std::mutex mu;
  std::vector<std::string> swapped;
  c->Start([&](const std::string& path) {
    std::lock_guard<std::mutex> lock(mu);
    swapped.push_back(path);
    return absl::OkStatus();
  });
  // Two engine-like threads offer 8 rows (of 10 captured) at a time into a queue of 16, so
  // some are dropped, while a third reads the status as /metrics does.
  const std::vector<int32_t> rows = {0, 1, 2, 4, 5, 6, 8, 9};
  constexpr int kTakes = 30;
  std::vector<std::thread> takers;
  for (uint64_t t = 0; t < 2; ++t) {
    takers.emplace_back([&, t] {
      for (int i = 0; i < kTakes; ++i) c->Take(States(c->depths().size(), 10, 100 * t + i), rows);
    });
  }
  std::thread reader([&] {
    for (int i = 0; i < 200; ++i) {
      const OnlineCalibrationStatus s = c->status();
      EXPECT_LE(s.rows + s.dropped_rows + s.pending_rows, s.offered_rows);
    }
  });
  for (std::thread& t : takers) t.join();
  reader.join();
  OnlineCalibrationStatus s = WaitFor(*c, Drained);
  EXPECT_EQ(s.offered_rows, 2 * kTakes * 8);
  // Rows one batch at a time until a re-solve is due, however many were dropped.
  for (uint64_t i = 0; s.rows < kResolveRows; ++i) {
    c->Take(States(c->depths().size(), 10, 1000 + i), rows);
    s = WaitFor(*c, Drained);
    ASSERT_TRUE(Drained(s));
  }
  s = WaitFor(*c, [](const OnlineCalibrationStatus& st) { return st.resolves >= 1; });
  EXPECT_EQ(s.failed_resolves, 0);
  EXPECT_GT(s.last_resolve_seconds, 0);
  EXPECT_GT(s.accumulate_seconds, 0);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_FALSE(swapped.empty());
    EXPECT_EQ(swapped.front(), options_.maps_path);
  }
  auto maps = MapFile::Open(options_.maps_path, {fingerprint_, kKvHeads, kHeadDim});
  ASSERT_TRUE(maps.ok()) << maps.status();
  ASSERT_NE((*maps)->FindSplit(kSplit), nullptr);
  EXPECT_EQ((*maps)->FindSplit(kSplit)->targets.size(), 2u);
  // Rows after the re-solve are checkpointed at Stop; a new calibrator restores all of them
  // and, having at least resolve_rows, re-solves at once (here its swap-in fails: counted).
  c->Take(States(c->depths().size(), 10, 5000), rows);
  s = WaitFor(*c, Drained);
  c->Stop();
  std::unique_ptr<OnlineCalibrator> restored = Create();
  ASSERT_NE(restored, nullptr);
  EXPECT_EQ(restored->status().rows, s.rows);
  restored->Start([](const std::string&) { return absl::UnavailableError("no server"); });
  const OnlineCalibrationStatus r =
      WaitFor(*restored, [](const OnlineCalibrationStatus& st) { return st.failed_resolves >= 1; });
  EXPECT_EQ(r.resolves, 0);
}

}  // namespace
}  // namespace ridgeserve
