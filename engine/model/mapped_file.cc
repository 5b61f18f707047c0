#include "engine/model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

// A read past the end of a mapped file that stays inside the last page returns zeros instead
// of faulting, so AddressSanitizer cannot see a parser overrun on a truncated file. Sanitizer
// builds therefore read the file into a heap buffer of exactly its size, where ASan does see
// every byte past the end. Release builds map.
#if defined(__SANITIZE_ADDRESS__)
#define RIDGESERVE_MAPPED_FILE_HEAP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RIDGESERVE_MAPPED_FILE_HEAP 1
#endif
#endif

namespace ridgeserve {
namespace {

absl::Status ErrnoError(int error_number, const std::string& path, absl::string_view what) {
  return absl::ErrnoToStatus(error_number, absl::StrCat(path, ": ", what));
}

// Closes the descriptor on every return path; the mapping does not need it open.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() { ::close(fd_); }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, path, "cannot open");
  FdCloser closer(fd);

  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, path, "cannot stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    return std::unique_ptr<MappedFile>(new MappedFile(path, nullptr, 0, false));
  }

#ifdef RIDGESERVE_MAPPED_FILE_HEAP
  auto buffer = std::make_unique<uint8_t[]>(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, buffer.get() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, path, "cannot read");
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, ": file shrank while being read"));
    }
    done += static_cast<size_t>(n);
  }
  return std::unique_ptr<MappedFile>(new MappedFile(path, buffer.release(), size, true));
#else
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) return ErrnoError(errno, path, "cannot mmap");
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const uint8_t*>(addr), size, false));
#endif
}

MappedFile::MappedFile(std::string path, const uint8_t* data, size_t size, bool heap_copy)
    : path_(std::move(path)), data_(data), size_(size), heap_copy_(heap_copy) {}

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  if (heap_copy_) {
    delete[] data_;
  } else {
    ::munmap(const_cast<uint8_t*>(data_), size_);
  }
}

}  // namespace ridgeserve
