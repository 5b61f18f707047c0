#include "engine/ridgefill/calibration_stats.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status_macros.h"

namespace ridgeserve {
namespace {

// Rows converted to double per merge: bounds the scratch memory (rows × (d + Σ d_l) × 8
// bytes: 66 MB for d = 576 and 28 targets of 576) while keeping k of the BLAS calls large
// enough to run near peak.
constexpr int64_t kChunkRows = 512;

// Index of the first non-finite value in [p, p + n), or -1.
template <typename T>
int64_t FirstNonFinite(const T* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i])) return i;
  }
  return -1;
}

// Column means of a [rows, cols] row-major matrix, subtracted in place; returns the means.
void CentreColumns(double* m, int64_t rows, int64_t cols, std::vector<double>& mean) {
  mean.assign(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = m + r * cols;
    for (int64_t c = 0; c < cols; ++c) mean[c] += row[c];
  }
  for (double& v : mean) v /= static_cast<double>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double* row = m + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] -= mean[c];
  }
}

// Whether `size` == a · b (a, b ≥ 0), without overflow.
bool SizeIs(size_t size, int64_t a, int64_t b) {
  int64_t product = 0;
  return !__builtin_mul_overflow(a, b, &product) && static_cast<uint64_t>(product) == size;
}

}  // namespace

absl::Status ValidateCalibrationStats(const CalibrationStats& s, int64_t seen_rows,
                                      int64_t first_target_layer) {
  const auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  // "<what> has 7 values, expected 2 × 4" unless size = a · b.
  const auto check_size = [&](const std::string& what, size_t size, int64_t a,
                              int64_t b) -> absl::Status {
    if (SizeIs(size, a, b)) return absl::OkStatus();
    return bad(what, " has ", size, " values, expected ", a, " × ", b);
  };
  const auto check_finite = [&](const std::string& what, const auto& v) -> absl::Status {
    if (int64_t i = FirstNonFinite(v.data(), static_cast<int64_t>(v.size())); i >= 0) {
      return bad(what, " is not finite at element ", i);
    }
    return absl::OkStatus();
  };
  const int64_t d = s.dim;
  if (d <= 0) return bad("dim ", d, " is not positive");
  if (seen_rows < 0 || s.rows < 0 || s.holdout_rows < 0 || s.rows > seen_rows - s.holdout_rows) {
    return bad(s.rows, " training and ", s.holdout_rows, " held-out rows do not fit in the ",
               seen_rows, " rows seen");
  }
  RS_RETURN_IF_ERROR(check_size("mean", s.mean.size(), d, 1));
  RS_RETURN_IF_ERROR(check_size("Gram", s.gram.size(), d, d));
  RS_RETURN_IF_ERROR(
      check_size("hold-out row index", s.holdout_row_index.size(), s.holdout_rows, 1));
  RS_RETURN_IF_ERROR(check_size("hold-out x", s.holdout_x.size(), s.holdout_rows, d));
  int64_t previous = -1;
  for (int64_t i : s.holdout_row_index) {
    if (i <= previous || i >= seen_rows) {
      return bad("hold-out row index ", i, " not ascending or not in [0, ", seen_rows, ")");
    }
    previous = i;
  }
  RS_RETURN_IF_ERROR(check_finite("mean", s.mean));
  RS_RETURN_IF_ERROR(check_finite("Gram", s.gram));
  RS_RETURN_IF_ERROR(check_finite("hold-out x", s.holdout_x));
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      if (s.gram[i * d + j] != s.gram[j * d + i]) {
        return bad("Gram is not symmetric at (", i, ", ", j, ")");
      }
    }
  }
  for (size_t t = 0; t < s.targets.size(); ++t) {
    const CalibrationStats::Target& target = s.targets[t];
    const std::string name =
        first_target_layer >= 0
            ? absl::StrCat("target layer ", first_target_layer + static_cast<int64_t>(t))
            : absl::StrCat("target ", t);
    if (target.dim <= 0) return bad(name, ": dim ", target.dim, " is not positive");
    RS_RETURN_IF_ERROR(check_size(name + " mean", target.mean.size(), target.dim, 1));
    RS_RETURN_IF_ERROR(check_size(name + " cross", target.cross.size(), target.dim, d));
    RS_RETURN_IF_ERROR(
        check_size(name + " hold-out y", target.holdout_y.size(), s.holdout_rows, target.dim));
    RS_RETURN_IF_ERROR(check_finite(name + " mean", target.mean));
    RS_RETURN_IF_ERROR(check_finite(name + " cross", target.cross));
    RS_RETURN_IF_ERROR(check_finite(name + " hold-out y", target.holdout_y));
  }
  return absl::OkStatus();
}

