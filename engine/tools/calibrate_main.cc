// ridgeserve-calibrate: fits RidgeFill maps (DESIGN.md, "RidgeFill — our definition") from
// calibration text on the real model, and checks map files against a model.
//
//   ridgeserve-calibrate --model M --text FILE[,FILE...] --split_layers 14,18,22 --out F.rfmap
//       [--max_tokens N] [--lambda auto|X] [--window 2048] [--map_target pre_norm]
//   ridgeserve-calibrate --check F.rfmap --model M
//
// Calibration: one exact forward pass over the text in windows of --window tokens (each window
// a fresh sequence, prefilled in chunks of --chunk rows). For every split s the forward pass
// captures X = h_s (the residual leaving layer s) and Y_l = the residual entering layer l for
// every l in [s + 2, L), and streams them into a CalibrationAccumulator (double precision,
// every 10th row held out). The first --sink_tokens rows of each window are left out: they
// are attention sinks with outlier residuals and always run exactly when serving.
// λ: --lambda X solves at that absolute λ (Cholesky); auto picks per target from a grid
// λ = α · trace(G)/d by the held-out error of the resulting K and V (layer l's input RMSNorm
// and its K/V projection rows, + bias, + Qwen3 k_norm, before RoPE), not of ĥ_l alone.
// Output: the map file, a per-layer table on stderr, one JSON summary on stdout.
// --check: opens the map file against the model's fingerprint and prints its summary JSON;
// exit 1 with one line naming the file when it does not fit.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
ABSL_FLAG(std::string, map_target, "pre_norm", "what the maps predict (only pre_norm so far)");
ABSL_FLAG(int64_t, holdout_every, 10, "every k-th row is held out for choosing λ");
ABSL_FLAG(int64_t, max_holdout_rows, 4096, "at most this many held-out rows");
ABSL_FLAG(int32_t, threads, 0, "CPU threads (0 = all)");
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

// Per-target quality on held-out rows (DESIGN.md's report).
struct Quality {
  double r2 = std::numeric_limits<double>::quiet_NaN();
  double k_cos = std::numeric_limits<double>::quiet_NaN();
  double v_cos = std::numeric_limits<double>::quiet_NaN();
  double key_norm_ratio = std::numeric_limits<double>::quiet_NaN();
  double kv_error = std::numeric_limits<double>::quiet_NaN();  // what auto-λ minimises
};

// Layer l's map from a residual-stream row to its K (before RoPE) and V, on the host.
class KvProjector {
 public:
  KvProjector(LlamaModel& model, int32_t layer) : c_(model.config()) {
    Backend& backend = model.backend();
    const LayerWeights& w = model.weights().layers[layer];
    const int32_t kv = c_.kv_dim();
    norm_.resize(c_.hidden);
    backend.CopyToHost(norm_.data(), w.attn_norm.as<float>(), sizeof(float) * c_.hidden);
    // wqkv rows: Q [q_dim], then K [kv_dim], then V [kv_dim]; K and V rows are contiguous.
    weight_.resize(static_cast<size_t>(2) * kv * c_.hidden);
    backend.CopyToHost(weight_.data(),
                       w.wqkv.as<float>() + static_cast<size_t>(c_.q_dim()) * c_.hidden,
                       sizeof(float) * weight_.size());
    if (w.bqkv.bytes() > 0) {
      bias_.resize(2 * kv);
      backend.CopyToHost(bias_.data(), w.bqkv.as<float>() + c_.q_dim(), sizeof(float) * 2 * kv);
    }
    if (c_.qk_norm) {
      k_norm_.resize(c_.head_dim);
      backend.CopyToHost(k_norm_.data(), w.k_norm.as<float>(), sizeof(float) * c_.head_dim);
    }
  }

