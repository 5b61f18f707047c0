#include "engine/ridgefill/map_fit.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <utility>

#include "engine/common/status_macros.h"

namespace ridgeserve {
namespace {

// Per-KV-head key scale γ_h = mean_r ‖K_h(r)‖ / mean_r ‖K̂_h(r)‖ over rows of K|V
// [rows, 2 kv_dim]: the factor that makes the predicted key norms match the exact ones on
// average (ridge shrinks predictions towards the mean).
std::vector<float> KeyScale(const std::vector<float>& got, const std::vector<float>& want,
                            int64_t rows, int32_t num_kv_heads, int32_t head_dim) {
  const int32_t kv_dim = num_kv_heads * head_dim;
  std::vector<double> g(num_kv_heads, 0.0), w(num_kv_heads, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      double gg = 0, ww = 0;
      for (int32_t j = h * head_dim; j < (h + 1) * head_dim; ++j) {
        gg += static_cast<double>(got[r * 2 * kv_dim + j]) * got[r * 2 * kv_dim + j];
        ww += static_cast<double>(want[r * 2 * kv_dim + j]) * want[r * 2 * kv_dim + j];
      }
      g[h] += std::sqrt(gg);
      w[h] += std::sqrt(ww);
    }
  }
  std::vector<float> scale(num_kv_heads, 1.0f);
  for (int32_t h = 0; h < num_kv_heads; ++h) {
    if (g[h] > 0 && w[h] > 0) scale[h] = static_cast<float>(w[h] / g[h]);
  }
  return scale;
}

// Compares predicted and actual K/V rows ([rows, 2 kv_dim]). kv_error is the relative squared
// error of K plus that of V: Σ‖K̂ − K‖²/Σ‖K‖² + Σ‖V̂ − V‖²/Σ‖V‖². key_norm_ratio is the mean
// over rows of ‖K̂‖/‖K‖ (all heads together), head_key_norm_ratio the same per KV head.
MapFitQuality CompareKv(const std::vector<float>& got, const std::vector<float>& want, int64_t rows,
                        int32_t num_kv_heads, int32_t head_dim) {
  const int32_t kv_dim = num_kv_heads * head_dim;
  MapFitQuality q;
  double k_cos = 0, v_cos = 0, norm_ratio = 0;
  double k_err = 0, k_ref = 0, v_err = 0, v_ref = 0;
  q.head_key_norm_ratio.assign(num_kv_heads, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = &got[r * 2 * kv_dim];
    const float* w = &want[r * 2 * kv_dim];
    k_cos += Cosine(g, w, kv_dim);
    v_cos += Cosine(g + kv_dim, w + kv_dim, kv_dim);
    double gk = 0, wk = 0;
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      double gh = 0, wh = 0;
      for (int32_t j = h * head_dim; j < (h + 1) * head_dim; ++j) {
        gh += static_cast<double>(g[j]) * g[j];
        wh += static_cast<double>(w[j]) * w[j];
        k_err += (static_cast<double>(g[j]) - w[j]) * (static_cast<double>(g[j]) - w[j]);
        const double gv = g[kv_dim + j], wv = w[kv_dim + j];
        v_err += (gv - wv) * (gv - wv);
        v_ref += wv * wv;
      }
      q.head_key_norm_ratio[h] += wh > 0 ? std::sqrt(gh / wh) : 0.0;
      gk += gh;
      wk += wh;
    }
    k_ref += wk;
    norm_ratio += wk > 0 ? std::sqrt(gk / wk) : 0.0;
  }
  q.k_cos = k_cos / rows;
  q.v_cos = v_cos / rows;
  q.key_norm_ratio = norm_ratio / rows;
  for (double& h : q.head_key_norm_ratio) h /= rows;
  q.kv_error = (k_ref > 0 ? k_err / k_ref : 0) + (v_ref > 0 ? v_err / v_ref : 0);
  return q;
}
// R² of ŷ against y [rows, dim], relative to y's own mean, summed over dims.
double RSquared(const std::vector<float>& y, const std::vector<float>& pred, int64_t rows,
                int64_t dim) {
  std::vector<double> mean(dim, 0.0);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t j = 0; j < dim; ++j) mean[j] += y[row * dim + j];
  }
  for (double& m : mean) m /= rows;
  double err = 0, var = 0;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t j = 0; j < dim; ++j) {
      const double e = static_cast<double>(y[row * dim + j]) - pred[row * dim + j];
      const double v = y[row * dim + j] - mean[j];
      err += e * e;
      var += v * v;
    }
  }
  return var > 0 ? 1.0 - err / var : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

