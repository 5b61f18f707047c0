#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gather_rows.h"

namespace ridgeserve::cuda {
namespace {

__global__ void GatherRowsKernel(const float* src, int32_t dim, const int32_t* index, int64_t total,
                                 float* dst) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / dim, d = e % dim;
    dst[e] = src[int64_t{index[i]} * dim + d];
  }
}

}  // namespace

void LaunchGatherRows(const float* src, int32_t dim, const int32_t* index, int32_t n, float* dst,
                      cudaStream_t stream) {
  const int64_t total = int64_t{n} * dim;
  if (total <= 0) return;
  GatherRowsKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(src, dim, index,
                                                                                 total, dst);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
