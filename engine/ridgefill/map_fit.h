// RidgeFill maps from calibration statistics on a loaded model: the per-split solve shared by
// ridgeserve-calibrate (offline) and the server's online calibration. For each target layer l
// of split s it picks λ (auto: the grid λ = α · trace(G)/d scored on the held-out rows' K and
// V as the fill path would cache them; or a fixed λ), optionally fits the per-KV-head key scale,
// measures the held-out quality, and adds the split's leverage test at the first target's λ.
// DESIGN.md, "RidgeFill — our definition"; the statistics: calibration_stats.h; the solve:
// ridge_solver.h.
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_MAP_FIT_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_MAP_FIT_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/llama.h"
#include "engine/ridgefill/calibration_stats.h"
#include "engine/ridgefill/map_file.h"
#include "engine/ridgefill/ridge_solver.h"

namespace ridgeserve {

// Per-target quality (DESIGN.md's report). R², K/V cosines and key-norm ratios are on the
// held-out rows; attn_cos on ridgeserve-calibrate's attention window (NaN otherwise).
struct MapFitQuality {
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
// x̂ with the Q rows. Copies the layer's weights to the host at construction (on the thread
// that drives the model's backend); const methods are then safe from any thread.
class KvProjector {
 public:
  KvProjector(LlamaModel& model, int32_t layer);

  int32_t kv_dim() const { return c_.kv_dim(); }
  // Width of what a map of `kind` predicts.
  int32_t TargetDim(MapTarget kind) const {
    return kind == MapTarget::kKv ? 2 * c_.kv_dim() : c_.hidden;
  }
  // The exact target of `kind` from residual rows h [rows, hidden] → y [rows, TargetDim].
  void Target(MapTarget kind, const float* h, int64_t rows, std::vector<float>& y) const;
  // Target values of `kind` (exact or predicted) [rows, TargetDim] → K|V [rows, 2 kv_dim]
  // with K after QK-norm and before RoPE.
  void ToKv(MapTarget kind, const float* y, int64_t rows, std::vector<float>& kv) const;
  // Exact queries from residual rows h: [rows, q_dim], after QK-norm, before RoPE.
  void Queries(const float* h, int64_t rows, std::vector<float>& q) const;

 private:
  void Normalize(const float* h, int64_t rows, std::vector<float>& xn) const;
  // out [rows, count] = x · weight rows [first, first + count)ᵀ + bias.
  void ProjectRows(const float* x, int64_t rows, int32_t first, int32_t count,
                   std::vector<float>& out) const;
  void RmsNormRow(const float* x, const float* w, int32_t dim, float* out) const;

  const ModelConfig& c_;
  std::vector<float> norm_;    // [hidden]
  std::vector<float> weight_;  // [q_dim + 2 kv_dim, hidden]
  std::vector<float> bias_;    // [q_dim + 2 kv_dim] or empty
  std::vector<float> k_norm_;  // [head_dim] or empty
  std::vector<float> q_norm_;  // [head_dim] or empty
};

// Projectors for every target layer of `splits` (indexed by layer; null elsewhere).
std::vector<std::unique_ptr<KvProjector>> MakeKvProjectors(LlamaModel& model,
                                                           std::span<const int32_t> splits);

// cos(a, b) in double; 0 when either is zero.
double Cosine(const float* a, const float* b, int32_t n);
// ŷ = W x + b for rows x [rows, d] → [rows, out_dim].
std::vector<float> Predict(const RidgeFit& fit, const float* x, int64_t rows, int32_t d);
// K rows of K|V [rows, 2 kv_dim] times the per-head scale, in place.
void ApplyKeyScale(std::span<const float> scale, int64_t rows, int32_t head_dim,
                   std::vector<float>& kv);

// The statistics of a calibration pass over a model: the residual depths to capture
// (ForwardCapture::depths: s + 1, leaving layer s, and every l in [s + 2, L) for each split),
// each target layer's projector, and one accumulator per (kind, split). Targets of each kind
// are computed from the captured residuals per layer.
class SplitStatistics {
 public:
  // `splits` distinct, each in [0, L - 3]. Builds the projectors (backend work: on the thread
  // that drives the model's backend).
  SplitStatistics(LlamaModel& model, std::vector<int32_t> splits, std::vector<MapTarget> kinds,
                  HoldoutOptions holdout);

  const std::vector<int32_t>& splits() const { return splits_; }  // ascending
  const std::vector<MapTarget>& kinds() const { return kinds_; }
  const std::vector<int32_t>& depths() const { return depths_; }  // what to capture
  // Index of `depth` in depths(), or -1.
  int32_t slot(int32_t depth) const { return depth_slot_[depth]; }
  std::span<const std::unique_ptr<KvProjector>> projectors() const { return projectors_; }
  CalibrationAccumulator& accumulator(size_t kind, size_t split) {
    return accumulators_[kind][split];
  }
  const CalibrationAccumulator& accumulator(size_t kind, size_t split) const {
    return accumulators_[kind][split];
  }

  // Adds rows [first, first + rows) of captured residuals (states[i]: [n, hidden] at
  // depths()[i]) to every accumulator, spread over `threads` OpenMP threads (call with
  // single-threaded BLAS). An accumulator's error (a non-finite value) is returned; the
  // accumulators of other splits may have taken the rows.
  absl::Status Add(std::span<const std::vector<float>> states, int64_t first, int64_t rows,
                   int threads);

 private:
  const ModelConfig& config_;
  std::vector<int32_t> splits_;
  std::vector<MapTarget> kinds_;
  std::vector<int32_t> depths_;
  std::vector<int32_t> depth_slot_;                       // [depth] → index in depths_, or -1
  std::vector<std::unique_ptr<KvProjector>> projectors_;  // [layer] or null
  std::vector<std::vector<CalibrationAccumulator>> accumulators_;  // [kind][split]
  std::vector<std::vector<float>> targets_;                        // [layer] scratch
};

struct MapFitOptions {
  double fixed_lambda = -1;  // < 0: auto (held-out grid, scored on K/V)
  bool key_scale = false;
};

// One split's fitted maps and their held-out quality.
struct SplitFit {
  int32_t split = 0;
  int64_t train_rows = 0;
  int64_t holdout_rows = 0;
  std::vector<RidgeFit> fits;                 // targets s + 2 .. L - 1
  std::vector<MapFitQuality> quality;         // per target
  std::vector<std::vector<float>> key_scale;  // per target: [num_kv_heads] or empty
  std::vector<float> leverage_inverse;
  std::vector<float> leverage_mean;
  float leverage_lambda = 0;
};

// Solves split `split`'s maps of `kind` from `stats` (targets s + 2 .. L - 1, whose values are
// of `kind`) and `solver` (made from `stats`). `projectors` from MakeKvProjectors.
absl::StatusOr<SplitFit> FitSplitMaps(int32_t split, MapTarget kind, const MapFitOptions& options,
                                      const CalibrationStats& stats, const RidgeSolver& solver,
                                      std::span<const std::unique_ptr<KvProjector>> projectors,
                                      const ModelConfig& config);

// The maps of `fits` as a MapSet (its arrays point into `fits`, which must outlive it).
MapSet ToMapSet(std::span<const SplitFit> fits, MapTarget kind, const ModelFingerprint& model,
                const ModelConfig& config);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_MAP_FIT_H_
