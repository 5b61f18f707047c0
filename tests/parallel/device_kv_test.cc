// A server's memory on a GPU (--gpu_memory_utilization, --kv_cache_tokens), on the ~27B
// Qwen3-style config.json of memory_plan_test.py: CheckDeviceFit before the model loads and
// DeviceKvTokens after. The expectations are written from the shape here (a bf16 token of KV is
// 2 x 60 layers x 8 KV heads x 128 x 2 bytes; the weights about 56 GB of bf16), not from the
// planner's sums.
#include <gtest/gtest.h>

#include <string>

#include "engine/model/config.h"
#include "engine/parallel/memory_plan.h"

namespace ridgeserve {
namespace {

constexpr double kKvBytesPerToken = 2.0 * 60 * 8 * 128 * 2;  // 245,760
constexpr double kWeights = 56e9;
constexpr size_t kH200 = size_t{141} * 1000 * 1000 * 1000;
constexpr int64_t kBlock = 16;

ModelConfig Qwen27B() {
  absl::StatusOr<ModelConfig> config =
      ReadModelConfig(std::string(RIDGESERVE_TEST_DATA) + "/qwen3_27b_config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

MemoryPlanRequest Request(double utilization, int64_t min_kv_tokens = 0) {
  MemoryPlanRequest request;
  request.memory_utilization = utilization;
  request.min_kv_tokens = min_kv_tokens;
  return request;
}

// On an H200 after loading: `used` bytes in use (the weights among them).
int64_t Tokens(double used, double utilization, double other_bytes = 0, int64_t max_tokens = 0) {
  const DeviceMemory memory{kH200 - static_cast<size_t>(used), kH200};
  absl::StatusOr<int64_t> tokens =
      DeviceKvTokens(Qwen27B(), Request(utilization), memory, other_bytes, max_tokens);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.value_or(-1);
}

TEST(DeviceMemoryTest, KvCacheIsWholeBlocksOfWhatTheLoadedWeightsLeave) {
  const int64_t tokens = Tokens(kWeights, 0.9);
  EXPECT_EQ(tokens % kBlock, 0);
  // 126.9 GB usable less 56 GB of weights, under 2.5 GB of workspace and reserve, the sampling
  // keys (two buffers of 64 rows x 151,936 ids x 8 bytes) and penalty ids (64 contexts of
  // 40,960), and the ops' scratch: Linear's bf16
  // input for 2048 rows of the widest input (24,576 MLP features) and attention's split-KV
  // states for 128 rows x 40 query heads x 16 slots x (2 + 128) floats, with its tile list; the
  // step's metadata holds 64 block tables of the 40,960-token context (2,560 ints each).
  const double sampling = 2.0 * 64 * 151936 * 8 + 4.0 * 64 * 40960;
  const double ops = 2048.0 * 24576 * 2 + 128.0 * 40 * 16 * 130 * 4 + 16 * 1024;
  const double meta = 4.0 * (5 * 2048 + 2 * 64 + 1 + 64 * 2560);
  EXPECT_GT(tokens * kKvBytesPerToken, 126.9e9 - kWeights - 2.5e9 - sampling - ops - meta);
  EXPECT_LT(tokens * kKvBytesPerToken, 126.9e9 - kWeights);
}

TEST(DeviceMemoryTest, MemoryInUseAndStillToAllocateComeOffTheCacheTokenForToken) {
  const int64_t base = Tokens(kWeights, 0.9);
  EXPECT_NEAR(static_cast<double>(base - Tokens(kWeights + 10e9, 0.9)), 10e9 / kKvBytesPerToken,
              kBlock);
  EXPECT_NEAR(static_cast<double>(base - Tokens(kWeights, 0.9, /*other_bytes=*/3e9)),
              3e9 / kKvBytesPerToken, kBlock);
}

TEST(DeviceMemoryTest, UtilizationScalesTheCache) {
  EXPECT_NEAR(static_cast<double>(Tokens(kWeights, 0.9) - Tokens(kWeights, 0.8)),
              0.1 * kH200 / kKvBytesPerToken, kBlock);
}

TEST(DeviceMemoryTest, KvCacheTokensIsAnUpperBound) {
  EXPECT_EQ(Tokens(kWeights, 0.9, 0, /*max_tokens=*/100000), 100000);
  EXPECT_EQ(Tokens(kWeights, 0.9, 0, /*max_tokens=*/int64_t{1} << 40), Tokens(kWeights, 0.9));
}

TEST(DeviceMemoryTest, TooLittleRoomAfterLoadingNamesTheNumbers) {
  // 110 GB in use leaves 16.9 GB of the 126.9: under one full context (40960 tokens, 10 GB)
  // once 10 GB more is still to allocate.
  const absl::StatusOr<int64_t> tokens =
      DeviceKvTokens(Qwen27B(), Request(0.9), {kH200 - size_t{110'000'000'000}, kH200}, 10e9, 0);
  ASSERT_EQ(tokens.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(tokens.status().message());
  EXPECT_NE(message.find("need 40960"), std::string::npos) << message;
  EXPECT_NE(message.find("31.00 GB of 141.00 GB free"), std::string::npos) << message;
}

TEST(DeviceMemoryTest, AModelThatDoesNotFitIsRefusedBeforeLoading) {
  const size_t l40 = size_t{48} * 1000 * 1000 * 1000;
  const absl::Status fits = CheckDeviceFit(Qwen27B(), Request(0.9), {l40, l40});
  ASSERT_EQ(fits.code(), absl::StatusCode::kResourceExhausted);
  const std::string message(fits.message());
  EXPECT_NE(message.find("does not fit"), std::string::npos) << message;
  EXPECT_NE(message.find("48.00 GB of 48.00 GB free"), std::string::npos) << message;
  EXPECT_TRUE(CheckDeviceFit(Qwen27B(), Request(0.9), {kH200, kH200}).ok());
}

TEST(DeviceMemoryTest, ASmallerKvCacheTokensLetsAModelFitWithoutAFullContext) {
  // 72 GB at 0.9: 64.8 GB holds the weights, workspace, reserve and 8192 tokens of KV (2 GB),
  // not a full context of 40960 (10 GB).
  const size_t device = size_t{72} * 1000 * 1000 * 1000;
  EXPECT_EQ(CheckDeviceFit(Qwen27B(), Request(0.9), {device, device}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      CheckDeviceFit(Qwen27B(), Request(0.9, /*min_kv_tokens=*/8192), {device, device}).ok());
}

TEST(DeviceMemoryTest, NothingLeftWhenOthersHoldMoreThanTheShare) {
  // Others hold 85% of the device; at utilization 0.8 this server may use nothing.
  const DeviceMemory memory{kH200 * 15 / 100, kH200};
  EXPECT_EQ(CheckDeviceFit(Qwen27B(), Request(0.8), memory).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(DeviceKvTokens(Qwen27B(), Request(0.8), memory, 0, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// What a draft takes beside the target (the server subtracts it from the KV cache): self:K only
// its cache of K layers of the target's KV heads; a draft with weights of its own also its own
// activations, logit rows and step metadata, but not the sampling and ops' scratch it shares
// with the 27B target (the same vocabulary and context, smaller ops). Whole blocks of cache.
TEST(DeviceMemoryTest, ADraftTakesItsCacheAndItsOwnWorkspaceNotTheSharedScratch) {
  const ModelConfig target = Qwen27B();
  absl::StatusOr<double> self =
      PlanDraftBytes(target, target, 12, 32001, /*own_weights=*/false, Request(0.9));
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_EQ(*self, 32016.0 * 2 * 12 * 8 * 128 * 2);
  ModelConfig small = target;
  small.name = "draft";
  small.num_layers = 4;
  small.hidden = 1024;
  small.num_heads = 16;
  small.num_kv_heads = 4;
  small.head_dim = 64;
  small.ffn = 2816;
  absl::StatusOr<double> own = PlanDraftBytes(target, small, 4, 32000, true, Request(0.9));
  ASSERT_TRUE(own.ok()) << own.status();
  const double cache = 32000.0 * 2 * 4 * 4 * 64 * 2;
  // 2048 rows of f32 activations: 4 hidden, QKV (1024 + 2 x 256), attention out (1024) and
  // 3 x 2816 MLP features; 64 logit rows of 151,936; metadata (5 a row, 2 a sequence and one,
  // and 64 block tables of 2,560).
  const double activations = 4.0 * (2048 * (4 * 1024 + 1536 + 1024 + 3 * 2816) + 64 * 151936);
  const double meta = 4.0 * (5 * 2048 + 2 * 64 + 1 + 64 * 2560);
  EXPECT_DOUBLE_EQ(*own, cache + activations + meta);
}

// A shape the CUDA kernels do not take is refused by name, not planned.
TEST(DeviceMemoryTest, AShapeTheCudaKernelsDoNotTakeIsRefusedNamingTheBackend) {
  ModelConfig config = Qwen27B();
  config.head_dim = 80;
  const absl::Status fit = CheckDeviceFit(config, Request(0.9), {kH200, kH200});
  EXPECT_EQ(fit.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fit.message().find("qwen3-style-27b cannot run on the CUDA backend"), std::string::npos)
      << fit;
  EXPECT_NE(fit.message().find("head_dim 80"), std::string::npos) << fit;
}

TEST(DeviceMemoryTest, UtilizationOutsideZeroToOneIsRefused) {
  for (double u : {0.0, -0.5, 1.5}) {
    EXPECT_EQ(CheckDeviceFit(Qwen27B(), Request(u), {kH200, kH200}).code(),
              absl::StatusCode::kInvalidArgument)
        << u;
    EXPECT_EQ(DeviceKvTokens(Qwen27B(), Request(u), {kH200, kH200}, 0, 0).status().code(),
              absl::StatusCode::kInvalidArgument)
        << u;
  }
}

}  // namespace
}  // namespace ridgeserve
