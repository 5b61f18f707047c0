// Helpers shared by the libFuzzer targets: a per-process scratch directory on tmpfs for the
// readers that take a path, and splitting one input into parts.
#ifndef RIDGESERVE_TESTS_FUZZ_FUZZ_UTIL_H_
#define RIDGESERVE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ridgeserve::fuzz {

// A directory of this process's own (under /dev/shm when it exists, else $TMPDIR or /tmp),
// created on first use and removed at exit.
const std::string& ScratchDir();

// Writes `bytes` to ScratchDir()/name (replacing it) and returns the path. Aborts on an I/O
// error: that is the harness failing, not the reader.
std::string WriteScratchFile(const std::string& name, std::string_view bytes);
// Removes every file in ScratchDir(), so one input's files never leak into the next.
void ClearScratchDir();

// `data` cut at every occurrence of `separator` (the separator itself dropped).
std::vector<std::string_view> Split(std::string_view data, std::string_view separator);

// Aborts with `what` on stderr: a harness invariant failed (libFuzzer reports it as a crash).
[[noreturn]] void Fail(const char* what);

}  // namespace ridgeserve::fuzz

#endif  // RIDGESERVE_TESTS_FUZZ_FUZZ_UTIL_H_
