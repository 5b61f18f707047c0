#include "engine/ridgefill/ridge_solver.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

// LAPACK from OpenBLAS, Fortran calling convention (32-bit integers in Debian's
// libopenblas0; the trailing size_t arguments are the hidden lengths of the character
// arguments, which gfortran-built LAPACK expects).
extern "C" {
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
             double* work, const int* lwork, int* iwork, const int* liwork, int* info,
             size_t jobz_len, size_t uplo_len);
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info, size_t uplo_len);
void dpotrs_(const char* uplo, const int* n, const int* nrhs, const double* a, const int* lda,
             double* b, const int* ldb, int* info, size_t uplo_len);
}

namespace ridgeserve {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Fills R² and MSE of `predicted` [rows, dim] against `actual` (float, as accumulated).
void HeldOutScores(const double* predicted, const float* actual, int64_t rows, int64_t dim,
                   RidgeFit& fit) {
  if (rows == 0) {
    fit.holdout_r2 = kNaN;
    fit.holdout_mse = kNaN;
    return;
  }
  std::vector<double> mean(dim, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < dim; ++j) mean[j] += actual[r * dim + j];
  }
  for (double& m : mean) m /= static_cast<double>(rows);
  double sse = 0, sst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < dim; ++j) {
      const double y = actual[r * dim + j];
      const double e = y - predicted[r * dim + j];
      const double c = y - mean[j];
      sse += e * e;
      sst += c * c;
    }
  }
  fit.holdout_mse = sse / static_cast<double>(rows * dim);
  fit.holdout_r2 = sst > 0 ? 1.0 - sse / sst : kNaN;
}

// b = ȳ − W x̄ with W in double [out, in].
std::vector<float> Intercept(const std::vector<double>& w, const std::vector<double>& y_mean,
                             const std::vector<double>& x_mean) {
  const int64_t out = static_cast<int64_t>(y_mean.size());
  const int64_t in = static_cast<int64_t>(x_mean.size());
  std::vector<float> b(out);
  for (int64_t j = 0; j < out; ++j) {
    double acc = y_mean[j];
    for (int64_t i = 0; i < in; ++i) acc -= w[j * in + i] * x_mean[i];
    b[j] = static_cast<float>(acc);
  }
  return b;
}

absl::Status CheckLambda(double lambda) {
  if (!(lambda >= 0) || !std::isfinite(lambda)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ridge λ must be finite and >= 0, got ", lambda));
  }
  return absl::OkStatus();
}

