// GGUF v2/v3 reader: mmaps the file and parses it in named phases (header → metadata →
// tensor infos → data), validating every count, length and offset against the file size
// before use. Every error reads "<path>: <phase>: <what>[ (tensor NAME | key KEY)]", e.g.
// "model.gguf: data: data [0, +186624) runs past end of file (data section holds 1024 bytes)
// (tensor blk.3.attn_q.weight)". Malformed files are InvalidArgument; unsupported versions and
// tensor types Unimplemented.
#ifndef RIDGESERVE_ENGINE_MODEL_GGUF_H_
#define RIDGESERVE_ENGINE_MODEL_GGUF_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/tensor_source.h"

namespace ridgeserve {

class MappedFile;

class GgufFile : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile() override;

  uint32_t version() const;
  bool Has(std::string_view key) const;
  // Typed metadata accessors. Integers of any width and signedness convert to int64_t;
  // f32/f64 (and integers) to double. A missing key or a type mismatch is NotFound /
  // InvalidArgument naming the file and key; a u64 above INT64_MAX is OutOfRange for GetInt.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;

  const std::string& path() const override;
  const std::vector<TensorInfo>& tensors() const override;
  const TensorInfo* FindTensor(std::string_view name) const override;
  absl::StatusOr<std::vector<float>> ReadF32(const TensorInfo& tensor) const override;

 private:
  struct Impl;
  explicit GgufFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_GGUF_H_
