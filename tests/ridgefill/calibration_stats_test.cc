#include "engine/ridgefill/calibration_stats.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/ridgefill/stats_file.h"

namespace ridgeserve {
namespace {

struct Rows {
  int64_t n, d;
  std::vector<int64_t> dims;
  std::vector<float> x;               // [n, d]
  std::vector<std::vector<float>> y;  // per target [n, d_t]
};

// Random rows with a large common offset and unequal scales, like a residual stream.
Rows MakeRows(int64_t n, int64_t d, std::vector<int64_t> dims, float offset, uint64_t seed) {
  Rows r{n, d, dims, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  r.x.resize(n * d);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) r.x[i * d + j] = offset * (j % 3 == 0) + (1 + j % 5) * g(rng);
  }
  for (int64_t dl : dims) {
    std::vector<float> y(n * dl);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < dl; ++j) y[i * dl + j] = 0.5f * r.x[i * d + (j % d)] + g(rng) - 3;
    }
    r.y.push_back(std::move(y));
  }
  return r;
}

// Rows [first, last) of r in batches of the given sizes, cycled.
void AddRange(CalibrationAccumulator& acc, const Rows& r, int64_t first, int64_t last,
              std::vector<int64_t> batch_sizes) {
  int64_t start = first;
  size_t b = 0;
  while (start < last) {
    const int64_t rows = std::min(batch_sizes[b++ % batch_sizes.size()], last - start);
    std::vector<const float*> ys;
    for (size_t t = 0; t < r.y.size(); ++t) ys.push_back(r.y[t].data() + start * r.dims[t]);
    ASSERT_TRUE(acc.AddRows(r.x.data() + start * r.d, rows, ys).ok());
    start += rows;
  }
}

void AddAll(CalibrationAccumulator& acc, const Rows& r, std::vector<int64_t> batch_sizes) {
  AddRange(acc, r, 0, r.n, std::move(batch_sizes));
}

// Two-pass centred moments in long double over the rows `keep` selects: the reference.
struct Reference {
  std::vector<long double> mean, gram;
  std::vector<std::vector<long double>> y_mean, cross;
};
Reference TwoPass(const Rows& r, const std::vector<bool>& keep) {
  Reference ref;
  ref.mean.assign(r.d, 0);
  ref.gram.assign(r.d * r.d, 0);
  int64_t n = 0;
  for (int64_t i = 0; i < r.n; ++i) {
    if (!keep[i]) continue;
    ++n;
    for (int64_t j = 0; j < r.d; ++j) ref.mean[j] += r.x[i * r.d + j];
  }
  for (auto& m : ref.mean) m /= n;
  for (int64_t i = 0; i < r.n; ++i) {
    if (!keep[i]) continue;
    for (int64_t a = 0; a < r.d; ++a) {
      for (int64_t b = 0; b < r.d; ++b) {
        ref.gram[a * r.d + b] +=
            (r.x[i * r.d + a] - ref.mean[a]) * (r.x[i * r.d + b] - ref.mean[b]);
      }
    }
  }
  for (size_t t = 0; t < r.dims.size(); ++t) {
    const int64_t dl = r.dims[t];
    std::vector<long double> ym(dl, 0), cr(dl * r.d, 0);
    for (int64_t i = 0; i < r.n; ++i) {
      if (!keep[i]) continue;
      for (int64_t j = 0; j < dl; ++j) ym[j] += r.y[t][i * dl + j];
    }
    for (auto& m : ym) m /= n;
    for (int64_t i = 0; i < r.n; ++i) {
      if (!keep[i]) continue;
      for (int64_t j = 0; j < dl; ++j) {
        for (int64_t a = 0; a < r.d; ++a) {
          cr[j * r.d + a] += (r.y[t][i * dl + j] - ym[j]) * (r.x[i * r.d + a] - ref.mean[a]);
        }
      }
    }
    ref.y_mean.push_back(ym);
    ref.cross.push_back(cr);
  }
  return ref;
}

