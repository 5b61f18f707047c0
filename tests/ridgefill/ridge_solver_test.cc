#include "engine/ridgefill/ridge_solver.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/ridgefill/calibration_stats.h"

namespace ridgeserve {
namespace {

// Y = A X + b + noise, X with correlated columns, a non-zero mean and one direction of
// small variance (conditioning like a hidden state's).
struct Problem {
  int64_t d, d_out, n;
  std::vector<double> a;  // [d_out, d]
  std::vector<double> b;  // [d_out]
  std::vector<float> x;   // [n, d]
  std::vector<float> y;   // [n, d_out]
};

// `rank` < d spans X with fewer directions (rounding to float leaves tiny eigenvalues);
// `constant_column` ≥ 0 makes that column exactly constant, so G is exactly singular.
Problem MakeProblem(int64_t d, int64_t d_out, int64_t n, double noise, uint64_t seed,
                    int64_t rank = -1, int64_t constant_column = -1) {
  if (rank < 0) rank = d;
  Problem p{d, d_out, n, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g;
  std::vector<double> mix(rank * d);  // x = z · mix + mu, z ∈ R^rank
  for (auto& v : mix) v = 0.3 * g(rng) / std::sqrt(static_cast<double>(rank));
  for (int64_t j = 0; j < d; ++j) mix[(j % rank) * d + j] += 1.0;
  std::vector<double> mu(d);
  for (auto& v : mu) v = 3.0 * g(rng);
  p.a.resize(d_out * d);
  for (auto& v : p.a) v = g(rng);
  p.b.resize(d_out);
  for (auto& v : p.b) v = g(rng);
  p.x.resize(n * d);
  p.y.resize(n * d_out);
  std::vector<double> z(rank), x(d);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < rank; ++k) z[k] = g(rng) * (k == 0 ? 0.05 : 1.0);
    for (int64_t j = 0; j < d; ++j) {
      double v = mu[j];
      for (int64_t k = 0; k < rank; ++k) v += z[k] * mix[k * d + j];
      p.x[i * d + j] = j == constant_column ? 1.5f : static_cast<float>(v);
      x[j] = p.x[i * d + j];  // the model sees the float X
    }
    for (int64_t o = 0; o < d_out; ++o) {
      double v = p.b[o] + noise * g(rng);
      for (int64_t j = 0; j < d; ++j) v += p.a[o * d + j] * x[j];
      p.y[i * d_out + o] = static_cast<float>(v);
    }
  }
  return p;
}

CalibrationStats Accumulate(const Problem& p, HoldoutOptions opts) {
  CalibrationAccumulator acc(p.d, {p.d_out}, opts);
  const float* y = p.y.data();
  EXPECT_TRUE(acc.AddRows(p.x.data(), p.n, {&y, 1}).ok());
  return acc.Finish();
}

double RelFrobenius(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

double RelFrobenius(const std::vector<float>& got, const std::vector<float>& want) {
  return RelFrobenius(got, std::vector<double>(want.begin(), want.end()));
}

// Ordinary least squares with an intercept by Householder QR of [X 1] — independent of the
// normal equations the solver uses. Returns W [d_out, d] then b [d_out].
std::pair<std::vector<double>, std::vector<double>> OlsByQr(const Problem& p) {
  const int64_t m = p.n, k = p.d + 1;
  std::vector<double> a(m * k), y(m * p.d_out);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < p.d; ++j) a[i * k + j] = p.x[i * p.d + j];
    a[i * k + p.d] = 1.0;
    for (int64_t o = 0; o < p.d_out; ++o) y[i * p.d_out + o] = p.y[i * p.d_out + o];
  }
  std::vector<double> v(m);
  for (int64_t c = 0; c < k; ++c) {
    double norm = 0;
    for (int64_t i = c; i < m; ++i) norm += a[i * k + c] * a[i * k + c];
    norm = std::sqrt(norm);
    const double alpha = a[c * k + c] > 0 ? -norm : norm;
    for (int64_t i = c; i < m; ++i) v[i] = a[i * k + c];
    v[c] -= alpha;
    double vv = 0;
    for (int64_t i = c; i < m; ++i) vv += v[i] * v[i];
    if (vv == 0) continue;
    const auto reflect = [&](double* base, int64_t stride, int64_t cols, int64_t first) {
      for (int64_t col = first; col < cols; ++col) {
        double dot = 0;
        for (int64_t i = c; i < m; ++i) dot += v[i] * base[i * stride + col];
        const double f = 2 * dot / vv;
        for (int64_t i = c; i < m; ++i) base[i * stride + col] -= f * v[i];
      }
    };
    reflect(a.data(), k, k, c);
    reflect(y.data(), p.d_out, p.d_out, 0);
  }
  std::vector<double> beta(k * p.d_out);  // [k, d_out]
  for (int64_t o = 0; o < p.d_out; ++o) {
    for (int64_t r = k - 1; r >= 0; --r) {
      double s = y[r * p.d_out + o];
      for (int64_t c = r + 1; c < k; ++c) s -= a[r * k + c] * beta[c * p.d_out + o];
      beta[r * p.d_out + o] = s / a[r * k + r];
    }
  }
  std::vector<double> w(p.d_out * p.d), b(p.d_out);
  for (int64_t o = 0; o < p.d_out; ++o) {
    for (int64_t j = 0; j < p.d; ++j) w[o * p.d + j] = beta[j * p.d_out + o];
    b[o] = beta[p.d * p.d_out + o];
  }
  return {w, b};
}

