// Block layouts follow ggml (ggml-common.h) as decoded by the gguf Python package's
// gguf/quants.py, which the tests use as the reference. All multi-byte fields are little-endian;
// "f16" is IEEE binary16. Each Dequantize* function converts `num_blocks` consecutive blocks.
//
// Arithmetic follows the reference's order (e.g. Q4_K: (d * sc) * q - dmin * m), and each
// product is its own statement so that it is rounded before the add, as NumPy rounds it: the
// result is then bit-identical to gguf.quants.dequantize. (ISO C++ mode makes GCC keep products
// and sums apart; clang's default contracts only within one expression. Only
// -ffp-contract=fast could fuse them into an FMA, and the dequant test would then say so.)
#include "kernels/dtype.h"

#include <omp.h>

#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ridgeserve {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the readers assume a little-endian host, as GGUF and safetensors files are");

constexpr int64_t kQK = 32;     // weights per block of the 32-wide formats
constexpr int64_t kQK_K = 256;  // weights per K-quant super-block

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu);  // NaN
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 2^16: infinity
  if (magnitude < 0x38800000u) {
    // Below 2^-14: an f16 subnormal, round(|f| * 2^24) units of 2^-24. The product is exact and
    // nearbyint rounds to nearest even in the default mode.
    const float units = std::nearbyint(std::bit_cast<float>(magnitude) * 0x1p24f);
    return sign | static_cast<uint16_t>(units);  // 1024 units is the smallest normal's bits
  }
  // Normal: drop 13 mantissa bits, rounding to nearest even; a carry into the exponent is right.
  const uint32_t rebased = magnitude - (uint32_t{127 - 15} << 23);
  const uint32_t rounded = rebased + 0x0FFFu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>(rounded >> 13);
}

bool IsKvCacheDType(DType type) {
  return type == DType::kF32 || type == DType::kF16 || type == DType::kBF16;
}

absl::StatusOr<DType> ParseKvCacheDType(std::string_view name) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("kv_cache_dtype '", std::string(name), "': want f32, bf16 or f16"));
}

std::string_view KvCacheDTypeName(DType type) {
  return type == DType::kF16 ? "f16" : type == DType::kBF16 ? "bf16" : "f32";
}

size_t ElementBytes(DType type) { return type == DType::kF32 ? 4 : 2; }

void ConvertFromFloat(const float* src, int64_t n, DType type, uint8_t* dst) {
  if (type == DType::kF32) {
    std::memcpy(dst, src, sizeof(float) * n);
    return;
  }
  const auto convert = type == DType::kF16 ? FloatToHalf : FloatToBFloat16;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = convert(src[i]);
    std::memcpy(dst + 2 * i, &h, sizeof(h));
  }
}

namespace {

float LoadHalf(const uint8_t* p) { return HalfToFloat(LoadU16(p)); }

void DequantizeF16(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = LoadHalf(src + 2 * i);
}

void DequantizeBF16(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = std::bit_cast<float>(static_cast<uint32_t>(LoadU16(src + 2 * i)) << 16);
  }
}

// Q4_0 {f16 d; u8 qs[16]}: low nibbles are weights 0..15, high nibbles 16..31; y = (q - 8) d.
void DequantizeQ4_0(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 18, dst += kQK) {
    const float d = LoadHalf(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
      dst[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

// Q4_1 {f16 d; f16 m; u8 qs[16]}: nibbles as Q4_0, unsigned; y = q d + m.
void DequantizeQ4_1(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 20, dst += kQK) {
    const float d = LoadHalf(src);
    const float m = LoadHalf(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      const float lo = d * static_cast<float>(qs[j] & 0x0F);
      const float hi = d * static_cast<float>(qs[j] >> 4);
      dst[j] = lo + m;
      dst[j + 16] = hi + m;
    }
  }
}

// Q5_0 {f16 d; u32 qh; u8 qs[16]}: weight j's 5th bit is bit j of qh; y = (q - 16) d.
void DequantizeQ5_0(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 22, dst += kQK) {
    const float d = LoadHalf(src);
    const uint32_t qh = LoadU32(src + 2);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
      const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      dst[j] = d * static_cast<float>(lo - 16);
      dst[j + 16] = d * static_cast<float>(hi - 16);
    }
  }
}

