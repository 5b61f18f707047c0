#include "kernels/backend_registry.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#if RIDGESERVE_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace ridgeserve {

std::vector<std::string_view> BuiltInBackends() {
#if RIDGESERVE_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name,
                                                       const BackendOptions& options) {
  if (name == "cpu") return CreateCpuBackend(options.num_threads, options.isa, options.activations);
  if (name == "cuda") {
#if RIDGESERVE_WITH_CUDA
    return CreateCudaBackend(options.device);
#else
    return absl::UnimplementedError(
        "the CUDA backend is not built into this binary (RIDGESERVE_CUDA=OFF, or no nvcc when it "
        "was configured)");
#endif
  }
  std::string names;
  for (std::string_view built : BuiltInBackends()) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", std::string(built));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no backend '", std::string(name), "' (built in: ", names, ")"));
}

}  // namespace ridgeserve
