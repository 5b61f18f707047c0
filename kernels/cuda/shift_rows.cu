#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/shift_rows.h"

namespace ridgeserve::cuda {
namespace {

__global__ void ShiftRowsKernel(const float* a, const float* shift, int32_t dim, int64_t count,
                                float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __fsub_rn(a[i], shift[i % dim]);
  }
}

}  // namespace

void LaunchShiftRows(const float* a, const float* shift, int32_t n, int32_t dim, float* out,
                     cudaStream_t stream) {
  const int64_t count = int64_t{n} * dim;
  if (count <= 0) return;
  ShiftRowsKernel<<<ElementwiseBlocks(count), kElementwiseThreads, 0, stream>>>(a, shift, dim,
                                                                                count, out);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
