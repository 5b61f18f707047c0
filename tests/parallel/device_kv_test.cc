// DeviceKvTokens: the KV cache a server on a GPU gets from the device's memory before the model
// loads (--gpu_memory_utilization, --kv_cache_tokens), on the ~27B Qwen3-style config.json of
// memory_plan_test.py. The expectations are written from the shape here (a bf16 token of KV is
// 2 x 60 layers x 8 KV heads x 128 x 2 bytes), not from the planner's sums.
#include <gtest/gtest.h>

#include <string>

#include "engine/model/config.h"
#include "engine/parallel/memory_plan.h"

namespace ridgeserve {
namespace {

constexpr double kKvBytesPerToken = 2.0 * 60 * 8 * 128 * 2;  // 245,760
constexpr size_t kH200 = size_t{141} * 1000 * 1000 * 1000;
constexpr int64_t kBlock = 16;

ModelConfig Qwen27B() {
  absl::StatusOr<ModelConfig> config =
      ReadModelConfig(std::string(RIDGESERVE_TEST_DATA) + "/qwen3_27b_config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

MemoryPlanRequest Request(double utilization) {
  MemoryPlanRequest request;
  request.memory_utilization = utilization;
  request.min_kv_tokens = 4096;
  return request;
}

int64_t Tokens(size_t free_bytes, double utilization, int64_t max_tokens = 0) {
  absl::StatusOr<int64_t> tokens =
      DeviceKvTokens(Qwen27B(), Request(utilization), {free_bytes, kH200}, max_tokens);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.value_or(-1);
}

TEST(DeviceKvTokensTest, WholeBlocksOfWhatTheWeightsLeave) {
  const int64_t tokens = Tokens(kH200, 0.9);
  EXPECT_EQ(tokens % kBlock, 0);
  // 27B parameters of bf16 (~55 GB) leave a few tens of GB of the 126.9 GB usable.
  EXPECT_GT(tokens * kKvBytesPerToken, 40e9);
  EXPECT_LT(tokens * kKvBytesPerToken, 126.9e9 - 50e9);
}

TEST(DeviceKvTokensTest, OtherProcessesMemoryComesOffTheCache) {
  const double others = 10e9;
  const int64_t all = Tokens(kH200, 0.9);
  const int64_t shared = Tokens(kH200 - static_cast<size_t>(others), 0.9);
  EXPECT_NEAR(static_cast<double>(all - shared), others / kKvBytesPerToken, kBlock);
}

TEST(DeviceKvTokensTest, UtilizationScalesTheCache) {
  const int64_t high = Tokens(kH200, 0.9), low = Tokens(kH200, 0.8);
  EXPECT_NEAR(static_cast<double>(high - low), 0.1 * kH200 / kKvBytesPerToken, kBlock);
}

TEST(DeviceKvTokensTest, KvCacheTokensIsAnUpperBound) {
  EXPECT_EQ(Tokens(kH200, 0.9, /*max_tokens=*/100000), 100000);
  EXPECT_EQ(Tokens(kH200, 0.9, /*max_tokens=*/int64_t{1} << 40), Tokens(kH200, 0.9));
}

TEST(DeviceKvTokensTest, AModelThatDoesNotFitNamesTheDevicesMemory) {
  const size_t l40 = size_t{48} * 1000 * 1000 * 1000;
  const absl::StatusOr<int64_t> tokens =
      DeviceKvTokens(Qwen27B(), Request(0.9), {l40, l40}, /*max_tokens=*/0);
  ASSERT_EQ(tokens.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(tokens.status().message());
  EXPECT_NE(message.find("does not fit"), std::string::npos) << message;
  EXPECT_NE(message.find("48.00 GB of 48.00 GB free"), std::string::npos) << message;
}

TEST(DeviceKvTokensTest, NothingLeftWhenOthersHoldMoreThanTheShare) {
  // Others hold 85% of the device; at utilization 0.8 this server may use nothing.
  const absl::StatusOr<int64_t> tokens =
      DeviceKvTokens(Qwen27B(), Request(0.8), {kH200 * 15 / 100, kH200}, 0);
  ASSERT_EQ(tokens.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(tokens.status().message()).find("nothing"), std::string::npos)
      << tokens.status();
}

TEST(DeviceKvTokensTest, UtilizationOutsideZeroToOneIsRefused) {
  for (double u : {0.0, -0.5, 1.5}) {
    EXPECT_EQ(DeviceKvTokens(Qwen27B(), Request(u), {kH200, kH200}, 0).status().code(),
              absl::StatusCode::kInvalidArgument)
        << u;
  }
}

}  // namespace
}  // namespace ridgeserve
