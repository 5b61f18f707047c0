// Which instruction-set path the CPU kernels take. Chosen once from CPUID features (never
// from CPU model names, and not only from -march), logged by the backend, and forced by tests
// and by RIDGESERVE_CPU_ISA so that every path the machine has is tested on it.
//
// Every path computes the same bits: the kernels fix one arithmetic order (kernels/cpu/linear.h)
// and each path implements it, the scalar one lane by lane. So results do not depend on which
// CPU runs them, only on the inputs.
#ifndef RIDGESERVE_KERNELS_CPU_CPU_FEATURES_H_
#define RIDGESERVE_KERNELS_CPU_CPU_FEATURES_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ridgeserve::cpu {

// Best last; each needs the features of the ones before it.
enum class Isa {
  kScalar,  // portable C++: the reference of the arithmetic order
  kAvx2,    // AVX2 + FMA + F16C (x86-64-v3)
  kAvx512,  // kAvx2 + AVX-512 F, BW, DQ, VL and VNNI: 16-lane f32 tiles, int8 dot products
  kAmx,     // kAvx512 + AMX-TILE and AMX-INT8, granted by the OS: int8 Linear on many rows
            // of x in tiles (f32 activations run kAvx512's code)
};

std::string_view IsaName(Isa isa);

// The paths this CPU can run, from CPUID and the OS's saved register state; scalar first,
// best last.
std::vector<Isa> AvailableIsas();
// AvailableIsas().back().
Isa BestIsa();

// RIDGESERVE_CPU_ISA ("scalar", "avx2", "avx512", "amx"; unset or "auto" = the best available).
// InvalidArgument for an unknown name or a path this CPU cannot run, naming both.
absl::StatusOr<Isa> IsaFromEnvironment();

}  // namespace ridgeserve::cpu

#endif  // RIDGESERVE_KERNELS_CPU_CPU_FEATURES_H_
