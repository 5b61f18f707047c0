// A read-only view of the tensors in a weights file (GGUF) or directory (safetensors).
#ifndef RIDGESERVE_ENGINE_MODEL_TENSOR_SOURCE_H_
#define RIDGESERVE_ENGINE_MODEL_TENSOR_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace ridgeserve {

// Metadata of one stored tensor. `shape` is outermost-first (PyTorch order): a GGUF tensor
// with ne = {in, out} has shape {out, in}; element (i, j) of a 2-D tensor is at i*in + j.
// `data` points into the mapped file and stays valid while the owning source lives.
struct TensorInfo {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> shape;
  int64_t num_elements = 0;
  const uint8_t* data = nullptr;
  size_t num_bytes = 0;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The file or directory the tensors come from, for error messages.
  virtual const std::string& path() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // nullptr when absent. This one searches tensors() in order; file formats override it with
  // their index.
  virtual const TensorInfo* FindTensor(std::string_view name) const {
    for (const TensorInfo& t : tensors()) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  // Dequantizes/converts the whole tensor to f32, row-major in `shape`.
  virtual absl::StatusOr<std::vector<float>> ReadF32(const TensorInfo& tensor) const = 0;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_TENSOR_SOURCE_H_
