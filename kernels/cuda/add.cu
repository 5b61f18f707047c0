#include "kernels/cuda/add.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"

namespace ridgeserve::cuda {
namespace {

__global__ void AddKernel(float* x, const float* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = __fadd_rn(x[i], y[i]);
  }
}

}  // namespace

void LaunchAdd(float* x, const float* y, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  const int64_t n = static_cast<int64_t>(count);
  AddKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