KvProjector::KvProjector(LlamaModel& model, int32_t layer) : c_(model.config()) {
  Backend& backend = model.backend();
  const LayerWeights& w = model.weights().layers[layer];
  const int32_t kv = c_.kv_dim(), q_dim = c_.q_dim();
  norm_.resize(c_.hidden);
  backend.CopyToHost(norm_.data(), w.attn_norm.as<float>(), sizeof(float) * c_.hidden);
  // wqkv rows: Q [q_dim], then K [kv_dim], then V [kv_dim].
  weight_.resize(static_cast<size_t>(q_dim + 2 * kv) * c_.hidden);
  const absl::Status unpacked = backend.UnpackWeight(w.wqkv, 0, w.wqkv.rows(), weight_.data());
  assert(unpacked.ok());  // the whole weight: a range error would be ours
  (void)unpacked;
  if (w.bqkv.bytes() > 0) {
    bias_.resize(q_dim + 2 * kv);
    backend.CopyToHost(bias_.data(), w.bqkv.as<float>(), sizeof(float) * bias_.size());
  }
  if (c_.qk_norm) {
    k_norm_.resize(c_.head_dim);
    backend.CopyToHost(k_norm_.data(), w.k_norm.as<float>(), sizeof(float) * c_.head_dim);
    q_norm_.resize(c_.head_dim);
    backend.CopyToHost(q_norm_.data(), w.q_norm.as<float>(), sizeof(float) * c_.head_dim);
  }
}

void KvProjector::Target(MapTarget kind, const float* h, int64_t rows,
                         std::vector<float>& y) const {
  if (kind == MapTarget::kPreNorm) {
    y.assign(h, h + rows * c_.hidden);
    return;
  }
  Normalize(h, rows, y);
  if (kind == MapTarget::kKv) {
    std::vector<float> xn = std::move(y);
    ProjectRows(xn.data(), rows, c_.q_dim(), 2 * c_.kv_dim(), y);
  }
}

void KvProjector::ToKv(MapTarget kind, const float* y, int64_t rows, std::vector<float>& kv) const {
  if (kind == MapTarget::kKv) {
    kv.assign(y, y + rows * 2 * c_.kv_dim());
  } else {
    std::vector<float> xn;
    const float* in = y;
    if (kind == MapTarget::kPreNorm) {
      Normalize(y, rows, xn);
      in = xn.data();
    }
    ProjectRows(in, rows, c_.q_dim(), 2 * c_.kv_dim(), kv);
  }
  if (k_norm_.empty()) return;
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t hd = 0; hd < c_.num_kv_heads; ++hd) {
      float* head = &kv[r * 2 * c_.kv_dim() + hd * c_.head_dim];
      RmsNormRow(head, k_norm_.data(), c_.head_dim, head);
    }
  }
}

void KvProjector::Queries(const float* h, int64_t rows, std::vector<float>& q) const {
  std::vector<float> xn;
  Normalize(h, rows, xn);
  ProjectRows(xn.data(), rows, 0, c_.q_dim(), q);
  if (q_norm_.empty()) return;
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t hd = 0; hd < c_.num_heads; ++hd) {
      float* head = &q[r * c_.q_dim() + hd * c_.head_dim];
      RmsNormRow(head, q_norm_.data(), c_.head_dim, head);
    }
  }
}

void KvProjector::Normalize(const float* h, int64_t rows, std::vector<float>& xn) const {
  const int32_t d = c_.hidden;
  xn.resize(static_cast<size_t>(rows) * d);
  for (int64_t r = 0; r < rows; ++r) RmsNormRow(h + r * d, norm_.data(), d, &xn[r * d]);
}
void KvProjector::ProjectRows(const float* x, int64_t rows, int32_t first, int32_t count,
                              std::vector<float>& out) const {
  const int32_t d = c_.hidden;
  out.assign(static_cast<size_t>(rows) * count, 0.0f);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, count, d, 1.0f, x, d,
              weight_.data() + static_cast<size_t>(first) * d, d, 0.0f, out.data(), count);
  if (bias_.empty()) return;
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t j = 0; j < count; ++j) out[r * count + j] += bias_[first + j];
  }
}
void KvProjector::RmsNormRow(const float* x, const float* w, int32_t dim, float* out) const {
  double sum = 0;
  for (int32_t i = 0; i < dim; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(sum / dim + c_.rms_eps));
  for (int32_t i = 0; i < dim; ++i) out[i] = (x[i] * r) * w[i];
}

