// The CUDA error helpers' host side (kernels/cuda/cuda_check.h): no device needed, so these run
// in every CUDA build.
#include "kernels/cuda/cuda_check.h"

#include <string>

#include "gtest/gtest.h"

namespace ridgeserve::cuda {
namespace {

TEST(CudaCheckTest, AnErrorNamesTheCallTheErrorAndTheLine) {
  const absl::Status s = CudaError(cudaErrorIllegalAddress, "cudaStreamSynchronize(s)", "f.cc", 12);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(std::string(s.message()),
            "cudaStreamSynchronize(s): cudaErrorIllegalAddress (an illegal memory access was "
            "encountered) at f.cc:12");
  EXPECT_EQ(CudaError(cudaErrorMemoryAllocation, "cudaMalloc", "f.cc", 1).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(CudaCheckTest, SyncLaunchesTakesZeroOrOne) {
  EXPECT_FALSE(*SyncLaunches(nullptr));
  EXPECT_FALSE(*SyncLaunches(""));
  EXPECT_FALSE(*SyncLaunches("0"));
  EXPECT_TRUE(*SyncLaunches("1"));
  const absl::StatusOr<bool> bad = SyncLaunches("yes");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("RIDGESERVE_CUDA_SYNC_LAUNCHES"), std::string::npos);
  EXPECT_NE(bad.status().message().find("\"yes\""), std::string::npos);
}

}  // namespace
}  // namespace ridgeserve::cuda