  // h [rows, hidden] → kv [rows, 2 kv_dim]: K then V per row.
  void Project(const float* h, int64_t rows, std::vector<float>& kv) const {
    const int32_t d = c_.hidden, kv_dim = c_.kv_dim();
    std::vector<float> xn(static_cast<size_t>(rows) * d);
    for (int64_t r = 0; r < rows; ++r) RmsNormRow(h + r * d, norm_.data(), d, &xn[r * d]);
    kv.assign(static_cast<size_t>(rows) * 2 * kv_dim, 0.0f);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, 2 * kv_dim, d, 1.0f, xn.data(), d,
                weight_.data(), d, 0.0f, kv.data(), 2 * kv_dim);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = &kv[r * 2 * kv_dim];
      if (!bias_.empty()) {
        for (int32_t j = 0; j < 2 * kv_dim; ++j) row[j] += bias_[j];
      }
      if (!k_norm_.empty()) {
        for (int32_t hd = 0; hd < c_.num_kv_heads; ++hd) {
          float* head = row + hd * c_.head_dim;
          RmsNormRow(head, k_norm_.data(), c_.head_dim, head);
        }
      }
    }
  }

  int32_t kv_dim() const { return c_.kv_dim(); }

 private:
  void RmsNormRow(const float* x, const float* w, int32_t dim, float* out) const {
    double sum = 0;
    for (int32_t i = 0; i < dim; ++i) sum += static_cast<double>(x[i]) * x[i];
    const float r = static_cast<float>(1.0 / std::sqrt(sum / dim + c_.rms_eps));
    for (int32_t i = 0; i < dim; ++i) out[i] = (x[i] * r) * w[i];
  }

  const ModelConfig& c_;
  std::vector<float> norm_;    // [hidden]
  std::vector<float> weight_;  // [2 kv_dim, hidden]
  std::vector<float> bias_;    // [2 kv_dim] or empty
  std::vector<float> k_norm_;  // [head_dim] or empty
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

// Compares predicted and actual K/V rows ([rows, 2 kv_dim]). kv_error is the relative squared
// error of K plus that of V: Σ‖K̂ − K‖²/Σ‖K‖² + Σ‖V̂ − V‖²/Σ‖V‖².
Quality CompareKv(const std::vector<float>& got, const std::vector<float>& want, int64_t rows,
                  int32_t kv_dim) {
  Quality q;
  double k_cos = 0, v_cos = 0, norm_ratio = 0;
  double k_err = 0, k_ref = 0, v_err = 0, v_ref = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = &got[r * 2 * kv_dim];
    const float* w = &want[r * 2 * kv_dim];
    k_cos += Cosine(g, w, kv_dim);
    v_cos += Cosine(g + kv_dim, w + kv_dim, kv_dim);
    double gk = 0, wk = 0;
    for (int32_t j = 0; j < kv_dim; ++j) {
      gk += static_cast<double>(g[j]) * g[j];
      wk += static_cast<double>(w[j]) * w[j];
      k_err += (static_cast<double>(g[j]) - w[j]) * (static_cast<double>(g[j]) - w[j]);
      const double gv = g[kv_dim + j], wv = w[kv_dim + j];
      v_err += (gv - wv) * (gv - wv);
      v_ref += wv * wv;
    }
    k_ref += wk;
    norm_ratio += wk > 0 ? std::sqrt(gk / wk) : 0.0;
  }
  q.k_cos = k_cos / rows;
  q.v_cos = v_cos / rows;
  q.key_norm_ratio = norm_ratio / rows;
  q.kv_error = (k_ref > 0 ? k_err / k_ref : 0) + (v_ref > 0 ? v_err / v_ref : 0);
  return q;
}

struct SplitResult {
  int32_t split = 0;
  CalibrationStats stats;
  std::vector<RidgeFit> fits;
  std::vector<Quality> quality;
  std::vector<float> leverage_inverse;
  std::vector<float> leverage_mean;
  float leverage_lambda = 0;
};