TEST(RidgeSolverTest, RecoversLinearMapAndErrorShrinksWithRows) {
  double previous_w = INFINITY, previous_b = INFINITY;
  for (int64_t n : {500, 5000}) {
    const Problem p = MakeProblem(64, 32, n, 0.1, 11);
    const CalibrationStats s = Accumulate(p, {.holdout_every = 10});
    auto solver = RidgeSolver::Create(s);
    ASSERT_TRUE(solver.ok()) << solver.status();
    auto fit = (*solver)->FitSelect(0);
    ASSERT_TRUE(fit.ok()) << fit.status();
    ASSERT_EQ(fit->weight.size(), 32u * 64u);
    const double err_w = RelFrobenius(fit->weight, p.a);
    const double err_b = RelFrobenius(fit->bias, p.b);
    // b itself is only as good as W times |x̄| (x̄ is far from 0 here); the prediction at the
    // data's centre, W x̄ + b, is pinned down to the noise over √n.
    std::vector<float> centre(32);
    std::vector<double> centre_true(32);
    for (int64_t o = 0; o < 32; ++o) {
      double got = fit->bias[o], want = p.b[o];
      for (int64_t j = 0; j < 64; ++j) {
        got += fit->weight[o * 64 + j] * s.mean[j];
        want += p.a[o * 64 + j] * s.mean[j];
      }
      centre[o] = static_cast<float>(got);
      centre_true[o] = want;
    }
    const double err_centre = RelFrobenius(centre, centre_true);
    SCOPED_TRACE(testing::Message()
                 << "n=" << n << " rel err W " << err_w << " b " << err_b << " centre "
                 << err_centre << " alpha " << fit->alpha << " R2 " << fit->holdout_r2);
    EXPECT_LT(err_w, n == 5000 ? 0.01 : 0.05);
    EXPECT_LT(err_centre, 1e-3);
    // ~1/√10 going from 500 to 5000 rows.
    EXPECT_LT(err_w, previous_w / 2);
    EXPECT_LT(err_b, previous_b / 2);
    previous_w = err_w;
    previous_b = err_b;
    EXPECT_GT(fit->holdout_r2, 0.99);
    EXPECT_NEAR(fit->holdout_mse, 0.01, 0.003);  // the noise variance
    EXPECT_EQ(fit->grid_errors.size(), DefaultRidgeAlphas().size());
  }
}

TEST(RidgeSolverTest, LambdaZeroIsOrdinaryLeastSquares) {
  const Problem p = MakeProblem(16, 8, 2000, 0.5, 12);
  const CalibrationStats s = Accumulate(p, {.holdout_every = 0});
  const auto [w_ref, b_ref] = OlsByQr(p);
  auto solver = RidgeSolver::Create(s);
  ASSERT_TRUE(solver.ok());
  auto eig = (*solver)->Fit(0, 0.0);
  ASSERT_TRUE(eig.ok()) << eig.status();
  auto chol = FitRidgeCholesky(s, 0, 0.0);
  ASSERT_TRUE(chol.ok()) << chol.status();
  // The float output rounds W to ~6e-8; the double solves agree far better than that.
  EXPECT_LT(RelFrobenius(eig->weight, w_ref), 1e-6);
  EXPECT_LT(RelFrobenius(eig->bias, b_ref), 1e-6);
  EXPECT_LT(RelFrobenius(chol->weight, w_ref), 1e-6);
  EXPECT_LT(RelFrobenius(chol->bias, b_ref), 1e-6);
  EXPECT_TRUE(std::isnan(eig->holdout_r2));
}

