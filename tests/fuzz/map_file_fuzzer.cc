// RidgeFill map file reader (engine/ridgefill/map_file.*) on arbitrary bytes.
//
// Input: byte 0 holds flags, the rest is the file (ridgefill_file_input.h).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "engine/ridgefill/map_file.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/ridgefill_file_input.h"

namespace {

float Touch(std::span<const float> values) {
  float sum = 0;
  for (float v : values) sum += v;
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ridgeserve;
  if (size == 0) return 0;
  const std::string bytes = fuzz::RidgeFillFileFromInput(data, size);
  std::string path = fuzz::WriteScratchFile("maps.rfmap", bytes);
  auto file = MapFile::OpenUnchecked(path);
  if (!file.ok()) {
    if (file.status().message().empty()) fuzz::Fail("an error without a message");
    return 0;
  }
  const MapSet& maps = (*file)->maps();
  if (!ValidateMapSet(maps).ok()) fuzz::Fail("a map file that opens fails ValidateMapSet");
  volatile float sink = 0;
  for (const SplitMaps& split : maps.splits) {
    if ((*file)->FindSplit(split.split_layer) != &split) fuzz::Fail("FindSplit lost a split");
    sink = sink + Touch(split.leverage_inverse) + Touch(split.leverage_mean);
    for (const TargetMap& target : split.targets) {
      sink = sink + Touch(target.weight) + Touch(target.bias) + Touch(target.key_scale);
    }
  }
  MapFileExpectations same{maps.model, maps.num_kv_heads, maps.head_dim};
  if (!MapFile::Open(path, same).ok()) fuzz::Fail("a map file does not match its own model");
  MapFileExpectations other = same;
  other.model.hash ^= 1;
  if (MapFile::Open(path, other).ok()) fuzz::Fail("a map file matches another model");
  return 0;
}
