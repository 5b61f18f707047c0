// RidgeFill maps on a backend: for each split layer s of a map file, the pre_norm maps
// ĥ_l = W_l h_s + b_l of every later layer l in [s + 2, L), uploaded once for LlamaModel's
// fill path (DESIGN.md, "RidgeFill — our definition").
//
// Dependency note: LlamaModel (rs_model) uses this type through its header only (struct
// members, inline lookups); Load lives in rs_ridgefill_maps, which links rs_model and
// rs_ridgefill, so there is no cycle.
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_MAPS_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_MAPS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace ridgeserve {

struct MapSet;
struct ModelConfig;

// One target layer's map on the backend.
struct RidgeFillLayerMap {
  int32_t layer = 0;
  DeviceBuffer weight;  // [hidden, hidden] row-major (MatMul's w layout): ĥ = W h_s + b
  DeviceBuffer bias;    // [hidden]
};

struct RidgeFillSplitMaps {
  int32_t split_layer = 0;
  // by_layer[l] for l in [s + 2, num_layers); entries below s + 2 are empty.
  std::vector<RidgeFillLayerMap> by_layer;
};

// Immutable after Load; the buffers belong to the backend it was loaded on, so use it only
// with models on that backend. Read by the engine thread during Forward.
class RidgeFillMaps {
 public:
  // Uploads every split of `maps`. Checks them against `config`: target kind pre_norm (the
  // other kinds are not implemented in the forward pass: Unimplemented), num_layers, hidden,
  // num_kv_heads and head_dim equal, and every layer in [s + 2, L) has a map
  // (InvalidArgument naming the split and layer otherwise). The model fingerprint is the
  // MapFile::Open caller's job.
  static absl::StatusOr<std::unique_ptr<RidgeFillMaps>> Load(const MapSet& maps,
                                                             const ModelConfig& config,
                                                             Backend& backend);

  // nullptr when there are no maps for split layer `s`.
  const RidgeFillSplitMaps* FindSplit(int32_t split_layer) const {
    for (const RidgeFillSplitMaps& s : splits_) {
      if (s.split_layer == split_layer) return &s;
    }
    return nullptr;
  }
  std::vector<int32_t> split_layers() const {
    std::vector<int32_t> out;
    for (const RidgeFillSplitMaps& s : splits_) out.push_back(s.split_layer);
    return out;
  }

 private:
  std::vector<RidgeFillSplitMaps> splits_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_MAPS_H_