// Q5_1 {f16 d; f16 m; u32 qh; u8 qs[16]}: bits as Q5_0, unsigned; y = q d + m.
void DequantizeQ5_1(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 24, dst += kQK) {
    const float d = LoadHalf(src);
    const float m = LoadHalf(src + 2);
    const uint32_t qh = LoadU32(src + 4);
    const uint8_t* qs = src + 8;
    for (int j = 0; j < 16; ++j) {
      const uint32_t lo = (qs[j] & 0x0Fu) | (((qh >> j) & 1u) << 4);
      const uint32_t hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
      const float lo_scaled = d * static_cast<float>(lo);
      const float hi_scaled = d * static_cast<float>(hi);
      dst[j] = lo_scaled + m;
      dst[j + 16] = hi_scaled + m;
    }
  }
}

// Q8_0 {f16 d; i8 qs[32]}: y = q d.
void DequantizeQ8_0(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 34, dst += kQK) {
    const float d = LoadHalf(src);
    const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < kQK; ++j) dst[j] = static_cast<float>(qs[j]) * d;
  }
}

// Q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}, 16 sub-blocks of 16 weights. Scale byte s:
// low nibble scales d, high nibble scales dmin. Weight e = 128 h + 32 k + l (h < 2, k < 4,
// l < 32) is bits 2k..2k+1 of qs[32 h + l]; y = d sc q - dmin m for sub-block e / 16.
void DequantizeQ2_K(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 84, dst += kQK_K) {
    const uint8_t* scales = src;
    const uint8_t* qs = src + 16;
    const float d = LoadHalf(src + 80);
    const float dmin = LoadHalf(src + 82);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, k = (e / 32) % 4, l = e % 32;
      const uint8_t s = scales[e / 16];
      const float dl = d * static_cast<float>(s & 0x0F);
      const float ml = dmin * static_cast<float>(s >> 4);
      const int q = (qs[32 * h + l] >> (2 * k)) & 3;
      const float scaled = dl * static_cast<float>(q);
      dst[e] = scaled - ml;
    }
  }
}

// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}, 16 sub-blocks of 16 weights.
// Sub-block i's 6-bit scale: low 4 bits from nibble (i / 8) of scales[i % 8], high 2 bits from
// bits 2 (i / 4) of scales[8 + i % 4]; it is stored +32. Weight e: low 2 bits as in Q2_K; the
// third bit is bit (e / 32) of hmask[e % 32], and a CLEAR bit means subtract 4.
void DequantizeQ3_K(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 110, dst += kQK_K) {
    const uint8_t* hmask = src;
    const uint8_t* qs = src + 32;
    const uint8_t* scales = src + 96;
    const float d = LoadHalf(src + 108);
    float dl[16];
    for (int i = 0; i < 16; ++i) {
      const int low = (scales[i % 8] >> (4 * (i / 8))) & 0x0F;
      const int high = (scales[8 + i % 4] >> (2 * (i / 4))) & 0x03;
      dl[i] = d * static_cast<float>((low | (high << 4)) - 32);
    }
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, k = (e / 32) % 4, l = e % 32;
      const int low = (qs[32 * h + l] >> (2 * k)) & 3;
      const int high_clear = ((hmask[l] >> (e / 32)) & 1) ^ 1;
      dst[e] = dl[e / 16] * static_cast<float>(low - 4 * high_clear);
    }
  }
}