absl::Status CheckTargetIndex(const CalibrationStats& stats, int target) {
  if (target < 0 || target >= static_cast<int>(stats.targets.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("ridge target ", target, " out of range [0, ", stats.targets.size(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

double HeldOutMse(const HeldOutPrediction& p) {
  double sse = 0;
  for (size_t k = 0; k < p.predicted.size(); ++k) {
    const double e = static_cast<double>(p.actual[k]) - p.predicted[k];
    sse += e * e;
  }
  return p.predicted.empty() ? kNaN : sse / static_cast<double>(p.predicted.size());
}

std::vector<double> DefaultRidgeAlphas() { return {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0}; }

absl::StatusOr<std::unique_ptr<RidgeSolver>> RidgeSolver::Create(const CalibrationStats& stats) {
  if (stats.rows < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("ridge fit needs at least 2 training rows, the calibration has ", stats.rows));
  }
  const int64_t d = stats.dim;
  if (d > std::numeric_limits<int>::max() / 4) {
    return absl::InvalidArgumentError(absl::StrCat("hidden size ", d, " too large for LAPACK"));
  }
  std::unique_ptr<RidgeSolver> s(new RidgeSolver(stats));
  s->dim_ = d;
  double trace = 0;
  for (int64_t i = 0; i < d; ++i) trace += stats.gram[i * d + i];
  s->lambda_scale_ = trace / static_cast<double>(d);

  // dsyevd overwrites its matrix with the eigenvectors, column-major: column k = eigenvector
  // k, which read row-major is Qᵀ. G is symmetric, so its row-major copy is already the
  // column-major input.
  s->qt_ = stats.gram;
  s->eigenvalues_.assign(d, 0.0);
  const int n = static_cast<int>(d);
  int info = 0;
  int lwork = -1, liwork = -1;
  double work_query = 0;
  int iwork_query = 0;
  dsyevd_("V", "U", &n, s->qt_.data(), &n, s->eigenvalues_.data(), &work_query, &lwork,
          &iwork_query, &liwork, &info, 1, 1);
  if (info != 0) return absl::InternalError(absl::StrCat("dsyevd workspace query: info ", info));
  lwork = static_cast<int>(work_query);
  liwork = iwork_query;
  std::vector<double> work(std::max(lwork, 1));
  std::vector<int> iwork(std::max(liwork, 1));
  dsyevd_("V", "U", &n, s->qt_.data(), &n, s->eigenvalues_.data(), work.data(), &lwork,
          iwork.data(), &liwork, &info, 1, 1);
  if (info != 0) {
    return absl::InternalError(
        absl::StrCat("eigendecomposition of the calibration Gram failed (dsyevd info ", info, ")"));
  }

  // Z = (X_held − x̄) Q = X_c · (Qᵀ)ᵀ, shared by every target and λ.
  const int64_t held = stats.holdout_rows;
  if (held > 0) {
    std::vector<double> xc(held * d);
    for (int64_t r = 0; r < held; ++r) {
      for (int64_t i = 0; i < d; ++i) {
        xc[r * d + i] = static_cast<double>(stats.holdout_x[r * d + i]) - stats.mean[i];
      }
    }
    s->z_.assign(held * d, 0.0);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, held, d, d, 1.0, xc.data(), d,
                s->qt_.data(), d, 0.0, s->z_.data(), d);
  }
  return s;
}

std::vector<double> RidgeSolver::InverseShifted(double lambda) const {
  const double e_max = std::max(eigenvalues_.back(), 0.0);
  const double cutoff = static_cast<double>(dim_) * std::numeric_limits<double>::epsilon() * e_max;
  std::vector<double> inv(dim_);
  for (int64_t k = 0; k < dim_; ++k) {
    const double shifted = std::max(eigenvalues_[k], 0.0) + lambda;
    // With λ > 0 every shifted eigenvalue is ≥ λ; λ = 0 drops the numerically null space.
    inv[k] = shifted > (lambda > 0 ? 0.0 : cutoff) ? 1.0 / shifted : 0.0;
  }
  return inv;
}

absl::Status RidgeSolver::CheckTarget(int target) const { return CheckTargetIndex(stats_, target); }

std::vector<double> RidgeSolver::ProjectCross(int target) const {
  const CalibrationStats::Target& t = stats_.targets[target];
  std::vector<double> p(t.dim * dim_);
  // P [d_l, d] = C_l [d_l, d] · Q = C_l · (Qᵀ)ᵀ.
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t.dim, dim_, dim_, 1.0, t.cross.data(), dim_,
              qt_.data(), dim_, 0.0, p.data(), dim_);
  return p;
}

std::vector<double> RidgeSolver::PredictHeldOut(int target, const std::vector<double>& p,
                                                const std::vector<double>& inv) const {
  const CalibrationStats::Target& t = stats_.targets[target];
  const int64_t held = stats_.holdout_rows;
  std::vector<double> zs(z_.size());
  for (int64_t r = 0; r < held; ++r) {
    for (int64_t k = 0; k < dim_; ++k) zs[r * dim_ + k] = z_[r * dim_ + k] * inv[k];
  }
  // Ŷ [held, d_l] = (Z (E+λ)⁻¹) · Pᵀ, then + ȳ.
  std::vector<double> yhat(held * t.dim);
  for (int64_t r = 0; r < held; ++r) std::copy(t.mean.begin(), t.mean.end(), &yhat[r * t.dim]);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, held, t.dim, dim_, 1.0, zs.data(), dim_,
              p.data(), dim_, 1.0, yhat.data(), t.dim);
  return yhat;
}

RidgeFit RidgeSolver::Assemble(int target, double lambda, const std::vector<double>& p) const {
  const CalibrationStats::Target& t = stats_.targets[target];
  const std::vector<double> inv = InverseShifted(lambda);
  // W [d_l, d] = (P (E+λ)⁻¹) · Qᵀ.
  std::vector<double> ps(p.size());
  for (int64_t j = 0; j < t.dim; ++j) {
    for (int64_t k = 0; k < dim_; ++k) ps[j * dim_ + k] = p[j * dim_ + k] * inv[k];
  }
  std::vector<double> w(t.dim * dim_);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t.dim, dim_, dim_, 1.0, ps.data(), dim_,
              qt_.data(), dim_, 0.0, w.data(), dim_);
  RidgeFit fit;
  fit.target = target;
  fit.in_dim = dim_;
  fit.out_dim = t.dim;
  fit.lambda = lambda;
  fit.alpha = lambda_scale_ > 0 ? lambda / lambda_scale_ : 0.0;
  fit.weight.assign(w.begin(), w.end());
  fit.bias = Intercept(w, t.mean, stats_.mean);
  if (stats_.holdout_rows > 0) {
    const std::vector<double> yhat = PredictHeldOut(target, p, inv);
    HeldOutScores(yhat.data(), t.holdout_y.data(), stats_.holdout_rows, t.dim, fit);
  } else {
    HeldOutScores(nullptr, nullptr, 0, t.dim, fit);
  }
  return fit;
}

