#include "kernels/backend_registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"

namespace ridgeserve {
namespace {

#if RIDGESERVE_WITH_CUDA
// rs_backend_cuda.so: $RIDGESERVE_CUDA_MODULE, else beside the executable. Loaded once, never
// unloaded (backends it made may live until exit).
absl::StatusOr<void*> CudaModule() {
  static std::once_flag once;
  static absl::StatusOr<void*> handle = absl::UnknownError("not loaded");
  std::call_once(once, [] {
    std::string path;
    if (const char* env = std::getenv("RIDGESERVE_CUDA_MODULE"); env != nullptr && *env) {
      path = env;
    } else {
      char exe[PATH_MAX];
      const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe));
      if (n <= 0 || n == static_cast<ssize_t>(sizeof(exe))) {
        handle = absl::FailedPreconditionError(
            "cannot find the CUDA backend module: /proc/self/exe does not resolve (set "
            "RIDGESERVE_CUDA_MODULE)");
        return;
      }
      path = std::string(exe, n);
      path = path.substr(0, path.rfind('/') + 1) + "rs_backend_cuda.so";
    }
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      handle = absl::FailedPreconditionError(
          absl::StrCat("cannot load the CUDA backend module ", path, ": ", dlerror()));
    } else {
      handle = h;
    }
  });
  return handle;
}
#endif

}  // namespace

absl::StatusOr<void*> BackendModuleSymbol(std::string_view name, const char* symbol) {
#if RIDGESERVE_WITH_CUDA
  if (name == "cuda") {
    absl::StatusOr<void*> module = CudaModule();
    if (!module.ok()) return module.status();
    void* address = dlsym(*module, symbol);
    if (address == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("the CUDA backend module has no ", symbol, ": ", dlerror()));
    }
    return address;
  }
#endif
  return absl::UnimplementedError(
      absl::StrCat("no module for backend '", std::string(name), "' in this build"));
}

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
    absl::StatusOr<void*> create = BackendModuleSymbol(name, kCudaModuleCreateBackend);
    if (!create.ok()) return create.status();
    return reinterpret_cast<CreateModuleBackendFn>(*create)(options.device);
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
