// The CUDA sampling's host-side plan (kernels/cuda/sample_plan.h): runs on every machine.
#include "kernels/cuda/sample_plan.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ridgeserve::cuda {
namespace {

SampleSpec Spec(float temperature, int32_t top_k, float top_p) {
  SampleSpec s;
  s.temperature = temperature;
  s.top_k = top_k;
  s.top_p = top_p;
  return s;
}

TEST(SamplePlanTest, OnlyRowsWalkingInRankOrderAreSorted) {
  const int32_t vocab = 1000;
  EXPECT_FALSE(NeedsRankOrder(Spec(0.0f, 20, 0.5f), vocab));     // greedy ignores the filters
  EXPECT_FALSE(NeedsRankOrder(Spec(1.0f, 0, 1.0f), vocab));      // id order
  EXPECT_FALSE(NeedsRankOrder(Spec(1.0f, vocab, 1.0f), vocab));  // top-k over everything is off
  EXPECT_TRUE(NeedsRankOrder(Spec(1.0f, vocab - 1, 1.0f), vocab));
  EXPECT_TRUE(NeedsRankOrder(Spec(0.7f, 0, 0.95f), vocab));
  SampleSpec min_p_only = Spec(1.0f, 0, 1.0f);
  min_p_only.min_p = 0.1f;
  EXPECT_FALSE(NeedsRankOrder(min_p_only, vocab));  // min-p keeps id order
}

TEST(SamplePlanTest, SlotsAreConsecutiveSegmentsInSpecOrder) {
  const int32_t vocab = 1000;
  const std::vector<SampleSpec> specs = {Spec(0.0f, 0, 1.0f), Spec(1.0f, 5, 1.0f),
                                         Spec(1.0f, 0, 1.0f), Spec(1.0f, 0, 0.9f),
                                         Spec(1.0f, 3, 0.5f)};
  const absl::StatusOr<SamplePlan> plan = PlanSample(specs, vocab, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->sort_slot, (std::vector<int32_t>{-1, 0, -1, 1, 2}));
  EXPECT_EQ(plan->slot_spec, (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(plan->slot_offsets, (std::vector<int32_t>{0, 1000, 2000, 3000}));
}

// The upload holds each part where the plan says, so the device reads back what the host had.
TEST(SamplePlanTest, UploadHoldsEveryPartAtItsOffset) {
  std::vector<SampleSpec> specs = {Spec(1.0f, 5, 1.0f), Spec(0.0f, 0, 1.0f), Spec(0.8f, 0, 0.9f)};
  specs[1].seed = 0x0123456789abcdefull;
  specs[2].repetition_penalty = 1.2f;
  specs[2].penalty_end = 3;
  const std::vector<int32_t> penalty_ids = {4, 8, 15};
  const absl::StatusOr<SamplePlan> plan = PlanSample(specs, 100, penalty_ids.size());
  ASSERT_TRUE(plan.ok());
  std::vector<uint8_t> upload(plan->upload_bytes);
  PackSampleUpload(*plan, specs, penalty_ids, upload.data());
  EXPECT_EQ(plan->specs_offset % alignof(SampleSpec), 0u);
  for (size_t i = 0; i < specs.size(); ++i) {
    SampleSpec back;
    std::memcpy(&back, upload.data() + plan->specs_offset + i * sizeof(SampleSpec), sizeof(back));
    EXPECT_EQ(std::memcmp(&back, &specs[i], sizeof(back)), 0) << i;
  }
  auto ints = [&](size_t offset, size_t n) {
    std::vector<int32_t> v(n);
    std::memcpy(v.data(), upload.data() + offset, sizeof(int32_t) * n);
    return v;
  };
  EXPECT_EQ(ints(plan->sort_slot_offset, 3), plan->sort_slot);
  EXPECT_EQ(ints(plan->slot_spec_offset, 2), plan->slot_spec);
  EXPECT_EQ(ints(plan->slot_offsets_offset, 3), plan->slot_offsets);
  EXPECT_EQ(ints(plan->penalty_offset, 3), penalty_ids);
  EXPECT_EQ(plan->upload_bytes, plan->penalty_offset + sizeof(int32_t) * 3);
}

TEST(SamplePlanTest, RefusesMoreSortedKeysThanTheSortCounts) {
  const int32_t vocab = std::numeric_limits<int32_t>::max() / 3 + 1;
  const std::vector<SampleSpec> specs(3, Spec(1.0f, 0, 0.9f));
  EXPECT_TRUE(PlanSample(std::span(specs).first(2), vocab, 0).ok());
  const absl::StatusOr<SamplePlan> plan = PlanSample(specs, vocab, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("3 sorted rows"), std::string::npos) << plan.status();
}

TEST(SamplePlanTest, PenaltyBitmapIsABitPerIdInWholeWords) {
  EXPECT_EQ(PenaltyBitmapBytes(1), 4u);
  EXPECT_EQ(PenaltyBitmapBytes(32), 4u);
  EXPECT_EQ(PenaltyBitmapBytes(33), 8u);
  EXPECT_EQ(PenaltyBitmapBytes(49152), 6144u);    // SmolLM2
  EXPECT_EQ(PenaltyBitmapBytes(128256), 16032u);  // Llama 3
  EXPECT_EQ(PenaltyBitmapBytes(151936), 18992u);  // Qwen 2.5 / 3
}

// The limit is the device's (PrepareSampleKernels): a vocabulary over it is refused at the
// start with both sizes named, not left to fail a launch mid-request.
TEST(SamplePlanTest, RefusesAVocabularyWhoseBitmapIsOverTheDevicesSharedMemory) {
  const int32_t vocab = 151936;
  EXPECT_TRUE(CheckPenaltyBitmap(vocab, 18992).ok());
  const absl::Status over = CheckPenaltyBitmap(vocab, 18991);
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument);
  for (const char* part : {"151936 ids", "18992 bytes", "18991"}) {
    EXPECT_NE(over.message().find(part), std::string::npos) << part << ": " << over;
  }
}

}  // namespace
}  // namespace ridgeserve::cuda