absl::StatusOr<RidgeFit> RidgeSolver::Fit(int target, double lambda) const {
  if (absl::Status s = CheckTarget(target); !s.ok()) return s;
  if (absl::Status s = CheckLambda(lambda); !s.ok()) return s;
  return Assemble(target, lambda, ProjectCross(target));
}

absl::StatusOr<RidgeFit> RidgeSolver::FitSelect(int target,
                                                const RidgeSelectOptions& options) const {
  if (absl::Status s = CheckTarget(target); !s.ok()) return s;
  if (options.alphas.empty()) return absl::InvalidArgumentError("ridge λ grid is empty");
  for (double a : options.alphas) {
    if (absl::Status s = CheckLambda(a); !s.ok()) return s;
  }
  const std::vector<double> p = ProjectCross(target);
  if (options.alphas.size() == 1) return Assemble(target, options.alphas[0] * lambda_scale_, p);
  const int64_t held = stats_.holdout_rows;
  if (held == 0) {
    return absl::FailedPreconditionError(
        "choosing ridge λ needs held-out rows, the calibration kept none");
  }
  const CalibrationStats::Target& t = stats_.targets[target];
  const HeldOutError& error = options.error ? options.error : HeldOutError(HeldOutMse);
  std::vector<double> lambdas, errors;
  std::vector<float> predicted(held * t.dim);
  int best = -1;
  for (size_t g = 0; g < options.alphas.size(); ++g) {
    const double lambda = options.alphas[g] * lambda_scale_;
    const std::vector<double> yhat = PredictHeldOut(target, p, InverseShifted(lambda));
    std::copy(yhat.begin(), yhat.end(), predicted.begin());
    HeldOutPrediction candidate;
    candidate.target = target;
    candidate.lambda = lambda;
    candidate.alpha = options.alphas[g];
    candidate.rows = held;
    candidate.dim = t.dim;
    candidate.x = stats_.holdout_x;
    candidate.predicted = predicted;
    candidate.actual = t.holdout_y;
    const double e = error(candidate);
    lambdas.push_back(lambda);
    errors.push_back(e);
    if (!std::isfinite(e)) continue;
    // Ties (and the grid in any order) go to the larger λ: the better-conditioned map.
    if (best < 0 || e < errors[best] || (e == errors[best] && lambda > lambdas[best])) {
      best = static_cast<int>(g);
    }
  }
  if (best < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no ridge λ on the grid gave a finite held-out error for target ", target));
  }
  RidgeFit fit = Assemble(target, lambdas[best], p);
  fit.grid_lambdas = std::move(lambdas);
  fit.grid_errors = std::move(errors);
  return fit;
}

