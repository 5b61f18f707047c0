// CPU backend: our own kernels (Linear on packed, still-quantized weights in linear.h,
// attention in attention.h, row-wise ops in row_ops.h), no BLAS, threaded by one OpenMP pool.
// Linear's path is chosen from CPUID features (cpu_features.h) and gives the same bits on each.
#ifndef RIDGESERVE_KERNELS_CPU_CPU_BACKEND_H_
#define RIDGESERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/linear.h"

namespace ridgeserve {

// Ops use up to num_threads threads (num_threads <= 0: all hardware threads); results do not
// depend on the count, nor on `isa`, which must be one of cpu::AvailableIsas(). `activations`
// picks Linear's arithmetic (linear.h): f32 by default, int8 when asked (faster, less exact).
std::unique_ptr<Backend> CreateCpuBackend(int num_threads, cpu::Isa isa = cpu::BestIsa(),
                                          cpu::Activations activations = cpu::Activations::kF32);
// With the path RIDGESERVE_CPU_ISA names, else the best this CPU has (cpu_features.h).
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackendFromEnvironment(
    int num_threads, cpu::Activations activations = cpu::Activations::kF32);

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_CPU_CPU_BACKEND_H_