// max |a − b| / max |b|.
double RelErr(const std::vector<double>& a, const std::vector<long double>& b) {
  long double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return static_cast<double>(num / den);
}

TEST(CalibrationStatsTest, MatchesTwoPassReferenceDespiteLargeOffset) {
  // Offset 1e4 on a third of the columns: raw sums Σxxᵀ in double would lose ~1e-8 (relative)
  // of the centred Gram to cancellation; the centred batch merge keeps ~1e-13.
  const Rows r = MakeRows(3000, 24, {24, 8}, 1e4f, 1);
  CalibrationAccumulator acc(r.d, r.dims, {.holdout_every = 10, .max_holdout_rows = 1000});
  AddAll(acc, r, {700});
  const CalibrationStats s = acc.Finish();

  std::vector<bool> keep(r.n);
  for (int64_t i = 0; i < r.n; ++i) keep[i] = (i + 1) % 10 != 0;
  const Reference ref = TwoPass(r, keep);
  EXPECT_EQ(s.rows, 2700);
  EXPECT_EQ(s.holdout_rows, 300);
  EXPECT_LT(RelErr(s.mean, ref.mean), 1e-13);
  EXPECT_LT(RelErr(s.gram, ref.gram), 1e-11);
  for (int64_t a = 0; a < r.d; ++a) {
    for (int64_t b = 0; b < r.d; ++b) ASSERT_EQ(s.gram[a * r.d + b], s.gram[b * r.d + a]);
  }
  for (size_t t = 0; t < r.dims.size(); ++t) {
    EXPECT_LT(RelErr(s.targets[t].mean, ref.y_mean[t]), 1e-13);
    EXPECT_LT(RelErr(s.targets[t].cross, ref.cross[t]), 1e-11);
  }
  // Held-out rows are exactly the rows training skipped, copied bit for bit.
  for (int64_t h = 0; h < s.holdout_rows; ++h) {
    const int64_t i = s.holdout_row_index[h];
    ASSERT_EQ((i + 1) % 10, 0);
    for (int64_t j = 0; j < r.d; ++j) ASSERT_EQ(s.holdout_x[h * r.d + j], r.x[i * r.d + j]);
    for (size_t t = 0; t < r.dims.size(); ++t) {
      for (int64_t j = 0; j < r.dims[t]; ++j) {
        ASSERT_EQ(s.targets[t].holdout_y[h * r.dims[t] + j], r.y[t][i * r.dims[t] + j]);
      }
    }
  }
}

TEST(CalibrationStatsTest, BatchingDoesNotChangeTheResult) {
  const Rows r = MakeRows(2500, 16, {16, 6, 3}, 100.0f, 2);
  const HoldoutOptions opts{.holdout_every = 7, .max_holdout_rows = 60};
  CalibrationAccumulator one(r.d, r.dims, opts);
  AddAll(one, r, {r.n});
  CalibrationAccumulator many(r.d, r.dims, opts);
  AddAll(many, r, {1, 2, 3, 517, 1, 64, 1500});
  const CalibrationStats a = one.Finish();
  const CalibrationStats b = many.Finish();
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.holdout_row_index, b.holdout_row_index);
  EXPECT_EQ(a.holdout_x, b.holdout_x);
  std::vector<long double> ga(a.gram.begin(), a.gram.end());
  EXPECT_LT(RelErr(b.gram, ga), 1e-12);
  std::vector<long double> ma(a.mean.begin(), a.mean.end());
  EXPECT_LT(RelErr(b.mean, ma), 1e-12);
  for (size_t t = 0; t < r.dims.size(); ++t) {
    std::vector<long double> ca(a.targets[t].cross.begin(), a.targets[t].cross.end());
    EXPECT_LT(RelErr(b.targets[t].cross, ca), 1e-12);
    EXPECT_EQ(a.targets[t].holdout_y, b.targets[t].holdout_y);
  }
}

