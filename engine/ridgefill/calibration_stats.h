// Calibration statistics for RidgeFill: the centred second moments of the split layer's
// hidden state X = h_s and of each target Y_l, accumulated in double over a calibration pass,
// plus a deterministic set of held-out rows for choosing the ridge λ.
//
// Notation (see DESIGN.md, "RidgeFill — our definition"): a row is one token position.
// x ∈ R^d is that row's h_s (d = hidden); y_l ∈ R^{d_l} is target l's value at the same row
// (the residual stream entering layer l, its normalised input, or its K/V; the accumulator
// does not care which). Training rows give
//   n            number of training rows,
//   x̄, ȳ_l       means,
//   G   = Σ (x - x̄)(x - x̄)ᵀ        [d, d]      the centred Gram "XᵀX",
//   C_l = Σ (y_l - ȳ_l)(x - x̄)ᵀ    [d_l, d]    the centred cross-covariance "(XᵀY_l)ᵀ".
// Sums, not averages: G and C_l grow with n, and λ is chosen relative to trace(G)/d.
//
// Numerics. Residual streams have a few dimensions with large, nearly constant values, so
// raw sums Σxxᵀ lose the small centred part to cancellation. Each AddRows batch is instead
// centred on its own mean (in double) and merged into the running moments with the exact
// pairwise update of Chan, Golub & LeVeque (1979):
//   G ← G + G_b + (n_a n_b / n) δ δᵀ,  δ = x̄_b - x̄_a,  x̄ ← x̄_a + δ n_b / n,
// and the same with (δ_y, δ_x) for C_l. Every product runs on centred values, so no term is
// large compared to the result; batches of any size (even one row) give the same moments up
// to rounding. The products use BLAS dsyrk / dgemm on double copies of the batch.
//
// Held-out rows: training never sees them. Global row i (0-based, counted over all AddRows
// calls) is held out when (i + 1) % stride == 0; stride starts at `holdout_every`. When more
// than `max_holdout_rows` are held, stride doubles and the held rows that no longer qualify
// are moved into the training moments, so the held-out set always spans the whole
// calibration stream evenly (not just its beginning) and no row is ever lost. The result
// depends only on the row order and the options, never on how rows were split into batches.
//
// Checkpoints: Finish(), total_rows() and holdout_stride() are the whole state, so an
// accumulator with the same options continues from them (Restore) as if it had seen every
// row itself; stats_file.h keeps them on disk (the server's online calibration).
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_CALIBRATION_STATS_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_CALIBRATION_STATS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace ridgeserve {

struct HoldoutOptions {
  // Every k-th row is held out (k >= 2), or none when 0.
  int64_t holdout_every = 10;
  // Upper bound on held rows (they are kept in float: rows × (d + Σ d_l) × 4 bytes).
  int64_t max_holdout_rows = 2048;
};

// The finished statistics. Matrices are row-major and full (both triangles of G filled).
struct CalibrationStats {
  struct Target {
    int64_t dim = 0;               // d_l
    std::vector<double> mean;      // ȳ_l [d_l]
    std::vector<double> cross;     // C_l [d_l, d]: element (j, i) = Σ (y_j - ȳ_j)(x_i - x̄_i)
    std::vector<float> holdout_y;  // [holdout_rows, d_l], as given
  };

  int64_t dim = 0;              // d
  int64_t rows = 0;             // n, training rows
  std::vector<double> mean;     // x̄ [d]
  std::vector<double> gram;     // G [d, d], symmetric
  std::vector<Target> targets;  // in the order given to the accumulator
  int64_t holdout_rows = 0;
  std::vector<int64_t> holdout_row_index;  // [holdout_rows] global row index, ascending
  std::vector<float> holdout_x;            // [holdout_rows, d], as given
};

// Checks that `stats` is consistent in itself, as Finish() of an accumulator that saw
// `seen_rows` rows leaves it: dim and every d_l > 0; the array sizes above; 0 ≤ rows and
// rows + holdout_rows ≤ seen_rows; hold-out indices strictly ascending in [0, seen_rows);
// G exactly symmetric; every value finite. InvalidArgument naming the array (and target t, as
// "layer first_target_layer + t" when first_target_layer ≥ 0) at fault.
absl::Status ValidateCalibrationStats(const CalibrationStats& stats, int64_t seen_rows,
                                      int64_t first_target_layer = -1);

// Streams rows into CalibrationStats. Not thread-safe: one thread calls AddRows (the
// calibration forward pass); Finish may be called any number of times, between AddRows too.
class CalibrationAccumulator {
 public:
  // `dim` = d; `target_dims` = d_l for each target, in the order AddRows gets them.
  CalibrationAccumulator(int64_t dim, std::vector<int64_t> target_dims,
                         HoldoutOptions holdout = {});

  // Adds `rows` rows: x is [rows, d] row-major, ys[t] is [rows, d_t] row-major. The data is
  // copied; the pointers need only live for the call. InvalidArgument (nothing added) when
  // ys has the wrong number of targets or a value is not finite (a NaN would poison G).
  absl::Status AddRows(const float* x, int64_t rows, std::span<const float* const> ys);

  int64_t total_rows() const { return total_rows_; }
  // The current hold-out stride: holdout_every · 2^k after k thinnings (0: no hold-out).
  int64_t holdout_stride() const { return holdout_stride_; }
  CalibrationStats Finish() const;

  // Replaces the whole state with a checkpoint: `stats` = Finish(), `seen_rows` =
  // total_rows() and `holdout_stride` = holdout_stride() of an accumulator with the same
  // dims and options. Finish() then returns `stats` exactly, and further rows give what one
  // accumulator fed every row would (moments up to rounding; the same held-out rows).
  // InvalidArgument, leaving the state unchanged, when the dims or target dims differ, the
  // stride is not holdout_every · 2^k (0 when holdout_every is 0), or the checkpoint is not
  // one such an accumulator could hold: array sizes, rows + held rows ≠ seen_rows, held rows
  // other than every row i < seen_rows with (i + 1) % stride == 0, or more than
  // max_holdout_rows of them.
  absl::Status Restore(const CalibrationStats& stats, int64_t seen_rows, int64_t holdout_stride);

 private:
  // Merges `rows` training rows (double, row-major: x [rows, d], ys[t] [rows, d_t]) into the
  // moments. Centres the arrays in place (they are scratch).
  void MergeBatch(double* x, const std::vector<double*>& ys, int64_t rows);
  // Doubles the hold-out stride, moving rows that no longer qualify into training.
  void ThinHoldout();
  bool IsHeldOut(int64_t global_row) const {
    return holdout_stride_ > 0 && (global_row + 1) % holdout_stride_ == 0;
  }

  int64_t dim_;
  std::vector<int64_t> target_dims_;
  HoldoutOptions holdout_;
  int64_t holdout_stride_;
  int64_t total_rows_ = 0;  // every row seen, training and held out

  int64_t train_rows_ = 0;
  std::vector<double> mean_;                 // [d]
  std::vector<double> gram_upper_;           // [d, d], upper triangle valid (dsyrk)
  std::vector<std::vector<double>> y_mean_;  // per target [d_l]
  std::vector<std::vector<double>> cross_;   // per target [d_l, d]

  std::vector<int64_t> holdout_index_;
  std::vector<float> holdout_x_;               // [held, d]
  std::vector<std::vector<float>> holdout_y_;  // per target [held, d_l]

  // Scratch for one batch in double, reused across calls.
  std::vector<double> batch_x_;
  std::vector<std::vector<double>> batch_y_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_CALIBRATION_STATS_H_
