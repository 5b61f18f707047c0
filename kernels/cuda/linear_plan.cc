#include "kernels/cuda/linear_plan.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ridgeserve::cuda {

absl::StatusOr<int64_t> GemmReferenceN(const char* env_value) {
  const std::string value = env_value == nullptr ? "" : env_value;
  if (value.empty()) return kReferenceN;
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 1 || n > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("RIDGESERVE_CUDA_GEMM_REFERENCE_N=", value,
                                                   ": want an integer in [1, 65536]"));
  }
  return n;
}

}  // namespace ridgeserve::cuda