// The 12 packed bytes shared by Q4_K and Q5_K: eight 6-bit scales and eight 6-bit mins.
//   bytes 0-3: scale j (j < 4) in bits 0-5, bits 4-5 of scale j+4 in bits 6-7
//   bytes 4-7: min j in bits 0-5, bits 4-5 of min j+4 in bits 6-7
//   bytes 8-11: low 4 bits of scale j+4 (low nibble) and of min j+4 (high nibble)
void UnpackKScales(const uint8_t* packed, uint8_t scale[8], uint8_t min[8]) {
  for (int j = 0; j < 4; ++j) {
    scale[j] = packed[j] & 0x3F;
    min[j] = packed[4 + j] & 0x3F;
    scale[j + 4] = (packed[8 + j] & 0x0F) | ((packed[j] >> 2) & 0x30);
    min[j + 4] = (packed[8 + j] >> 4) | ((packed[4 + j] >> 2) & 0x30);
  }
}

// Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}, 8 sub-blocks of 32 weights. Sub-block
// 2c + s is nibble s of qs[32 c .. 32 c + 31]; y = (d sc) q - dmin m.
void DequantizeQ4_K(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 144, dst += kQK_K) {
    const float d = LoadHalf(src);
    const float dmin = LoadHalf(src + 2);
    uint8_t scale[8], min[8];
    UnpackKScales(src + 4, scale, min);
    const uint8_t* qs = src + 16;
    for (int j = 0; j < 8; ++j) {
      const float dj = d * static_cast<float>(scale[j]);
      const float mj = dmin * static_cast<float>(min[j]);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const float scaled = dj * static_cast<float>((q[l] >> shift) & 0x0F);
        dst[32 * j + l] = scaled - mj;
      }
    }
  }
}

// Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K plus a 5th bit for
// weight l of sub-block j in bit j of qh[l].
void DequantizeQ5_K(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 176, dst += kQK_K) {
    const float d = LoadHalf(src);
    const float dmin = LoadHalf(src + 2);
    uint8_t scale[8], min[8];
    UnpackKScales(src + 4, scale, min);
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int j = 0; j < 8; ++j) {
      const float dj = d * static_cast<float>(scale[j]);
      const float mj = dmin * static_cast<float>(min[j]);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int value = ((q[l] >> shift) & 0x0F) | (((qh[l] >> j) & 1) << 4);
        const float scaled = dj * static_cast<float>(value);
        dst[32 * j + l] = scaled - mj;
      }
    }
  }
}

// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}, 16 sub-blocks of 16 weights. Weight
// e = 128 h + 32 k + l (h < 2, k < 4, l < 32): low 4 bits are nibble (k / 2) of
// ql[64 h + 32 (k % 2) + l], high 2 bits are bits 2k..2k+1 of qh[32 h + l]; stored +32;
// y = (d scale) q.
void DequantizeQ6_K(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 210, dst += kQK_K) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const int8_t* scales = reinterpret_cast<const int8_t*>(src + 192);
    const float d = LoadHalf(src + 208);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, k = (e / 32) % 4, l = e % 32;
      const int low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
      const int high = (qh[32 * h + l] >> (2 * k)) & 0x03;
      const float dl = d * static_cast<float>(scales[e / 16]);
      dst[e] = dl * static_cast<float>((low | (high << 4)) - 32);
    }
  }
}

// ggml type names by id, so an unsupported type is named in errors rather than numbered.
absl::string_view DTypeName(uint32_t id) {
  static constexpr absl::string_view kNames[] = {
      "F32",   "F16",        "Q4_0",       "Q4_1",       "Q4_2",     "Q4_3",     "Q5_0",
      "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
      "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
      "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
      "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
      "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",    "NVFP4",    "Q1_0"};
  if (id < std::size(kNames)) return kNames[id];
  return {};
}

}  // namespace

bool HasIntegerBlocks32(DType type) {
  switch (type) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
      return true;
    default:
      return false;
  }
}

