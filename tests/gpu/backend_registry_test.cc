// The backend registry: what this build lists and what each name gives, with and without a
// GPU (without one, "cuda" must fail with the one clear error the server prints).
#include "kernels/backend_registry.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"

namespace ridgeserve {
namespace {

TEST(BackendRegistryTest, ListsCpuAndCuda) {
  const std::vector<std::string_view> names = BuiltInBackends();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "cpu");
  EXPECT_NE(std::find(names.begin(), names.end(), "cuda"), names.end());
}

TEST(BackendRegistryTest, CpuAlwaysWorksAndUnknownNamesAreRefused) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateBackend("cpu", {.num_threads = 1});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->name(), "cpu");
  absl::StatusOr<std::unique_ptr<Backend>> bad = CreateBackend("tpu", {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cpu, cuda"), std::string::npos) << bad.status();
}

TEST(BackendRegistryTest, CudaWithoutADeviceIsOneClearError) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateBackend("cuda", {});
  if (CudaDeviceCount() == 0) {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(cuda.status().message().find("no CUDA device visible"), std::string::npos)
        << cuda.status();
  } else {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_EQ((*cuda)->name(), "cuda");
    EXPECT_EQ((*cuda)->DefaultKvCacheDType(), DType::kBF16);
  }
}

}  // namespace
}  // namespace ridgeserve
