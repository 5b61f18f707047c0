// The CUDA attention's host-side plan (kernels/cuda/attention_plan.h): runs on every machine,
// with or without a GPU. The partition and slot layout of a row must cover its context exactly
// once, in order, in at most kSplitSlots slots, and depend on its position alone.
#include "kernels/cuda/attention_plan.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/op_scratch.h"

namespace ridgeserve::cuda {
namespace {

TEST(AttentionPlanTest, SlotsCoverEveryPartitionOnceInOrder) {
  for (int32_t pos : {0, 1, 31, 255, 256, 257, 4095, 4096, 4097, 8191, 32767, 131071, 1 << 20}) {
    const int parts = NumPartitions(pos);
    EXPECT_EQ(parts, pos / kPartition + 1);
    EXPECT_GE(int64_t{parts} * kPartition, int64_t{pos} + 1);
    const int used = SlotsUsed(pos);
    ASSERT_GE(used, 1) << pos;
    ASSERT_LE(used, kSplitSlots) << pos;
    int next = 0;
    for (int z = 0; z < kSplitSlots; ++z) {
      const int b = SlotBegin(pos, z), e = SlotEnd(pos, z);
      if (z < used) {
        EXPECT_EQ(b, next) << "pos " << pos << " slot " << z;
        EXPECT_GT(e, b) << "pos " << pos << " slot " << z << " is empty but counted";
        EXPECT_LE(e - b, PartitionsPerSlot(pos));
        next = e;
      } else {
        EXPECT_EQ(b, e) << "pos " << pos << " slot " << z << " past SlotsUsed is not empty";
      }
    }
    EXPECT_EQ(next, parts) << pos;
  }
}

TEST(AttentionPlanTest, ShortContextsUseOnePartitionPerSlot) {
  EXPECT_EQ(PartitionsPerSlot(kPartition * kSplitSlots - 1), 1);
  EXPECT_EQ(SlotsUsed(kPartition * kSplitSlots - 1), kSplitSlots);
  EXPECT_EQ(PartitionsPerSlot(kPartition * kSplitSlots), 2);
  EXPECT_EQ(SlotsUsed(kPartition * kSplitSlots), 9);  // 17 partitions in slots of 2
}

TEST(AttentionPlanTest, KernelChoiceAndWorkspace) {
  absl::StatusOr<AttentionPlan> decode = PlanAttention(64, 32, 8, 128, DType::kF16);
  ASSERT_TRUE(decode.ok());
  EXPECT_TRUE(decode->split);
  EXPECT_EQ(decode->threads, 4 * 32);
  EXPECT_EQ(decode->workspace_bytes, sizeof(float) * 64 * 32 * kSplitSlots * (2 + 128));
  EXPECT_EQ(decode->shared_bytes, AttentionSharedBytes(4, 128));

  absl::StatusOr<AttentionPlan> prefill = PlanAttention(kSplitMaxRows + 1, 9, 3, 64, DType::kF32);
  ASSERT_TRUE(prefill.ok());
  EXPECT_FALSE(prefill->split);
  EXPECT_EQ(prefill->workspace_bytes, 0u);

  EXPECT_FALSE(prefill->tiles);

  // Largest supported shape fits an H100/H200 CTA's shared memory (227 KiB opt-in).
  EXPECT_LE(AttentionSharedBytes(kMaxGroup, kMaxHeadDim), size_t{227} << 10);
}

// A BF16 cache with head_dim 64 or 128 runs on the tiles, any other cache or head dim on rows.
TEST(AttentionPlanTest, TilesForABf16CacheAndTheirHeadDims) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int32_t head_dim : {32, 64, 96, 128, 256}) {
      absl::StatusOr<AttentionPlan> plan = PlanAttention(16, 32, 8, head_dim, dtype);
      ASSERT_TRUE(plan.ok());
      EXPECT_EQ(plan->tiles, dtype == DType::kBF16 && (head_dim == 64 || head_dim == 128))
          << "head_dim " << head_dim;
    }
  }
}