CalibrationAccumulator::CalibrationAccumulator(int64_t dim, std::vector<int64_t> target_dims,
                                               HoldoutOptions holdout)
    : dim_(dim),
      target_dims_(std::move(target_dims)),
      holdout_(holdout),
      holdout_stride_(holdout.holdout_every) {
  assert(dim_ > 0);
  assert(holdout_.holdout_every == 0 || holdout_.holdout_every >= 2);
  assert(holdout_.max_holdout_rows >= 1);
  mean_.assign(dim_, 0.0);
  gram_upper_.assign(dim_ * dim_, 0.0);
  const size_t num_targets = target_dims_.size();
  y_mean_.resize(num_targets);
  cross_.resize(num_targets);
  holdout_y_.resize(num_targets);
  batch_y_.resize(num_targets);
  for (size_t t = 0; t < num_targets; ++t) {
    assert(target_dims_[t] > 0);
    y_mean_[t].assign(target_dims_[t], 0.0);
    cross_[t].assign(target_dims_[t] * dim_, 0.0);
  }
}

absl::Status CalibrationAccumulator::AddRows(const float* x, int64_t rows,
                                             std::span<const float* const> ys) {
  if (ys.size() != target_dims_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("calibration rows carry ", ys.size(),
                                                   " targets, the accumulator expects ",
                                                   target_dims_.size()));
  }
  if (rows <= 0) return absl::OkStatus();
  // Check everything before adding anything, so a failed call leaves the moments unchanged.
  if (int64_t bad = FirstNonFinite(x, rows * dim_); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration input h_s is not finite at batch row ", bad / dim_,
                     " (global row ", total_rows_ + bad / dim_, "), column ", bad % dim_));
  }
  for (size_t t = 0; t < ys.size(); ++t) {
    if (int64_t bad = FirstNonFinite(ys[t], rows * target_dims_[t]); bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration target ", t, " is not finite at batch row ",
                       bad / target_dims_[t], " (global row ", total_rows_ + bad / target_dims_[t],
                       "), column ", bad % target_dims_[t]));
    }
  }

  const size_t num_targets = target_dims_.size();
  std::vector<double*> y_ptrs(num_targets);
  int64_t pending = 0;  // training rows converted into batch_x_/batch_y_, not yet merged
  auto flush = [&] {
    if (pending == 0) return;
    for (size_t t = 0; t < num_targets; ++t) y_ptrs[t] = batch_y_[t].data();
    MergeBatch(batch_x_.data(), y_ptrs, pending);
    pending = 0;
  };
  batch_x_.resize(kChunkRows * dim_);
  for (size_t t = 0; t < num_targets; ++t) batch_y_[t].resize(kChunkRows * target_dims_[t]);

  for (int64_t r = 0; r < rows; ++r, ++total_rows_) {
    const float* xr = x + r * dim_;
    if (IsHeldOut(total_rows_)) {
      holdout_index_.push_back(total_rows_);
      holdout_x_.insert(holdout_x_.end(), xr, xr + dim_);
      for (size_t t = 0; t < num_targets; ++t) {
        const float* yr = ys[t] + r * target_dims_[t];
        holdout_y_[t].insert(holdout_y_[t].end(), yr, yr + target_dims_[t]);
      }
      if (static_cast<int64_t>(holdout_index_.size()) > holdout_.max_holdout_rows) {
        ThinHoldout();
      }
      continue;
    }
    std::copy(xr, xr + dim_, batch_x_.begin() + pending * dim_);
    for (size_t t = 0; t < num_targets; ++t) {
      const float* yr = ys[t] + r * target_dims_[t];
      std::copy(yr, yr + target_dims_[t], batch_y_[t].begin() + pending * target_dims_[t]);
    }
    if (++pending == kChunkRows) flush();
  }
  flush();
  return absl::OkStatus();
}

