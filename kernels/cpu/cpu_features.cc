#include "kernels/cpu/cpu_features.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ridgeserve::cpu {

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

std::vector<Isa> AvailableIsas() {
  std::vector<Isa> out = {Isa::kScalar};
  // libgcc's checks read CPUID and XGETBV, so a feature the OS does not save counts as absent.
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
      !__builtin_cpu_supports("f16c")) {
    return out;
  }
  out.push_back(Isa::kAvx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512vnni")) {
    out.push_back(Isa::kAvx512);
  }
  return out;
}

Isa BestIsa() { return AvailableIsas().back(); }

absl::StatusOr<Isa> IsaFromEnvironment() {
  const std::vector<Isa> available = AvailableIsas();
  const char* env = std::getenv("RIDGESERVE_CPU_ISA");
  const std::string wanted = env == nullptr ? "auto" : env;
  if (wanted.empty() || wanted == "auto") return available.back();
  for (Isa isa : available) {
    if (IsaName(isa) == wanted) return isa;
  }
  std::vector<std::string> names;
  for (Isa isa : available) names.emplace_back(IsaName(isa));
  return absl::InvalidArgumentError(absl::StrCat("RIDGESERVE_CPU_ISA=", wanted, ": this CPU runs ",
                                                 absl::StrJoin(names, ", "), " (or auto)"));
}

}  // namespace ridgeserve::cpu
