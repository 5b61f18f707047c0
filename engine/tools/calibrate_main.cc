// ridgeserve-calibrate: fits RidgeFill maps (DESIGN.md, "RidgeFill — our definition") from
// calibration text on the real model, and checks map files against a model.
//
//   ridgeserve-calibrate --model M --text FILE[,FILE...] --split_layers 14,18,22 --out F.rfmap
//       [--max_tokens N] [--lambda auto|X] [--window 2048] [--map_target pre_norm|post_norm|kv]
//       [--key_scale off|on]
//   ridgeserve-calibrate --check F.rfmap --model M
//
// Calibration: one exact forward pass over the text in windows of --window tokens (each window
// a fresh sequence, prefilled in chunks of --chunk rows). For every split s the forward pass
// captures X = h_s (the residual leaving layer s) and, for every l in [s + 2, L), the target
// of --map_target computed from the residual entering layer l (pre_norm: that residual;
// post_norm: its RMSNorm · attn_norm; kv: K before RoPE and QK-norm, and V, of layer l), and
// streams them into a CalibrationAccumulator (double precision, every 10th row held out). The
// first --sink_tokens rows of each window are left out: they are attention sinks with outlier
// residuals and always run exactly when serving. The last window (--attn_window) is left out
// of the statistics too and measures the attention-output cosine (AttentionCosine below).
// λ: --lambda X solves at that absolute λ (Cholesky); auto picks per target from a grid
// λ = α · trace(G)/d by the held-out error of the resulting K and V (layer l's K after QK-norm,
// before RoPE, with the key scale when it is on), not of the target alone.
// Key scale (--key_scale on): per layer and KV head, γ = mean ‖K‖ / mean ‖K̂‖ on the held-out
// rows, stored in the file and applied by the fill path to predicted keys.
// Several comma-separated --map_target and --key_scale values fit every combination from one
// pass, each to --out with {target} and {key_scale} replaced.
// Note: with λ chosen by K/V error, post_norm and kv give the same K/V map: ridge regression
// is equivariant under a linear map of the targets (W_kv = P W_post for the layer's K/V rows
// P), so they differ only by rounding; pre_norm differs (the RMSNorm after the map).
// Output: the map file(s), a per-layer table on stderr, one JSON summary on stdout.
// --check: opens the map file against the model's fingerprint and prints its summary JSON;
// exit 1 with one line naming the file when it does not fit.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "engine/common/status_macros.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/config.h"
#include "engine/model/gguf.h"
#include "engine/model/llama.h"
#include "engine/model/model.h"
#include "engine/model/safetensors.h"
#include "engine/ridgefill/calibration_stats.h"
#include "engine/ridgefill/map_file.h"
#include "engine/ridgefill/ridge_solver.h"
#include "engine/tools/tool_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face directory");
ABSL_FLAG(std::string, text, "", "calibration text file(s), comma-separated");
ABSL_FLAG(std::string, split_layers, "", "split layers s, comma-separated (0 <= s <= L-3)");
ABSL_FLAG(std::string, out, "", "map file to write");
ABSL_FLAG(int64_t, max_tokens, 0, "use at most this many tokens of the text (0 = all)");
ABSL_FLAG(std::string, lambda, "auto",
          "ridge λ: 'auto' (held-out grid, scored on K/V) or an absolute value");
ABSL_FLAG(int32_t, window, 2048, "tokens per calibration window (a fresh sequence each)");
ABSL_FLAG(int32_t, chunk, 512, "rows per forward pass");
ABSL_FLAG(int32_t, sink_tokens, 4, "first rows of each window left out of the statistics");
ABSL_FLAG(std::string, map_target, "pre_norm",
          "what the maps predict: pre_norm, post_norm or kv (DESIGN.md)");
ABSL_FLAG(std::string, key_scale, "off",
          "per-layer, per-KV-head key-scale correction stored with the maps: on|off");
ABSL_FLAG(bool, attn_window, true,
          "hold the last calibration window out of the statistics and measure the "
          "attention-output cosine on it");
ABSL_FLAG(int64_t, holdout_every, 10, "every k-th row is held out for choosing λ");
ABSL_FLAG(int64_t, max_holdout_rows, 4096, "at most this many held-out rows");
ABSL_FLAG(int32_t, threads, 0, "CPU threads (0 = all)");
ABSL_FLAG(std::string, cpu_activations, "f32",
          "CPU Linear arithmetic: f32 (the default: float math on the exact weights) or int8");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "KV cache element type: f32, bf16, f16 (rounded to nearest even when stored, widened "
          "exactly when read) or auto (the backend's default: f16 on the CPU)");
ABSL_FLAG(std::string, check, "", "map file to check against --model (prints its summary)");

