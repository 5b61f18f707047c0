#include "engine/ridgefill/ridgefill_maps.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/config.h"
#include "engine/ridgefill/map_file.h"

namespace ridgeserve {

absl::StatusOr<std::unique_ptr<RidgeFillMaps>> RidgeFillMaps::Load(const MapSet& maps,
                                                                   const ModelConfig& config,
                                                                   Backend& backend) {
  if (maps.kind != MapTarget::kPreNorm) {
    return absl::UnimplementedError(absl::StrCat("ridgefill: map target ",
                                                 std::string(MapTargetName(maps.kind)),
                                                 " is not supported by the forward pass "
                                                 "(only pre_norm)"));
  }
  if (maps.model.num_layers != config.num_layers || maps.model.hidden != config.hidden ||
      maps.num_kv_heads != config.num_kv_heads || maps.head_dim != config.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("ridgefill: maps are for ", maps.model.num_layers, " layers, hidden ",
                     maps.model.hidden, ", ", maps.num_kv_heads, " KV heads of ", maps.head_dim,
                     "; the model has ", config.num_layers, ", ", config.hidden, ", ",
                     config.num_kv_heads, " of ", config.head_dim));
  }
  const int32_t hidden = config.hidden;
  auto result = std::unique_ptr<RidgeFillMaps>(new RidgeFillMaps());
  for (const SplitMaps& split : maps.splits) {
    const int32_t s = split.split_layer;
    if (s < 0 || s + 2 > config.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("ridgefill: split layer ", s, " outside [0, ", config.num_layers - 2, "]"));
    }
    RidgeFillSplitMaps out;
    out.split_layer = s;
    out.by_layer.resize(config.num_layers);
    std::vector<bool> seen(config.num_layers, false);
    for (const TargetMap& t : split.targets) {
      if (t.layer < s + 2 || t.layer >= config.num_layers || seen[t.layer]) {
        return absl::InvalidArgumentError(
            absl::StrCat("ridgefill: split ", s, ": bad target layer ", t.layer));
      }
      if (t.out_dim != hidden || t.weight.size() != static_cast<size_t>(hidden) * hidden ||
          t.bias.size() != static_cast<size_t>(hidden)) {
        return absl::InvalidArgumentError(absl::StrCat("ridgefill: split ", s, " layer ", t.layer,
                                                       ": map is not [", hidden, ", ", hidden,
                                                       "] + bias"));
      }
      seen[t.layer] = true;
      RidgeFillLayerMap& m = out.by_layer[t.layer];
      m.layer = t.layer;
      m.weight = backend.Alloc(sizeof(float) * t.weight.size());
      m.bias = backend.Alloc(sizeof(float) * t.bias.size());
      if (m.weight.as<void>() == nullptr || m.bias.as<void>() == nullptr) {
        return absl::ResourceExhaustedError("ridgefill: cannot allocate map buffers");
      }
      backend.CopyToDevice(m.weight.as<void>(), t.weight.data(), sizeof(float) * t.weight.size());
      backend.CopyToDevice(m.bias.as<void>(), t.bias.data(), sizeof(float) * t.bias.size());
    }
    // The fill path predicts the input of every layer after s + 1; a gap has no fallback.
    for (int32_t l = s + 2; l < config.num_layers; ++l) {
      if (!seen[l]) {
        return absl::InvalidArgumentError(absl::StrCat("ridgefill: split ", s,
                                                       " has no map for layer ", l,
                                                       " (every layer in [s + 2, L) needs one)"));
      }
    }
    result->splits_.push_back(std::move(out));
  }
  return result;
}

}  // namespace ridgeserve
