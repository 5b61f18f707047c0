// The RidgeFill calibration-statistics file: per split layer, the CalibrationStats of the
// split's hidden state and its target layers (calibration_stats.h), with how many rows the
// accumulator saw and its hold-out stride. One format for two uses: the base statistics of
// shipped maps (ridgeserve-calibrate --stats_out) and the checkpoint of the server's online
// calibration (CalibrationAccumulator::Restore continues from it).
//
// Format, version 1, in the container of the map file (binary_io.h): little-endian, every
// array at a file offset that is a multiple of 64.
//
//   [0, 64)  header
//     char[8] magic "RFSTATS\0"         u32 version (1)          u32 header size (64)
//     u64 file size (all bytes, trailer included)
//     u64 metadata offset (64)          u64 metadata size        u64 data offset (64-aligned)
//     16 bytes zero
//   metadata, packed:
//     u64 fingerprint hash   u32 num_layers   u32 hidden
//     u32 target kind (0 pre_norm, 1 post_norm, 2 kv)
//     u32 model name length, name bytes (UTF-8, no terminator)
//     u32 split count, then per split:
//       u32 split layer   u32 target count
//       i64 seen rows   i64 hold-out stride   i64 training rows   i64 hold-out rows
//       array mean f64 [hidden]   array Gram f64 [hidden, hidden]
//       array hold-out row index i64 [hold-out rows]   array hold-out x f32 [hold-out rows, hidden]
//       per target (layers s + 2 .. L − 1 in order):
//         u32 dim   array mean f64 [dim]   array cross f64 [dim, hidden]
//         array hold-out y f32 [hold-out rows, dim]
//     where an array is u64 file offset, u64 element count (offset 0 when empty); its element
//     type is fixed by its place
//   data: the arrays in metadata order, none overlapping another, zero padding between them
//   trailer: u64 XXH64 (seed 0) of every byte before the trailer, char[8] "RFSTSEND"
//
// Shape rules (checked when writing and when reading): split layers distinct and ascending,
// 0 ≤ s ≤ L − 3; L − s − 2 targets; the statistics' dim = hidden; target dim = hidden for
// pre_norm and post_norm, any positive dim (the same for every target) for kv; array sizes as
// above, Gram exactly symmetric; rows ≥ 0 and rows + hold-out rows ≤ seen rows; hold-out row
// indices strictly ascending and < seen rows; hold-out stride 0 (then no hold-out rows) or
// ≥ 2; every value finite.
//
// Size per split: 8 · (d + d² + Σ d_l (1 + d)) bytes of moments and 4 · held rows · (d + Σ d_l)
// of held-out rows, ~160 MB in all for a 30-layer model of hidden 576 with pre_norm splits 14 and
// 22 and 2048 held-out rows each. Written straight from the statistics (no copy of the file in
// memory); read through a mapping into the statistics' own arrays.
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_STATS_FILE_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_STATS_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/ridgefill/calibration_stats.h"
#include "engine/ridgefill/map_file.h"

namespace ridgeserve {

inline constexpr uint32_t kStatsFileVersion = 1;

// One split's statistics.
struct SplitStats {
  int32_t split_layer = 0;     // s
  int64_t seen_rows = 0;       // every row the accumulator saw (training + held out)
  int64_t holdout_stride = 0;  // its hold-out stride then (0: no hold-out)
  CalibrationStats stats;      // targets: layers s + 2 .. L − 1 in ascending order
};

struct StatsSet {
  ModelFingerprint model;
  MapTarget kind = MapTarget::kPreNorm;
  std::vector<SplitStats> splits;  // distinct split layers, ascending
};

// Checks the shape rules above. InvalidArgument naming the split and target layer at fault.
absl::Status ValidateStatsSet(const StatsSet& stats);

// Validates, then writes `path` atomically (a temporary file renamed into place). Every
// error is one line starting with the path.
absl::Status WriteStatsFile(const std::string& path, const StatsSet& stats);

// Reads and checks `path`: magic, version, size, checksum, every count and offset against
// the file size before anything is allocated, the shape rules, and the model when `expected`
// is not null. Every error is one line starting with the path: NotFound etc. from opening,
// DataLoss for a truncated or corrupted file, InvalidArgument for a wrong magic, unsupported
// version or inconsistent shapes, FailedPrecondition when the file was made for another model
// (naming both).
absl::StatusOr<StatsSet> ReadStatsFile(const std::string& path, const ModelFingerprint* expected);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_STATS_FILE_H_