namespace ridgeserve {
namespace {

using Clock = ToolClock;
using Json = nlohmann::json;

// JSON cannot hold NaN; unmeasured values become null.
Json Num(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

// The model's config and fingerprint without loading its weights or tokenizer.
struct ModelIdentity {
  ModelConfig config;
  ModelFingerprint fingerprint;
};

absl::StatusOr<ModelIdentity> IdentifyModel(const std::string& path) {
  ModelIdentity id;
  std::unique_ptr<TensorSource> source;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    RS_ASSIGN_OR_RETURN(id.config, ConfigFromHfJson(path + "/config.json"));
    RS_ASSIGN_OR_RETURN(source, SafetensorsModel::Open(path));
  } else {
    RS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
    std::vector<float> rope_factors;
    if (const TensorInfo* t = gguf->FindTensor("rope_freqs.weight"); t != nullptr) {
      RS_ASSIGN_OR_RETURN(rope_factors, gguf->ReadF32(*t));
    }
    RS_ASSIGN_OR_RETURN(id.config, ConfigFromGguf(*gguf, rope_factors));
    source = std::move(gguf);
  }
  id.fingerprint =
      ComputeModelFingerprint(*source, id.config.name, id.config.num_layers, id.config.hidden);
  return id;
}

// Per-target quality (DESIGN.md's report). R², K/V cosines and key-norm ratios are on the
// held-out rows; attn_cos on the attention window (see AttentionCosine).
struct Quality {
  double r2 = std::numeric_limits<double>::quiet_NaN();
  double k_cos = std::numeric_limits<double>::quiet_NaN();
  double v_cos = std::numeric_limits<double>::quiet_NaN();
  double key_norm_ratio = std::numeric_limits<double>::quiet_NaN();
  double attn_cos = std::numeric_limits<double>::quiet_NaN();
  double kv_error = std::numeric_limits<double>::quiet_NaN();  // what auto-λ minimises
  // Before the key scale (equal to the above when it is off).
  double key_norm_ratio_unscaled = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> head_key_norm_ratio;  // [num_kv_heads]
};

// Layer l's path from its input residual row to its K (before RoPE) and V, on the host, in
// stages that match what each map target predicts:
//   residual h --Normalize--> x̂ (RMSNorm · attn_norm) --Project--> raw K|V (+ bias)
//   --FinishK--> K after QK-norm (Qwen3; identity otherwise), V unchanged.
// pre_norm predicts h, post_norm x̂, kv raw K|V. Queries (for the attention cosine) come from
// x̂ with the Q rows.
class KvProjector {
 public:
  KvProjector(LlamaModel& model, int32_t layer) : c_(model.config()) {
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

  int32_t kv_dim() const { return c_.kv_dim(); }
  // Width of what a map of `kind` predicts.
  int32_t TargetDim(MapTarget kind) const {
    return kind == MapTarget::kKv ? 2 * c_.kv_dim() : c_.hidden;
  }

  // The exact target of `kind` from residual rows h [rows, hidden] → y [rows, TargetDim].
  void Target(MapTarget kind, const float* h, int64_t rows, std::vector<float>& y) const {
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

  // Target values of `kind` (exact or predicted) [rows, TargetDim] → K|V [rows, 2 kv_dim]
  // with K after QK-norm and before RoPE.
  void ToKv(MapTarget kind, const float* y, int64_t rows, std::vector<float>& kv) const {
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

  // Exact queries from residual rows h: [rows, q_dim], after QK-norm, before RoPE.
  void Queries(const float* h, int64_t rows, std::vector<float>& q) const {
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

 private:
  void Normalize(const float* h, int64_t rows, std::vector<float>& xn) const {
    const int32_t d = c_.hidden;
    xn.resize(static_cast<size_t>(rows) * d);
    for (int64_t r = 0; r < rows; ++r) RmsNormRow(h + r * d, norm_.data(), d, &xn[r * d]);
  }
  // out [rows, count] = x · weight rows [first, first + count)ᵀ + bias.
  void ProjectRows(const float* x, int64_t rows, int32_t first, int32_t count,
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
  void RmsNormRow(const float* x, const float* w, int32_t dim, float* out) const {
    double sum = 0;
    for (int32_t i = 0; i < dim; ++i) sum += static_cast<double>(x[i]) * x[i];
    const float r = static_cast<float>(1.0 / std::sqrt(sum / dim + c_.rms_eps));
    for (int32_t i = 0; i < dim; ++i) out[i] = (x[i] * r) * w[i];
  }

  const ModelConfig& c_;
  std::vector<float> norm_;    // [hidden]
  std::vector<float> weight_;  // [q_dim + 2 kv_dim, hidden]
  std::vector<float> bias_;    // [q_dim + 2 kv_dim] or empty
  std::vector<float> k_norm_;  // [head_dim] or empty
  std::vector<float> q_norm_;  // [head_dim] or empty
};

double Cosine(const float* a, const float* b, int32_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int32_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

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

// K rows of K|V [rows, 2 kv_dim] times the per-head scale, in place.
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

// Compares predicted and actual K/V rows ([rows, 2 kv_dim]). kv_error is the relative squared
// error of K plus that of V: Σ‖K̂ − K‖²/Σ‖K‖² + Σ‖V̂ − V‖²/Σ‖V‖². key_norm_ratio is the mean
// over rows of ‖K̂‖/‖K‖ (all heads together), head_key_norm_ratio the same per KV head.
Quality CompareKv(const std::vector<float>& got, const std::vector<float>& want, int64_t rows,
                  int32_t num_kv_heads, int32_t head_dim) {
  const int32_t kv_dim = num_kv_heads * head_dim;
  Quality q;
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

// Rotary embedding on the host, as Backend::Rope (half-split pairs, float angle), on `heads`
// heads of rows `ld` apart; row r is at position positions[r].
void HostRope(float* x, int32_t ld, int64_t rows, int32_t heads, int32_t head_dim,
              const std::vector<int32_t>& positions, const std::vector<float>& inv_freq) {
  const int32_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t j = 0; j < half; ++j) {
      const float theta = static_cast<float>(positions[r]) * inv_freq[j];
      const float c = static_cast<float>(std::cos(static_cast<double>(theta)));
      const float s = static_cast<float>(std::sin(static_cast<double>(theta)));
      for (int32_t h = 0; h < heads; ++h) {
        float* p = x + r * ld + h * head_dim;
        const float a = p[j], b = p[j + half];
        p[j] = a * c - b * s;
        p[j + half] = b * c + a * s;
      }
    }
  }
}

// Attention-output cosine of one layer on the attention window (a contiguous calibration
// window left out of the statistics, positions 0..n-1). Queries: the exact queries of the
// rows at positions ≥ n/2 (the part of a prompt that would be the exact tail). Keys/values:
// every row at positions ≤ the query's (causal), exact for rows < sink (attention sinks run
// exactly when serving) and predicted for the others (K̂ with key scale, RoPE at the true
// position) — the worst case, as if the whole causal prefix were filled. For each query row
// and query head h (GQA: KV head h / (heads / kv_heads)):
//   o   = softmax(q_h · Kᵀ / √d) V       (exact K, V)
//   ô   = softmax(q_h · K̂ᵀ / √d) V̂      (predicted K̂, V̂)
// and the result is the mean over (row, head) of cos(o, ô).
// q [n, q_dim] before RoPE; kv_exact, kv_pred [n, 2 kv_dim] before RoPE.
double AttentionCosine(const ModelConfig& c, std::vector<float> q, std::vector<float> kv_exact,
                       std::vector<float> kv_pred, int32_t n, int32_t sink) {
  const int32_t q_dim = c.q_dim(), kv_dim = c.kv_dim(), hd = c.head_dim;
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  for (int64_t r = 0; r < std::min(n, sink); ++r) {
    std::copy_n(&kv_exact[r * 2 * kv_dim], 2 * kv_dim, &kv_pred[r * 2 * kv_dim]);
  }
  HostRope(q.data(), q_dim, n, c.num_heads, hd, positions, c.rope_inv_freq);
  HostRope(kv_exact.data(), 2 * kv_dim, n, c.num_kv_heads, hd, positions, c.rope_inv_freq);
  HostRope(kv_pred.data(), 2 * kv_dim, n, c.num_kv_heads, hd, positions, c.rope_inv_freq);
  const int32_t q0 = n / 2, nq = n - q0;
  const int32_t group = c.num_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> scores(static_cast<size_t>(nq) * n), out_exact(static_cast<size_t>(nq) * hd),
      out_pred(static_cast<size_t>(nq) * hd);
  // One head's outputs [nq, hd] over keys/values in kv (K at column kh·hd, V at kv_dim + kh·hd).
  auto attend = [&](int32_t h, const std::vector<float>& kv, std::vector<float>& out) {
    const int32_t kh = h / group;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, n, hd, scale,
                &q[static_cast<size_t>(q0) * q_dim + h * hd], q_dim, &kv[kh * hd], 2 * kv_dim, 0.0f,
                scores.data(), n);
    for (int32_t i = 0; i < nq; ++i) {
      float* row = &scores[static_cast<size_t>(i) * n];
      const int32_t len = q0 + i + 1;  // causal context
      const float mx = *std::max_element(row, row + len);
      double sum = 0;
      for (int32_t j = 0; j < len; ++j) sum += row[j] = std::exp(row[j] - mx);
      for (int32_t j = 0; j < len; ++j) row[j] = static_cast<float>(row[j] / sum);
      std::fill(row + len, row + n, 0.0f);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, n, 1.0f, scores.data(), n,
                &kv[kv_dim + kh * hd], 2 * kv_dim, 0.0f, out.data(), hd);
  };
  double total = 0;
  for (int32_t h = 0; h < c.num_heads; ++h) {
    attend(h, kv_exact, out_exact);
    attend(h, kv_pred, out_pred);
    for (int32_t i = 0; i < nq; ++i) {
      total += Cosine(&out_exact[static_cast<size_t>(i) * hd],
                      &out_pred[static_cast<size_t>(i) * hd], hd);
    }
  }
  return total / (static_cast<double>(nq) * c.num_heads);
}

// ŷ = W x + b for rows x [rows, d] → [rows, out_dim].
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

struct SplitResult {
  int32_t split = 0;
  int64_t train_rows = 0;
  int64_t holdout_rows = 0;
  std::vector<RidgeFit> fits;
  std::vector<Quality> quality;
  std::vector<std::vector<float>> key_scale;  // per target: [num_kv_heads] or empty
  std::vector<float> leverage_inverse;
  std::vector<float> leverage_mean;
  float leverage_lambda = 0;
};

// One calibration, in its phases: flags, model and splits, text windows, the exact pass that
// accumulates the statistics, the solve, the map files.
class Calibrator {
 public:
  absl::Status Run() {
    RS_RETURN_IF_ERROR(ParseFlags());
    RS_RETURN_IF_ERROR(LoadModelAndSplits());
    RS_RETURN_IF_ERROR(ReadWindows());
    PlanStatistics();
    RS_RETURN_IF_ERROR(Pass());
    RS_RETURN_IF_ERROR(Solve());
    return WriteMaps();
  }

  static Json MapSummary(const MapSet& maps) {
    Json j;
    j["model"] = maps.model.model_name;
    j["fingerprint"] = absl::StrFormat("%016x", maps.model.hash);
    j["num_layers"] = maps.model.num_layers;
    j["hidden"] = maps.model.hidden;
    j["map_target"] = std::string(MapTargetName(maps.kind));
    j["splits"] = Json::array();
    for (const SplitMaps& s : maps.splits) {
      Json js;
      js["split_layer"] = s.split_layer;
      js["leverage_lambda"] = s.leverage_lambda;
      js["layers"] = Json::array();
      for (const TargetMap& t : s.targets) {
        Json key_scale = Json::array();
        for (float g : t.key_scale) key_scale.push_back(g);
        js["layers"].push_back(Json{{"layer", t.layer},
                                    {"lambda", t.lambda},
                                    {"r2", Num(t.diagnostics.r2)},
                                    {"k_cos", Num(t.diagnostics.k_cos)},
                                    {"v_cos", Num(t.diagnostics.v_cos)},
                                    {"key_norm_ratio", Num(t.diagnostics.key_norm_ratio)},
                                    {"attn_cos", Num(t.diagnostics.attn_cos)},
                                    {"key_scale", std::move(key_scale)}});
      }
      j["splits"].push_back(std::move(js));
    }
    return j;
  }

  static void PrintTable(const MapSet& maps) {
    for (const SplitMaps& s : maps.splits) {
      std::fprintf(stderr,
                   "split %d (%s):\n  layer        R2     K cos     V cos  |K^|/|K|  attn cos"
                   "     lambda  key scale\n",
                   s.split_layer, std::string(MapTargetName(maps.kind)).c_str());
      for (const TargetMap& t : s.targets) {
        const MapDiagnostics& d = t.diagnostics;
        std::string scales;
        for (float g : t.key_scale) absl::StrAppendFormat(&scales, " %.3f", g);
        std::fprintf(stderr, "  %5d  %8.4f  %8.4f  %8.4f  %8.4f  %8.4f  %9.3g %s\n", t.layer, d.r2,
                     d.k_cos, d.v_cos, d.key_norm_ratio, d.attn_cos, t.lambda, scales.c_str());
      }
    }
  }

 private:
  // --model, --out, --map_target, --key_scale, --lambda, --window, --chunk, --sink_tokens.
  absl::Status ParseFlags() {
    if (absl::GetFlag(FLAGS_model).empty()) {
      return absl::InvalidArgumentError("--model is required");
    }
    out_ = absl::GetFlag(FLAGS_out);
    if (out_.empty()) return absl::InvalidArgumentError("--out is required");
    // Every (target, key scale) combination asked for is fitted from the same pass.
    for (absl::string_view part :
         absl::StrSplit(absl::GetFlag(FLAGS_map_target), ',', absl::SkipWhitespace())) {
      RS_ASSIGN_OR_RETURN(const MapTarget kind,
                          ParseMapTarget(std::string_view(part.data(), part.size())));
      if (std::find(kinds_.begin(), kinds_.end(), kind) != kinds_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("--map_target: ", part, " given twice"));
      }
      kinds_.push_back(kind);
    }
    for (absl::string_view part :
         absl::StrSplit(absl::GetFlag(FLAGS_key_scale), ',', absl::SkipWhitespace())) {
      if (part != "on" && part != "off") {
        return absl::InvalidArgumentError(
            absl::StrCat("--key_scale: want 'on' or 'off', got '", part, "'"));
      }
      if (std::find(key_scales_.begin(), key_scales_.end(), part == "on") != key_scales_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("--key_scale: ", part, " given twice"));
      }
      key_scales_.push_back(part == "on");
    }
    if (kinds_.empty() || key_scales_.empty()) {
      return absl::InvalidArgumentError("--map_target and --key_scale need a value");
    }
    if (kinds_.size() > 1 && out_.find("{target}") == std::string::npos) {
      return absl::InvalidArgumentError("--out: several --map_target values need {target} in it");
    }
    if (key_scales_.size() > 1 && out_.find("{key_scale}") == std::string::npos) {
      return absl::InvalidArgumentError("--out: several --key_scale values need {key_scale} in it");
    }
    const std::string lambda_flag = absl::GetFlag(FLAGS_lambda);
    if (lambda_flag != "auto" && (!absl::SimpleAtod(lambda_flag, &fixed_lambda_) ||
                                  !(fixed_lambda_ >= 0) || !std::isfinite(fixed_lambda_))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lambda: want 'auto' or a number >= 0, got '", lambda_flag, "'"));
    }
    chunk_ = absl::GetFlag(FLAGS_chunk);
    sink_ = absl::GetFlag(FLAGS_sink_tokens);
    return absl::OkStatus();
  }

  // The model on the CPU backend and --split_layers checked against it.
  absl::Status LoadModelAndSplits() {
    const std::string model_path = absl::GetFlag(FLAGS_model);
    RS_ASSIGN_OR_RETURN(const cpu::Activations activations,
                        cpu::ParseActivations(absl::GetFlag(FLAGS_cpu_activations)));
    RS_ASSIGN_OR_RETURN(backend_,
                        CreateCpuBackendFromEnvironment(absl::GetFlag(FLAGS_threads), activations));
    RS_ASSIGN_OR_RETURN(id_, IdentifyModel(model_path));
    RS_ASSIGN_OR_RETURN(model_, LoadModel(model_path, *backend_));
    RS_ASSIGN_OR_RETURN(const DType kv_dtype,
                        ResolveKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype), *backend_));
    model_->llama->SetKvCacheDType(kv_dtype);
    const int32_t num_layers = model_->config.num_layers;
    for (absl::string_view part :
         absl::StrSplit(absl::GetFlag(FLAGS_split_layers), ',', absl::SkipWhitespace())) {
      int32_t s;
      if (!absl::SimpleAtoi(part, &s) || s < 0 || s > num_layers - 3) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--split_layers: '", part, "' is not a layer in [0, ", num_layers - 3, "]"));
      }
      if (std::find(splits_.begin(), splits_.end(), s) != splits_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("--split_layers: ", s, " given twice"));
      }
      splits_.push_back(s);
    }
    if (splits_.empty()) return absl::InvalidArgumentError("--split_layers is required");
    std::sort(splits_.begin(), splits_.end());
    return absl::OkStatus();
  }

