// The RidgeFill map file: the fitted maps W_l, b_l for one or more split layers of one
// model, with what the engine needs to check that they fit the loaded model.
//
// Format, version 1, in the container it shares with the statistics file (binary_io.h).
// Little-endian throughout; every float array starts at a file offset that is a multiple of
// 64, so a mapped file can be used in place.
//
//   [0, 64)  header
//     char[8] magic "RFMAP\0\0\0"       u32 version (1)          u32 header size (64)
//     u64 file size (all bytes, trailer included)
//     u64 metadata offset (64)          u64 metadata size        u64 data offset (64-aligned)
//     16 bytes zero
//   metadata, packed:
//     u64 fingerprint hash   u32 num_layers   u32 hidden   u32 num_kv_heads   u32 head_dim
//     u32 target kind (0 pre_norm, 1 post_norm, 2 kv)      u32 dtype (0 = f32)
//     u32 model name length, name bytes (UTF-8, no terminator)
//     u32 split count, then per split:
//       u32 split layer   u32 target count   f32 leverage λ   u32 zero
//       array leverage inverse [hidden, hidden] or empty   array leverage mean [hidden] or empty
//       per target:
//         u32 layer   u32 out_dim   f32 λ   f32 R², K cos, V cos, key-norm ratio, attention cos
//         array W [out_dim, hidden]   array b [out_dim]   array key scale [num_kv_heads] or empty
//     where an array is u64 file offset, u64 element count (offset 0 when empty)
//   data: the arrays, zero padding between them
//   trailer: u64 XXH64 (seed 0) of every byte before the trailer, char[8] "RFMAPEND"
//
// Shape rules (checked when writing and when reading): split layer s with 0 ≤ s ≤ L − 3;
// target layers strictly ascending in [s + 2, L) (layer s + 1 sees the exact h_s); out_dim
// = hidden for pre_norm and post_norm, 2 · num_kv_heads · head_dim for kv (rows [0, kv_dim)
// predict K before RoPE, rows [kv_dim, 2 kv_dim) predict V); key scale empty or one per KV
// head; λ finite and ≥ 0; leverage inverse and mean both present or both empty; split layers
// distinct.
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_MAP_FILE_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_MAP_FILE_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/tensor_source.h"

namespace ridgeserve {

class MappedFile;

inline constexpr uint32_t kMapFileVersion = 1;

// What the map predicts for each later layer (DESIGN.md, --map_target).
enum class MapTarget : uint32_t { kPreNorm = 0, kPostNorm = 1, kKv = 2 };
std::string_view MapTargetName(MapTarget kind);  // "pre_norm", "post_norm", "kv"
absl::StatusOr<MapTarget> ParseMapTarget(std::string_view name);

// Identity of the model a map was fitted on. Maps match a model when hash, num_layers and
// hidden match; the name is only for people reading error messages.
struct ModelFingerprint {
  uint64_t hash = 0;
  std::string model_name;
  int32_t num_layers = 0;
  int32_t hidden = 0;
};

// Hash of a weights file's tensor table: for every tensor, in name order, its name, storage
// type, shape and byte size, plus its first and last 4 KiB of stored bytes. Cheap (touches
// at most 8 KiB per tensor) and changes with any re-quantisation, fine-tune or reshaping.
uint64_t TensorTableHash(const TensorSource& source);
ModelFingerprint ComputeModelFingerprint(const TensorSource& source, std::string model_name,
                                         int32_t num_layers, int32_t hidden);
// Whether a file made for `made_for` fits `loaded` (hash, num_layers and hidden agree).
bool SameModel(const ModelFingerprint& made_for, const ModelFingerprint& loaded);
// "'name' (fingerprint 0123456789abcdef, 30 layers, hidden 576)", for error messages.
std::string DescribeModel(const ModelFingerprint& m);

// Quality measured at calibration time; NaN when not measured.
struct MapDiagnostics {
  float r2 = std::numeric_limits<float>::quiet_NaN();
  float k_cos = std::numeric_limits<float>::quiet_NaN();
  float v_cos = std::numeric_limits<float>::quiet_NaN();
  float key_norm_ratio = std::numeric_limits<float>::quiet_NaN();
  float attn_cos = std::numeric_limits<float>::quiet_NaN();
};

// Array members are views: for writing they point at the caller's data, which must live
// through WriteMapFile; from MapFile they point into the file and live as long as it.
struct TargetMap {
  int32_t layer = 0;  // l
  float lambda = 0;   // absolute λ the map was solved with
  int32_t out_dim = 0;
  std::span<const float> weight;     // [out_dim, hidden] row-major: y = W h_s + b
  std::span<const float> bias;       // [out_dim]
  std::span<const float> key_scale;  // [num_kv_heads] or empty
  MapDiagnostics diagnostics;
};

struct SplitMaps {
  int32_t split_layer = 0;         // s
  std::vector<TargetMap> targets;  // ascending layer
  // Optional outlier-row test: leverage(h) = (h − mean)ᵀ inverse (h − mean) with
  // inverse = (G + leverage_lambda · I)⁻¹ of this split's calibration Gram.
  float leverage_lambda = 0;
  std::span<const float> leverage_inverse;  // [hidden, hidden] or empty
  std::span<const float> leverage_mean;     // [hidden] or empty
};

struct MapSet {
  ModelFingerprint model;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  MapTarget kind = MapTarget::kPreNorm;
  std::vector<SplitMaps> splits;
};

// Checks the shape rules above. InvalidArgument naming the split and layer at fault.
absl::Status ValidateMapSet(const MapSet& maps);

// Validates, then writes `path` atomically (a temporary file renamed into place). Errors
// name the file.
absl::Status WriteMapFile(const std::string& path, const MapSet& maps);

// The model a map file must match when loaded for serving.
struct MapFileExpectations {
  ModelFingerprint model;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

// A map file opened read-only. The maps' arrays point into the mapping. Immutable after
// Open, so any number of threads may read it.
class MapFile {
 public:
  // Reads, checks (magic, version, size, checksum, every count and offset against the file
  // size before using it, the shape rules, and the model) and maps `path`. Every error is one
  // line naming the file: NotFound etc. from opening, DataLoss for a truncated or corrupted
  // file, InvalidArgument for a wrong magic, unsupported version or inconsistent shapes,
  // FailedPrecondition when the file was made for another model (naming both).
  static absl::StatusOr<std::unique_ptr<MapFile>> Open(const std::string& path,
                                                       const MapFileExpectations& expected);
  // The same checks without a model to compare against (inspection tools).
  static absl::StatusOr<std::unique_ptr<MapFile>> OpenUnchecked(const std::string& path);

  ~MapFile();
  MapFile(const MapFile&) = delete;
  MapFile& operator=(const MapFile&) = delete;

  const std::string& path() const;
  const MapSet& maps() const { return maps_; }
  // The trailer's XXH64 of the file's bytes: identifies its contents (ridgeserve keys its
  // prefix cache on it, so K/V filled by two different map files are never mixed).
  uint64_t checksum() const { return checksum_; }
  // nullptr when the file has no maps for split layer `s`.
  const SplitMaps* FindSplit(int32_t split_layer) const;

 private:
  MapFile(std::unique_ptr<MappedFile> file, MapSet maps, uint64_t checksum);
  // `expected` == nullptr: no model to compare against.
  static absl::StatusOr<std::unique_ptr<MapFile>> OpenImpl(const std::string& path,
                                                           const MapFileExpectations* expected);

  std::unique_ptr<MappedFile> file_;
  MapSet maps_;
  uint64_t checksum_ = 0;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_MAP_FILE_H_
