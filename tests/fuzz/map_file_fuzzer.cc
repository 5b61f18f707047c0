// RidgeFill map file reader (engine/ridgefill/map_file.*) on arbitrary bytes.
//
// Input: byte 0 holds flags, the rest is the file. The file checksum (XXH64 trailer) and the
// header's file size would stop almost every mutation at the first check, so bit 0 makes the
// harness write the true file size into the header and bit 1 the true checksum into the
// trailer before the reader sees the file; the parse behind them is what is fuzzed.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "engine/ridgefill/map_file.h"
#include "engine/ridgefill/xxh64.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr size_t kHeaderFileSizeOffset = 16;
constexpr size_t kTrailerBytes = 16;  // u64 XXH64, char[8] "RFMAPEND"

float Touch(std::span<const float> values) {
  float sum = 0;
  for (float v : values) sum += v;
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ridgeserve;
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((flags & 1) != 0 && bytes.size() >= kHeaderFileSizeOffset + 8) {
    const uint64_t file_size = bytes.size();
    std::memcpy(bytes.data() + kHeaderFileSizeOffset, &file_size, 8);
  }
  if ((flags & 2) != 0 && bytes.size() >= kTrailerBytes) {
    const size_t body = bytes.size() - kTrailerBytes;
    const uint64_t hash = Xxh64Hash(bytes.data(), body);
    std::memcpy(bytes.data() + body, &hash, 8);
  }
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