class Calibrator {
 public:
  absl::Status Run() {
    const std::string model_path = absl::GetFlag(FLAGS_model);
    if (model_path.empty()) return absl::InvalidArgumentError("--model is required");
    const std::string out = absl::GetFlag(FLAGS_out);
    if (out.empty()) return absl::InvalidArgumentError("--out is required");
    RS_ASSIGN_OR_RETURN(MapTarget kind, ParseMapTarget(absl::GetFlag(FLAGS_map_target)));
    if (kind != MapTarget::kPreNorm) {
      return absl::UnimplementedError(absl::StrCat("--map_target ", absl::GetFlag(FLAGS_map_target),
                                                   ": only pre_norm is implemented so far"));
    }
    const std::string lambda_flag = absl::GetFlag(FLAGS_lambda);
    double fixed_lambda = -1;
    if (lambda_flag != "auto" && (!absl::SimpleAtod(lambda_flag, &fixed_lambda) ||
                                  !(fixed_lambda >= 0) || !std::isfinite(fixed_lambda))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lambda: want 'auto' or a number >= 0, got '", lambda_flag, "'"));
    }

    backend_ = CreateCpuBackend(absl::GetFlag(FLAGS_threads));
    RS_ASSIGN_OR_RETURN(ModelIdentity id, IdentifyModel(model_path));
    RS_ASSIGN_OR_RETURN(model_, LoadModel(model_path, *backend_));
    const ModelConfig& c = model_->config;
    const int32_t num_layers = c.num_layers;

    std::vector<int32_t> splits;
    for (absl::string_view part :
         absl::StrSplit(absl::GetFlag(FLAGS_split_layers), ',', absl::SkipWhitespace())) {
      int32_t s;
      if (!absl::SimpleAtoi(part, &s) || s < 0 || s > num_layers - 3) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--split_layers: '", part, "' is not a layer in [0, ", num_layers - 3, "]"));
      }
      if (std::find(splits.begin(), splits.end(), s) != splits.end()) {
        return absl::InvalidArgumentError(absl::StrCat("--split_layers: ", s, " given twice"));
      }
      splits.push_back(s);
    }
    if (splits.empty()) return absl::InvalidArgumentError("--split_layers is required");
    std::sort(splits.begin(), splits.end());

    // Tokens: each file tokenised on its own (BOS where the model wants one), cut in windows.
    const int32_t window = std::min(absl::GetFlag(FLAGS_window), c.context_length);
    const int32_t chunk = absl::GetFlag(FLAGS_chunk);
    const int32_t sink = absl::GetFlag(FLAGS_sink_tokens);
    if (window < 2 || chunk < 1 || sink < 0 || sink >= window) {
      return absl::InvalidArgumentError(
          "need --window >= 2, --chunk >= 1, 0 <= --sink_tokens < --window");
    }
    std::vector<std::vector<int32_t>> windows;
    int64_t total = 0;
    const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
    for (absl::string_view file :
         absl::StrSplit(absl::GetFlag(FLAGS_text), ',', absl::SkipWhitespace())) {
      RS_ASSIGN_OR_RETURN(std::string text, ReadFile(std::string(file)));
      std::vector<int32_t> tokens =
          model_->tokenizer->Encode(text, /*add_bos=*/true, /*parse_special=*/false);
      for (size_t b = 0; b < tokens.size(); b += window) {
        if (max_tokens > 0 && total >= max_tokens) break;
        size_t count = std::min<size_t>(window, tokens.size() - b);
        if (max_tokens > 0) count = std::min<size_t>(count, max_tokens - total);
        if (static_cast<int32_t>(count) <= sink) break;  // nothing left to learn from
        windows.emplace_back(tokens.begin() + b, tokens.begin() + b + count);
        total += count;
      }
    }
    if (total == 0) return absl::InvalidArgumentError("--text: no calibration tokens");

    // Capture depths: s + 1 (leaving layer s) and every l in [s + 2, L) for each split.
    ForwardCapture capture;
    std::vector<int32_t> depth_slot(num_layers + 1, -1);
    auto want_depth = [&](int32_t d) {
      if (depth_slot[d] >= 0) return;
      depth_slot[d] = static_cast<int32_t>(capture.depths.size());
      capture.depths.push_back(d);
    };
    HoldoutOptions holdout{absl::GetFlag(FLAGS_holdout_every),
                           absl::GetFlag(FLAGS_max_holdout_rows)};
    std::vector<CalibrationAccumulator> accumulators;
    for (int32_t s : splits) {
      want_depth(s + 1);
      for (int32_t l = s + 2; l < num_layers; ++l) want_depth(l);
      accumulators.emplace_back(c.hidden, std::vector<int64_t>(num_layers - s - 2, c.hidden),
                                holdout);
    }

