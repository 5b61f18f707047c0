#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/row_dots.h"

namespace ridgeserve::cuda {
namespace {

constexpr int kWarpsPerBlock = kElementwiseThreads / 32;

__global__ void ShiftedRowDotsKernel(const float* a, const float* shift, const float* b, int32_t n,
                                     int32_t dim, double* out) {
  const int32_t row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;  // the whole warp leaves together
  const float* ar = a + int64_t{row} * dim;
  const float* br = b + int64_t{row} * dim;
  double sum = 0.0;
  for (int32_t j = lane; j < dim; j += 32) {
    sum = __dadd_rn(sum, __dmul_rn(__dsub_rn(double(ar[j]), double(shift[j])), double(br[j])));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum = __dadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, offset));
  }
  if (lane == 0) out[row] = sum;
}

}  // namespace

void LaunchShiftedRowDots(const float* a, const float* shift, const float* b, int32_t n,
                          int32_t dim, double* out, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned blocks = static_cast<unsigned>((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  ShiftedRowDotsKernel<<<blocks, kElementwiseThreads, 0, stream>>>(a, shift, b, n, dim, out);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
