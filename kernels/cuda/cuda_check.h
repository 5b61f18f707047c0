// Checks for CUDA runtime and cuBLAS calls that carry the file and line of the call.
//
// Two kinds, because Backend v2's ops return void (kernels/backend.h):
//   CUDA_RETURN_IF_ERROR / CUBLAS_RETURN_IF_ERROR, where a caller gets an absl::Status (setup,
//     Alloc, PackWeight): the status names the call, the error and file:line;
//   CUDA_CHECK / CUBLAS_CHECK, inside ops and launchers: a failure there is a device fault or
//     a programmer error with no status to carry it, so it logs one line (call, error,
//     file:line) and aborts rather than letting later steps compute on garbage or hang.
// Host-only: no device code, safe to include from .cc and .cu files.
#ifndef RIDGESERVE_KERNELS_CUDA_CUDA_CHECK_H_
#define RIDGESERVE_KERNELS_CUDA_CUDA_CHECK_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ridgeserve::cuda {

// "<call>: <error name> (<error string>) at <file>:<line>".
absl::Status CudaError(cudaError_t error, const char* call, const char* file, int line);
absl::Status CublasError(cublasStatus_t status, const char* call, const char* file, int line);
// Logs the status to stderr and aborts.
[[noreturn]] void Fatal(const absl::Status& status);
// CUDA_CHECK_LAUNCH's work.
void CheckLaunch(cudaStream_t stream, const char* file, int line);
// RIDGESERVE_CUDA_SYNC_LAUNCHES's value: unset, empty or "0" is off (false), "1" on;
// InvalidArgument naming the variable otherwise.
absl::StatusOr<bool> SyncLaunches(const char* env_value);

}  // namespace ridgeserve::cuda

#define CUDA_RETURN_IF_ERROR(call)                                                     \
  do {                                                                                 \
    const cudaError_t rs_cuda_error_ = (call);                                         \
    if (rs_cuda_error_ != cudaSuccess) {                                               \
      return ::ridgeserve::cuda::CudaError(rs_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(call)                                                        \
  do {                                                                                      \
    const cublasStatus_t rs_cublas_status_ = (call);                                        \
    if (rs_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                       \
      return ::ridgeserve::cuda::CublasError(rs_cublas_status_, #call, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

#define CUDA_CHECK(call)                                                             \
  do {                                                                               \
    const cudaError_t rs_cuda_error_ = (call);                                       \
    if (rs_cuda_error_ != cudaSuccess) {                                             \
      ::ridgeserve::cuda::Fatal(                                                     \
          ::ridgeserve::cuda::CudaError(rs_cuda_error_, #call, __FILE__, __LINE__)); \
    }                                                                                \
  } while (0)

#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    const cublasStatus_t rs_cublas_status_ = (call);                                      \
    if (rs_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                     \
      ::ridgeserve::cuda::Fatal(                                                          \
          ::ridgeserve::cuda::CublasError(rs_cublas_status_, #call, __FILE__, __LINE__)); \
    }                                                                                     \
  } while (0)

// After a kernel launch on `stream`: launch-configuration errors surface here, at the
// launcher's line. A fault inside the kernel surfaces at the next wait for the device, naming
// that call; for triage, RIDGESERVE_CUDA_SYNC_LAUNCHES=1 waits after every launch on a stream
// that is not being recorded, so the fault names the launcher's line (slow: tests/gpu/run.sh
// reruns a test that crashed its process this way).
#define CUDA_CHECK_LAUNCH(stream) ::ridgeserve::cuda::CheckLaunch((stream), __FILE__, __LINE__)

#endif  // RIDGESERVE_KERNELS_CUDA_CUDA_CHECK_H_
