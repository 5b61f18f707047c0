// Element types of stored tensors and weights (the ggml block formats, f16, bf16, f32) and
// their conversion to f32. Shared by the model readers and every backend.
#ifndef RIDGESERVE_KERNELS_DTYPE_H_
#define RIDGESERVE_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/statusor.h"

namespace ridgeserve {

// Storage types, numbered as ggml numbers them (GGUF type ids). Safetensors dtypes map onto
// F32, F16 and BF16; I32 is for index tensors on a backend.
enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kI32 = 26,
  kBF16 = 30,
};

struct TypeTraits {
  std::string_view name;   // "Q4_K"
  int64_t block_elements;  // weights per block (1 for F32/F16/BF16)
  int64_t block_bytes;     // bytes per block
};

// Unimplemented for types this build cannot read.
absl::StatusOr<TypeTraits> GetTypeTraits(DType type);

// Bytes that `num_elements` of `type` occupy; InvalidArgument when num_elements is not a
// multiple of the block size or the size overflows.
absl::StatusOr<size_t> StorageBytes(DType type, int64_t num_elements);

// Exact binary16 -> binary32 (every f16 value, subnormals, infinities and NaN payloads). Inline
// and without branches, so that loops over it vectorize.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7FFFu;  // exponent and mantissa
  // Zero or subnormal: mantissa * 2^-24 is exact in f32.
  const float small_value = static_cast<float>(static_cast<int32_t>(magnitude)) * 0x1p-24f;
  uint32_t small;
  std::memcpy(&small, &small_value, sizeof(small));
  // Infinity or NaN (payload kept): the f32 exponent all ones.
  const uint32_t special = 0x7F800000u | (magnitude << 13);
  // Normal: the exponent rebased from 15 to 127.
  const uint32_t normal = (magnitude << 13) + (uint32_t{127 - 15} << 23);
  // Chosen with masks: a ?: here compiles to branches, which stop loops vectorizing.
  const uint32_t is_small = 0u - static_cast<uint32_t>(magnitude < 0x400u);
  const uint32_t is_special = 0u - static_cast<uint32_t>(magnitude >= 0x7C00u);
  const uint32_t bits =
      sign | (small & is_small) | (special & is_special) | (normal & ~(is_small | is_special));
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// binary32 -> binary16 and -> bfloat16, rounded to nearest, ties to even (as IEEE conversion,
// F16C's vcvtps2ph and PyTorch's .to(torch.bfloat16) round): overflow gives infinity, f16
// keeps subnormals, NaN stays NaN (quiet).
uint16_t FloatToHalf(float f);
// Inline, and a select rather than a branch, so that loops over it vectorize.
inline uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));  // (std::bit_cast: not in the CUDA files' C++ 17)
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

// The element types a KV cache may hold.
bool IsKvCacheDType(DType type);
// "f32", "bf16" or "f16" (the --kv_cache_dtype values); InvalidArgument naming the value.
absl::StatusOr<DType> ParseKvCacheDType(std::string_view name);
// The --kv_cache_dtype name of F32, F16 or BF16.
std::string_view KvCacheDTypeName(DType type);
// Bytes of one element of F32, F16 or BF16.
size_t ElementBytes(DType type);
// dst[i] = src[i] in `type` (F32, F16 or BF16) with the rounding above; `dst` holds
// n * ElementBytes(type) bytes.
void ConvertFromFloat(const float* src, int64_t n, DType type, uint8_t* dst);

// The formats whose values are d * q + m over blocks of 32 weights with a small integer q:
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the 32-weight sub-blocks of Q4_K and Q5_K.
bool HasIntegerBlocks32(DType type);
// For such a type, each 32-block b of a row of `cols` weights as d[b], m[b] and q[32 b + e]
// with fma(d, q, m) == DequantizeRow's value exactly (the products d * q are exact in f32
// for these formats, so one rounding of the sum is the reference's). q is in [0, 31] for the
// unsigned formats; for Q8_0 it is the stored int8 (cast to uint8_t) and m = 0.
void IntegerBlocks32(DType type, const uint8_t* src, int64_t cols, float* d, float* m, uint8_t* q);

// Converts `num_elements` (a multiple of the block size) from `src` to `dst`.
absl::Status DequantizeRow(DType type, const uint8_t* src, int64_t num_elements, float* dst);
// dst[r * cols + c] = FloatToBFloat16(DequantizeRow(row r)[c]) for the `rows` rows of `cols`
// weights stored row_bytes apart from `src`, the rows shared among `threads` threads (<= 0:
// OpenMP's default, OMP_NUM_THREADS or one per processor). The errors of DequantizeRow, and
// InvalidArgument for rows closer than their storage.
absl::Status DequantizeRowsToBf16(DType type, const uint8_t* src, size_t row_bytes, int64_t rows,
                                  int64_t cols, uint16_t* dst, int threads);

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_DTYPE_H_
