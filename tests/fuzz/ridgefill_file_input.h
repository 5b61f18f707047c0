// The input of the RidgeFill file fuzzers (map file, statistics file; both in the container of
// engine/ridgefill/binary_io.h): byte 0 holds flags, the rest is the file. The XXH64 trailer
// and the header's file size would stop almost every mutation at the first check, so bit 0
// writes the true file size into the header and bit 1 the true checksum into the trailer
// before the reader sees the file; the parse behind them is what is fuzzed.
#ifndef RIDGESERVE_TESTS_FUZZ_RIDGEFILL_FILE_INPUT_H_
#define RIDGESERVE_TESTS_FUZZ_RIDGEFILL_FILE_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "engine/ridgefill/xxh64.h"

namespace ridgeserve::fuzz {

// The file bytes of a non-empty input, repaired as its flags say.
inline std::string RidgeFillFileFromInput(const uint8_t* data, size_t size) {
  constexpr size_t kHeaderFileSizeOffset = 16;
  constexpr size_t kTrailerBytes = 16;  // u64 XXH64, char[8] end magic
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
  return bytes;
}

}  // namespace ridgeserve::fuzz

#endif  // RIDGESERVE_TESTS_FUZZ_RIDGEFILL_FILE_INPUT_H_
