#include "kernels/cuda/convert.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"

namespace ridgeserve::cuda {
namespace {

__global__ void F32ToBF16Kernel(const float* src, int64_t count, uint16_t* dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = Bf16Bits(src[i]);
  }
}

__global__ void AddBiasKernel(float* y, int64_t ld, int64_t cols, int64_t total,
                              const float* bias) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / cols, j = e % cols;
    y[i * ld + j] = __fadd_rn(y[i * ld + j], bias[j]);
  }
}

}  // namespace

void LaunchF32ToBF16(const float* src, size_t count, uint16_t* dst, cudaStream_t stream) {
  if (count == 0) return;
  const int64_t n = static_cast<int64_t>(count);
  F32ToBF16Kernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(src, n, dst);
  CUDA_CHECK_LAUNCH(stream);
}

void LaunchAddBias(float* y, int64_t ld, int32_t n, int64_t cols, const float* bias,
                   cudaStream_t stream) {
  const int64_t total = int64_t{n} * cols;
  if (total <= 0) return;
  AddBiasKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(y, ld, cols, total,
                                                                              bias);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
