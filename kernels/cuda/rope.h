// Rotary embedding on the device (Backend::Rope), half-split layout, with the header's
// arithmetic: theta = float(pos) * inv_freq[j] rounded to float, cos and sin in double
// rounded to float, then the rotation in float without FMA contraction.
#ifndef RIDGESERVE_KERNELS_CUDA_ROPE_H_
#define RIDGESERVE_KERNELS_CUDA_ROPE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

void LaunchRope(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                const int32_t* positions, const float* inv_freq, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_ROPE_H_
