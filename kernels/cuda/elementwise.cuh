// Launch shape shared by the elementwise kernels, the bf16 store of activations and the paged
// cache's slot formula (device code: include from .cu files only).
#ifndef RIDGESERVE_KERNELS_CUDA_ELEMENTWISE_CUH_
#define RIDGESERVE_KERNELS_CUDA_ELEMENTWISE_CUH_

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace ridgeserve::cuda {

// 256 threads: 8 warps per CTA, enough for latency hiding at full occupancy (2048 threads per
// SM = 8 CTAs) with no shared memory; grids are capped and the kernels loop (grid-stride).
inline constexpr int kElementwiseThreads = 256;
inline constexpr int64_t kMaxElementwiseBlocks = 132 * 32;  // H200 SMs x 32 waves

inline unsigned ElementwiseBlocks(int64_t count) {
  const int64_t blocks = (count + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxElementwiseBlocks));
}

// v rounded to bf16, nearest even (FloatToBFloat16's rounding), as its bits: how an activation
// op stores its output (Backend::ActivationDType) and how Linear rounds f32 input.
__device__ inline uint16_t Bf16Bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// The cache slot of place `place` of a sequence whose places sit in the blocks of `table`, in
// order: kernels/backend.h's PagedSlot, on the device.
__device__ inline int64_t PagedSlot(const int32_t* table, int32_t block_size, int32_t place) {
  return int64_t{table[place / block_size]} * block_size + place % block_size;
}

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_ELEMENTWISE_CUH_
