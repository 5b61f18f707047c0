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
//   FailedPrecondition "no CUDA device visible" when it is built but no device can be used.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name,
                                                       const BackendOptions& options);

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_BACKEND_REGISTRY_H_
