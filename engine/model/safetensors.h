// Hugging Face safetensors reader: a single `model.safetensors` or shards listed in
// `model.safetensors.index.json`, each mmapped. Supports F32, F16 and BF16. Every header
// length, offset and shape is bounded by the file size before it is used; errors name the
// file and the tensor.
#ifndef RIDGESERVE_ENGINE_MODEL_SAFETENSORS_H_
#define RIDGESERVE_ENGINE_MODEL_SAFETENSORS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/tensor_source.h"

namespace ridgeserve {

class SafetensorsModel : public TensorSource {
 public:
  // `dir` holds model.safetensors or model.safetensors.index.json + shards.
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(const std::string& dir);
  ~SafetensorsModel() override;

  const std::string& path() const override;
  const std::vector<TensorInfo>& tensors() const override;
  const TensorInfo* FindTensor(std::string_view name) const override;
  absl::StatusOr<std::vector<float>> ReadF32(const TensorInfo& tensor) const override;

 private:
  struct Impl;
  explicit SafetensorsModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_SAFETENSORS_H_
