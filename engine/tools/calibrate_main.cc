// ridgeserve-calibrate: fits RidgeFill maps (DESIGN.md, "RidgeFill — our definition") from
// calibration text on the real model, and checks map files against a model.
//
//   ridgeserve-calibrate --model M --text FILE[,FILE...] --split_layers 14,18,22 --out F.rfmap
//       [--max_tokens N] [--lambda auto|X] [--window 2048] [--map_target pre_norm|post_norm|kv]
//       [--key_scale off|on] [--stats_out F.rfstats]
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
// Output: the map file(s), a per-layer table on stderr, one JSON summary on stdout; with
// --stats_out the statistics too (stats_file.h), for the server's online calibration.
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
#include "engine/ridgefill/map_fit.h"
#include "engine/ridgefill/ridge_solver.h"
#include "engine/ridgefill/stats_file.h"
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
ABSL_FLAG(std::string, stats_out, "",
          "also write the calibration statistics (without held-out rows) to this file, the base "
          "that the server's --ridgefill_online_calibration mixes served rows into; {target} is "
          "replaced as in --out");
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

// accumulates the statistics, the solve, the map files.
class Calibrator {
 public:
  absl::Status Run() {
    RS_RETURN_IF_ERROR(ParseFlags());
    RS_RETURN_IF_ERROR(LoadModelAndSplits());
    RS_RETURN_IF_ERROR(ReadWindows());
    PlanStatistics();
    RS_RETURN_IF_ERROR(Pass());
    RS_RETURN_IF_ERROR(WriteStats());
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

  // What the pass captures and accumulates: every kind for every split.
  void PlanStatistics() {
    statistics_ = std::make_unique<SplitStatistics>(
        *model_->llama, splits_, kinds_,
        HoldoutOptions{absl::GetFlag(FLAGS_holdout_every), absl::GetFlag(FLAGS_max_holdout_rows)});
    capture_.depths = statistics_->depths();
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
        if (count - skip > 0) {
          RS_RETURN_IF_ERROR(statistics_->Add(capture_.states, skip, count - skip, threads_));
        }
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

  // --stats_out: one statistics file per kind, every split, held-out rows left out (the server
  // chooses λ on served rows; they would make the file several times larger).
  absl::Status WriteStats() const {
    const std::string pattern = absl::GetFlag(FLAGS_stats_out);
    if (pattern.empty()) return absl::OkStatus();
    if (kinds_.size() > 1 && pattern.find("{target}") == std::string::npos) {
      return absl::InvalidArgumentError(
          "--stats_out: several --map_target values need {target} in it");
    }
    for (size_t k = 0; k < kinds_.size(); ++k) {
      StatsSet set{id_.fingerprint, kinds_[k], {}};
      for (size_t i = 0; i < splits_.size(); ++i) {
        const CalibrationAccumulator& acc = statistics_->accumulator(k, i);
        CalibrationStats stats = acc.Finish();
        stats.holdout_rows = 0;
        stats.holdout_row_index.clear();
        stats.holdout_x.clear();
        for (CalibrationStats::Target& t : stats.targets) t.holdout_y.clear();
        set.splits.push_back(
            SplitStats{splits_[i], acc.total_rows(), acc.holdout_stride(), std::move(stats)});
      }
      const std::string path =
          absl::StrReplaceAll(pattern, {{"{target}", std::string(MapTargetName(kinds_[k]))}});
      RS_RETURN_IF_ERROR(WriteStatsFile(path, set));
      std::fprintf(stderr, "calibrate: statistics written to %s\n", path.c_str());
    }
    return absl::OkStatus();
  }

  // Solve and score: per split and target kind one Gram eigendecomposition, then every key
  // scale choice.
  absl::Status Solve() {
    const auto solve_start = Clock::now();
    results_.assign(kinds_.size(), std::vector<std::vector<SplitFit>>(key_scales_.size()));
    for (size_t i = 0; i < splits_.size(); ++i) {
      for (size_t k = 0; k < kinds_.size(); ++k) {
        const CalibrationStats stats = statistics_->accumulator(k, i).Finish();
        RS_ASSIGN_OR_RETURN(std::unique_ptr<RidgeSolver> solver, RidgeSolver::Create(stats));
        for (size_t j = 0; j < key_scales_.size(); ++j) {
          RS_ASSIGN_OR_RETURN(SplitFit r,
                              SolveSplit(splits_[i], kinds_[k], key_scales_[j], stats, *solver));
          results_[k][j].push_back(std::move(r));
        }
      }
    }
    solve_seconds_ = SecondsSince(solve_start);
    return absl::OkStatus();
  }

  // One split's maps for one kind and key-scale choice (map_fit.h), with the attention-window
  // cosine of each target.
  absl::StatusOr<SplitFit> SolveSplit(int32_t split, MapTarget kind, bool key_scale,
                                      const CalibrationStats& stats, const RidgeSolver& solver) {
    const ModelConfig& c = model_->config;
    RS_ASSIGN_OR_RETURN(SplitFit r, FitSplitMaps(split, kind, {fixed_lambda_, key_scale}, stats,
                                                 solver, statistics_->projectors(), c));
    if (!attn_window_) return r;
    const int32_t attn_rows = static_cast<int32_t>(windows_.back().size());
    const float* attn_x = attn_states_[statistics_->slot(split + 1)].data();
    for (size_t t = 0; t < r.fits.size(); ++t) {
      const int32_t layer = split + 2 + static_cast<int32_t>(t);
      const KvProjector& projector = *statistics_->projectors()[layer];
      const std::vector<float>& h_l = attn_states_[statistics_->slot(layer)];
      std::vector<float> queries, y_exact, kv_exact, kv_attn_pred;
      projector.Queries(h_l.data(), attn_rows, queries);
      projector.Target(kind, h_l.data(), attn_rows, y_exact);
      projector.ToKv(kind, y_exact.data(), attn_rows, kv_exact);
      const std::vector<float> pred = Predict(r.fits[t], attn_x, attn_rows, c.hidden);
      projector.ToKv(kind, pred.data(), attn_rows, kv_attn_pred);
      if (!r.key_scale[t].empty()) {
        ApplyKeyScale(r.key_scale[t], attn_rows, c.head_dim, kv_attn_pred);
      }
      r.quality[t].attn_cos = AttentionCosine(c, std::move(queries), std::move(kv_exact),
                                              std::move(kv_attn_pred), attn_rows, sink_);
    }
    return r;
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
        const MapSet maps = ToMapSet(results_[k][j], kinds_[k], id_.fingerprint, model_->config);
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
          const SplitFit& r = results_[k][j][i];
          Json& js = summary["splits"][i];
          js["train_rows"] = r.train_rows;
          js["holdout_rows"] = r.holdout_rows;
          for (size_t t = 0; t < r.fits.size(); ++t) {
            const MapFitQuality& q = r.quality[t];
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
  std::unique_ptr<SplitStatistics> statistics_;
  std::vector<std::vector<float>> attn_states_;  // [capture slot] the attention window's rows
  int threads_ = 1;
  double pass_seconds_ = 0;
  // The solve: results_[k][j][i] for kind k, key scale j, split i.
  std::vector<std::vector<std::vector<SplitFit>>> results_;
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
