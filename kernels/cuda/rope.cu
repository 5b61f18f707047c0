#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/rope.h"

namespace ridgeserve::cuda {
namespace {

// One thread per (row, head, pair j): the angle is recomputed per head (cheap next to the
// double cos/sin it needs anyway) so no thread waits on another.
__global__ void RopeKernel(float* x, int32_t ld, int32_t num_heads, int32_t half, int64_t total,
                           const int32_t* positions, const float* inv_freq) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e % half;
    const int64_t h = (e / half) % num_heads;
    const int64_t i = e / (int64_t{half} * num_heads);
    const float theta = __fmul_rn(static_cast<float>(positions[i]), inv_freq[j]);
    const float c = static_cast<float>(cos(static_cast<double>(theta)));
    const float s = static_cast<float>(sin(static_cast<double>(theta)));
    float* x0 = x + i * ld + h * 2 * half;
    const float a = x0[j], b = x0[j + half];
    x0[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    x0[j + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

}  // namespace

void LaunchRope(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                const int32_t* positions, const float* inv_freq, cudaStream_t stream) {
  const int32_t half = head_dim / 2;
  const int64_t total = int64_t{n} * num_heads * half;
  if (total <= 0) return;
  RopeKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(
      x, ld, num_heads, half, total, positions, inv_freq);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