std::vector<std::unique_ptr<KvProjector>> MakeKvProjectors(LlamaModel& model,
                                                           std::span<const int32_t> splits) {
  const int32_t num_layers = model.config().num_layers;
  std::vector<std::unique_ptr<KvProjector>> projectors(num_layers);
  for (int32_t s : splits) {
    for (int32_t l = s + 2; l < num_layers; ++l) {
      if (projectors[l] == nullptr) projectors[l] = std::make_unique<KvProjector>(model, l);
    }
  }
  return projectors;
}

SplitStatistics::SplitStatistics(LlamaModel& model, std::vector<int32_t> splits,
                                 std::vector<MapTarget> kinds, HoldoutOptions holdout)
    : config_(model.config()), splits_(std::move(splits)), kinds_(std::move(kinds)) {
  std::sort(splits_.begin(), splits_.end());
  const int32_t num_layers = config_.num_layers;
  depth_slot_.assign(num_layers + 1, -1);
  auto want_depth = [&](int32_t d) {
    if (depth_slot_[d] >= 0) return;
    depth_slot_[d] = static_cast<int32_t>(depths_.size());
    depths_.push_back(d);
  };
  projectors_ = MakeKvProjectors(model, splits_);
  accumulators_.resize(kinds_.size());
  for (int32_t s : splits_) {
    want_depth(s + 1);
    for (int32_t l = s + 2; l < num_layers; ++l) want_depth(l);
    for (size_t k = 0; k < kinds_.size(); ++k) {
      std::vector<int64_t> dims;
      for (int32_t l = s + 2; l < num_layers; ++l) {
        dims.push_back(projectors_[l]->TargetDim(kinds_[k]));
      }
      accumulators_[k].emplace_back(config_.hidden, std::move(dims), holdout);
    }
  }
  targets_.resize(num_layers);
}

absl::Status SplitStatistics::Add(std::span<const std::vector<float>> states, int64_t first,
                                  int64_t rows, int threads) {
  const int32_t num_layers = config_.num_layers;
  const size_t offset = static_cast<size_t>(first) * config_.hidden;
  // Layers' targets, then splits' statistics, each independent of the others.
  for (size_t k = 0; k < kinds_.size(); ++k) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int32_t l = 0; l < num_layers; ++l) {
      if (projectors_[l] == nullptr) continue;
      projectors_[l]->Target(kinds_[k], states[depth_slot_[l]].data() + offset, rows, targets_[l]);
    }
    std::vector<absl::Status> added(splits_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t i = 0; i < splits_.size(); ++i) {
      const int32_t s = splits_[i];
      std::vector<const float*> ys;
      for (int32_t l = s + 2; l < num_layers; ++l) ys.push_back(targets_[l].data());
      added[i] = accumulators_[k][i].AddRows(states[depth_slot_[s + 1]].data() + offset, rows, ys);
    }
    for (const absl::Status& status : added) RS_RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

double Cosine(const float* a, const float* b, int32_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int32_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

std::vector<float> Predict(const RidgeFit& fit, const float* x, int64_t rows, int32_t d) {
  const int64_t out_dim = fit.out_dim;
  std::vector<float> pred(static_cast<size_t>(rows) * out_dim);
  for (int64_t row = 0; row < rows; ++row) {
    std::copy(fit.bias.begin(), fit.bias.end(), pred.begin() + row * out_dim);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out_dim, d, 1.0f, x, d,
              fit.weight.data(), d, 1.0f, pred.data(), out_dim);
  return pred;
}

void ApplyKeyScale(std::span<const float> scale, int64_t rows, int32_t head_dim,
                   std::vector<float>& kv) {
  const int32_t kv_dim = static_cast<int32_t>(scale.size()) * head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t h = 0; h < scale.size(); ++h) {
      float* k = &kv[r * 2 * kv_dim + h * head_dim];
      for (int32_t j = 0; j < head_dim; ++j) k[j] *= scale[h];
    }
  }
}

