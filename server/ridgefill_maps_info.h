// The RidgeFill maps' state as the API gives it (GetModelInfo.ridgefill_maps and the answer of
// Admin.ReloadRidgeFillMaps).
#ifndef RIDGESERVE_SERVER_RIDGEFILL_MAPS_INFO_H_
#define RIDGESERVE_SERVER_RIDGEFILL_MAPS_INFO_H_

#include "ridgeserve/v1/ridgeserve.pb.h"
#include "server/ridgefill_maps_manager.h"

namespace ridgeserve {

v1::RidgeFillMapsInfo ToRidgeFillMapsInfo(const RidgeFillMapsSnapshot& maps);

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_RIDGEFILL_MAPS_INFO_H_
