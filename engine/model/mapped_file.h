// A read-only memory map of a whole file, unmapped when the object dies.
//
// The weights readers hand out pointers into the mapping (TensorInfo::data), so a MappedFile
// must outlive every pointer taken from it. The file must not be truncated while mapped: the
// kernel answers a read past the new end with SIGBUS, which no parser can check for.
#ifndef RIDGESERVE_ENGINE_MODEL_MAPPED_FILE_H_
#define RIDGESERVE_ENGINE_MODEL_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace ridgeserve {

class MappedFile {
 public:
  // Maps `path` read-only. NotFound / PermissionDenied / InvalidArgument (not a regular file)
  // and friends, each naming the file. An empty file maps to an empty span.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  // nullptr when the file is empty.
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size, bool heap_copy);

  std::string path_;
  const uint8_t* data_;
  size_t size_;
  // True in AddressSanitizer builds, where the file is read into an exactly sized heap
  // buffer instead of mapped (see mapped_file.cc).
  bool heap_copy_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_MAPPED_FILE_H_
