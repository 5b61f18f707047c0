// RidgeFill maps on a backend, and RidgeFill's fill step: for each split layer s of a map file,
// what writes the K/V of a filled row in every later layer l in [s + 2, L) from its h_s
// (DESIGN.md, "RidgeFill — our definition"), uploaded once. RidgeFillMaps is the RowFill that
// LlamaModel::Forward calls for filled rows (ForwardBatch::row_fill): the model runs layers, the
// maps decide what a filled row's K/V are.
//
// Per target kind (MapFile's --map_target):
//   pre_norm   ĥ_l = W_l h_s + b_l [hidden]; the layer's input RMSNorm and K/V projection
//              rows then give K (before RoPE) and V, as for an exact row.
//   post_norm  x̂_l = W_l h_s + b_l predicts the normalized input, so K/V = P_l x̂_l + c_l with
//              P_l the layer's K/V projection rows [2 kv_dim, hidden] and c_l their bias. Folded
//              at load: A_l = P_l W_l [2 kv_dim, hidden], a_l = P_l b_l + c_l.
//   kv         K (before RoPE, before QK-norm) and V regressed on h_s directly: A_l = W_l,
//              a_l = b_l.
// So both folded kinds cost one [rows, hidden] x [hidden, 2 kv_dim] GEMM per layer. QK-norm
// (Qwen3): k_norm is applied to the folded prediction, as to an exact row's projection; the
// kv target therefore predicts the projection output before k_norm, which renormalizes it per
// head (as the pre_norm target's RMSNorm undoes ridge shrinkage of ĥ's scale).
//
// Key scale (per layer, per KV head, optional in the file): multiplies the predicted K of
// head h (after QK-norm, before RoPE) by γ_h. Folded into the K rows of the per-layer K/V
// weights where it can be (no QK-norm); with QK-norm, into a per-head copy of k_norm.
//
// Layer s + 1 sees the exact h_s (its input), so its K/V come from the layer's own projection.
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_MAPS_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_MAPS_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama.h"
#include "kernels/backend.h"

namespace ridgeserve {

struct MapSet;

// One target layer's map on the backend: Weights packed from f32 ([out, in], Linear's layout),
// biases and norms as f32 buffers.
struct RidgeFillLayerMap {
  int32_t layer = 0;
  // pre_norm only: ĥ = W h_s + b, [hidden, hidden] and [hidden]. Empty for folded kinds.
  Weight weight;
  DeviceBuffer bias;
  // K/V rows [2 kv_dim, in] and bias [2 kv_dim]: folded kinds, in = hidden applied to h_s;
  // pre_norm with a key scale and no QK-norm, the layer's own K/V rows with the scale folded
  // in, applied to the normalized ĥ. Empty for pre_norm otherwise (the model's rows are used).
  Weight kv_weight;
  DeviceBuffer kv_bias;  // empty when there is no bias at all
  // QK-norm models with a key scale: [num_kv_heads, head_dim], head h's k_norm times γ_h.
  DeviceBuffer k_norm_scaled;
};

struct RidgeFillSplitMaps {
  int32_t split_layer = 0;
  bool folded = false;  // post_norm or kv: K/V come from kv_weight applied to h_s
  // Outlier-row test (leverage_mean empty when the file has none): leverage(h) =
  // (h − μ)ᵀ M (h − μ), with M = (G + λI)⁻¹ of the split's centred calibration Gram
  // [hidden, hidden], computed as (h − μ) · M (h − μ) with the rows centred before the GEMM.
  // On rank 0 only (it decides for every rank).
  Weight leverage_inverse;
  DeviceBuffer leverage_shift;       // μ on the backend (rank 0)
  std::vector<float> leverage_mean;  // μ, host, on every rank
  // by_layer[l] for l in [s + 2, num_layers); entries below s + 2 are empty.
  std::vector<RidgeFillLayerMap> by_layer;
};

// Immutable after Load. At tensor parallel N the maps are replicated per rank (the predicted
// input is full-width; each rank folds and applies its own KV heads' rows), each rank's on its
// own backend, so use them only with the models they were loaded for. Read by the threads
// running Forward (the engine thread, or every rank's).
class RidgeFillMaps : public RowFill {
 public:
  // Uploads (and for post_norm/kv folds) every split of `maps` for each of `ranks` (one model
  // at TP = 1; rank r's model at ranks[r], with no rank running meanwhile). Checks them
  // against the model's config: num_layers, hidden, num_kv_heads and head_dim equal, every
  // layer in [s + 2, L) has a map of the kind's shape, key scales finite and > 0
  // (InvalidArgument naming the split and layer otherwise). The model fingerprint is the
  // MapFile::Open caller's job. `max_leverage`: the leverage test (DESIGN.md) sends a filled
  // row whose h_s has leverage (h_s − μ)ᵀ (G + λI)⁻¹ (h_s − μ) above it, under its split's
  // calibration Gram G, back to exact (it lies far outside what the map was fitted on); 0
  // turns it off, and maps without leverage data never send a row back.
  static absl::StatusOr<std::unique_ptr<RidgeFillMaps>> Load(const MapSet& maps,
                                                             std::span<LlamaModel* const> ranks,
                                                             float max_leverage = 0);
  static absl::StatusOr<std::unique_ptr<RidgeFillMaps>> Load(const MapSet& maps, LlamaModel& model,
                                                             float max_leverage = 0) {
    LlamaModel* const one[] = {&model};
    return Load(maps, one, max_leverage);
  }

  // RowFill.
  absl::Status CheckSplit(const LlamaModel& model, int32_t split_layer) const override;
  bool SelectsExactRows(int32_t split_layer) const override;
  void SelectExactRows(LlamaModel& model, const FilledRows& rows,
                       std::span<int32_t> exact) const override;
  void WriteKv(LlamaModel& model, int32_t layer, const FilledRows& rows,
               const KvLayerView& kv) const override;

  // Rank `rank`'s maps for split layer `s`; nullptr when there are none.
  const RidgeFillSplitMaps* FindSplit(int32_t split_layer, int32_t rank = 0) const {
    if (rank < 0 || rank >= static_cast<int32_t>(by_rank_.size())) return nullptr;
    for (const RidgeFillSplitMaps& s : by_rank_[rank]) {
      if (s.split_layer == split_layer) return &s;
    }
    return nullptr;
  }
  std::vector<int32_t> split_layers() const {
    std::vector<int32_t> out;
    for (const RidgeFillSplitMaps& s : by_rank_.front()) out.push_back(s.split_layer);
    return out;
  }
  // What the engine keys its prefix cache on (with the split layer): requests filled by maps
  // of another id never share K/V blocks. Load gives a number unique in this process;
  // LoadRidgeFillMaps sets the map file's checksum instead (MapFile::checksum), so maps of the
  // same contents, loaded again, share the cache and maps of other contents never do.
  uint64_t id() const { return id_; }
  void set_id(uint64_t id) { id_ = id; }

 private:
  std::vector<std::vector<RidgeFillSplitMaps>> by_rank_;  // [rank][split]
  uint64_t id_ = 0;
  float max_leverage_ = 0;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_MAPS_H_
