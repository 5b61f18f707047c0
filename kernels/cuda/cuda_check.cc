#include "kernels/cuda/cuda_check.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace ridgeserve::cuda {

absl::Status CudaError(cudaError_t error, const char* call, const char* file, int line) {
  const std::string message = absl::StrCat(call, ": ", cudaGetErrorName(error), " (",
                                           cudaGetErrorString(error), ") at ", file, ":", line);
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status CublasError(cublasStatus_t status, const char* call, const char* file, int line) {
  const std::string message =
      absl::StrCat(call, ": ", cublasLtGetStatusName(status), " (", cublasLtGetStatusString(status),
                   ") at ", file, ":", line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return absl::UnimplementedError(message);
  return absl::InternalError(message);
}

void Fatal(const absl::Status& status) {
  std::fprintf(stderr, "ridgeserve: fatal CUDA error: %s\n", std::string(status.message()).c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ridgeserve::cuda
