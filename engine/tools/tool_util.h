// Small helpers shared by the offline command-line tools.
#ifndef RIDGESERVE_ENGINE_TOOLS_TOOL_UTIL_H_
#define RIDGESERVE_ENGINE_TOOLS_TOOL_UTIL_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ridgeserve {

using ToolClock = std::chrono::steady_clock;

inline double SecondsSince(ToolClock::time_point start) {
  return std::chrono::duration<double>(ToolClock::now() - start).count();
}

// The whole file, or NotFound naming it.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// "1,2,3" → {1, 2, 3}; InvalidArgument naming --flag on anything else.
absl::StatusOr<std::vector<int32_t>> ParseIntList(const std::string& flag, const std::string& s);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_TOOL_UTIL_H_