TEST(RidgeSolverTest, EigenAndCholeskyPathsAgree) {
  const Problem p = MakeProblem(48, 20, 3000, 0.3, 13);
  const CalibrationStats s = Accumulate(p, {.holdout_every = 8});
  auto solver = RidgeSolver::Create(s);
  ASSERT_TRUE(solver.ok());
  for (double alpha : {1e-6, 1e-3, 1e-1, 10.0}) {
    const double lambda = alpha * (*solver)->lambda_scale();
    auto eig = (*solver)->Fit(0, lambda);
    auto chol = FitRidgeCholesky(s, 0, lambda);
    ASSERT_TRUE(eig.ok() && chol.ok());
    SCOPED_TRACE(alpha);
    EXPECT_LT(RelFrobenius(eig->weight, chol->weight), 1e-6);
    EXPECT_LT(RelFrobenius(eig->bias, chol->bias), 1e-6);
    EXPECT_NEAR(eig->holdout_r2, chol->holdout_r2, 1e-9);
    EXPECT_NEAR(eig->holdout_mse, chol->holdout_mse, 1e-9 * chol->holdout_mse);
    EXPECT_NEAR(eig->alpha, alpha, 1e-12 * alpha);
    EXPECT_NEAR(chol->alpha, alpha, 1e-9 * alpha);
  }
}

TEST(RidgeSolverTest, SelectionFollowsTheNoise) {
  // Plenty of rows, little noise: hardly any shrinkage is right.
  {
    const Problem p = MakeProblem(32, 8, 4000, 1e-3, 14);
    const CalibrationStats s = Accumulate(p, {.holdout_every = 5});
    auto solver = RidgeSolver::Create(s);
    auto fit = (*solver)->FitSelect(0);
    ASSERT_TRUE(fit.ok());
    EXPECT_LE(fit->alpha, 1e-4);
    EXPECT_GT(fit->holdout_r2, 0.9999);
  }
  // Fewer training rows than 2 d and loud noise: least squares overfits, shrinkage wins.
  {
    const Problem p = MakeProblem(64, 8, 100, 3.0, 15);
    const CalibrationStats s = Accumulate(p, {.holdout_every = 4});
    auto solver = RidgeSolver::Create(s);
    auto fit = (*solver)->FitSelect(0);
    ASSERT_TRUE(fit.ok());
    EXPECT_GE(fit->alpha, 1e-2);
    for (float v : fit->weight) ASSERT_TRUE(std::isfinite(v));
    // The chosen λ beats the smallest on the held-out rows (that is what it was chosen by).
    EXPECT_LT(fit->holdout_mse, fit->grid_errors.front());
  }
}

TEST(RidgeSolverTest, RankDeficientInputStaysFinite) {
  // 64 columns spanned by 12 directions, one of them constant: G has 52 (numerically)
  // zero eigenvalues, one of them exactly zero.
  const Problem p = MakeProblem(64, 16, 3000, 0.01, 16, /*rank=*/12, /*constant_column=*/5);
  const CalibrationStats s = Accumulate(p, {.holdout_every = 10});
  auto solver = RidgeSolver::Create(s);
  ASSERT_TRUE(solver.ok());
  EXPECT_LT((*solver)->eigenvalues()[51], 1e-9 * (*solver)->eigenvalues().back());
  auto fit = (*solver)->FitSelect(0);
  ASSERT_TRUE(fit.ok()) << fit.status();
  for (double e : fit->grid_errors) EXPECT_TRUE(std::isfinite(e));
  for (float v : fit->weight) ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT(fit->holdout_r2, 0.999);
  // λ = 0 is the pseudo-inverse: finite and as predictive; Cholesky has to refuse.
  auto pinv = (*solver)->Fit(0, 0.0);
  ASSERT_TRUE(pinv.ok());
  for (float v : pinv->weight) ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT(pinv->holdout_r2, 0.999);
  auto chol = FitRidgeCholesky(s, 0, 0.0);
  EXPECT_EQ(chol.status().code(), absl::StatusCode::kFailedPrecondition) << chol.status();
}