  // Tokens: each file tokenised on its own (BOS where the model wants one), cut in windows.
  absl::Status ReadWindows() {
    window_ = std::min(absl::GetFlag(FLAGS_window), model_->config.context_length);
    if (window_ < 2 || chunk_ < 1 || sink_ < 0 || sink_ >= window_) {
      return absl::InvalidArgumentError(
          "need --window >= 2, --chunk >= 1, 0 <= --sink_tokens < --window");
    }
    const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
    for (absl::string_view file :
         absl::StrSplit(absl::GetFlag(FLAGS_text), ',', absl::SkipWhitespace())) {
      RS_ASSIGN_OR_RETURN(std::string text, ReadFile(std::string(file)));
      std::vector<int32_t> tokens =
          model_->tokenizer->Encode(text, /*add_bos=*/true, /*parse_special=*/false);
      for (size_t b = 0; b < tokens.size(); b += window_) {
        if (max_tokens > 0 && total_ >= max_tokens) break;
        size_t count = std::min<size_t>(window_, tokens.size() - b);
        if (max_tokens > 0) count = std::min<size_t>(count, max_tokens - total_);
        if (static_cast<int32_t>(count) <= sink_) break;  // nothing left to learn from
        windows_.emplace_back(tokens.begin() + b, tokens.begin() + b + count);
        total_ += count;
      }
    }
    if (total_ == 0) return absl::InvalidArgumentError("--text: no calibration tokens");
    // The last window measures the attention-output cosine and stays out of the statistics.
    attn_window_ = absl::GetFlag(FLAGS_attn_window) && windows_.size() >= 2;
    return absl::OkStatus();
  }