void IntegerBlocks32(DType type, const uint8_t* src, int64_t cols, float* d, float* m, uint8_t* q) {
  const int64_t blocks = cols / kQK;
  for (int64_t b = 0; b < blocks; ++b, q += kQK) {
    switch (type) {
      case DType::kQ4_0:
      case DType::kQ4_1: {
        const bool with_min = type == DType::kQ4_1;
        const uint8_t* block = src + b * (with_min ? 20 : 18);
        d[b] = LoadHalf(block);
        m[b] = with_min ? LoadHalf(block + 2) : -8.0f * d[b];
        const uint8_t* qs = block + (with_min ? 4 : 2);
        for (int j = 0; j < 16; ++j) {
          q[j] = qs[j] & 0x0F;
          q[j + 16] = qs[j] >> 4;
        }
        break;
      }
      case DType::kQ5_0:
      case DType::kQ5_1: {
        const bool with_min = type == DType::kQ5_1;
        const uint8_t* block = src + b * (with_min ? 24 : 22);
        d[b] = LoadHalf(block);
        m[b] = with_min ? LoadHalf(block + 2) : -16.0f * d[b];
        const uint32_t qh = LoadU32(block + (with_min ? 4 : 2));
        const uint8_t* qs = block + (with_min ? 8 : 6);
        for (int j = 0; j < 16; ++j) {
          q[j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
          q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        }
        break;
      }
      case DType::kQ8_0: {
        const uint8_t* block = src + b * 34;
        d[b] = LoadHalf(block);
        m[b] = 0.0f;
        std::memcpy(q, block + 2, kQK);
        break;
      }
      case DType::kQ4_K:
      case DType::kQ5_K: {
        const bool five = type == DType::kQ5_K;
        const uint8_t* super = src + (b / 8) * (five ? 176 : 144);
        const int j = static_cast<int>(b % 8);
        uint8_t scale[8], min[8];
        UnpackKScales(super + 4, scale, min);
        d[b] = LoadHalf(super) * static_cast<float>(scale[j]);
        m[b] = -(LoadHalf(super + 2) * static_cast<float>(min[j]));
        const uint8_t* qh = super + 16;
        const uint8_t* qs = super + (five ? 48 : 16) + 32 * (j / 2);
        for (int l = 0; l < kQK; ++l) {
          q[l] = (qs[l] >> (4 * (j % 2))) & 0x0F;
          if (five) q[l] |= ((qh[l] >> j) & 1) << 4;
        }
        break;
      }
      default:
        assert(false && "not a 32-block integer format");
    }
  }
}

absl::StatusOr<TypeTraits> GetTypeTraits(DType type) {
  switch (type) {
    case DType::kF32:
      return TypeTraits{"F32", 1, 4};
    case DType::kF16:
      return TypeTraits{"F16", 1, 2};
    case DType::kBF16:
      return TypeTraits{"BF16", 1, 2};
    case DType::kQ4_0:
      return TypeTraits{"Q4_0", kQK, 18};
    case DType::kQ4_1:
      return TypeTraits{"Q4_1", kQK, 20};
    case DType::kQ5_0:
      return TypeTraits{"Q5_0", kQK, 22};
    case DType::kQ5_1:
      return TypeTraits{"Q5_1", kQK, 24};
    case DType::kQ8_0:
      return TypeTraits{"Q8_0", kQK, 34};
    case DType::kQ2_K:
      return TypeTraits{"Q2_K", kQK_K, 84};
    case DType::kQ3_K:
      return TypeTraits{"Q3_K", kQK_K, 110};
    case DType::kQ4_K:
      return TypeTraits{"Q4_K", kQK_K, 144};
    case DType::kQ5_K:
      return TypeTraits{"Q5_K", kQK_K, 176};
    case DType::kQ6_K:
      return TypeTraits{"Q6_K", kQK_K, 210};
    case DType::kI32:
      return TypeTraits{"I32", 1, 4};
    case DType::kQ8_1:
      break;
  }
  const uint32_t id = static_cast<uint32_t>(type);
  const absl::string_view name = DTypeName(id);
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ggml type id ", id));
  }
  return absl::UnimplementedError(
      absl::StrCat("ggml type ", name, " (id ", id, ") is not supported by this build"));
}

