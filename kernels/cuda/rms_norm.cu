#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/rms_norm.h"

namespace ridgeserve::cuda {
namespace {

// One CTA per row: 256 threads cover a 4096-wide row in 16 strided steps each; the partial
// sums meet in a fixed shared-memory tree, so the order depends on dim alone.
constexpr int kRowThreads = 256;
// RmsNormHeads: one warp per (row, head), 8 warps per CTA.
constexpr int kHeadWarps = 8;

__device__ inline float NormScale(double sum, int32_t dim, float eps) {
  return static_cast<float>(1.0 / sqrt(sum / dim + static_cast<double>(eps)));
}

__global__ void RmsNormKernel(const float* x, const float* w, int32_t dim, float eps,
                              uint16_t* out) {
  __shared__ double partial[kRowThreads];
  const float* xr = x + int64_t{blockIdx.x} * dim;
  uint16_t* orow = out + int64_t{blockIdx.x} * dim;
  double sum = 0.0;
  for (int32_t i = threadIdx.x; i < dim; i += kRowThreads) {
    sum = __dadd_rn(sum, __dmul_rn(double{xr[i]}, double{xr[i]}));
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      partial[threadIdx.x] = __dadd_rn(partial[threadIdx.x], partial[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const float r = NormScale(partial[0], dim, eps);
  for (int32_t i = threadIdx.x; i < dim; i += kRowThreads) {
    orow[i] = Bf16Bits(__fmul_rn(__fmul_rn(xr[i], r), w[i]));
  }
}

__global__ void RmsNormHeadsKernel(float* x, int32_t ld, int64_t num_items, int32_t num_heads,
                                   int32_t head_dim, const float* w, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t item = int64_t{blockIdx.x} * kHeadWarps + threadIdx.x / 32;
  if (item >= num_items) return;
  float* head = x + (item / num_heads) * ld + (item % num_heads) * head_dim;
  double sum = 0.0;
  for (int32_t d = lane; d < head_dim; d += 32) {
    sum = __dadd_rn(sum, __dmul_rn(double{head[d]}, double{head[d]}));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum = __dadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, offset));
  }
  const float r = NormScale(sum, head_dim, eps);
  for (int32_t d = lane; d < head_dim; d += 32) head[d] = __fmul_rn(__fmul_rn(head[d], r), w[d]);
}

}  // namespace

void LaunchRmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps, uint16_t* out,
                   cudaStream_t stream) {
  if (n <= 0) return;
  RmsNormKernel<<<n, kRowThreads, 0, stream>>>(x, w, dim, eps, out);
  CUDA_CHECK_LAUNCH(stream);
}

void LaunchRmsNormHeads(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                        const float* w, float eps, cudaStream_t stream) {
  const int64_t items = int64_t{n} * num_heads;
  if (items <= 0) return;
  const unsigned blocks = static_cast<unsigned>((items + kHeadWarps - 1) / kHeadWarps);
  RmsNormHeadsKernel<<<blocks, 32 * kHeadWarps, 0, stream>>>(x, ld, items, num_heads, head_dim, w,
                                                             eps);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
