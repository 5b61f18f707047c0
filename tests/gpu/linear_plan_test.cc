// RIDGESERVE_CUDA_GEMM_REFERENCE_N (kernels/cuda/linear_plan.h), on any machine.
#include "kernels/cuda/linear_plan.h"

#include <gtest/gtest.h>

#include <string>

namespace ridgeserve::cuda {
namespace {

TEST(GemmReferenceNTest, DefaultOrAPositiveBatchElseNamesTheVariable) {
  EXPECT_EQ(*GemmReferenceN(nullptr), kReferenceN);
  EXPECT_EQ(*GemmReferenceN(""), kReferenceN);
  EXPECT_EQ(*GemmReferenceN("16"), 16);
  EXPECT_EQ(*GemmReferenceN("1"), 1);
  EXPECT_EQ(*GemmReferenceN("65536"), 65536);
  for (const char* bad : {"0", "-8", "65537", "16x", "sixteen", "1.5"}) {
    const absl::StatusOr<int64_t> n = GemmReferenceN(bad);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(n.status().message().find(std::string("RIDGESERVE_CUDA_GEMM_REFERENCE_N=") + bad),
              std::string::npos)
        << n.status();
  }
}

}  // namespace
}  // namespace ridgeserve::cuda
