#include "tests/fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace ridgeserve::fuzz {
namespace {

std::string MakeScratchDir() {
  std::string base = "/dev/shm";
  std::error_code ec;
  if (!std::filesystem::is_directory(base, ec)) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string dir = base + "/ridgeserve-fuzz-" + std::to_string(getpid());
  std::filesystem::create_directories(dir, ec);
  if (ec) Fail("cannot create the scratch directory");
  return dir;
}

}  // namespace

const std::string& ScratchDir() {
  static const std::string* dir = [] {
    auto* d = new std::string(MakeScratchDir());
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return d;
  }();
  return *dir;
}

std::string WriteScratchFile(const std::string& name, std::string_view bytes) {
  std::string path = ScratchDir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) Fail("cannot write a scratch file");
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    Fail("short write to a scratch file");
  }
  if (std::fclose(f) != 0) Fail("cannot close a scratch file");
  return path;
}

void ClearScratchDir() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(ScratchDir(), ec)) {
    std::filesystem::remove_all(entry.path(), ec);
  }
}

std::vector<std::string_view> Split(std::string_view data, std::string_view separator) {
  std::vector<std::string_view> parts;
  while (true) {
    size_t at = data.find(separator);
    if (at == std::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + separator.size());
  }
  parts.push_back(data);
  return parts;
}

void Fail(const char* what) {
  std::fprintf(stderr, "fuzz harness: %s\n", what);
  std::abort();
}

}  // namespace ridgeserve::fuzz
