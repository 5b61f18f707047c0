// The CUDA module, rs_backend_cuda.so: the CUDA backend and its NCCL communicators behind two
// entry points that kernels/backend_registry.cc finds with dlsym. Only this module links
// cudart, cuBLASLt and NCCL (why: kernels/backend_registry.h).
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "engine/parallel/nccl_communicator.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

extern "C" {

// kCudaModuleCreateBackend: CreateModuleBackendFn.
__attribute__((visibility("default"))) absl::StatusOr<std::unique_ptr<ridgeserve::Backend>>
ridgeserve_cuda_create_backend(int device) {
  return ridgeserve::CreateCudaBackend(device);
}

// kCudaModuleCreateNcclGroup: CreateNcclGroupFn.
__attribute__((visibility("default")))
absl::StatusOr<std::shared_ptr<ridgeserve::NcclCommunicatorGroup>>
ridgeserve_cuda_create_nccl_group(std::span<ridgeserve::Backend* const> backends) {
  absl::StatusOr<std::unique_ptr<ridgeserve::NcclCommunicatorGroup>> group =
      ridgeserve::NcclCommunicatorGroup::Create(backends);
  if (!group.ok()) return group.status();
  return std::shared_ptr<ridgeserve::NcclCommunicatorGroup>(std::move(*group));
}

}  // extern "C"
