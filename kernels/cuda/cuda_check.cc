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

absl::StatusOr<bool> SyncLaunches(const char* env_value) {
  const std::string value = env_value == nullptr ? "" : env_value;
  if (value.empty() || value == "0") return false;
  if (value == "1") return true;
  return absl::InvalidArgumentError(
      absl::StrCat("RIDGESERVE_CUDA_SYNC_LAUNCHES must be 0 or 1, got \"", value, "\""));
}

void CheckLaunch(cudaStream_t stream, const char* file, int line) {
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) Fatal(CudaError(launched, "kernel launch", file, line));
  static const absl::StatusOr<bool> sync =
      SyncLaunches(std::getenv("RIDGESERVE_CUDA_SYNC_LAUNCHES"));
  if (!sync.ok()) Fatal(sync.status());
  if (!*sync) return;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  const cudaError_t asked = cudaStreamIsCapturing(stream, &capturing);
  if (asked != cudaSuccess) Fatal(CudaError(asked, "cudaStreamIsCapturing", file, line));
  if (capturing != cudaStreamCaptureStatusNone) return;
  const cudaError_t ran = cudaStreamSynchronize(stream);
  if (ran != cudaSuccess) {
    Fatal(CudaError(ran, "the kernel launched (RIDGESERVE_CUDA_SYNC_LAUNCHES=1)", file, line));
  }
}

}  // namespace ridgeserve::cuda
