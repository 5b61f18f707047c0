// CPU backend: OpenBLAS sgemm for MatMul, AVX2 / AVX-512 kernels for the rest (attention in
// attention.h, row-wise ops in row_ops.h), all threaded by one OpenMP pool: OpenBLAS itself is
// set to one thread, process-wide, so its pool and OpenMP's do not fight over the cores.
#ifndef RIDGESERVE_KERNELS_CPU_CPU_BACKEND_H_
#define RIDGESERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>

#include "kernels/backend.h"

namespace ridgeserve {

// Ops use up to num_threads threads (num_threads <= 0: all hardware threads); results do not
// depend on the count.
std::unique_ptr<Backend> CreateCpuBackend(int num_threads);

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_CPU_CPU_BACKEND_H_
