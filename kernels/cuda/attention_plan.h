// The CUDA attention's arithmetic layout and launch plan, as plain host code (no CUDA
// headers), so the choices are unit-tested on any machine (tests/gpu/attention_plan_test.cc).
//
// A row at position `pos` attends to positions 0..pos. They are cut into PARTITIONS of
// kPartition positions ([p * kPartition, (p + 1) * kPartition) ∩ [0, pos]), p < P(pos) =
// pos / kPartition + 1, and partitions into at most kSplitSlots SLOTS of k(pos) = ceil(P /
// kSplitSlots) consecutive partitions each. The result is, with ⊕ the log-sum-exp merge of two
// (max, sum, acc) states:
//   slot z:  G_z = S_{zk} ⊕ S_{zk+1} ⊕ ... (left to right), S_p = the online softmax over
//            partition p in chunks of positions, from a fresh state;
//   row:     T = G_0 ⊕ G_1 ⊕ ... (left to right);  out = T.acc / T.sum.
// Everything here depends on `pos` alone: not on the batch, the kernel, the block size or
// which blocks hold the tokens. Two families of kernels compute this tree, each in two forms:
//   split-KV: one CTA per (rows, kv head, slot) writes G_z to a workspace, a merge kernel
//             folds the slots in order (decode and small batches: many CTAs per row);
//   walker:   one CTA per (rows, kv head) computes G_0, G_1, ... itself and folds them as
//             it goes (large batches: enough CTAs already).
// The forms of a family use the same device functions with explicitly rounded operations (no
// FMA contraction left to the compiler), so a row's bits do not depend on which form ran it,
// and the choice between them below depends on the batch size. The family depends on the
// shape and the cache alone:
//   rows (attention.cu): one row per CTA, one warp per query head, f32 arithmetic on the
//     cached values widened exactly; chunks of kAttentionChunk keys. F32 and F16 caches, and
//     head dims the tiles do not take.
//   tiles (attention_tiles.cu): a BF16 cache and head_dim 64 or 128. A CTA takes a TILE of
//     consecutive rows of one sequence with all the query heads of one KV head, kTileSlots
//     (row, head) pairs, and computes scores and softmax · V on tensor cores (mma m16n8k16,
//     bf16 in, f32 accumulate) in chunks of kTileChunk keys: the query and the softmax
//     weights are rounded to bf16 for the products (as FlashAttention does), everything else
//     is f32. Each (row, head) pair's arithmetic is the same in whatever tile and place it
//     sits: an mma's output element depends only on its own row of A and column of B, a chunk
//     is aligned to absolute positions, and the keys a row does not see (past its position or
//     its slot) weigh exactly 0. That last part needs finite cached values: a tile loads keys
//     up to its highest row's position, and an Inf or NaN in V there would reach the rows
//     before it through 0 · Inf (the rows family never reads past a row's position).
#ifndef RIDGESERVE_KERNELS_CUDA_ATTENTION_PLAN_H_
#define RIDGESERVE_KERNELS_CUDA_ATTENTION_PLAN_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

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
// Where the state of (row, query head, slot z) starts in the split-KV workspace, in floats.
constexpr size_t StateOffset(int32_t row, int32_t head, int z, int32_t num_heads, int head_dim) {
  return ((static_cast<size_t>(row) * num_heads + head) * kSplitSlots + z) * StateFloats(head_dim);
}

// The tiles: (row, query head) pairs per CTA, 16 per warp (an mma's rows), the pairs of
// kTileSlots / group rows; a row's pairs are its group's heads in order.
inline constexpr int kTileSlots = 64;
inline constexpr int kTileThreads = 32 * (kTileSlots / 16);  // 4 warps
// Keys per online-softmax step of the tiles (a multiple of 16, an mma's k).
inline constexpr int kTileChunk = 64;
static_assert(kPartition % kTileChunk == 0);
// CTAs along the tile list beyond one per kTileSlots / group rows: a step's tiles are at most
// rows / tile_rows + one per run of rows of one sequence, and CTAs take the list in strides of
// the grid, so any number of runs is covered.
inline constexpr int kTileExtraCtas = 256;
inline constexpr int kMaxTileHeadDim = 128;
constexpr bool TilesTakeHeadDim(int head_dim) {
  return head_dim == 64 || head_dim == kMaxTileHeadDim;
}
// Dynamic shared memory of a tile CTA: the K chunk [kTileChunk, head_dim + 8] and the V chunk
// transposed [head_dim, kTileChunk + 8] (bf16, padded so the mma operand loads of a warp hit 32
// distinct banks), the slot state's accumulators [kTileSlots, head_dim + 8] and, walking, the
// row state's (f32; float2 accesses, conflict-free at that stride).
constexpr size_t TileSharedBytes(int head_dim, bool walk) {
  return sizeof(uint16_t) * (static_cast<size_t>(kTileChunk) * (head_dim + 8) +
                             static_cast<size_t>(head_dim) * (kTileChunk + 8)) +
         sizeof(float) * kTileSlots * (static_cast<size_t>(head_dim) + 8) * (walk ? 2 : 1);
}

struct AttentionPlan {
  bool split = false;           // split-KV + merge, else the walker
  bool tiles = false;           // the tensor-core tiles, else one row per CTA
  int threads = 0;              // per CTA (rows: one warp per query head of a KV head's group)
  size_t shared_bytes = 0;      // dynamic shared memory per CTA
  int32_t tile_rows = 0;        // tiles: rows per tile at most (kTileSlots / group)
  int32_t grid_tiles = 0;       // tiles: CTAs along the tile list
  size_t tile_list_offset = 0;  // tiles: bytes into the workspace where the tile list starts
  // Split: num_rows x num_heads x kSplitSlots states; tiles: then the tile list (its count and
  // num_rows + 1 row bounds, int32).
  size_t workspace_bytes = 0;
};

// The plan for one call over a cache of `kv_dtype`, on the tiles where they take the shape and
// `allow_tiles`; InvalidArgument for shapes the kernels do not take (head_dim not a multiple of
// 32 or above kMaxHeadDim, num_heads not a multiple of num_kv_heads, a group above kMaxGroup),
// naming the value.
absl::StatusOr<AttentionPlan> PlanAttention(int32_t num_rows, int32_t num_heads,
                                            int32_t num_kv_heads, int32_t head_dim, DType kv_dtype,
                                            bool allow_tiles = true);

// RIDGESERVE_CUDA_ATTENTION's value: unset, empty or "auto" lets bf16 caches run on the tiles
// (true); "rows" keeps every cache on the rows kernels (false), an escape hatch while the tiles
// are new; anything else is InvalidArgument naming the variable and the values.
absl::StatusOr<bool> TilesAllowed(const char* env_value);

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
