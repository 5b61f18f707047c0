#include "engine/ridgefill/ridgefill_load.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/model/gguf.h"
#include "engine/model/safetensors.h"

namespace ridgeserve {

absl::StatusOr<std::unique_ptr<MapFile>> OpenRidgeFillMapFile(const std::string& maps_path,
                                                              const Model& model) {
  const ModelConfig& c = model.config;
  // The map file must have been fitted on this very model (fingerprint of its tensors).
  std::unique_ptr<TensorSource> source;
  std::error_code ec;
  if (std::filesystem::is_directory(model.path, ec)) {
    RS_ASSIGN_OR_RETURN(source, SafetensorsModel::Open(model.path));
  } else {
    RS_ASSIGN_OR_RETURN(source, GgufFile::Open(model.path));
  }
  MapFileExpectations expected;
  expected.model = ComputeModelFingerprint(*source, c.name, c.num_layers, c.hidden);
  expected.num_kv_heads = c.num_kv_heads;
  expected.head_dim = c.head_dim;
  return MapFile::Open(maps_path, expected);
}

absl::StatusOr<std::unique_ptr<RidgeFillMaps>> UploadRidgeFillMaps(const MapFile& file,
                                                                   Model& model,
                                                                   float max_leverage) {
  absl::StatusOr<std::unique_ptr<RidgeFillMaps>> maps =
      RidgeFillMaps::Load(file.maps(), model.rank_models(), max_leverage);
  if (!maps.ok()) {
    return absl::Status(maps.status().code(),
                        absl::StrCat(file.path(), ": ", maps.status().message()));
  }
  (*maps)->set_id(file.checksum());
  return maps;
}

absl::StatusOr<LoadedRidgeFillMaps> LoadRidgeFillMaps(const std::string& maps_path, Model& model,
                                                      float max_leverage) {
  LoadedRidgeFillMaps loaded;
  RS_ASSIGN_OR_RETURN(loaded.file, OpenRidgeFillMapFile(maps_path, model));
  RS_ASSIGN_OR_RETURN(loaded.maps, UploadRidgeFillMaps(*loaded.file, model, max_leverage));
  return loaded;
}

}  // namespace ridgeserve