TEST(CalibrationStatsTest, HoldoutThinsEvenlyAndLosesNoRow) {
  const Rows r = MakeRows(5000, 8, {4}, 0.0f, 3);
  CalibrationAccumulator acc(r.d, r.dims, {.holdout_every = 5, .max_holdout_rows = 100});
  AddAll(acc, r, {333});
  const CalibrationStats s = acc.Finish();
  // 5000 rows / 5 = 1000 held would exceed 100: the stride doubles to 80, leaving 62 rows
  // spread over the whole stream.
  EXPECT_LE(s.holdout_rows, 100);
  EXPECT_EQ(s.rows + s.holdout_rows, r.n);
  ASSERT_GT(s.holdout_rows, 50);
  const int64_t stride = s.holdout_row_index[0] + 1;
  for (int64_t h = 0; h < s.holdout_rows; ++h) {
    EXPECT_EQ(s.holdout_row_index[h], (h + 1) * stride - 1);
  }
  EXPECT_GT(s.holdout_row_index.back(), r.n - 2 * stride);
  // The training moments are those of exactly the complement.
  std::vector<bool> keep(r.n, true);
  for (int64_t i : s.holdout_row_index) keep[i] = false;
  const Reference ref = TwoPass(r, keep);
  EXPECT_LT(RelErr(s.gram, ref.gram), 1e-12);
  EXPECT_LT(RelErr(s.targets[0].cross, ref.cross[0]), 1e-12);
}

TEST(CalibrationStatsTest, NoHoldout) {
  const Rows r = MakeRows(100, 4, {2}, 0.0f, 4);
  CalibrationAccumulator acc(r.d, r.dims, {.holdout_every = 0});
  AddAll(acc, r, {10});
  EXPECT_EQ(acc.Finish().rows, 100);
  EXPECT_EQ(acc.Finish().holdout_rows, 0);
}

