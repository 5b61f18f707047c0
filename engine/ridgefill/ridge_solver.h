// Closed-form ridge regression of each RidgeFill target on the split layer's hidden state,
// from the centred moments in CalibrationStats (see calibration_stats.h for G, C_l, x̄, ȳ_l).
//
// For target l and λ ≥ 0 the map is, in PyTorch Linear orientation (y = W x + b):
//   W = C_l (G + λI)⁻¹           [d_l, d]
//   b = ȳ_l − W x̄                [d_l]
// which is the usual W_solve = (XᵀX + λI)⁻¹ XᵀY on centred data, transposed. The intercept is
// not penalised (centring takes it out of the penalty).
//
// Two ways to solve:
// - RidgeSolver: ONE symmetric eigendecomposition G = Q E Qᵀ (LAPACK dsyevd), reused for
//   every target and every λ: (G + λI)⁻¹ = Q (E + λI)⁻¹ Qᵀ. With P_l = C_l Q and
//   z = Qᵀ(x − x̄), predictions on held-out rows are ŷ = P_l (E + λI)⁻¹ z + ȳ_l, so trying a λ
//   costs one [n_held, d] × [d, d_l] product and no new factorisation.
// - FitRidgeCholesky: dpotrf/dpotrs of G + λI for a single λ (λ > 0, or G positive definite).
//
// λ is chosen on held-out rows from a grid relative to the Gram's scale:
//   λ = α · trace(G) / d   (the mean eigenvalue of G, i.e. n × the mean variance of x),
// by a caller-supplied error (so the engine can score K/V after projecting ĥ), by default the
// held-out mean squared error of the target itself.
//
// Leverage for outlier-row selection: h is "far outside the calibration distribution" when
// (h − x̄)ᵀ (G + λI)⁻¹ (h − x̄) is large. G is a sum over n rows, so a typical training row
// scores about d / n; thresholds should be set relative to that.
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_RIDGE_SOLVER_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_RIDGE_SOLVER_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ridgefill/calibration_stats.h"

namespace ridgeserve {

// What a held-out error function sees for one candidate λ of one target.
struct HeldOutPrediction {
  int target = 0;                    // index into CalibrationStats::targets
  double lambda = 0;                 // absolute λ
  double alpha = 0;                  // λ / (trace(G) / d)
  int64_t rows = 0;                  // held-out rows
  int64_t dim = 0;                   // d_l
  std::span<const float> x;          // [rows, d]   held-out h_s, as accumulated
  std::span<const float> predicted;  // [rows, d_l] ŷ = W x + b
  std::span<const float> actual;     // [rows, d_l] y, as accumulated
};
// Returns the error of a candidate (lower is better). A non-finite value rules it out.
using HeldOutError = std::function<double(const HeldOutPrediction&)>;

// Held-out mean squared error over all rows and dims: Σ ‖y − ŷ‖² / (rows · d_l).
double HeldOutMse(const HeldOutPrediction& p);

// α grid: 1e-6, 1e-5, ..., 1e0.
std::vector<double> DefaultRidgeAlphas();

struct RidgeSelectOptions {
  std::vector<double> alphas = DefaultRidgeAlphas();  // each ≥ 0
  HeldOutError error;                                 // empty: HeldOutMse
};

struct RidgeFit {
  int target = 0;
  int64_t in_dim = 0;   // d
  int64_t out_dim = 0;  // d_l
  double lambda = 0;
  double alpha = 0;
  std::vector<float> weight;  // [d_l, d] row-major: y = W x + b
  std::vector<float> bias;    // [d_l]
  // On held-out rows (NaN when there are none): R² = 1 − Σ‖y − ŷ‖² / Σ‖y − ȳ_held‖² summed
  // over all dims, and the MSE as HeldOutMse defines it.
  double holdout_r2 = std::numeric_limits<double>::quiet_NaN();
  double holdout_mse = std::numeric_limits<double>::quiet_NaN();
  // Selection only: λ and the error function's value for each grid point, in grid order.
  std::vector<double> grid_lambdas;
  std::vector<double> grid_errors;
};

// Holds the eigendecomposition of one CalibrationStats' Gram. The stats must outlive the
// solver and stay unchanged. Const methods are safe to call from several threads at once.
class RidgeSolver {
 public:
  // FailedPrecondition when the stats hold fewer than 2 training rows; Internal when dsyevd
  // does not converge.
  static absl::StatusOr<std::unique_ptr<RidgeSolver>> Create(const CalibrationStats& stats);

  int64_t dim() const { return dim_; }
  // trace(G) / d: the unit of α.
  double lambda_scale() const { return lambda_scale_; }
  // E, ascending [d], exactly as dsyevd returned them (rounding can leave tiny negatives;
  // the solves clamp them to 0).
  const std::vector<double>& eigenvalues() const { return eigenvalues_; }

  // W and b for one target at a fixed λ ≥ 0. λ = 0 is ordinary least squares through the
  // pseudo-inverse (eigenvalues below d · ε · max(E) count as zero), so it stays finite for
  // a rank-deficient X. R²/MSE filled from the held-out rows when there are any.
  absl::StatusOr<RidgeFit> Fit(int target, double lambda) const;

  // Tries λ = α · lambda_scale() for each α on held-out rows, keeps the lowest error (ties go
  // to the larger λ), and returns the fit at that λ. FailedPrecondition when the grid has more
  // than one point and there are no held-out rows, or when every error is non-finite.
  absl::StatusOr<RidgeFit> FitSelect(int target, const RidgeSelectOptions& options = {}) const;

  // M = (G + λI)⁻¹ as float [d, d] row-major (symmetric), for the leverage (h − x̄)ᵀ M (h − x̄).
  // λ = 0 gives the pseudo-inverse.
  std::vector<float> RegularizedInverse(double lambda) const;

 private:
  explicit RidgeSolver(const CalibrationStats& stats) : stats_(stats) {}
  // 1/(E + λ) per eigenvalue, 0 where the pseudo-inverse drops it.
  std::vector<double> InverseShifted(double lambda) const;
  absl::Status CheckTarget(int target) const;
  // P_l = C_l Q [d_l, d].
  std::vector<double> ProjectCross(int target) const;
  // W = P_l (E + λ)⁻¹ Qᵀ, b = ȳ − W x̄, R²/MSE on held-out rows.
  RidgeFit Assemble(int target, double lambda, const std::vector<double>& p) const;
  // Ŷ = (Z (E + λ)⁻¹) P_lᵀ + ȳ [held, d_l], double.
  std::vector<double> PredictHeldOut(int target, const std::vector<double>& p,
                                     const std::vector<double>& inv) const;

  const CalibrationStats& stats_;
  int64_t dim_ = 0;
  double lambda_scale_ = 0;
  std::vector<double> eigenvalues_;  // [d] ascending
  std::vector<double> qt_;           // Qᵀ [d, d] row-major: row k is eigenvector k
  std::vector<double> z_;            // Z = (X_held − x̄) Q [held, d]
};

// The same fit by Cholesky of G + λI (one λ, no eigendecomposition). FailedPrecondition when
// G + λI is not positive definite (λ = 0 with a rank-deficient X, say).
absl::StatusOr<RidgeFit> FitRidgeCholesky(const CalibrationStats& stats, int target, double lambda);

// (h − mean)ᵀ M (h − mean) for h [d], M [d, d] from RegularizedInverse, mean = x̄ [d].
double Leverage(std::span<const float> inverse, std::span<const float> mean,
                std::span<const float> h);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_RIDGE_SOLVER_H_