absl::StatusOr<size_t> StorageBytes(DType type, int64_t num_elements) {
  absl::StatusOr<TypeTraits> traits = GetTypeTraits(type);
  if (!traits.ok()) return traits.status();
  if (num_elements < 0 || num_elements % traits->block_elements != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_elements, " elements is not a multiple of the ", std::string(traits->name),
                     " block size ", traits->block_elements));
  }
  const uint64_t blocks = static_cast<uint64_t>(num_elements / traits->block_elements);
  const uint64_t block_bytes = static_cast<uint64_t>(traits->block_bytes);
  if (blocks > std::numeric_limits<size_t>::max() / block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        num_elements, " elements of ", std::string(traits->name), " overflow the address space"));
  }
  return static_cast<size_t>(blocks * block_bytes);
}

absl::Status DequantizeRowsToBf16(DType type, const uint8_t* src, size_t row_bytes, int64_t rows,
                                  int64_t cols, uint16_t* dst, int threads) {
  if (rows <= 0) return absl::OkStatus();
  const absl::StatusOr<size_t> stored = StorageBytes(type, cols);
  if (!stored.ok()) return stored.status();
  if (row_bytes < *stored) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows ", row_bytes, " bytes apart hold ", *stored, " bytes each"));
  }
  // Every row fails as the first would (only the type and cols can fail), so the first runs
  // alone to report it, and the others cannot fail.
  std::vector<float> first(static_cast<size_t>(cols));
  if (absl::Status s = DequantizeRow(type, src, cols, first.data()); !s.ok()) return s;
  for (int64_t c = 0; c < cols; ++c) dst[c] = FloatToBFloat16(first[c]);
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
  {
    std::vector<float> row(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 1; r < rows; ++r) {
      DequantizeRow(type, src + static_cast<size_t>(r) * row_bytes, cols, row.data()).IgnoreError();
      uint16_t* out = dst + static_cast<size_t>(r) * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = FloatToBFloat16(row[c]);
    }
  }
  return absl::OkStatus();
}

absl::Status DequantizeRow(DType type, const uint8_t* src, int64_t num_elements, float* dst) {
  absl::StatusOr<TypeTraits> traits = GetTypeTraits(type);
  if (!traits.ok()) return traits.status();
  if (num_elements < 0 || num_elements % traits->block_elements != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_elements, " elements is not a multiple of the ", std::string(traits->name),
                     " block size ", traits->block_elements));
  }
  const int64_t blocks = num_elements / traits->block_elements;
  switch (type) {
    case DType::kF32:
      if (num_elements > 0) std::memcpy(dst, src, static_cast<size_t>(num_elements) * 4);
      break;
    case DType::kF16:
      DequantizeF16(src, num_elements, dst);
      break;
    case DType::kBF16:
      DequantizeBF16(src, num_elements, dst);
      break;
    case DType::kQ4_0:
      DequantizeQ4_0(src, blocks, dst);
      break;
    case DType::kQ4_1:
      DequantizeQ4_1(src, blocks, dst);
      break;
    case DType::kQ5_0:
      DequantizeQ5_0(src, blocks, dst);
      break;
    case DType::kQ5_1:
      DequantizeQ5_1(src, blocks, dst);
      break;
    case DType::kQ8_0:
      DequantizeQ8_0(src, blocks, dst);
      break;
    case DType::kQ2_K:
      DequantizeQ2_K(src, blocks, dst);
      break;
    case DType::kQ3_K:
      DequantizeQ3_K(src, blocks, dst);
      break;
    case DType::kQ4_K:
      DequantizeQ4_K(src, blocks, dst);
      break;
    case DType::kQ5_K:
      DequantizeQ5_K(src, blocks, dst);
      break;
    case DType::kQ6_K:
      DequantizeQ6_K(src, blocks, dst);
      break;
    case DType::kI32:
      return absl::InvalidArgumentError("I32 data does not convert to f32 weights");
    case DType::kQ8_1:  // GetTypeTraits refused it above.
      break;
  }
  return absl::OkStatus();
}

}  // namespace ridgeserve
