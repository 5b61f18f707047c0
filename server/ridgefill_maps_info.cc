#include "server/ridgefill_maps_info.h"

#include "absl/strings/str_format.h"

namespace ridgeserve {

v1::RidgeFillMapsInfo ToRidgeFillMapsInfo(const RidgeFillMapsSnapshot& maps) {
  v1::RidgeFillMapsInfo info;
  // Indexed by RidgeFillMapsState.
  constexpr v1::RidgeFillMapsInfo::State kStates[] = {
      v1::RidgeFillMapsInfo::NONE, v1::RidgeFillMapsInfo::CALIBRATING,
      v1::RidgeFillMapsInfo::LOADED, v1::RidgeFillMapsInfo::FAILED};
  info.set_state(kStates[static_cast<int>(maps.state)]);
  info.set_version(maps.version);
  if (maps.version > 0) info.set_checksum(absl::StrFormat("%016x", maps.checksum));
  info.set_default_split_layer(maps.default_split_layer);
  info.set_calibrated_tokens(maps.calibrated_tokens);
  info.set_calibration_tokens(maps.calibration_tokens);
  info.set_detail(maps.unavailable);
  info.set_reloads_ok(maps.reloads_ok);
  info.set_reloads_refused(maps.reloads_refused);
  info.set_path(maps.path);
  return info;
}

}  // namespace ridgeserve
