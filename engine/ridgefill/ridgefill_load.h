// Loads a RidgeFill map file for a loaded model: checks the file against the model's
// fingerprint and shape and uploads the maps to the model's backend (every rank's, at TP > 1),
// ready to be the fill of filled rows (ForwardBatch::row_fill, RidgeFillRequest::maps).
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_LOAD_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_LOAD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/ridgefill/map_file.h"
#include "engine/ridgefill/ridgefill_maps.h"

namespace ridgeserve {

// Keeps the file and the uploaded maps alive together.
struct LoadedRidgeFillMaps {
  std::unique_ptr<MapFile> file;
  std::unique_ptr<RidgeFillMaps> maps;
};

// `model.path` is re-read for its fingerprint. Errors name the map file and what is wrong
// (another model's maps, a truncated or corrupted file, a shape that does not fit).
// `max_leverage`: RidgeFillMaps::Load's.
absl::StatusOr<LoadedRidgeFillMaps> LoadRidgeFillMaps(const std::string& maps_path, Model& model,
                                                      float max_leverage = 0);

// LoadRidgeFillMaps in its two halves, for a server that swaps maps while it serves. Opening reads
// and checks the file against the model (no backend work, any thread); uploading puts the maps on
// the model's backend (the thread that drives it), with the file's checksum as their id
// (RidgeFillMaps::id).
absl::StatusOr<std::unique_ptr<MapFile>> OpenRidgeFillMapFile(const std::string& maps_path,
                                                              const Model& model);
absl::StatusOr<std::unique_ptr<RidgeFillMaps>> UploadRidgeFillMaps(const MapFile& file,
                                                                   Model& model,
                                                                   float max_leverage = 0);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_LOAD_H_
