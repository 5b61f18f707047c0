// SwiGLU on the device (Backend::SwiGlu): out = g / (1 + expf(-g)) * up in float (CUDA's
// expf, within 2 ulp like the CPU's), no FMA contraction.
#ifndef RIDGESERVE_KERNELS_CUDA_SWIGLU_H_
#define RIDGESERVE_KERNELS_CUDA_SWIGLU_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

// gate_up [n, 2 * ff], out [n, ff].
void LaunchSwiGlu(const float* gate_up, int32_t n, int32_t ff, float* out, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_SWIGLU_H_
