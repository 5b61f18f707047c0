#include "kernels/cuda/compact_kv.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"

namespace ridgeserve::cuda {
namespace {

// Element e of the moved entries, in 16-bit units: [cache (K, V)][g][i][unit of the head]. The
// unit's place in cache memory for place `place`.
__device__ inline uint16_t* UnitAt(const CompactKvParams& p, int64_t e, bool source) {
  const int64_t head_units = int64_t{p.head_dim} * p.element_bytes / 2;
  const int64_t per_cache = head_units * p.num_kv_heads * p.n;
  const int which = static_cast<int>(e / per_cache);
  const int64_t rest = e % per_cache;
  const int64_t gi = rest / head_units, u = rest % head_units;
  const int g = static_cast<int>(gi / p.n);
  const int32_t i = static_cast<int32_t>(gi % p.n);
  const int32_t place = source ? p.from[gi] : i;
  const int64_t slot = PagedSlot(p.blocks, p.block_size, place);
  uint8_t* base = which == 0 ? p.k : p.v;
  return reinterpret_cast<uint16_t*>(base) + (slot * p.num_kv_heads + g) * head_units + u;
}

__global__ void GatherKernel(CompactKvParams p, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    p.moved[e] = *UnitAt(p, e, /*source=*/true);
  }
}

__global__ void ScatterKernel(CompactKvParams p, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    *UnitAt(p, e, /*source=*/false) = p.moved[e];
  }
}

}  // namespace

void LaunchCompactKv(const CompactKvParams& p, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(
      CompactKvScratchBytes(p.element_bytes, p.num_kv_heads, p.head_dim, p.n) / 2);
  if (total <= 0) return;
  GatherKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(p, total);
  CUDA_CHECK_LAUNCH(stream);
  ScatterKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(p, total);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
