// Byte-level helpers of the RidgeFill file tests (map file, statistics file): scratch paths,
// reading and writing whole files, patching bytes and resealing the XXH64 trailer.
#ifndef RIDGESERVE_TESTS_RIDGEFILL_FILE_BYTES_H_
#define RIDGESERVE_TESTS_RIDGEFILL_FILE_BYTES_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "engine/ridgefill/xxh64.h"

namespace ridgeserve::testing_files {

// A path of this process's own in the test's temporary directory.
inline std::string TempPath(const std::string& prefix, const std::string& name) {
  return ::testing::TempDir() + "/" + prefix + std::to_string(::getpid()) + "_" + name;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Recomputes the trailer checksum (u64 XXH64, then 8 magic bytes) after a test patched the
// bytes on purpose.
inline void Reseal(std::string& bytes) {
  const uint64_t h = Xxh64Hash(bytes.data(), bytes.size() - 16);
  std::memcpy(bytes.data() + bytes.size() - 16, &h, 8);
}

template <typename T>
void Poke(std::string& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

}  // namespace ridgeserve::testing_files

#endif  // RIDGESERVE_TESTS_RIDGEFILL_FILE_BYTES_H_
