// The CUDA attention's arithmetic layout and launch plan, as plain host code (no CUDA
// headers), so the choices are unit-tested on any machine (tests/gpu/attention_plan_test.cc).
//
// A row at position `pos` attends to positions 0..pos. They are cut into PARTITIONS of
// kPartition positions ([p * kPartition, (p + 1) * kPartition) ∩ [0, pos]), p < P(pos) =
// pos / kPartition + 1, and partitions into at most kSplitSlots SLOTS of k(pos) = ceil(P /
// kSplitSlots) consecutive partitions each. The result is, with ⊕ the log-sum-exp merge of two
// (max, sum, acc) states:
//   slot z:  G_z = S_{zk} ⊕ S_{zk+1} ⊕ ... (left to right), S_p = the online softmax over
//            partition p in chunks of kAttentionChunk positions, from a fresh state;
//   row:     T = G_0 ⊕ G_1 ⊕ ... (left to right);  out = T.acc / T.sum.
// Everything here depends on `pos` alone: not on the batch, the kernel, the block size or
// which blocks hold the tokens. The two kernels (attention.cu) compute exactly this tree:
//   split-KV: one CTA per (row, kv head, slot) writes G_z to a workspace, a merge kernel
//             folds the slots in order (decode and small batches: many CTAs per row);
//   walker:   one CTA per (row, kv head) computes G_0, G_1, ... itself and folds them as
//             it goes (large batches: enough CTAs already, no workspace).
// Both use the same device functions with explicitly rounded operations (no FMA contraction
// left to the compiler), so a row's bits do not depend on which kernel ran it, and the choice
// below may depend on the batch size.
#ifndef RIDGESERVE_KERNELS_CUDA_ATTENTION_PLAN_H_
#define RIDGESERVE_KERNELS_CUDA_ATTENTION_PLAN_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace ridgeserve::cuda {

// Keys per online-softmax step: one key per lane of a warp, so the chunk's max and sum are
// warp reductions with a fixed butterfly order.
inline constexpr int kAttentionChunk = 32;
// Positions per partition (8 chunks): long enough that a CTA's fixed cost (loading q,
// writing its state) is small next to its K/V reads, short enough that a 4K-token decode
// row already spreads over 16 CTAs per KV head.
inline constexpr int kPartition = 256;
static_assert(kPartition % kAttentionChunk == 0);
// Slots (CTAs per row and KV head in the split-KV kernel): 16 x the KV heads x the rows fill
// an H200's 132 SMs from a single decode row of a model with 8 KV heads, and bound the
// workspace to 16 states per row and query head.
inline constexpr int kSplitSlots = 16;
// The split-KV kernel is used up to this many rows (its workspace is rows x query heads x
// kSplitSlots states); above it the walker has rows x KV heads CTAs, enough to fill the GPU.
inline constexpr int kSplitMaxRows = 128;
// Head dims up to this (lanes hold head_dim / 32 accumulators each).
inline constexpr int kMaxHeadDim = 256;
// Query heads per KV head (one warp each): CTAs of at most 512 threads, so the kernels may use
// up to 128 registers a thread (__launch_bounds__) for the three live states of head_dim 256.
inline constexpr int kMaxGroup = 16;

constexpr int NumPartitions(int32_t pos) { return pos / kPartition + 1; }
constexpr int PartitionsPerSlot(int32_t pos) {
  return (NumPartitions(pos) + kSplitSlots - 1) / kSplitSlots;
}
constexpr int SlotsUsed(int32_t pos) {
  return (NumPartitions(pos) + PartitionsPerSlot(pos) - 1) / PartitionsPerSlot(pos);
}
// Partitions [begin, end) of slot z (empty when z >= SlotsUsed(pos)).
constexpr int SlotBegin(int32_t pos, int z) {
  const int b = z * PartitionsPerSlot(pos);
  return b < NumPartitions(pos) ? b : NumPartitions(pos);
}
constexpr int SlotEnd(int32_t pos, int z) {
  const int e = (z + 1) * PartitionsPerSlot(pos);
  return e < NumPartitions(pos) ? e : NumPartitions(pos);
}

// Floats of one slot state in the workspace: max, sum, then head_dim accumulators.
constexpr size_t StateFloats(int head_dim) { return 2 + static_cast<size_t>(head_dim); }

struct AttentionPlan {
  bool split = false;          // split-KV + merge, else the walker
  int threads = 0;             // per CTA: one warp per query head of a KV head's group
  size_t shared_bytes = 0;     // dynamic shared memory per CTA
  size_t workspace_bytes = 0;  // split only: num_rows x num_heads x kSplitSlots states
};

// The plan for one call; InvalidArgument for shapes the kernels do not take (head_dim not a
// multiple of 32 or above kMaxHeadDim, num_heads not a multiple of num_kv_heads, a group
// above kMaxGroup), naming the value.
absl::StatusOr<AttentionPlan> PlanAttention(int32_t num_rows, int32_t num_heads,
                                            int32_t num_kv_heads, int32_t head_dim);

// Dynamic shared memory of a CTA: q [group, head_dim], K chunk [32, head_dim + 1] (padded so
// lane j reading key j's element d hits bank (j + d) % 32), V chunk [32, head_dim], chunk
// slot offsets [32] (int64).
constexpr size_t AttentionSharedBytes(int group, int head_dim) {
  return sizeof(float) * (static_cast<size_t>(group) * head_dim +
                          static_cast<size_t>(kAttentionChunk) * (head_dim + 1) +
                          static_cast<size_t>(kAttentionChunk) * head_dim) +
         sizeof(int64_t) * kAttentionChunk;
}

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_ATTENTION_PLAN_H_