TEST(RidgeSolverTest, CallerSuppliedErrorDecides) {
  const Problem p = MakeProblem(16, 4, 1000, 0.1, 17);
  const CalibrationStats s = Accumulate(p, {.holdout_every = 10});
  auto solver = RidgeSolver::Create(s);
  RidgeSelectOptions opts;
  opts.alphas = {1e-6, 1e-3, 1.0, 1e-2};
  int calls = 0;
  opts.error = [&](const HeldOutPrediction& c) {
    ++calls;
    EXPECT_EQ(c.rows, s.holdout_rows);
    EXPECT_EQ(c.dim, 4);
    EXPECT_EQ(c.predicted.size(), static_cast<size_t>(c.rows * 4));
    EXPECT_EQ(c.actual.size(), c.predicted.size());
    EXPECT_EQ(c.x.size(), static_cast<size_t>(c.rows * 16));
    return c.alpha == 1.0 ? 0.0 : 1.0;  // perverse on purpose: only λ = scale is "good"
  };
  auto fit = (*solver)->FitSelect(0, opts);
  ASSERT_TRUE(fit.ok());
  EXPECT_EQ(calls, 4);
  EXPECT_DOUBLE_EQ(fit->alpha, 1.0);
  EXPECT_EQ(fit->grid_lambdas.size(), 4u);

  opts.error = [](const HeldOutPrediction&) { return NAN; };
  EXPECT_EQ((*solver)->FitSelect(0, opts).status().code(), absl::StatusCode::kFailedPrecondition);
  // Predictions handed to the error function are the fit's own predictions.
  opts.error = HeldOutMse;
  auto mse_fit = (*solver)->FitSelect(0, opts);
  ASSERT_TRUE(mse_fit.ok());
  double best = INFINITY;
  for (double e : mse_fit->grid_errors) best = std::min(best, e);
  EXPECT_NEAR(mse_fit->holdout_mse, best, 1e-6 * best);
}

TEST(RidgeSolverTest, BadArguments) {
  const Problem p = MakeProblem(8, 2, 200, 0.1, 18);
  const CalibrationStats s = Accumulate(p, {.holdout_every = 0});
  auto solver = RidgeSolver::Create(s);
  EXPECT_EQ((*solver)->Fit(1, 1.0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*solver)->Fit(0, -1.0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*solver)->Fit(0, NAN).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*solver)->FitSelect(0).status().code(), absl::StatusCode::kFailedPrecondition);
  RidgeSelectOptions one;
  one.alphas = {1e-3};
  EXPECT_TRUE((*solver)->FitSelect(0, one).ok());  // one λ needs no held-out rows
  EXPECT_EQ(FitRidgeCholesky(s, 0, -1).status().code(), absl::StatusCode::kInvalidArgument);

  CalibrationAccumulator empty(8, {2});
  const CalibrationStats none = empty.Finish();
  EXPECT_EQ(RidgeSolver::Create(none).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RidgeSolverTest, RegularizedInverseAndLeverage) {
  const Problem p = MakeProblem(24, 2, 4000, 0.1, 19);
  const CalibrationStats s = Accumulate(p, {.holdout_every = 0});
  auto solver = RidgeSolver::Create(s);
  const int64_t d = 24;
  const double lambda = 1e-3 * (*solver)->lambda_scale();
  const std::vector<float> m = (*solver)->RegularizedInverse(lambda);
  // M (G + λI) = I.
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      double v = 0;
      for (int64_t k = 0; k < d; ++k) v += m[i * d + k] * (s.gram[k * d + j] + (k == j) * lambda);
      ASSERT_NEAR(v, i == j ? 1.0 : 0.0, 1e-4) << i << "," << j;
    }
  }
  // The mean training leverage is tr(M G) / n ≈ d / n; a row 100 σ out along the
  // least-varied direction scores ≈ 100² e₀ / ((e₀ + λ) n), far above that.
  const std::vector<float> mean(s.mean.begin(), s.mean.end());
  double sum = 0;
  for (int64_t i = 0; i < p.n; ++i) {
    sum += Leverage(m, mean, std::span<const float>(p.x.data() + i * d, d));
  }
  EXPECT_NEAR(sum / p.n, static_cast<double>(d) / p.n, 0.05 * d / p.n);
  std::vector<float> far = mean;
  const double e0 = (*solver)->eigenvalues()[0];
  const double sigma0 = std::sqrt(e0 / p.n);  // std of x along that direction
  // Direction of the smallest eigenvalue: power iteration on M.
  std::vector<double> v(d, 1.0);
  for (int it = 0; it < 200; ++it) {
    std::vector<double> w(d, 0.0);
    double norm = 0;
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t k = 0; k < d; ++k) w[i] += m[i * d + k] * v[k];
      norm += w[i] * w[i];
    }
    for (int64_t i = 0; i < d; ++i) v[i] = w[i] / std::sqrt(norm);
  }
  for (int64_t i = 0; i < d; ++i) far[i] += static_cast<float>(100 * sigma0 * v[i]);
  EXPECT_GT(Leverage(m, mean, far), 100.0 * d / p.n);
}

}  // namespace
}  // namespace ridgeserve