TEST(CalibrationStatsTest, RejectsNonFiniteAndWrongTargetCountWithoutChangingState) {
  Rows r = MakeRows(50, 4, {3}, 0.0f, 5);
  CalibrationAccumulator acc(r.d, r.dims);
  AddAll(acc, r, {50});
  const CalibrationStats before = acc.Finish();

  std::vector<float> x = r.x;
  x[17 * 4 + 2] = std::nanf("");
  const float* y = r.y[0].data();
  absl::Status st = acc.AddRows(x.data(), 50, {&y, 1});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("row 17"), std::string::npos) << st;
  std::vector<float> yb = r.y[0];
  yb[3] = INFINITY;
  const float* ybp = yb.data();
  EXPECT_EQ(acc.AddRows(r.x.data(), 50, {&ybp, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.AddRows(r.x.data(), 50, {}).code(), absl::StatusCode::kInvalidArgument);

  const CalibrationStats after = acc.Finish();
  EXPECT_EQ(after.rows, before.rows);
  EXPECT_EQ(after.gram, before.gram);
  EXPECT_EQ(after.holdout_rows, before.holdout_rows);
  EXPECT_EQ(acc.total_rows(), 50);
}

struct Checkpoint {
  CalibrationStats stats;
  int64_t seen_rows = 0;
  int64_t holdout_stride = 0;
};

// The accumulator's state written to a statistics file and read back, as the server keeps
// it across a restart: split 0 of a (2 + targets)-layer model whose hidden is the row dim.
Checkpoint ThroughFile(const CalibrationAccumulator& acc, const Rows& r) {
  StatsSet set;
  set.model = {0x5eedf00d, "CheckpointTest", static_cast<int32_t>(r.dims.size() + 2),
               static_cast<int32_t>(r.d)};
  set.kind = MapTarget::kKv;  // target dims other than hidden
  set.splits.push_back({0, acc.total_rows(), acc.holdout_stride(), acc.Finish()});
  const std::string path =
      testing::TempDir() + "/ridgefill_checkpoint_" + std::to_string(::getpid());
  absl::Status written = WriteStatsFile(path, set);
  absl::StatusOr<StatsSet> read = ReadStatsFile(path, &set.model);
  std::remove(path.c_str());
  if (!written.ok() || !read.ok()) {
    ADD_FAILURE() << written << " / " << read.status();
    return {};
  }
  const SplitStats& split = read->splits.at(0);
  return {split.stats, split.seen_rows, split.holdout_stride};
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

void ExpectSameBits(const CalibrationStats& a, const CalibrationStats& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_TRUE(SameBits(a.mean, b.mean));
  EXPECT_TRUE(SameBits(a.gram, b.gram));
  EXPECT_EQ(a.holdout_rows, b.holdout_rows);
  EXPECT_EQ(a.holdout_row_index, b.holdout_row_index);
  EXPECT_TRUE(SameBits(a.holdout_x, b.holdout_x));
  ASSERT_EQ(a.targets.size(), b.targets.size());
  for (size_t t = 0; t < a.targets.size(); ++t) {
    EXPECT_EQ(a.targets[t].dim, b.targets[t].dim);
    EXPECT_TRUE(SameBits(a.targets[t].mean, b.targets[t].mean));
    EXPECT_TRUE(SameBits(a.targets[t].cross, b.targets[t].cross));
    EXPECT_TRUE(SameBits(a.targets[t].holdout_y, b.targets[t].holdout_y));
  }
}

std::vector<long double> Wide(const std::vector<double>& v) { return {v.begin(), v.end()}; }

TEST(CalibrationStatsTest, RestoredCheckpointContinuesAsOneAccumulator) {
  const Rows r = MakeRows(3800, 12, {6, 6, 6}, 100.0f, 6);
  struct Case {
    const char* what;
    int64_t checkpoint_at;
    HoldoutOptions holdout;
  };
  const Case cases[] = {
      {"no thinning", 1500, {.holdout_every = 7, .max_holdout_rows = 1000}},
      // Stride 28 at the checkpoint, 112 at the end.
      {"thinning before and after", 1500, {.holdout_every = 7, .max_holdout_rows = 60}},
      // Exactly max_holdout_rows held at the checkpoint; the next held row thins.
      {"first thinning after the restore", 700, {.holdout_every = 7, .max_holdout_rows = 100}},
      {"no hold-out", 1777, {.holdout_every = 0, .max_holdout_rows = 1}},
      {"empty checkpoint", 0, {.holdout_every = 5, .max_holdout_rows = 64}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    CalibrationAccumulator one(r.d, r.dims, c.holdout);
    AddAll(one, r, {r.n});

    CalibrationAccumulator before(r.d, r.dims, c.holdout);
    AddRange(before, r, 0, c.checkpoint_at, {97});
    const Checkpoint ck = ThroughFile(before, r);
    CalibrationAccumulator after(r.d, r.dims, c.holdout);
    ASSERT_TRUE(after.Restore(ck.stats, ck.seen_rows, ck.holdout_stride).ok());
    EXPECT_EQ(after.total_rows(), c.checkpoint_at);
    EXPECT_EQ(after.holdout_stride(), before.holdout_stride());
    ExpectSameBits(after.Finish(), before.Finish());
    AddRange(after, r, c.checkpoint_at, r.n, {333, 1, 50});

    const CalibrationStats a = one.Finish();
    const CalibrationStats b = after.Finish();
    EXPECT_EQ(after.total_rows(), r.n);
    EXPECT_EQ(after.holdout_stride(), one.holdout_stride());
    EXPECT_EQ(b.rows, a.rows);
    EXPECT_EQ(b.holdout_rows, a.holdout_rows);
    EXPECT_EQ(b.holdout_row_index, a.holdout_row_index);
    EXPECT_TRUE(SameBits(b.holdout_x, a.holdout_x));
    EXPECT_LT(RelErr(b.mean, Wide(a.mean)), 1e-12);
    EXPECT_LT(RelErr(b.gram, Wide(a.gram)), 1e-12);
    for (size_t t = 0; t < r.dims.size(); ++t) {
      EXPECT_LT(RelErr(b.targets[t].mean, Wide(a.targets[t].mean)), 1e-12);
      EXPECT_LT(RelErr(b.targets[t].cross, Wide(a.targets[t].cross)), 1e-12);
      EXPECT_TRUE(SameBits(b.targets[t].holdout_y, a.targets[t].holdout_y));
    }
  }
}

TEST(CalibrationStatsTest, RestoreRefusesAnotherShapeOrStrideWithoutChangingState) {
  const Rows r = MakeRows(800, 6, {6, 4}, 0.0f, 7);
  const HoldoutOptions opts{.holdout_every = 5, .max_holdout_rows = 40};
  CalibrationAccumulator source(r.d, r.dims, opts);
  AddAll(source, r, {100});
  const CalibrationStats ck = source.Finish();
  const int64_t seen = source.total_rows();
  const int64_t stride = source.holdout_stride();
  ASSERT_EQ(stride, 20);  // every 5th row would be 160 held: thinned twice, 40 held

  CalibrationAccumulator acc(r.d, r.dims, opts);
  AddRange(acc, r, 0, 50, {50});
  const CalibrationStats state = acc.Finish();
  const auto refused = [&](CalibrationAccumulator& into, const CalibrationStats& s,
                           int64_t seen_rows, int64_t st, const char* names) {
    const absl::Status status = into.Restore(s, seen_rows, st);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << names;
    EXPECT_NE(status.message().find(names), std::string::npos) << status;
  };
  refused(acc, ck, seen, 15, "stride 15 is not 5 · 2^k");
  refused(acc, ck, seen, 0, "stride 0 is not 5 · 2^k");
  refused(acc, ck, seen, 2 * stride, "the accumulator holds 20");
  refused(acc, ck, seen + 40, stride, "the accumulator holds 42");
  CalibrationStats moved = ck;
  moved.holdout_row_index[3] += 1;
  refused(acc, moved, seen, stride, "held-out row 3 is row 80");
  CalibrationStats fewer = ck;
  fewer.rows -= 1;
  refused(acc, fewer, seen, stride, "759 training");
  CalibrationStats short_mean = ck;
  short_mean.mean.pop_back();
  refused(acc, short_mean, seen, stride, "mean has 5 values");
  CalibrationStats nan = ck;
  nan.targets[1].cross[3] = std::nan("");
  refused(acc, nan, seen, stride, "target 1 cross is not finite");
  // The accumulator is untouched by all of that.
  EXPECT_EQ(acc.total_rows(), 50);
  EXPECT_EQ(acc.holdout_stride(), 5);
  ExpectSameBits(acc.Finish(), state);

  CalibrationAccumulator wider(r.d + 1, r.dims, opts);
  refused(wider, ck, seen, stride, "dim 6 and target dims [6, 4], the accumulator has 7");
  CalibrationAccumulator other_targets(r.d, {6, 3}, opts);
  refused(other_targets, ck, seen, stride, "the accumulator has 6 and [6, 3]");
  CalibrationAccumulator no_holdout(r.d, r.dims, {.holdout_every = 0});
  refused(no_holdout, ck, seen, stride, "stride 20 is not 0");
  CalibrationAccumulator smaller(r.d, r.dims, {.holdout_every = 5, .max_holdout_rows = 10});
  refused(smaller, ck, seen, stride, "more than max_holdout_rows 10");

  ASSERT_TRUE(acc.Restore(ck, seen, stride).ok());
  EXPECT_EQ(acc.total_rows(), seen);
  ExpectSameBits(acc.Finish(), ck);
}

}  // namespace
}  // namespace ridgeserve