  // Capture depths s + 1 (leaving layer s) and every l in [s + 2, L) for each split, the
  // layers' target projectors and one accumulator per kind and split.
  void PlanStatistics() {
    const ModelConfig& c = model_->config;
    const int32_t num_layers = c.num_layers;
    depth_slot_.assign(num_layers + 1, -1);
    auto want_depth = [&](int32_t d) {
      if (depth_slot_[d] >= 0) return;
      depth_slot_[d] = static_cast<int32_t>(capture_.depths.size());
      capture_.depths.push_back(d);
    };
    const HoldoutOptions holdout{absl::GetFlag(FLAGS_holdout_every),
                                 absl::GetFlag(FLAGS_max_holdout_rows)};
    projectors_.resize(num_layers);
    accumulators_.resize(kinds_.size());
    for (int32_t s : splits_) {
      want_depth(s + 1);
      for (int32_t l = s + 2; l < num_layers; ++l) {
        want_depth(l);
        if (projectors_[l] == nullptr) {
          projectors_[l] = std::make_unique<KvProjector>(*model_->llama, l);
        }
      }
      for (size_t k = 0; k < kinds_.size(); ++k) {
        std::vector<int64_t> dims;
        for (int32_t l = s + 2; l < num_layers; ++l) {
          dims.push_back(projectors_[l]->TargetDim(kinds_[k]));
        }
        accumulators_[k].emplace_back(c.hidden, std::move(dims), holdout);
      }
    }
  }