absl::StatusOr<SplitFit> FitSplitMaps(int32_t split, MapTarget kind, const MapFitOptions& options,
                                      const CalibrationStats& stats, const RidgeSolver& solver,
                                      std::span<const std::unique_ptr<KvProjector>> projectors,
                                      const ModelConfig& config) {
  const ModelConfig& c = config;
  const int32_t kv_heads = c.num_kv_heads, head_dim = c.head_dim;
  SplitFit r;
  r.split = split;
  r.train_rows = stats.rows;
  r.holdout_rows = stats.holdout_rows;
  for (int t = 0; t < static_cast<int>(stats.targets.size()); ++t) {
    const KvProjector& projector = *projectors[split + 2 + t];
    const int64_t held = stats.holdout_rows;
    const std::vector<float>& y_held = stats.targets[t].holdout_y;
    std::vector<float> kv_actual, kv_pred;
    if (held > 0) projector.ToKv(kind, y_held.data(), held, kv_actual);
    RidgeFit fit;
    if (options.fixed_lambda >= 0) {
      RS_ASSIGN_OR_RETURN(fit, FitRidgeCholesky(stats, t, options.fixed_lambda));
    } else {
      // Scored on K/V as served: with the key scale fitted for that λ when it is on.
      RidgeSelectOptions select;
      select.error = [&](const HeldOutPrediction& p) {
        projector.ToKv(kind, p.predicted.data(), p.rows, kv_pred);
        if (options.key_scale) {
          ApplyKeyScale(KeyScale(kv_pred, kv_actual, p.rows, kv_heads, head_dim), p.rows, head_dim,
                        kv_pred);
        }
        return CompareKv(kv_pred, kv_actual, p.rows, kv_heads, head_dim).kv_error;
      };
      RS_ASSIGN_OR_RETURN(fit, solver.FitSelect(t, select));
    }
    MapFitQuality q;
    std::vector<float> scale;
    if (held > 0) {
      const std::vector<float> pred = Predict(fit, stats.holdout_x.data(), held, c.hidden);
      projector.ToKv(kind, pred.data(), held, kv_pred);
      // The scale is fitted on the held-out rows it is then scored on: kv_heads numbers per
      // layer against ~1600 rows, so the optimism is small. key_norm_ratio is then ~1 by
      // construction; the *_unscaled values are before the scale.
      const MapFitQuality unscaled = CompareKv(kv_pred, kv_actual, held, kv_heads, head_dim);
      q = unscaled;
      if (options.key_scale) {
        scale = KeyScale(kv_pred, kv_actual, held, kv_heads, head_dim);
        ApplyKeyScale(scale, held, head_dim, kv_pred);
        q = CompareKv(kv_pred, kv_actual, held, kv_heads, head_dim);
      }
      q.key_norm_ratio_unscaled = unscaled.key_norm_ratio;
      q.head_key_norm_ratio = unscaled.head_key_norm_ratio;
      q.r2 = RSquared(y_held, pred, held, fit.out_dim);
    }
    r.fits.push_back(std::move(fit));
    r.quality.push_back(std::move(q));
    r.key_scale.push_back(std::move(scale));
  }
  // Leverage test for outlier rows, at the λ chosen for the first target (s + 2).
  r.leverage_lambda = static_cast<float>(r.fits.front().lambda);
  r.leverage_inverse = solver.RegularizedInverse(r.fits.front().lambda);
  r.leverage_mean.assign(stats.mean.begin(), stats.mean.end());
  return r;
}

MapSet ToMapSet(std::span<const SplitFit> fits, MapTarget kind, const ModelFingerprint& model,
                const ModelConfig& config) {
  MapSet maps;
  maps.model = model;
  maps.num_kv_heads = config.num_kv_heads;
  maps.head_dim = config.head_dim;
  maps.kind = kind;
  for (const SplitFit& r : fits) {
    SplitMaps sm;
    sm.split_layer = r.split;
    sm.leverage_lambda = r.leverage_lambda;
    sm.leverage_inverse = r.leverage_inverse;
    sm.leverage_mean = r.leverage_mean;
    for (size_t t = 0; t < r.fits.size(); ++t) {
      TargetMap tm;
      tm.layer = r.split + 2 + static_cast<int32_t>(t);
      tm.lambda = static_cast<float>(r.fits[t].lambda);
      tm.out_dim = static_cast<int32_t>(r.fits[t].out_dim);
      tm.weight = r.fits[t].weight;
      tm.bias = r.fits[t].bias;
      tm.key_scale = r.key_scale[t];
      tm.diagnostics.r2 = static_cast<float>(r.quality[t].r2);
      tm.diagnostics.k_cos = static_cast<float>(r.quality[t].k_cos);
      tm.diagnostics.v_cos = static_cast<float>(r.quality[t].v_cos);
      tm.diagnostics.key_norm_ratio = static_cast<float>(r.quality[t].key_norm_ratio);
      tm.diagnostics.attn_cos = static_cast<float>(r.quality[t].attn_cos);
      sm.targets.push_back(std::move(tm));
    }
    maps.splits.push_back(std::move(sm));
  }
  return maps;
}

}  // namespace ridgeserve