    // The exact pass.
    PagedKvCache cache(
        *backend_, KvCacheShape{num_layers, c.num_kv_heads, c.head_dim, 16, (window + 15) / 16});
    BlockTable table;
    std::vector<float> logits;
    int64_t done = 0;
    const auto start = Clock::now();
    auto last_report = start;
    for (const std::vector<int32_t>& tokens : windows) {
      RS_RETURN_IF_ERROR(table.Reserve(cache.pool(), static_cast<int32_t>(tokens.size()), 16));
      for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
        const int32_t count = static_cast<int32_t>(std::min<size_t>(chunk, tokens.size() - begin));
        ForwardBatch batch;
        batch.AddSequence(table, 16, std::span(tokens).subspan(begin, count),
                          static_cast<int32_t>(begin), /*want_logits=*/false);
        RS_RETURN_IF_ERROR(model_->llama->Forward(batch, cache, logits, &capture));
        // Rows at positions < sink stay out of the statistics.
        const int32_t skip = std::clamp<int32_t>(sink - static_cast<int32_t>(begin), 0, count);
        const int32_t rows = count - skip;
        if (rows > 0) {
          const size_t offset = static_cast<size_t>(skip) * c.hidden;
          for (size_t i = 0; i < splits.size(); ++i) {
            const int32_t s = splits[i];
            std::vector<const float*> ys;
            for (int32_t l = s + 2; l < num_layers; ++l) {
              ys.push_back(capture.states[depth_slot[l]].data() + offset);
            }
            RS_RETURN_IF_ERROR(accumulators[i].AddRows(
                capture.states[depth_slot[s + 1]].data() + offset, rows, ys));
          }
        }
        done += count;
      }
      table.Release(cache.pool());
      if (SecondsSince(last_report) > 5 || done == total) {
        last_report = Clock::now();
        const double secs = SecondsSince(start);
        std::fprintf(stderr, "calibrate: %lld/%lld tokens, %.1f tokens/s, %.0f s\n",
                     static_cast<long long>(done), static_cast<long long>(total), done / secs,
                     secs);
      }
    }
    const double pass_seconds = SecondsSince(start);

    // Solve and score each split.
    const auto solve_start = Clock::now();
    std::vector<SplitResult> results;
    for (size_t i = 0; i < splits.size(); ++i) {
      SplitResult r;
      r.split = splits[i];
      r.stats = accumulators[i].Finish();
      RS_ASSIGN_OR_RETURN(std::unique_ptr<RidgeSolver> solver, RidgeSolver::Create(r.stats));
      for (int t = 0; t < static_cast<int>(r.stats.targets.size()); ++t) {
        const int32_t layer = r.split + 2 + t;
        const KvProjector projector(*model_->llama, layer);
        const int64_t held = r.stats.holdout_rows;
        std::vector<float> kv_actual, kv_pred;
        if (held > 0) projector.Project(r.stats.targets[t].holdout_y.data(), held, kv_actual);
        RidgeFit fit;
        if (fixed_lambda >= 0) {
          RS_ASSIGN_OR_RETURN(fit, FitRidgeCholesky(r.stats, t, fixed_lambda));
        } else {
          RidgeSelectOptions options;
          options.error = [&](const HeldOutPrediction& p) {
            projector.Project(p.predicted.data(), p.rows, kv_pred);
            return CompareKv(kv_pred, kv_actual, p.rows, projector.kv_dim()).kv_error;
          };
          RS_ASSIGN_OR_RETURN(fit, solver->FitSelect(t, options));
        }
        Quality q;
        if (held > 0) {
          // ĥ = W x + b on the held-out rows, then K/V from it.
          const int32_t d = c.hidden;
          std::vector<float> pred(static_cast<size_t>(held) * d);
          for (int64_t row = 0; row < held; ++row) {
            std::copy(fit.bias.begin(), fit.bias.end(), pred.begin() + row * d);
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, held, d, d, 1.0f,
                      r.stats.holdout_x.data(), d, fit.weight.data(), d, 1.0f, pred.data(), d);
          projector.Project(pred.data(), held, kv_pred);
          q = CompareKv(kv_pred, kv_actual, held, projector.kv_dim());
          // R² of ĥ against the held-out rows' own mean, summed over dims.
          const std::vector<float>& y = r.stats.targets[t].holdout_y;
          std::vector<double> mean(d, 0.0);
          for (int64_t row = 0; row < held; ++row) {
            for (int32_t j = 0; j < d; ++j) mean[j] += y[row * d + j];
          }
          for (double& m : mean) m /= held;
          double err = 0, var = 0;
          for (int64_t row = 0; row < held; ++row) {
            for (int32_t j = 0; j < d; ++j) {
              const double e = static_cast<double>(y[row * d + j]) - pred[row * d + j];
              const double v = y[row * d + j] - mean[j];
              err += e * e;
              var += v * v;
            }
          }
          q.r2 = var > 0 ? 1.0 - err / var : std::numeric_limits<double>::quiet_NaN();
        }
        r.fits.push_back(std::move(fit));
        r.quality.push_back(q);
      }
      // Leverage test for outlier rows, at the λ chosen for the first target (s + 2).
      r.leverage_lambda = static_cast<float>(r.fits.front().lambda);
      r.leverage_inverse = solver->RegularizedInverse(r.fits.front().lambda);
      r.leverage_mean.assign(r.stats.mean.begin(), r.stats.mean.end());
      results.push_back(std::move(r));
    }
    const double solve_seconds = SecondsSince(solve_start);

    // Map file.
    MapSet maps;
    maps.model = id.fingerprint;
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
        tm.diagnostics.r2 = static_cast<float>(r.quality[t].r2);
        tm.diagnostics.k_cos = static_cast<float>(r.quality[t].k_cos);
        tm.diagnostics.v_cos = static_cast<float>(r.quality[t].v_cos);
        tm.diagnostics.key_norm_ratio = static_cast<float>(r.quality[t].key_norm_ratio);
        sm.targets.push_back(std::move(tm));
      }
      maps.splits.push_back(std::move(sm));
    }
    RS_RETURN_IF_ERROR(WriteMapFile(out, maps));

    // Report.
    Json summary = MapSummary(maps);
    summary["out"] = out;
    summary["tokens"] = total;
    summary["windows"] = windows.size();
    summary["window"] = window;
    summary["sink_tokens"] = sink;
    summary["lambda_mode"] = fixed_lambda >= 0 ? "fixed" : "auto";
    summary["pass_seconds"] = pass_seconds;
    summary["tokens_per_second"] = total / pass_seconds;
    summary["solve_seconds"] = solve_seconds;
    for (size_t i = 0; i < results.size(); ++i) {
      const SplitResult& r = results[i];
      Json& js = summary["splits"][i];
      js["train_rows"] = r.stats.rows;
      js["holdout_rows"] = r.stats.holdout_rows;
      for (size_t t = 0; t < r.fits.size(); ++t) {
        js["layers"][t]["alpha"] = Num(r.fits[t].alpha);
        js["layers"][t]["kv_error"] = Num(r.quality[t].kv_error);
      }
    }
    PrintTable(maps);
    std::printf("%s\n", summary.dump(2).c_str());
    return absl::OkStatus();
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
        js["layers"].push_back(Json{{"layer", t.layer},
                                    {"lambda", t.lambda},
                                    {"r2", Num(t.diagnostics.r2)},
                                    {"k_cos", Num(t.diagnostics.k_cos)},
                                    {"v_cos", Num(t.diagnostics.v_cos)},
                                    {"key_norm_ratio", Num(t.diagnostics.key_norm_ratio)},
                                    {"attn_cos", Num(t.diagnostics.attn_cos)}});
      }
      j["splits"].push_back(std::move(js));
    }
    return j;
  }

  static void PrintTable(const MapSet& maps) {
    for (const SplitMaps& s : maps.splits) {
      std::fprintf(stderr,
                   "split %d:\n  layer        R2     K cos     V cos  |K^|/|K|     lambda\n",
                   s.split_layer);
      for (const TargetMap& t : s.targets) {
        const MapDiagnostics& d = t.diagnostics;
        std::fprintf(stderr, "  %5d  %8.4f  %8.4f  %8.4f  %8.4f  %9.3g\n", t.layer, d.r2, d.k_cos,
                     d.v_cos, d.key_norm_ratio, t.lambda);
      }
    }
  }

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
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
      "  [--max_tokens N] [--lambda auto|X] [--window 2048] [--map_target pre_norm]\n"
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