  // The exact pass over every window. Targets of each kind are computed from the captured
  // residuals per layer and streamed into the accumulators; the attention window's residuals
  // are kept instead.
  absl::Status Pass() {
    const ModelConfig& c = model_->config;
    RS_ASSIGN_OR_RETURN(
        PagedKvCache cache,
        PagedKvCache::Create(*backend_,
                             KvCacheShape{c.num_layers, c.num_kv_heads, c.head_dim, 16,
                                          (window_ + 15) / 16, model_->llama->kv_cache_dtype()}));
    BlockTable table;
    std::vector<float> logits;
    targets_.resize(c.num_layers);
    // During the pass OpenBLAS runs inside our OpenMP threads, one thread each: its own
    // pthread pool would spin against the backend's OpenMP workers on the same cores (a third
    // of the pass went to spinning). The solve gets its threads back.
    threads_ =
        absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : omp_get_num_procs();
    openblas_set_num_threads(1);
    attn_states_.resize(capture_.depths.size());
    int64_t done = 0;
    const auto start = Clock::now();
    auto last_report = start;
    for (size_t wi = 0; wi < windows_.size(); ++wi) {
      const std::vector<int32_t>& tokens = windows_[wi];
      const bool for_attn = attn_window_ && wi + 1 == windows_.size();
      RS_RETURN_IF_ERROR(table.Reserve(cache.pool(), static_cast<int32_t>(tokens.size()), 16));
      for (size_t begin = 0; begin < tokens.size(); begin += chunk_) {
        const int32_t count = static_cast<int32_t>(std::min<size_t>(chunk_, tokens.size() - begin));
        ForwardBatch batch;
        batch.AddSequence(table, 16, std::span(tokens).subspan(begin, count),
                          static_cast<int32_t>(begin), /*want_logits=*/false);
        RS_RETURN_IF_ERROR(model_->llama->Forward(batch, cache, logits, &capture_));
        done += count;
        if (for_attn) {
          for (size_t i = 0; i < capture_.states.size(); ++i) {
            attn_states_[i].insert(attn_states_[i].end(), capture_.states[i].begin(),
                                   capture_.states[i].end());
          }
          continue;
        }
        // Rows at positions < sink stay out of the statistics.
        const int32_t skip = std::clamp<int32_t>(sink_ - static_cast<int32_t>(begin), 0, count);
        if (count - skip > 0) RS_RETURN_IF_ERROR(Accumulate(skip, count - skip));
      }
      table.Release(cache.pool());
      if (SecondsSince(last_report) > 5 || done == total_) {
        last_report = Clock::now();
        const double secs = SecondsSince(start);
        std::fprintf(stderr, "calibrate: %lld/%lld tokens, %.1f tokens/s, %.0f s\n",
                     static_cast<long long>(done), static_cast<long long>(total_), done / secs,
                     secs);
      }
    }
    pass_seconds_ = SecondsSince(start);
    openblas_set_num_threads(threads_);
    return absl::OkStatus();
  }