// RIDGESERVE_CUDA_ATTENTION=rows keeps a bf16 cache on the rows kernels; bad values are named.
TEST(AttentionPlanTest, RowsKernelsOnRequest) {
  EXPECT_TRUE(*TilesAllowed(nullptr));
  EXPECT_TRUE(*TilesAllowed(""));
  EXPECT_TRUE(*TilesAllowed("auto"));
  EXPECT_FALSE(*TilesAllowed("rows"));
  const absl::StatusOr<bool> bad = TilesAllowed("flash");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("RIDGESERVE_CUDA_ATTENTION=flash"), std::string::npos);
  absl::StatusOr<AttentionPlan> rows = PlanAttention(16, 32, 8, 128, DType::kBF16, false);
  ASSERT_TRUE(rows.ok());
  EXPECT_FALSE(rows->tiles);
  EXPECT_EQ(rows->threads, 4 * 32);
  EXPECT_EQ(rows->workspace_bytes, sizeof(float) * 16 * 32 * kSplitSlots * (2 + 128));
}

TEST(AttentionPlanTest, TileWorkspaceGridAndSharedMemory) {
  // Decode, Llama-3.1-8B heads: split-KV states, then the tile list 16-byte aligned.
  absl::StatusOr<AttentionPlan> decode = PlanAttention(64, 32, 8, 128, DType::kBF16);
  ASSERT_TRUE(decode.ok());
  EXPECT_TRUE(decode->tiles);
  EXPECT_TRUE(decode->split);
  EXPECT_EQ(decode->threads, kTileThreads);
  EXPECT_EQ(decode->tile_rows, 16);  // 64 (row, head) pairs of a group of 4
  const size_t states = sizeof(float) * 64 * 32 * kSplitSlots * (2 + 128);
  EXPECT_EQ(decode->tile_list_offset, states);
  EXPECT_EQ(decode->workspace_bytes, states + sizeof(int32_t) * (2 + 64));
  EXPECT_EQ(decode->grid_tiles, 64);  // up to one tile a row
  EXPECT_EQ(decode->shared_bytes, TileSharedBytes(128, /*walk=*/false));

  // An 8K prefill of SmolLM2's heads (group 3: tiles of 21 rows, 63 pairs): the walker, the
  // list alone, and 391 + kTileExtraCtas CTAs along it.
  absl::StatusOr<AttentionPlan> prefill = PlanAttention(8192, 9, 3, 64, DType::kBF16);
  ASSERT_TRUE(prefill.ok());
  EXPECT_FALSE(prefill->split);
  EXPECT_EQ(prefill->tile_rows, 21);
  EXPECT_EQ(prefill->tile_list_offset, 0u);
  EXPECT_EQ(prefill->workspace_bytes, sizeof(int32_t) * (2 + 8192));
  EXPECT_EQ(prefill->grid_tiles, (8192 + 20) / 21 + kTileExtraCtas);
  EXPECT_EQ(prefill->shared_bytes, TileSharedBytes(64, /*walk=*/true));

  // The list starts right after the states, 16-byte aligned: 3 rows x 2 heads x 16 slots x 66.
  absl::StatusOr<AttentionPlan> odd = PlanAttention(3, 2, 1, 64, DType::kBF16);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->tile_list_offset, sizeof(float) * 3 * 2 * kSplitSlots * 66);
  EXPECT_EQ(odd->tile_list_offset % 16, 0u);

  // The walker's two states at head_dim 128 fit the 227 KiB a CTA may opt into, twice per SM.
  EXPECT_EQ(TileSharedBytes(128, true), 2u * (64 * 136 + 128 * 72) + 2 * 4 * 64 * 136);
  EXPECT_LE(2 * TileSharedBytes(128, true), size_t{228} << 10);
}

