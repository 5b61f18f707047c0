// SpecPC's and SpecKV's attention scores on the device (Backend::AttentionScores): the largest
// attention weight a few query rows of one sequence give each of its cached keys.
//
// Two kernels, all in f32 with the keys widened exactly:
//   stats:  one CTA per (row, KV head); warp w takes the keys j = w, w + 8, ... <= the row's
//           position, scores each against the group's query heads (a dot product split over the
//           lanes, d = lane, lane + 32, ..., added in a fixed butterfly) and keeps an online
//           (max, sum of exp) per head; the warps' states are merged in warp order. So each
//           (row, query head) gets m = max_j s_j and l = sum_j exp(s_j - m) (the sum's order
//           differs from the CPU's j order, and exp is CUDA's expf: within a few ulp of it).
//   scores: one warp per (KV head, key j < count): max over the rows that see j and the group's
//           heads of weights[r] * expf(s_j - m) / l, s_j computed as in the stats kernel; 0 for
//           a key past every row's position, which is not read (the block table need not reach
//           it).
// The logits themselves differ from the CPU's in the last bits too: the dot product is FMAs per
// lane added in a butterfly, not the CPU's eight running sums.
// A max does not depend on the order it is taken in, so the result is deterministic.
#ifndef RIDGESERVE_KERNELS_CUDA_ATTENTION_SCORES_H_
#define RIDGESERVE_KERNELS_CUDA_ATTENTION_SCORES_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_plan.h"

namespace ridgeserve::cuda {

// Query heads per KV head and head dims the kernels take (their registers are sized by them):
// attention's, so every model the backend starts with (PlanAttention at ReserveOps) fits.
inline constexpr int kScoresMaxGroup = kMaxGroup;
inline constexpr int kScoresMaxHeadDim = kMaxHeadDim;

struct AttentionScoresParams {
  const float* q = nullptr;            // [rows, num_heads * head_dim]
  const int32_t* positions = nullptr;  // [rows]
  const float* weights = nullptr;      // [rows]
  const int32_t* blocks = nullptr;     // the sequence's block table
  const void* k = nullptr;             // the layer's K cache, [slots, num_kv_heads, head_dim]
  int dtype_code = 0;                  // its elements: 0 F32, 1 F16, 2 BF16
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t num_heads = 0;
  int32_t rows = 0;
  int32_t max_position = 0;  // the largest of positions: no key past it is read
  int32_t count = 0;
  float scale = 0.0f;
  float2* stats = nullptr;  // scratch [rows, num_heads]: (m, l)
  float* scores = nullptr;  // [num_kv_heads, count]
};

void LaunchAttentionScores(const AttentionScoresParams& p, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_ATTENTION_SCORES_H_