void CalibrationAccumulator::MergeBatch(double* xc, const std::vector<double*>& ys, int64_t rows) {
  std::vector<double> x_mean_b;
  CentreColumns(xc, rows, dim_, x_mean_b);

  const double n_a = static_cast<double>(train_rows_);
  const double n_b = static_cast<double>(rows);
  const double n = n_a + n_b;
  const double w = n_a * n_b / n;  // weight of the between-means term (0 for the first batch)
  std::vector<double> dx(dim_);
  for (int64_t i = 0; i < dim_; ++i) dx[i] = x_mean_b[i] - mean_[i];

  // G += X_cᵀ X_c + w δx δxᵀ (upper triangle; row-major upper == column-major lower, and
  // Finish mirrors it).
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, dim_, rows, 1.0, xc, dim_, 1.0,
              gram_upper_.data(), dim_);
  if (w > 0) cblas_dsyr(CblasRowMajor, CblasUpper, dim_, w, dx.data(), 1, gram_upper_.data(), dim_);

  std::vector<double> y_mean_b;
  for (size_t t = 0; t < target_dims_.size(); ++t) {
    const int64_t dl = target_dims_[t];
    double* yc = ys[t];
    CentreColumns(yc, rows, dl, y_mean_b);
    std::vector<double>& ym = y_mean_[t];
    std::vector<double> dy(dl);
    for (int64_t j = 0; j < dl; ++j) dy[j] = y_mean_b[j] - ym[j];
    // C_l [d_l, d] += Y_cᵀ X_c + w δy δxᵀ.
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dl, dim_, rows, 1.0, yc, dl, xc, dim_, 1.0,
                cross_[t].data(), dim_);
    if (w > 0) {
      cblas_dger(CblasRowMajor, dl, dim_, w, dy.data(), 1, dx.data(), 1, cross_[t].data(), dim_);
    }
    for (int64_t j = 0; j < dl; ++j) ym[j] += dy[j] * (n_b / n);
  }
  for (int64_t i = 0; i < dim_; ++i) mean_[i] += dx[i] * (n_b / n);
  train_rows_ += rows;
}

void CalibrationAccumulator::ThinHoldout() {
  holdout_stride_ *= 2;
  const size_t num_targets = target_dims_.size();
  const size_t held = holdout_index_.size();
  // Released rows, converted to double for MergeBatch; kept rows compacted in place.
  std::vector<double> rx;
  std::vector<std::vector<double>> ry(num_targets);
  size_t kept = 0;
  for (size_t h = 0; h < held; ++h) {
    const float* xr = holdout_x_.data() + h * dim_;
    if (IsHeldOut(holdout_index_[h])) {
      holdout_index_[kept] = holdout_index_[h];
      std::copy(xr, xr + dim_, holdout_x_.begin() + kept * dim_);
      for (size_t t = 0; t < num_targets; ++t) {
        const int64_t dl = target_dims_[t];
        const float* yr = holdout_y_[t].data() + h * dl;
        std::copy(yr, yr + dl, holdout_y_[t].begin() + kept * dl);
      }
      ++kept;
    } else {
      rx.insert(rx.end(), xr, xr + dim_);
      for (size_t t = 0; t < num_targets; ++t) {
        const int64_t dl = target_dims_[t];
        const float* yr = holdout_y_[t].data() + h * dl;
        ry[t].insert(ry[t].end(), yr, yr + dl);
      }
    }
  }
  holdout_index_.resize(kept);
  holdout_x_.resize(kept * dim_);
  for (size_t t = 0; t < num_targets; ++t) holdout_y_[t].resize(kept * target_dims_[t]);
  const int64_t released = static_cast<int64_t>(held - kept);
  if (released > 0) {
    std::vector<double*> y_ptrs(num_targets);
    for (size_t t = 0; t < num_targets; ++t) y_ptrs[t] = ry[t].data();
    MergeBatch(rx.data(), y_ptrs, released);
  }
}

