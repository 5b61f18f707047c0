#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embed.h"

namespace ridgeserve::cuda {
namespace {

__global__ void EmbedKernel(const uint16_t* table, int64_t rows, int64_t dim, int64_t id_begin,
                            const int32_t* ids, int64_t total, float* out) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / dim, d = e % dim;
    const int64_t r = ids[i] - id_begin;
    // bf16 -> f32 is exact: the bf16 bits are the top half of the f32.
    out[e] = r >= 0 && r < rows ? __uint_as_float(uint32_t{table[r * dim + d]} << 16) : 0.0f;
  }
}

}  // namespace

void LaunchEmbed(const uint16_t* table, int64_t rows, int64_t dim, int64_t id_begin,
                 const int32_t* ids, int32_t n, float* out, cudaStream_t stream) {
  const int64_t total = int64_t{n} * dim;
  if (total <= 0) return;
  EmbedKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(
      table, rows, dim, id_begin, ids, total, out);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