  // The captured rows [skip, skip + rows) of the last forward into every accumulator.
  absl::Status Accumulate(int32_t skip, int32_t rows) {
    const ModelConfig& c = model_->config;
    const int32_t num_layers = c.num_layers;
    const size_t offset = static_cast<size_t>(skip) * c.hidden;
    // Layers' targets, then splits' statistics, each independent of the others: spread over
    // this process's threads, each running single-threaded BLAS.
    for (size_t k = 0; k < kinds_.size(); ++k) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
      for (int32_t l = 0; l < num_layers; ++l) {
        if (projectors_[l] == nullptr) continue;
        projectors_[l]->Target(kinds_[k], capture_.states[depth_slot_[l]].data() + offset, rows,
                               targets_[l]);
      }
      std::vector<absl::Status> added(splits_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
      for (size_t i = 0; i < splits_.size(); ++i) {
        const int32_t s = splits_[i];
        std::vector<const float*> ys;
        for (int32_t l = s + 2; l < num_layers; ++l) ys.push_back(targets_[l].data());
        added[i] = accumulators_[k][i].AddRows(capture_.states[depth_slot_[s + 1]].data() + offset,
                                               rows, ys);
      }
      for (const absl::Status& status : added) RS_RETURN_IF_ERROR(status);
    }
    return absl::OkStatus();
  }

  // Solve and score: per split and target kind one Gram eigendecomposition, then every key
  // scale choice.
  absl::Status Solve() {
    const auto solve_start = Clock::now();
    results_.assign(kinds_.size(), std::vector<std::vector<SplitResult>>(key_scales_.size()));
    for (size_t i = 0; i < splits_.size(); ++i) {
      for (size_t k = 0; k < kinds_.size(); ++k) {
        const CalibrationStats stats = accumulators_[k][i].Finish();
        RS_ASSIGN_OR_RETURN(std::unique_ptr<RidgeSolver> solver, RidgeSolver::Create(stats));
        for (size_t j = 0; j < key_scales_.size(); ++j) {
          RS_ASSIGN_OR_RETURN(SplitResult r,
                              SolveSplit(splits_[i], kinds_[k], key_scales_[j], stats, *solver));
          results_[k][j].push_back(std::move(r));
        }
      }
    }
    solve_seconds_ = SecondsSince(solve_start);
    return absl::OkStatus();
  }

