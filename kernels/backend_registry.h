// The one place that knows which backends this binary has (DESIGN.md: GPU code is chosen at
// one place). Callers name a backend ("cpu", "cuda") and get the Backend interface; nothing
// above kernels/ includes a backend's own header to create one.
#ifndef RIDGESERVE_KERNELS_BACKEND_REGISTRY_H_
#define RIDGESERVE_KERNELS_BACKEND_REGISTRY_H_

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/linear.h"

namespace ridgeserve {

// Server options that reach a backend; each backend reads the fields it has.
struct BackendOptions {
  // cpu: OpenMP threads (<= 0: all hardware threads), kernel path, Linear's arithmetic.
  int num_threads = 0;
  cpu::Isa isa = cpu::BestIsa();
  cpu::Activations activations = cpu::Activations::kF32;
  // cuda: the device ordinal (tensor-parallel rank r uses device r).
  int device = 0;
};

// The backends built into this binary, in the order --backend lists them ("cpu" first).
std::vector<std::string_view> BuiltInBackends();

// The backend called `name`:
//   InvalidArgument for a name no build has (naming the built-in ones);
//   Unimplemented for "cuda" in a build without it;
//   FailedPrecondition naming the file when its module cannot be loaded;
//   FailedPrecondition "no CUDA device visible" when it is built but no device can be used.
//
// The CUDA backend lives in a module, rs_backend_cuda.so beside the executable (or the path in
// $RIDGESERVE_CUDA_MODULE), loaded on the
// first request for it: binaries never link the CUDA libraries, so a CPU server does not load
// ~1 GB of them, and their static thread-local storage (92 KiB in cuBLASLt) is not reserved in
// every thread's stack, which makes threads created with small stacks fail (civetweb's,
// behind /metrics: measured, `mg_start` returns null with cuBLASLt linked).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name,
                                                       const BackendOptions& options);

// A symbol of backend `name`'s module (loading it on first use), for what the module provides
// beside the backend (the CUDA module: NCCL communicators). Errors as CreateBackend's.
absl::StatusOr<void*> BackendModuleSymbol(std::string_view name, const char* symbol);

// The module's entry point that CreateBackend("cuda") calls.
inline constexpr char kCudaModuleCreateBackend[] = "ridgeserve_cuda_create_backend";
using CreateModuleBackendFn = absl::StatusOr<std::unique_ptr<Backend>> (*)(int device);

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_BACKEND_REGISTRY_H_
