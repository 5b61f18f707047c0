// What the two attention kernel families (attention_plan.h) share: the log-sum-exp merge of two
// states, with explicitly rounded operations so both compute the same bits, and the tiles'
// launcher, which attention.cu calls; and the widening of a cached element (also the selection
// scores', attention_scores.cu).
#ifndef RIDGESERVE_KERNELS_CUDA_ATTENTION_DEVICE_CUH_
#define RIDGESERVE_KERNELS_CUDA_ATTENTION_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention.h"

namespace ridgeserve::cuda {

// Element `index` of a K or V cache whose elements are F32 (kCode 0), F16 (1) or BF16 (2),
// widened to f32 exactly.
template <int kCode>
__device__ inline float LoadKvElement(const void* base, int64_t index) {
  if constexpr (kCode == 0) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kCode == 1) {
    return __half2float(static_cast<const __half*>(base)[index]);
  } else {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
  }
}

// a ⊕ b for states with finite maxima am and bm: the merged max and the factors of a's and b's
// sums and accumulators.
struct MergeWeights {
  float m;
  float wa;
  float wb;
};

__device__ inline MergeWeights MergeWeightsOf(float am, float bm) {
  const float m = fmaxf(am, bm);
  return {m, expf(__fsub_rn(am, m)), expf(__fsub_rn(bm, m))};
}

// One merged sum or accumulator: a * wa + b * wb.
__device__ inline float Merged(float a, float b, const MergeWeights& w) {
  return __fadd_rn(__fmul_rn(a, w.wa), __fmul_rn(b, w.wb));
}

// The tiles (attention_tiles.cu) for `plan` (plan.tiles): builds the tile list in the workspace,
// then runs the walker, or the split-KV CTAs that leave each slot's state in the workspace for
// attention.cu's merge kernel.
void LaunchAttentionTiles(const AttentionParams& p, const AttentionPlan& plan, void* workspace,
                          cudaStream_t stream);

// Lifts the tile kernels' dynamic shared memory limit (PrepareAttentionKernels).
cudaError_t PrepareAttentionTiles();

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_ATTENTION_DEVICE_CUH_
