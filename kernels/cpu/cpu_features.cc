#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
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
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

namespace {

// AMX-TILE and AMX-INT8 in CPUID, the tile state in XCR0, and Linux's permission for this
// process to use it (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; Linux >= 5.16).
// Asked once: the permission holds for every thread of the process.
bool AmxGranted() {
  static const bool granted = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    if ((edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) return false;  // AMX-TILE, AMX-INT8
    uint32_t xcr0_low = 0, xcr0_high = 0;
    __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    constexpr uint32_t kTileState = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
    if ((xcr0_low & kTileState) != kTileState) return false;
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

}  // namespace

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
    if (AmxGranted()) out.push_back(Isa::kAmx);
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
