// Conversion of stored blocks (ggml quantization formats, f16, bf16) to f32.
#ifndef RIDGESERVE_ENGINE_MODEL_DEQUANT_H_
#define RIDGESERVE_ENGINE_MODEL_DEQUANT_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/model/tensor_source.h"

namespace ridgeserve {

struct TypeTraits {
  std::string_view name;   // "Q4_K"
  int64_t block_elements;  // weights per block (1 for F32/F16/BF16)
  int64_t block_bytes;     // bytes per block
};

// Unimplemented for types this build cannot read.
absl::StatusOr<TypeTraits> GetTypeTraits(GgmlType type);

// Bytes that `num_elements` of `type` occupy; InvalidArgument when num_elements is not a
// multiple of the block size or the size overflows.
absl::StatusOr<size_t> StorageBytes(GgmlType type, int64_t num_elements);

// Converts `num_elements` (a multiple of the block size) from `src` to `dst`.
absl::Status DequantizeRow(GgmlType type, const uint8_t* src, int64_t num_elements, float* dst);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_DEQUANT_H_