absl::Status CalibrationAccumulator::Restore(const CalibrationStats& stats, int64_t seen_rows,
                                             int64_t holdout_stride) {
  const auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("calibration checkpoint: ", parts...));
  };
  bool same_dims = stats.dim == dim_ && stats.targets.size() == target_dims_.size();
  for (size_t t = 0; same_dims && t < target_dims_.size(); ++t) {
    same_dims = stats.targets[t].dim == target_dims_[t];
  }
  if (!same_dims) {
    std::vector<int64_t> dims;
    for (const CalibrationStats::Target& t : stats.targets) dims.push_back(t.dim);
    return bad("dim ", stats.dim, " and target dims [", absl::StrJoin(dims, ", "),
               "], the accumulator has ", dim_, " and [", absl::StrJoin(target_dims_, ", "), "]");
  }
  if (absl::Status s = ValidateCalibrationStats(stats, seen_rows); !s.ok()) {
    return bad(s.message());
  }
  // The strides an accumulator with these options passes through: holdout_every · 2^k.
  const int64_t every = holdout_.holdout_every;
  const bool stride_ok =
      every == 0 ? holdout_stride == 0
                 : holdout_stride >= every && holdout_stride % every == 0 &&
                       std::has_single_bit(static_cast<uint64_t>(holdout_stride / every));
  if (!stride_ok) {
    return bad("hold-out stride ", holdout_stride, " is not ", every, every == 0 ? "" : " · 2^k",
               " (the accumulator's holdout_every)");
  }
  // Thinning keeps exactly the rows i < seen_rows with (i + 1) % stride == 0, never more than
  // max_holdout_rows of them, and trains on every other row.
  const int64_t held = holdout_stride == 0 ? 0 : seen_rows / holdout_stride;
  if (stats.holdout_rows != held || stats.rows != seen_rows - held) {
    return bad(stats.rows, " training and ", stats.holdout_rows, " held-out rows; after ",
               seen_rows, " rows at stride ", holdout_stride, " the accumulator holds ", held,
               " and trains on ", seen_rows - held);
  }
  if (held > holdout_.max_holdout_rows) {
    return bad(held, " held-out rows, more than max_holdout_rows ", holdout_.max_holdout_rows);
  }
  for (int64_t h = 0; h < held; ++h) {
    if (stats.holdout_row_index[h] != (h + 1) * holdout_stride - 1) {
      return bad("held-out row ", h, " is row ", stats.holdout_row_index[h], ", not ",
                 (h + 1) * holdout_stride - 1, " as stride ", holdout_stride, " selects");
    }
  }

  holdout_stride_ = holdout_stride;
  total_rows_ = seen_rows;
  train_rows_ = stats.rows;
  mean_ = stats.mean;
  gram_upper_ = stats.gram;  // symmetric; only the upper triangle is read and updated
  for (size_t t = 0; t < target_dims_.size(); ++t) {
    y_mean_[t] = stats.targets[t].mean;
    cross_[t] = stats.targets[t].cross;
    holdout_y_[t] = stats.targets[t].holdout_y;
  }
  holdout_index_ = stats.holdout_row_index;
  holdout_x_ = stats.holdout_x;
  return absl::OkStatus();
}

CalibrationStats CalibrationAccumulator::Finish() const {
  CalibrationStats s;
  s.dim = dim_;
  s.rows = train_rows_;
  s.mean = mean_;
  s.gram = gram_upper_;
  for (int64_t i = 0; i < dim_; ++i) {
    for (int64_t j = 0; j < i; ++j) s.gram[i * dim_ + j] = s.gram[j * dim_ + i];
  }
  s.targets.resize(target_dims_.size());
  for (size_t t = 0; t < target_dims_.size(); ++t) {
    CalibrationStats::Target& target = s.targets[t];
    target.dim = target_dims_[t];
    target.mean = y_mean_[t];
    target.cross = cross_[t];
    target.holdout_y = holdout_y_[t];
  }
  s.holdout_rows = static_cast<int64_t>(holdout_index_.size());
  s.holdout_row_index = holdout_index_;
  s.holdout_x = holdout_x_;
  return s;
}

}  // namespace ridgeserve
