// RMSNorm on the device (Backend::RmsNorm, RmsNormHeads), with the CPU's arithmetic: the sum of
// squares in double in a fixed order (per thread strided partial sums, then a fixed tree),
// r = float(1 / sqrt(sum / dim + eps)) in double, out = (x * r) * w in float. Only the order
// of the double additions differs from the CPU, so results nearly always match it bitwise
// (RmsNorm's then rounded to bf16, RmsNormHeads' kept in f32).
#ifndef RIDGESERVE_KERNELS_CUDA_RMS_NORM_H_
#define RIDGESERVE_KERNELS_CUDA_RMS_NORM_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

// x [n, dim] f32; out [n, dim] bf16 bits (the Linear input), not overlapping x.
void LaunchRmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps, uint16_t* out,
                   cudaStream_t stream);
// In place, each head of each row (rows `ld` apart) with w [head_dim].
void LaunchRmsNormHeads(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                        const float* w, float eps, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_RMS_NORM_H_
