// CPU backend: OpenBLAS for GEMMs, OpenMP + compiler-vectorized/AVX loops for the rest.
#ifndef RIDGESERVE_KERNELS_CPU_CPU_BACKEND_H_
#define RIDGESERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>

#include "kernels/backend.h"

namespace ridgeserve {

// num_threads <= 0: all hardware threads.
std::unique_ptr<Backend> CreateCpuBackend(int num_threads);

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_CPU_CPU_BACKEND_H_
