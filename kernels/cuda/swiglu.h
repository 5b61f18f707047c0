// SwiGLU on the device (Backend::SwiGlu): out = g / (1 + expf(-g)) * up in float (CUDA's
// expf, within 2 ulp like the CPU's), no FMA contraction, stored rounded to bf16.
#ifndef RIDGESERVE_KERNELS_CUDA_SWIGLU_H_
#define RIDGESERVE_KERNELS_CUDA_SWIGLU_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

// gate_up [n, 2 * ff] f32, out [n, ff] bf16 bits (the Linear input).
void LaunchSwiGlu(const float* gate_up, int32_t n, int32_t ff, uint16_t* out, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_SWIGLU_H_