  // One split's maps for one kind and key-scale choice, with their held-out and
  // attention-window quality.
  absl::StatusOr<SplitResult> SolveSplit(int32_t split, MapTarget kind, bool key_scale,
                                         const CalibrationStats& stats, RidgeSolver& solver) {
    const ModelConfig& c = model_->config;
    const int32_t kv_heads = c.num_kv_heads, head_dim = c.head_dim;
    const int32_t attn_rows = attn_window_ ? static_cast<int32_t>(windows_.back().size()) : 0;
    const float* attn_x = attn_window_ ? attn_states_[depth_slot_[split + 1]].data() : nullptr;
    SplitResult r;
    r.split = split;
    r.train_rows = stats.rows;
    r.holdout_rows = stats.holdout_rows;
    for (int t = 0; t < static_cast<int>(stats.targets.size()); ++t) {
      const int32_t layer = split + 2 + t;
      const KvProjector& projector = *projectors_[layer];
      const int64_t held = stats.holdout_rows;
      const std::vector<float>& y_held = stats.targets[t].holdout_y;
      std::vector<float> kv_actual, kv_pred;
      if (held > 0) projector.ToKv(kind, y_held.data(), held, kv_actual);
      RidgeFit fit;
      if (fixed_lambda_ >= 0) {
        RS_ASSIGN_OR_RETURN(fit, FitRidgeCholesky(stats, t, fixed_lambda_));
      } else {
        // Scored on K/V as served: with the key scale fitted for that λ when it is on.
        RidgeSelectOptions options;
        options.error = [&](const HeldOutPrediction& p) {
          projector.ToKv(kind, p.predicted.data(), p.rows, kv_pred);
          if (key_scale) {
            ApplyKeyScale(KeyScale(kv_pred, kv_actual, p.rows, kv_heads, head_dim), p.rows,
                          head_dim, kv_pred);
          }
          return CompareKv(kv_pred, kv_actual, p.rows, kv_heads, head_dim).kv_error;
        };
        RS_ASSIGN_OR_RETURN(fit, solver.FitSelect(t, options));
      }
      Quality q;
      std::vector<float> scale;
      if (held > 0) {
        const std::vector<float> pred = Predict(fit, stats.holdout_x.data(), held, c.hidden);
        projector.ToKv(kind, pred.data(), held, kv_pred);
        // The scale is fitted on the held-out rows it is then scored on: kv_heads numbers per
        // layer against ~1600 rows, so the optimism is small. key_norm_ratio is then ~1 by
        // construction; the *_unscaled values are before the scale.
        const Quality unscaled = CompareKv(kv_pred, kv_actual, held, kv_heads, head_dim);
        q = unscaled;
        if (key_scale) {
          scale = KeyScale(kv_pred, kv_actual, held, kv_heads, head_dim);
          ApplyKeyScale(scale, held, head_dim, kv_pred);
          q = CompareKv(kv_pred, kv_actual, held, kv_heads, head_dim);
        }
        q.key_norm_ratio_unscaled = unscaled.key_norm_ratio;
        q.head_key_norm_ratio = unscaled.head_key_norm_ratio;
        q.r2 = RSquared(y_held, pred, held, fit.out_dim);
      }
      if (attn_window_) {
        const std::vector<float>& h_l = attn_states_[depth_slot_[layer]];
        std::vector<float> queries, y_exact, kv_exact, kv_attn_pred;
        projector.Queries(h_l.data(), attn_rows, queries);
        projector.Target(kind, h_l.data(), attn_rows, y_exact);
        projector.ToKv(kind, y_exact.data(), attn_rows, kv_exact);
        const std::vector<float> pred = Predict(fit, attn_x, attn_rows, c.hidden);
        projector.ToKv(kind, pred.data(), attn_rows, kv_attn_pred);
        if (!scale.empty()) ApplyKeyScale(scale, attn_rows, head_dim, kv_attn_pred);
        q.attn_cos = AttentionCosine(c, std::move(queries), std::move(kv_exact),
                                     std::move(kv_attn_pred), attn_rows, sink_);
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

  // The maps of one (target, key scale) combination as a MapSet.
  MapSet ToMapSet(const std::vector<SplitResult>& results, MapTarget kind) const {
    const ModelConfig& c = model_->config;
    MapSet maps;
    maps.model = id_.fingerprint;
    maps.num_kv_heads = c.num_kv_heads;
    maps.head_dim = c.head_dim;
    maps.kind = kind;
    for (const SplitResult& r : results) {
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

  // One map file per (target, key scale), its table on stderr; the summary JSON on stdout.
  absl::Status WriteMaps() {
    const int32_t attn_rows = attn_window_ ? static_cast<int32_t>(windows_.back().size()) : 0;
    Json reports = Json::array();
    for (size_t k = 0; k < kinds_.size(); ++k) {
      for (size_t j = 0; j < key_scales_.size(); ++j) {
        std::string path =
            absl::StrReplaceAll(out_, {{"{target}", std::string(MapTargetName(kinds_[k]))},
                                       {"{key_scale}", key_scales_[j] ? "on" : "off"}});
        const MapSet maps = ToMapSet(results_[k][j], kinds_[k]);
        RS_RETURN_IF_ERROR(WriteMapFile(path, maps));

        Json summary = MapSummary(maps);
        summary["out"] = path;
        summary["key_scale"] = key_scales_[j] ? "on" : "off";
        summary["tokens"] = total_;
        summary["windows"] = windows_.size();
        summary["window"] = window_;
        summary["sink_tokens"] = sink_;
        summary["attn_window_tokens"] = attn_rows;
        summary["lambda_mode"] = fixed_lambda_ >= 0 ? "fixed" : "auto";
        summary["pass_seconds"] = pass_seconds_;
        summary["tokens_per_second"] = total_ / pass_seconds_;
        summary["solve_seconds"] = solve_seconds_;
        for (size_t i = 0; i < results_[k][j].size(); ++i) {
          const SplitResult& r = results_[k][j][i];
          Json& js = summary["splits"][i];
          js["train_rows"] = r.train_rows;
          js["holdout_rows"] = r.holdout_rows;
          for (size_t t = 0; t < r.fits.size(); ++t) {
            const Quality& q = r.quality[t];
            Json& jl = js["layers"][t];
            jl["alpha"] = Num(r.fits[t].alpha);
            jl["kv_error"] = Num(q.kv_error);
            jl["key_norm_ratio_unscaled"] = Num(q.key_norm_ratio_unscaled);
            jl["head_key_norm_ratio_unscaled"] = Json::array();
            for (double h : q.head_key_norm_ratio) {
              jl["head_key_norm_ratio_unscaled"].push_back(Num(h));
            }
          }
        }
        std::fprintf(stderr, "%s\n", path.c_str());
        PrintTable(maps);
        reports.push_back(std::move(summary));
      }
    }
    // One combination: its summary; several: {"maps": [summary, ...]}.
    const Json result = reports.size() == 1 ? reports[0] : Json{{"maps", reports}};
    std::printf("%s\n", result.dump(2).c_str());
    return absl::OkStatus();
  }

  // Flags.
  std::string out_;
  std::vector<MapTarget> kinds_;
  std::vector<bool> key_scales_;
  double fixed_lambda_ = -1;  // < 0: auto
  int32_t window_ = 0, chunk_ = 0, sink_ = 0;
  // The model and its splits.
  std::unique_ptr<Backend> backend_;
  ModelIdentity id_;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> splits_;  // ascending
  // The text.
  std::vector<std::vector<int32_t>> windows_;
  int64_t total_ = 0;
  bool attn_window_ = false;  // the last window measures the attention-output cosine
  // The pass: what is captured, the targets and the statistics.
  ForwardCapture capture_;
  std::vector<int32_t> depth_slot_;                       // [depth] → capture slot, or -1
  std::vector<std::unique_ptr<KvProjector>> projectors_;  // [layer] or null
  std::vector<std::vector<CalibrationAccumulator>> accumulators_;  // [kind][split]
  std::vector<std::vector<float>> targets_;                        // [layer] scratch
  std::vector<std::vector<float>> attn_states_;  // [capture slot] the attention window's rows
  int threads_ = 1;
  double pass_seconds_ = 0;
  // The solve: results_[k][j][i] for kind k, key scale j, split i.
  std::vector<std::vector<std::vector<SplitResult>>> results_;
  double solve_seconds_ = 0;
};

absl::Status Check(const std::string& map_path) {
  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) return absl::InvalidArgumentError("--check needs --model");
  RS_ASSIGN_OR_RETURN(ModelIdentity id, IdentifyModel(model_path));
  MapFileExpectations expected;
  expected.model = id.fingerprint;
  expected.num_kv_heads = id.config.num_kv_heads;
  expected.head_dim = id.config.head_dim;
  RS_ASSIGN_OR_RETURN(std::unique_ptr<MapFile> file, MapFile::Open(map_path, expected));
  Json summary = Calibrator::MapSummary(file->maps());
  summary["file"] = map_path;
  Calibrator::PrintTable(file->maps());
  std::printf("%s\n", summary.dump(2).c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace ridgeserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ridgeserve-calibrate --model M --text FILE[,FILE...] --split_layers 14,18,22 --out F.rfmap\n"
      "  [--max_tokens N] [--lambda auto|X] [--window 2048] [--map_target pre_norm|post_norm|kv]\n"
      "  [--key_scale off|on]\n"
      "ridgeserve-calibrate --check F.rfmap --model M");
  absl::ParseCommandLine(argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("calibrate"));
  const std::string check = absl::GetFlag(FLAGS_check);
  absl::Status status;
  if (!check.empty()) {
    status = ridgeserve::Check(check);
  } else {
    ridgeserve::Calibrator calibrator;
    status = calibrator.Run();
  }
  if (!status.ok()) {
    std::fprintf(stderr, "ridgeserve-calibrate: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
