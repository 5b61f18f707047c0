// The CUDA attention's host-side plan (kernels/cuda/attention_plan.h): runs on every machine,
// with or without a GPU. The partition and slot layout of a row must cover its context exactly
// once, in order, in at most kSplitSlots slots, and depend on its position alone.
#include "kernels/cuda/attention_plan.h"

#include <cstdint>

#include "gtest/gtest.h"

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
  absl::StatusOr<AttentionPlan> decode = PlanAttention(64, 32, 8, 128);
  ASSERT_TRUE(decode.ok());
  EXPECT_TRUE(decode->split);
  EXPECT_EQ(decode->threads, 4 * 32);
  EXPECT_EQ(decode->workspace_bytes, sizeof(float) * 64 * 32 * kSplitSlots * (2 + 128));
  EXPECT_EQ(decode->shared_bytes, AttentionSharedBytes(4, 128));

  absl::StatusOr<AttentionPlan> prefill = PlanAttention(kSplitMaxRows + 1, 9, 3, 64);
  ASSERT_TRUE(prefill.ok());
  EXPECT_FALSE(prefill->split);
  EXPECT_EQ(prefill->workspace_bytes, 0u);

  // Largest supported shape fits an H100/H200 CTA's shared memory (227 KiB opt-in).
  EXPECT_LE(AttentionSharedBytes(kMaxGroup, kMaxHeadDim), size_t{227} << 10);
}

TEST(AttentionPlanTest, RefusesShapesTheKernelsDoNotTake) {
  EXPECT_EQ(PlanAttention(1, 9, 3, 80).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanAttention(1, 9, 3, 512).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanAttention(1, 10, 3, 64).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanAttention(1, 64, 2, 64).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PlanAttention(1, 32, 2, 64).ok());  // a group of 16
}

}  // namespace
}  // namespace ridgeserve::cuda
