// Element conversions on the device: f32 -> bf16 (round to nearest even, as FloatToBFloat16 and
// PyTorch round) for a Linear given f32 rows; the bias add after a GEMM.
#ifndef RIDGESERVE_KERNELS_CUDA_CONVERT_H_
#define RIDGESERVE_KERNELS_CUDA_CONVERT_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

// dst[i] = bf16(src[i]) for i < count (dst as uint16_t bits).
void LaunchF32ToBF16(const float* src, size_t count, uint16_t* dst, cudaStream_t stream);
// y[i, j] += bias[j] for y [n, cols] (rows `ld` apart).
void LaunchAddBias(float* y, int64_t ld, int32_t n, int64_t cols, const float* bias,
                   cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_CONVERT_H_
