#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce_ranks.h"

namespace ridgeserve::cuda {
namespace {

__global__ void SumRanksKernel(const float* gathered, int ranks, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    float sum = gathered[i];
    for (int r = 1; r < ranks; ++r) sum = __fadd_rn(sum, gathered[r * count + i]);
    out[i] = sum;
  }
}

}  // namespace

void LaunchSumRanksInOrder(const float* gathered, int ranks, size_t count, float* out,
                           cudaStream_t stream) {
  if (count == 0) return;
  const int64_t n = static_cast<int64_t>(count);
  SumRanksKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(gathered, ranks, n, out);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