// PlanOpScratch's answer for shapes it takes (a failure fails the test, with zeros).
OpScratch Planned(const OpShapes& shapes) {
  absl::StatusOr<OpScratch> ops = PlanOpScratch(shapes);
  EXPECT_TRUE(ops.ok()) << ops.status();
  return ops.value_or(OpScratch{});
}

// The ops' scratch Backend::ReserveOps allocates and the memory plan counts, from the shape:
// Llama-3.1-8B at 2048 rows (f32 Linear inputs, whose bf16 copy is scratch, are the hidden
// state's 4096 features: the MLP's 14,336 come as bf16 already; every output width is a multiple
// of 4, so no padded output).
TEST(OpScratchTest, LinearInputAndTheLargestAttentionWorkspace) {
  const OpShapes bf16{.rows = 2048,
                      .linear_ks = {4096, 4096, 14336},
                      .f32_linear_k = 4096,
                      .linear_widths = {6144, 4096, 28672, 128256, 2048},
                      .num_heads = 32,
                      .num_kv_heads = 8,
                      .head_dim = 128,
                      .kv_dtype = DType::kBF16};
  absl::StatusOr<OpScratch> ops = PlanOpScratch(bf16);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->linear_input_bytes, size_t{2048} * 4096 * 2);
  EXPECT_EQ(ops->linear_output_bytes, 0u);
  // The split form at 128 rows (states, then its tile list) outweighs the walker's list alone.
  const size_t states = sizeof(float) * 128 * 32 * kSplitSlots * (2 + 128);
  EXPECT_EQ(ops->attention_bytes, states + sizeof(int32_t) * (2 + 128));
  EXPECT_EQ(ops->total(), ops->linear_input_bytes + ops->attention_bytes);
  // An f16 cache runs the rows kernels: states, no list. Fewer rows than kSplitMaxRows: theirs.
  OpShapes f16 = bf16;
  f16.kv_dtype = DType::kF16;
  EXPECT_EQ(Planned(f16).attention_bytes, states);
  f16.rows = 16;
  EXPECT_EQ(Planned(f16).attention_bytes, sizeof(float) * 16 * 32 * kSplitSlots * 130);
  OpShapes odd = bf16;
  odd.head_dim = 80;
  EXPECT_EQ(PlanOpScratch(odd).status().code(), absl::StatusCode::kInvalidArgument);
}

// A width that is not a multiple of 4 (a vocabulary of 32,001) computes through rows padded to
// 32,004 floats, kPaddedOutputRows of them at most; fewer rows a step, fewer rows of scratch.
TEST(OpScratchTest, PaddedOutputForTheWidestUnalignedWidth) {
  OpShapes shapes{.rows = 2048,
                  .linear_ks = {4096, 4096, 11008},
                  .linear_widths = {12288, 4096, 22016, 32001, 8190, 8192},
                  .num_heads = 32,
                  .num_kv_heads = 32,
                  .head_dim = 128,
                  .kv_dtype = DType::kBF16};
  absl::StatusOr<OpScratch> ops = PlanOpScratch(shapes);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->linear_output_bytes, sizeof(float) * 256 * 32004);
  EXPECT_EQ(ops->total(),
            ops->linear_input_bytes + ops->linear_output_bytes + ops->attention_bytes);
  shapes.rows = 16;
  EXPECT_EQ(Planned(shapes).linear_output_bytes, sizeof(float) * 16 * 32004);
  shapes.linear_widths = {32002};
  EXPECT_EQ(Planned(shapes).linear_output_bytes, sizeof(float) * 16 * 32004);
}

TEST(AttentionPlanTest, RefusesShapesTheKernelsDoNotTake) {
  EXPECT_EQ(PlanAttention(1, 9, 3, 80, DType::kBF16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanAttention(1, 9, 3, 512, DType::kBF16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanAttention(1, 10, 3, 64, DType::kBF16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanAttention(1, 64, 2, 64, DType::kBF16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PlanAttention(1, 32, 2, 64, DType::kBF16).ok());  // a group of 16
}

}  // namespace
}  // namespace ridgeserve::cuda
