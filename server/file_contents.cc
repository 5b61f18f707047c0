#include "server/file_contents.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ridgeserve {
namespace {

absl::Status CannotRead(const std::string& path, int error) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": cannot read it (", std::strerror(error), ")"));
}

}  // namespace

absl::StatusOr<std::string> ReadFileContents(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return CannotRead(path, errno);
  std::string bytes;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) bytes.append(buffer, n);
  // A directory opens, then fails to read (EISDIR).
  const int error = std::ferror(file) ? errno : 0;
  std::fclose(file);
  if (error != 0) return CannotRead(path, error);
  return bytes;
}

}  // namespace ridgeserve
