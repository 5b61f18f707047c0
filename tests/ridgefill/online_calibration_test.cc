// MixCalibrationStats against weighted moments computed directly from the rows of the two
// populations (long double, no centring tricks).
#include "engine/ridgefill/online_calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

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

}  // namespace
}  // namespace ridgeserve
