#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/swiglu.h"

namespace ridgeserve::cuda {
namespace {

__global__ void SwiGluKernel(const float* gate_up, int32_t ff, int64_t total, uint16_t* out) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / ff, j = e % ff;
    const float g = gate_up[i * 2 * ff + j];
    const float up = gate_up[i * 2 * ff + ff + j];
    out[e] = Bf16Bits(__fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up));
  }
}

}  // namespace

void LaunchSwiGlu(const float* gate_up, int32_t n, int32_t ff, uint16_t* out, cudaStream_t stream) {
  const int64_t total = int64_t{n} * ff;
  if (total <= 0) return;
  SwiGluKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(gate_up, ff, total,
                                                                             out);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