std::vector<float> RidgeSolver::RegularizedInverse(double lambda) const {
  const std::vector<double> inv = InverseShifted(lambda);
  // M = Q (E+λ)⁻¹ Qᵀ = (Qᵀ)ᵀ · ((E+λ)⁻¹ Qᵀ).
  std::vector<double> scaled(qt_.size());
  for (int64_t k = 0; k < dim_; ++k) {
    for (int64_t i = 0; i < dim_; ++i) scaled[k * dim_ + i] = qt_[k * dim_ + i] * inv[k];
  }
  std::vector<double> m(dim_ * dim_);
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dim_, dim_, dim_, 1.0, qt_.data(), dim_,
              scaled.data(), dim_, 0.0, m.data(), dim_);
  return std::vector<float>(m.begin(), m.end());
}

absl::StatusOr<RidgeFit> FitRidgeCholesky(const CalibrationStats& stats, int target,
                                          double lambda) {
  if (absl::Status s = CheckTargetIndex(stats, target); !s.ok()) return s;
  if (absl::Status s = CheckLambda(lambda); !s.ok()) return s;
  if (stats.rows < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("ridge fit needs at least 2 training rows, the calibration has ", stats.rows));
  }
  const int64_t d = stats.dim;
  const CalibrationStats::Target& t = stats.targets[target];
  std::vector<double> a = stats.gram;
  for (int64_t i = 0; i < d; ++i) a[i * d + i] += lambda;
  const int n = static_cast<int>(d);
  int info = 0;
  dpotrf_("U", &n, a.data(), &n, &info, 1);
  if (info != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Cholesky of the calibration Gram + λI failed at column ", info,
                     " (λ = ", lambda, "): not positive definite, X is rank-deficient for this λ"));
  }
  // C_l stored row-major [d_l, d] is, column-major, the d × d_l right-hand side XᵀY; the
  // solution (G+λI)⁻¹XᵀY column-major is W [d_l, d] row-major.
  std::vector<double> w = t.cross;
  const int nrhs = static_cast<int>(t.dim);
  dpotrs_("U", &n, &nrhs, a.data(), &n, w.data(), &n, &info, 1);
  if (info != 0) return absl::InternalError(absl::StrCat("dpotrs info ", info));

  RidgeFit fit;
  fit.target = target;
  fit.in_dim = d;
  fit.out_dim = t.dim;
  fit.lambda = lambda;
  double trace = 0;
  for (int64_t i = 0; i < d; ++i) trace += stats.gram[i * d + i];
  fit.alpha = trace > 0 ? lambda / (trace / static_cast<double>(d)) : 0.0;
  fit.weight.assign(w.begin(), w.end());
  fit.bias = Intercept(w, t.mean, stats.mean);
  // Held-out predictions Ŷ [held, d_l] = ȳ + (X_held − x̄) · Wᵀ.
  const int64_t held = stats.holdout_rows;
  std::vector<double> xc(held * d);
  for (int64_t r = 0; r < held; ++r) {
    for (int64_t i = 0; i < d; ++i) {
      xc[r * d + i] = static_cast<double>(stats.holdout_x[r * d + i]) - stats.mean[i];
    }
  }
  std::vector<double> yhat(held * t.dim);
  for (int64_t r = 0; r < held; ++r) std::copy(t.mean.begin(), t.mean.end(), &yhat[r * t.dim]);
  if (held > 0) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, held, t.dim, d, 1.0, xc.data(), d,
                w.data(), d, 1.0, yhat.data(), t.dim);
  }
  HeldOutScores(yhat.data(), t.holdout_y.data(), held, t.dim, fit);
  return fit;
}

double Leverage(std::span<const float> inverse, std::span<const float> mean,
                std::span<const float> h) {
  const size_t d = h.size();
  assert(mean.size() == d && inverse.size() == d * d);
  std::vector<double> c(d);
  for (size_t i = 0; i < d; ++i) c[i] = static_cast<double>(h[i]) - mean[i];
  double total = 0;
  for (size_t i = 0; i < d; ++i) {
    double row = 0;
    for (size_t j = 0; j < d; ++j) row += static_cast<double>(inverse[i * d + j]) * c[j];
    total += c[i] * row;
  }
  return total;
}

}  // namespace ridgeserve
