// Linear on the CPU. Each thread takes a contiguous range of w's rows in tiles. f32 path: a
// tile is converted to an f32 panel in L1 (once per block of rows of x) and a kernel runs MR
// rows of x against it, so every stored type shares one kernel and multiplies exactly
// DequantizeRow's values. int8 path: x is quantized once per call, and the kernel reads the
// packed integers directly (AVX2 and better: the 16-row tiles; scalar: the rows).
// Isa::kAvx512 hands both to linear_avx512.cc after quantizing x here; Isa::kAmx hands int8
// calls of at least kAmxMinRows rows to linear_amx.cc, and the rest to linear_avx512.cc.
#include "kernels/cpu/linear.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/linear_internal.h"
#include "kernels/cpu/simd.h"

namespace ridgeserve::cpu {
namespace {

using internal::BlockRow;
using internal::ForBlockTiles;
using internal::ForPanelTiles;
using internal::kAlignment;
using internal::kBlock;
using internal::kLanes;
using internal::kPrefetchBytes;
using internal::kTileRows;
using internal::Layout;
using internal::PrefetchSweep;
using internal::QuantizedX;
using internal::ReduceAvx2;
using internal::RoundUp;
using internal::RowOf;
using internal::TileTable;

// Tile: kMr rows of x by kNr rows of w: 12 accumulators, 2 x vectors and a panel vector in
// the 16 AVX2 registers. The panel (kNr rows, 14 KiB at k = 576) stays in L1 while x streams
// from L2, 2 vectors per 12 FMAs.
constexpr int kMr = 2;
constexpr int kNr = 6;
// Scalar int8 tile (the row layouts): 4 rows of x by 2 rows of w.
constexpr int kMrInt8 = 4;
constexpr int kNrInt8 = 2;

size_t PackedRowBytes(Layout layout, int64_t cols) {
  const size_t nb = static_cast<size_t>(cols / kBlock);
  switch (layout) {
    case Layout::kU4:
    case Layout::kU4T:
      return nb * (8 + 16);
    case Layout::kU8:
    case Layout::kU8T:
      return nb * (8 + 32);
    case Layout::kS8:
    case Layout::kS8T:
      return nb * (4 + 32);
    case Layout::kStored:
      break;
  }
  return 0;
}

Layout LayoutFor(DType type, bool tiles) {
  switch (type) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
      return tiles ? Layout::kU4T : Layout::kU4;
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ5_K:
      return tiles ? Layout::kU8T : Layout::kU8;
    case DType::kQ8_0:
      return tiles ? Layout::kS8T : Layout::kS8;
    default:
      return Layout::kStored;
  }
}

// One stored row of a 32-block type into `layout` (IntegerBlocks32 gives d, m and q).
void RepackRow(DType type, Layout layout, const uint8_t* src, int64_t cols, uint8_t* out) {
  const int64_t nb = cols / kBlock;
  std::vector<float> d(nb), m(nb);
  std::vector<uint8_t> q(cols);
  IntegerBlocks32(type, src, cols, d.data(), m.data(), q.data());
  std::memcpy(out, d.data(), sizeof(float) * nb);
  out += sizeof(float) * nb;
  if (layout != Layout::kS8) {
    std::memcpy(out, m.data(), sizeof(float) * nb);
    out += sizeof(float) * nb;
  }
  if (layout == Layout::kU4) {
    for (int64_t b = 0; b < nb; ++b) {
      for (int e = 0; e < 16; ++e) {
        out[16 * b + e] = static_cast<uint8_t>(q[kBlock * b + e] | (q[kBlock * b + e + 16] << 4));
      }
    }
  } else {
    std::memcpy(out, q.data(), cols);
  }
}

// Stored rows src[0, 16) of a 32-block type (nullptr: a zero row past the segment's end) as
// one tile of `layout` (linear.h).
void RepackTile(DType type, Layout layout, const uint8_t* const* src, int64_t cols, uint8_t* out) {
  const int64_t nb = cols / kBlock;
  std::vector<float> d(kTileRows * nb, 0.0f), m(kTileRows * nb, 0.0f);
  std::vector<uint8_t> q(kTileRows * cols, 0);
  for (int j = 0; j < kTileRows; ++j) {
    if (src[j] != nullptr) {
      IntegerBlocks32(type, src[j], cols, &d[j * nb], &m[j * nb], &q[j * cols]);
    }
  }
  const int64_t block_bytes = internal::TileBlockBytes(layout);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* block = out + b * block_bytes;
    float* dm = reinterpret_cast<float*>(block);
    for (int j = 0; j < kTileRows; ++j) {
      dm[j] = d[j * nb + b];
      if (layout != Layout::kS8T) dm[kTileRows + j] = m[j * nb + b];
    }
    uint8_t* qs = block + (layout == Layout::kS8T ? 64 : 128);
    for (int j = 0; j < kTileRows; ++j) {
      for (int e = 0; e < kBlock; ++e) {
        const uint8_t v = q[j * cols + kBlock * b + e];
        const int g = e / 4;
        if (layout == Layout::kU4T) {
          qs[64 * (g % 4) + 4 * j + e % 4] |= static_cast<uint8_t>(g < 4 ? v : v << 4);
        } else {
          qs[64 * g + 4 * j + e % 4] = v;
        }
      }
    }
  }
}

// Row `local` of a tiled segment to f32: the values DequantizeRow gives (d q + m, or d q).
void DequantizeTileRow(const CpuWeight::Segment& s, int64_t local, int64_t cols, float* dst) {
  const uint8_t* tile = internal::TileOf(s, local / kTileRows);
  const int j = static_cast<int>(local % kTileRows);
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    const internal::TileBlock block = internal::BlockOfTile(tile, s.layout, b);
    for (int e = 0; e < kBlock; ++e) {
      const int g = e / 4;
      float q;
      if (s.layout == Layout::kU4T) {
        const uint8_t byte = block.q[64 * (g % 4) + 4 * j + e % 4];
        q = static_cast<float>(g < 4 ? byte & 0x0F : byte >> 4);
      } else if (s.layout == Layout::kU8T) {
        q = static_cast<float>(block.q[64 * g + 4 * j + e % 4]);
      } else {
        q = static_cast<float>(static_cast<int8_t>(block.q[64 * g + 4 * j + e % 4]));
      }
      dst[kBlock * b + e] =
          s.layout == Layout::kS8T ? block.d[j] * q : std::fma(block.d[j], q, block.m[j]);
    }
  }
}

// Integer e of block b of a packed row's quants.
int32_t QuantAt(Layout layout, const uint8_t* q, int64_t b, int e) {
  switch (layout) {
    case Layout::kU4: {
      const uint8_t byte = q[16 * b + e % 16];
      return e < 16 ? byte & 0x0F : byte >> 4;
    }
    case Layout::kU8:
      return q[kBlock * b + e];
    default:
      return static_cast<int8_t>(q[kBlock * b + e]);
  }
}

// Block b of a packed row as 4 vectors of 8 floats: fma(d, q, m), or d * q for kS8
// (IntegerBlocks32's identity makes these DequantizeRow's values).
template <Layout L>
inline void ConvertBlockAvx2(const BlockRow& row, int64_t b, __m256 out[4]) {
  const __m256 d = _mm256_set1_ps(row.d[b]);
  __m128i bytes[4];  // 8 integers in the low half of each
  if constexpr (L == Layout::kU4) {
    const __m128i low_mask = _mm_set1_epi8(0x0F);
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.q + 16 * b));
    const __m128i lo = _mm_and_si128(qs, low_mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low_mask);
    bytes[0] = lo;
    bytes[1] = _mm_srli_si128(lo, 8);
    bytes[2] = hi;
    bytes[3] = _mm_srli_si128(hi, 8);
  } else {
    for (int g = 0; g < 4; ++g) {
      bytes[g] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.q + kBlock * b + 8 * g));
    }
  }
  for (int g = 0; g < 4; ++g) {
    if constexpr (L == Layout::kS8) {
      out[g] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes[g])));
    } else {
      out[g] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes[g])),
                               _mm256_set1_ps(row.m[b]));
    }
  }
}

template <Layout L>
void DequantizeBlockRowAvx2(const BlockRow& row, int64_t nb, float* dst) {
  for (int64_t b = 0; b < nb; ++b, dst += kBlock) {
    __m256 v[4];
    ConvertBlockAvx2<L>(row, b, v);
    for (int g = 0; g < 4; ++g) _mm256_storeu_ps(dst + 8 * g, v[g]);
  }
}

// Row `r` of a 32-block segment to f32: ConvertBlockAvx2's values, or the same lane by lane.
void DequantizeBlockRow(const CpuWeight::Segment& s, int64_t local_row, int64_t cols, float* dst,
                        Isa isa) {
  const int64_t nb = cols / kBlock;
  const BlockRow row = RowOf(s, local_row, nb);
  if (isa != Isa::kScalar) {
    switch (s.layout) {
      case Layout::kU4:
        return DequantizeBlockRowAvx2<Layout::kU4>(row, nb, dst);
      case Layout::kU8:
        return DequantizeBlockRowAvx2<Layout::kU8>(row, nb, dst);
      default:
        return DequantizeBlockRowAvx2<Layout::kS8>(row, nb, dst);
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int e = 0; e < kBlock; ++e) {
      const float q = static_cast<float>(QuantAt(s.layout, row.q, b, e));
      dst[kBlock * b + e] =
          s.layout == Layout::kS8 ? row.d[b] * q : std::fma(row.d[b], q, row.m[b]);
    }
  }
}

// ---- f32 conversion of stored rows --------------------------------------------------------

// One stored row to f32. The types were checked at packing, so conversion cannot fail.
void DequantizeStoredRow(DType dtype, const uint8_t* src, int64_t cols, float* dst, Isa isa) {
  if (isa != Isa::kScalar) {
    if (dtype == DType::kF16) return simd::WidenF16(src, cols, dst);
    if (dtype == DType::kBF16) return simd::WidenBF16(src, cols, dst);
  }
  const absl::Status status = DequantizeRow(dtype, src, cols, dst);
  assert(status.ok());
  (void)status;
}

// ---- tile kernels -------------------------------------------------------------------------

// y[r * ldy + j] for r < MR, j < NR: x rows ldx apart, panel rows kpad apart (zero past k).
using TileFn = void (*)(const float* x, int64_t ldx, const float* panel, int64_t kpad, int64_t k,
                        const float* bias, float* y, int64_t ldy);

float ReduceLanes(const float acc[kLanes]) {
  const float s0 = acc[0] + acc[4], s1 = acc[1] + acc[5], s2 = acc[2] + acc[6],
              s3 = acc[3] + acc[7];
  return (s0 + s2) + (s1 + s3);
}

template <int MR, int NR>
void TileScalar(const float* x, int64_t ldx, const float* panel, int64_t kpad, int64_t k,
                const float* bias, float* y, int64_t ldy) {
  float acc[MR][NR][kLanes] = {};
  for (int64_t c = 0; c < kpad; c += kLanes) {
    for (int r = 0; r < MR; ++r) {
      for (int l = 0; l < kLanes; ++l) {
        const float xv = c + l < k ? x[r * ldx + c + l] : 0.0f;
        for (int j = 0; j < NR; ++j) {
          acc[r][j][l] = std::fma(xv, panel[j * kpad + c + l], acc[r][j][l]);
        }
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NR; ++j) {
      const float sum = ReduceLanes(acc[r][j]);
      y[r * ldy + j] = bias != nullptr ? sum + bias[j] : sum;
    }
  }
}

template <int MR, int NR>
void TileAvx2(const float* x, int64_t ldx, const float* panel, int64_t kpad, int64_t k,
              const float* bias, float* y, int64_t ldy) {
  __m256 acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NR; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  const int64_t full = k / kLanes * kLanes;
  for (int64_t c = 0; c < full; c += kLanes) {
    __m256 xv[MR];
    for (int r = 0; r < MR; ++r) xv[r] = _mm256_loadu_ps(x + r * ldx + c);
    for (int j = 0; j < NR; ++j) {
      __m256 wv = _mm256_load_ps(panel + j * kpad + c);
      // Keep wv in a register: GCC otherwise folds the load into each of the MR FMAs, and
      // the doubled loads, not the FMAs, then bound the loop.
      __asm__("" : "+x"(wv));
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm256_fmadd_ps(xv[r], wv, acc[r][j]);
    }
  }
  if (full < kpad) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k - full)), lane);
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm256_loadu_ps(panel + j * kpad + full);
    for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_maskload_ps(x + r * ldx + full, mask);
      for (int j = 0; j < NR; ++j) acc[r][j] = _mm256_fmadd_ps(xv, wv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NR; ++j) {
      const float sum = ReduceAvx2(acc[r][j]);
      y[r * ldy + j] = bias != nullptr ? sum + bias[j] : sum;
    }
  }
}

template <int MR, int NR>
struct ScalarTile {
  static constexpr TileFn fn = &TileScalar<MR, NR>;
};
template <int MR, int NR>
struct Avx2Tile {
  static constexpr TileFn fn = &TileAvx2<MR, NR>;
};

TileFn PickTile(Isa isa, int mr, int nr) {
  static constexpr auto kAvx2 = TileTable<TileFn, Avx2Tile, kMr, kNr>();
  static constexpr auto kScalar = TileTable<TileFn, ScalarTile, kMr, kNr>();
  return isa == Isa::kScalar ? kScalar[mr - 1][nr - 1] : kAvx2[mr - 1][nr - 1];
}

// ---- f32, a few rows of x on AVX2: weights converted in registers ----------------------

// For n <= kMrFused rows of x (decode) storing a panel and reading it back costs more than the
// FMAs: each block of a weight row is converted in registers (ConvertBlockAvx2) and multiplied
// into every row of x at once, kNrFused weight rows side by side so that their FMA chains
// overlap. The same arithmetic as TileAvx2 (k is a multiple of 32 here, so there is no tail).
constexpr int kMrFused = 2;
constexpr int kNrFused = 2;

// y[r * ldy + j] for r < MR, j < nr from MR rows of x (k apart) and weight rows w[0, kNrFused)
// of one 32-block segment (w[j] for j >= nr repeats a real row; its results are dropped).
template <int MR, Layout L>
void FusedTileAvx2(const float* x, int64_t k, const BlockRow* w, int64_t row_bytes,
                   const float* bias, int nr, float* y, int64_t ldy) {
  PrefetchSweep sweep(reinterpret_cast<const char*>(w[0].d) + kPrefetchBytes, kNrFused * row_bytes,
                      k / kBlock);
  __m256 acc[MR][kNrFused];
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < kNrFused; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < k / kBlock; ++b) {
    sweep.Step();
    for (int j = 0; j < kNrFused; ++j) {
      __m256 wv[4];
      ConvertBlockAvx2<L>(w[j], b, wv);
      for (int g = 0; g < 4; ++g) {
        for (int r = 0; r < MR; ++r) {
          acc[r][j] =
              _mm256_fmadd_ps(_mm256_loadu_ps(x + r * k + kBlock * b + 8 * g), wv[g], acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < nr; ++j) {
      const float sum = ReduceAvx2(acc[r][j]);
      y[r * ldy + j] = bias != nullptr ? sum + bias[j] : sum;
    }
  }
}

using FusedTileFn = void (*)(const float* x, int64_t k, const BlockRow* w, int64_t row_bytes,
                             const float* bias, int nr, float* y, int64_t ldy);

FusedTileFn PickFusedTileAvx2(Layout layout, int mr) {
  static constexpr FusedTileFn kTable[3][kMrFused] = {
      {FusedTileAvx2<1, Layout::kU4>, FusedTileAvx2<2, Layout::kU4>},
      {FusedTileAvx2<1, Layout::kU8>, FusedTileAvx2<2, Layout::kU8>},
      {FusedTileAvx2<1, Layout::kS8>, FusedTileAvx2<2, Layout::kS8>},
  };
  const int l = layout == Layout::kU4 ? 0 : layout == Layout::kU8 ? 1 : 2;
  return kTable[l][mr - 1];
}

// ---- the int8 path ------------------------------------------------------------------------

// Row i of x as int8 blocks: q [k], dx [nb], sx [nb] (linear.h).
void QuantizeRowScalar(const float* x, int64_t k, int8_t* q, float* dx, float* sx) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + kBlock * b;
    float amax = 0.0f;
    for (int e = 0; e < kBlock; ++e) amax = std::max(amax, std::fabs(xb[e]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int e = 0; e < kBlock; ++e) {
      const int32_t v = static_cast<int32_t>(std::nearbyint(xb[e] * id));
      q[kBlock * b + e] = static_cast<int8_t>(v);
      sum += v;
    }
    dx[b] = amax / 127.0f;
    sx[b] = dx[b] * static_cast<float>(sum);
  }
}

void QuantizeRowAvx2(const float* x, int64_t k, int8_t* q, float* dx, float* sx) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + kBlock * b;
    __m256 v[4];
    for (int g = 0; g < 4; ++g) v[g] = _mm256_loadu_ps(xb + 8 * g);
    __m256 m =
        _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                      _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i i[4];
    for (int g = 0; g < 4; ++g) {
      i[g] = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(v[g], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const __m256i total =
        _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    const __m256i p01 = _mm256_packs_epi32(i[0], i[1]);
    const __m256i p23 = _mm256_packs_epi32(i[2], i[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23),
                                                      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + kBlock * b), bytes);
    dx[b] = amax / 127.0f;
    sx[b] = dx[b] * static_cast<float>(_mm_cvtsi128_si32(t));
  }
}

// The unsigned formats' m term of (row, weight row): R of accm (linear.h), scalar and AVX2.
float MinTermScalar(const float* mw, const float* sx, int64_t nb) {
  float accm[kLanes] = {};
  for (int64_t b = 0; b < nb; ++b) accm[b % kLanes] = std::fma(mw[b], sx[b], accm[b % kLanes]);
  return ReduceLanes(accm);
}

// p_b of block b: Σ qw_e qx_e over its 32 integers. Kept scalar: GCC 12 at -O3 with VNNI
// enabled vectorizes this loop for int8 weights into vpdpbusd, which reads one side as
// unsigned bytes, and the sums come out wrong.
__attribute__((noinline, optimize("no-tree-vectorize"))) int32_t BlockDotScalar(Layout layout,
                                                                                const uint8_t* qw,
                                                                                int64_t b,
                                                                                const int8_t* qx) {
  int32_t p = 0;
  for (int e = 0; e < kBlock; ++e) p += QuantAt(layout, qw, b, e) * qx[kBlock * b + e];
  return p;
}

// y[r * ldy + j] for r < MR, j < NR from quantized rows x (xq.q etc. already at the first row)
// and weight rows w[j].
template <int MR, int NR>
void Int8TileScalar(const QuantizedX& xq, const BlockRow* w, Layout layout, const float* bias,
                    float* y, int64_t ldy) {
  for (int r = 0; r < MR; ++r) {
    const int8_t* xr = xq.q + r * xq.k;
    for (int j = 0; j < NR; ++j) {
      float acc[kLanes] = {};
      for (int64_t b = 0; b < xq.nb; ++b) {
        const float p = static_cast<float>(BlockDotScalar(layout, w[j].q, b, xr));
        acc[b % kLanes] = std::fma(p, w[j].d[b] * xq.d[r * xq.nb + b], acc[b % kLanes]);
      }
      float sum = ReduceLanes(acc);
      if (layout != Layout::kS8) sum = sum + MinTermScalar(w[j].m, xq.s + r * xq.nb, xq.nb);
      y[r * ldy + j] = bias != nullptr ? sum + bias[j] : sum;
    }
  }
}

}  // namespace

namespace internal {

float* PanelBuffer(int64_t floats) {
  struct Buffer {
    std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};
    int64_t size = 0;
  };
  thread_local Buffer buffer;
  if (buffer.size < floats) {
    const size_t bytes = static_cast<size_t>(RoundUp(floats * 4, kAlignment));
    buffer.data.reset(static_cast<float*>(std::aligned_alloc(kAlignment, bytes)));
    if (buffer.data == nullptr) std::abort();  // under 100 KiB per thread
    buffer.size = floats;
  }
  return buffer.data.get();
}

}  // namespace internal

namespace {

// R of linear.h over 8 lane vectors (8 rows side by side).
inline __m256 ReduceRowsAvx2(const __m256 (&v)[kLanes]) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6])),
                       _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7])));
}

// TileRow of linear_avx512.cc on AVX2: tile rows [j0, j1) for one row of x, the tile's two
// halves of 8 rows one after the other, a row in each lane. p_b for 8 rows is the sum of 8
// vpmaddwd(vpmaddubsw(group g of the 8 rows, x's 4 bytes broadcast), 1), exact (pair sums stay
// within int16: at most 2 * 128 * 127). The blocks run 8 at a time, block b0 + t into lane
// vector t.
template <Layout L>
void TileRowAvx2(const QuantizedX& xq, const uint8_t* tile, int j0, int j1, int64_t prefetch_bytes,
                 const float* bias, float* y) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  PrefetchSweep sweep(tile + xq.nb * internal::TileBlockBytes(L), prefetch_bytes, xq.nb);
  for (int h = 0; h < kTileRows / kLanes; ++h) {
    const int lo = std::max(j0, kLanes * h), hi = std::min(j1, kLanes * (h + 1));
    if (lo >= hi) continue;
    __m256 acc[kLanes], accm[kLanes];
    for (int l = 0; l < kLanes; ++l) acc[l] = accm[l] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < xq.nb; b0 += kLanes) {
      const int count = static_cast<int>(std::min<int64_t>(kLanes, xq.nb - b0));
      for (int t = 0; t < kLanes; ++t) {
        if (t >= count) break;
        const int64_t b = b0 + t;
        if (prefetch_bytes > 0 && h == 0) sweep.Step();
        const internal::TileBlock block = internal::BlockOfTile(tile, L, b);
        const int8_t* xb = xq.q + kBlock * b;
        __m256i p = _mm256_setzero_si256();
        for (int g = 0; g < kLanes; ++g) {
          __m256i w;
          if constexpr (L == Layout::kU4T) {
            const __m256i v = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(block.q + 64 * (g % 4) + 32 * h));
            w = _mm256_and_si256(g < 4 ? v : _mm256_srli_epi16(v, 4), nibble);
          } else {
            w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.q + 64 * g + 32 * h));
          }
          int32_t four;
          std::memcpy(&four, xb + 4 * g, 4);
          const __m256i x4 = _mm256_set1_epi32(four);
          const __m256i pairs =
              L == Layout::kS8T ? _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x4, w))
                                : _mm256_maddubs_epi16(w, x4);
          p = _mm256_add_epi32(p, _mm256_madd_epi16(pairs, ones));
        }
        const __m256 dw = _mm256_loadu_ps(block.d + kLanes * h);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, _mm256_set1_ps(xq.d[b])),
                                 acc[t]);
        if constexpr (L != Layout::kS8T) {
          accm[t] = _mm256_fmadd_ps(_mm256_loadu_ps(block.m + kLanes * h), _mm256_set1_ps(xq.s[b]),
                                    accm[t]);
        }
      }
    }
    __m256 sum = ReduceRowsAvx2(acc);
    if constexpr (L != Layout::kS8T) sum = _mm256_add_ps(sum, ReduceRowsAvx2(accm));
    alignas(32) float rows[kLanes];
    _mm256_store_ps(rows, sum);
    for (int j = lo; j < hi; ++j) {
      const float v = rows[j - kLanes * h];
      y[j - j0] = bias != nullptr ? v + bias[j - j0] : v;
    }
  }
}

using Int8TileFn = void (*)(const QuantizedX& xq, const BlockRow* w, const float* bias, float* y,
                            int64_t ldy);

template <int MR, int NR, Layout L>
void Int8TileScalarFor(const QuantizedX& xq, const BlockRow* w, const float* bias, float* y,
                       int64_t ldy) {
  Int8TileScalar<MR, NR>(xq, w, L, bias, y, ldy);
}

template <Layout L>
Int8TileFn PickInt8Tile(int mr, int nr) {
  static constexpr Int8TileFn kScalar[kMrInt8][kNrInt8] = {
      {Int8TileScalarFor<1, 1, L>, Int8TileScalarFor<1, 2, L>},
      {Int8TileScalarFor<2, 1, L>, Int8TileScalarFor<2, 2, L>},
      {Int8TileScalarFor<3, 1, L>, Int8TileScalarFor<3, 2, L>},
      {Int8TileScalarFor<4, 1, L>, Int8TileScalarFor<4, 2, L>},
  };
  return kScalar[mr - 1][nr - 1];
}

Int8TileFn PickInt8Tile(Layout layout, int mr, int nr) {
  switch (layout) {
    case Layout::kU4:
      return PickInt8Tile<Layout::kU4>(mr, nr);
    case Layout::kU8:
      return PickInt8Tile<Layout::kU8>(mr, nr);
    default:
      return PickInt8Tile<Layout::kS8>(mr, nr);
  }
}

// Rows [j0, j0 + rows) of one segment (rows of the whole weight), f32 path; y rows ldy apart.
void LinearF32(const float* x, int32_t n, const CpuWeight& w, int64_t j0, int64_t rows,
               const float* bias, float* y, int64_t ldy, int num_threads, Isa isa) {
  const int64_t k = w.cols();
  const CpuWeight::Segment& s = w.SegmentOf(j0);
  if (isa == Isa::kAvx2 && n <= kMrFused && s.layout != Layout::kStored) {
    const FusedTileFn tile_fn = PickFusedTileAvx2(s.layout, n);
    return ForBlockTiles<kNrFused>(n, s, j0 - s.row_begin, rows, k / kBlock, kMrFused, num_threads,
                                   [&](int32_t, int, int64_t c0, int nr, const BlockRow* w) {
                                     tile_fn(x, k, w, static_cast<int64_t>(s.row_bytes),
                                             bias != nullptr ? bias + c0 : nullptr, nr, y + c0,
                                             ldy);
                                   });
  }
  const int64_t kpad = RoundUp(std::max<int64_t>(k, 1), kLanes);
  ForPanelTiles(
      n, k, rows, kNr, kMr, kNr * kpad, num_threads,
      [&](int64_t c0, int nr, float* panel) {
        DequantizeRows(w, j0 + c0, nr, panel, kpad, isa);
        for (int j = 0; j < nr; ++j) std::fill(panel + j * kpad + k, panel + (j + 1) * kpad, 0.0f);
      },
      [&](int32_t i, int mr, int64_t c0, int nr, const float* panel) {
        PickTile(isa, mr, nr)(x + int64_t{i} * k, k, panel, kpad, k,
                              bias != nullptr ? bias + c0 : nullptr, y + int64_t{i} * ldy + c0,
                              ldy);
      });
}

// int8 on the scalar path: the row layouts.
void LinearInt8Scalar(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s, int64_t local0,
                      int64_t rows, const float* bias, float* y, int64_t ldy, int num_threads) {
  ForBlockTiles<kNrInt8>(n, s, local0, rows, xq.nb, kMrInt8, num_threads,
                         [&](int32_t i, int mr, int64_t c0, int nr, const BlockRow* w) {
                           PickInt8Tile(s.layout, mr, nr)(xq.From(i), w,
                                                          bias != nullptr ? bias + c0 : nullptr,
                                                          y + int64_t{i} * ldy + c0, ldy);
                         });
}

// int8 on AVX2: the 16-row tiles.
void LinearInt8Avx2(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s, int64_t local0,
                    int64_t rows, const float* bias, float* y, int64_t ldy, int num_threads) {
  const auto row_fn = s.layout == Layout::kU4T   ? TileRowAvx2<Layout::kU4T>
                      : s.layout == Layout::kU8T ? TileRowAvx2<Layout::kU8T>
                                                 : TileRowAvx2<Layout::kS8T>;
  internal::ForTileRows(xq, n, s, local0, rows, bias, y, ldy, num_threads, row_fn);
}
}  // namespace

std::string_view ActivationsName(Activations a) { return a == Activations::kInt8 ? "int8" : "f32"; }

absl::StatusOr<Activations> ParseActivations(std::string_view name) {
  if (name == "f32") return Activations::kF32;
  if (name == "int8") return Activations::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("activations '", std::string(name), "': want f32 or int8"));
}

void CpuWeight::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

const CpuWeight::Segment& CpuWeight::SegmentOf(int64_t row) const {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), row,
                             [](int64_t r, const Segment& s) { return r < s.row_begin; });
  assert(it != segments_.begin());
  return *(it - 1);
}

absl::StatusOr<Weight> CpuWeight::Pack(std::span<const HostTensor> parts, bool tiles) {
  if (parts.empty()) return absl::InvalidArgumentError("PackWeight: no parts");
  auto weight = std::unique_ptr<CpuWeight>(new CpuWeight());
  weight->cols_ = parts[0].cols;
  int64_t rows = 0;
  std::vector<size_t> segment_of_part;
  for (const HostTensor& part : parts) {
    if (part.cols != weight->cols_) {
      return absl::InvalidArgumentError(
          absl::StrCat("PackWeight: parts have ", weight->cols_, " and ", part.cols, " columns"));
    }
    if (part.dtype == DType::kI32) {
      return absl::UnimplementedError("PackWeight: I32 is not a weight type");
    }
    absl::StatusOr<size_t> stored_bytes = StorageBytes(part.dtype, part.cols);
    if (!stored_bytes.ok()) {
      return absl::Status(stored_bytes.status().code(),
                          absl::StrCat("PackWeight: ", stored_bytes.status().message()));
    }
    if (part.row_bytes < *stored_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("PackWeight: rows ", part.row_bytes, " bytes apart hold ", *stored_bytes));
    }
    const Layout layout = LayoutFor(part.dtype, tiles);
    if (weight->segments_.empty() || weight->segments_.back().dtype != part.dtype) {
      const size_t row_bytes =
          layout == Layout::kStored ? *stored_bytes : PackedRowBytes(layout, part.cols);
      weight->segments_.push_back(Segment{part.dtype, layout, rows, 0, row_bytes, nullptr});
    }
    weight->segments_.back().rows += part.rows;
    segment_of_part.push_back(weight->segments_.size() - 1);
    rows += part.rows;
  }
  // A tiled segment holds whole tiles, its last padded with zero rows.
  std::vector<size_t> segment_bytes;
  size_t total = 0;
  for (const Segment& segment : weight->segments_) {
    const int64_t stored_rows =
        internal::IsTiled(segment.layout) ? RoundUp(segment.rows, kTileRows) : segment.rows;
    segment_bytes.push_back(segment.row_bytes * static_cast<size_t>(stored_rows));
    total += segment_bytes.back();
  }
  const size_t rounded = std::max<size_t>(RoundUp(static_cast<int64_t>(total), kAlignment), 64);
  weight->storage_.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlignment, rounded)));
  if (weight->storage_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("PackWeight: cannot allocate ", total,
                                                     " bytes for a [", rows, ", ", weight->cols_,
                                                     "] weight"));
  }
  std::memset(weight->storage_.get(), 0, total);
  std::vector<uint8_t*> segment_data;
  uint8_t* out = weight->storage_.get();
  for (size_t i = 0; i < weight->segments_.size(); ++i) {
    weight->segments_[i].data = out;
    segment_data.push_back(out);
    out += segment_bytes[i];
  }
  // Each segment's stored rows, in order, from its parts.
  std::vector<std::vector<const uint8_t*>> sources(weight->segments_.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    for (int64_t r = 0; r < parts[p].rows; ++r) {
      sources[segment_of_part[p]].push_back(parts[p].data +
                                            static_cast<size_t>(r) * parts[p].row_bytes);
    }
  }
  const int64_t cols = weight->cols_;
  for (size_t i = 0; i < weight->segments_.size(); ++i) {
    const Segment& segment = weight->segments_[i];
    uint8_t* dst = segment_data[i];
    const std::vector<const uint8_t*>& src = sources[i];
    if (internal::IsTiled(segment.layout)) {
      for (int64_t r0 = 0; r0 < segment.rows; r0 += kTileRows) {
        const uint8_t* tile_rows[kTileRows];
        for (int j = 0; j < kTileRows; ++j) {
          tile_rows[j] = r0 + j < segment.rows ? src[static_cast<size_t>(r0 + j)] : nullptr;
        }
        RepackTile(segment.dtype, segment.layout, tile_rows, cols,
                   dst + static_cast<size_t>(r0) * segment.row_bytes);
      }
      continue;
    }
    for (int64_t r = 0; r < segment.rows; ++r, dst += segment.row_bytes) {
      if (segment.layout == Layout::kStored) {
        std::memcpy(dst, src[static_cast<size_t>(r)], segment.row_bytes);
      } else {
        RepackRow(segment.dtype, segment.layout, src[static_cast<size_t>(r)], cols, dst);
      }
    }
  }
  return Weight(std::move(weight), rows, cols, total);
}

void DequantizeRows(const CpuWeight& w, int64_t row, int64_t count, float* out, int64_t ld,
                    Isa isa) {
  for (int64_t i = 0; i < count; ++i) {
    const CpuWeight::Segment& s = w.SegmentOf(row + i);
    const int64_t local = row + i - s.row_begin;
    if (s.layout == Layout::kStored) {
      DequantizeStoredRow(s.dtype, s.data + static_cast<size_t>(local) * s.row_bytes, w.cols(),
                          out + i * ld, isa);
    } else if (internal::IsTiled(s.layout)) {
      DequantizeTileRow(s, local, w.cols(), out + i * ld);
    } else {
      DequantizeBlockRow(s, local, w.cols(), out + i * ld, isa);
    }
  }
}

void Linear(const float* x, int32_t n, const CpuWeight& w, int64_t row_begin, int64_t rows,
            const float* bias, float* y, int num_threads, Isa isa, Activations activations,
            LinearScratch& scratch) {
  if (n <= 0 || rows <= 0) return;
  const int64_t k = w.cols();
  bool quantized = false;  // x quantized for this call
  // Each segment's part of [row_begin, row_begin + rows) on its own path.
  for (int64_t r = row_begin; r < row_begin + rows;) {
    const CpuWeight::Segment& s = w.SegmentOf(r);
    const int64_t end = std::min(row_begin + rows, s.row_begin + s.rows);
    const int64_t c0 = r - row_begin;
    float* ys = y + c0;
    const float* bs = bias != nullptr ? bias + c0 : nullptr;
    if (activations == Activations::kInt8 && s.layout != Layout::kStored) {
      const int64_t nb = k / kBlock;
      if (!quantized) {
        // Zero rows past n, to a multiple of kAmxRows (QuantizedX); rows [0, n) are written
        // below, so only the padding is cleared.
        const size_t rows_q = static_cast<size_t>(n), padded = RoundUp(n, internal::kAmxRows);
        scratch.q.resize(padded * k);
        scratch.d.resize(padded * nb);
        scratch.s.resize(padded * nb);
        std::fill(scratch.q.begin() + rows_q * k, scratch.q.end(), int8_t{0});
        std::fill(scratch.d.begin() + rows_q * nb, scratch.d.end(), 0.0f);
        std::fill(scratch.s.begin() + rows_q * nb, scratch.s.end(), 0.0f);
        const auto quantize = isa == Isa::kScalar ? QuantizeRowScalar : QuantizeRowAvx2;
#pragma omp parallel for num_threads(std::max(1, std::min(num_threads, n)))
        for (int32_t i = 0; i < n; ++i) {
          quantize(x + static_cast<int64_t>(i) * k, k, &scratch.q[static_cast<size_t>(i) * k],
                   &scratch.d[static_cast<size_t>(i) * nb],
                   &scratch.s[static_cast<size_t>(i) * nb]);
        }
        quantized = true;
      }
      const QuantizedX xq{scratch.q.data(), scratch.d.data(), scratch.s.data(), k, nb};
      // An int8 backend on AVX2 or better packs tiles (CpuBackend::PackWeight), scalar rows.
      assert(internal::IsTiled(s.layout) == (isa >= Isa::kAvx2));
      if (isa == Isa::kAmx && n >= internal::kAmxMinRows) {
        internal::LinearInt8Amx(xq, n, s, r - s.row_begin, end - r, bs, ys, rows, num_threads);
      } else if (isa >= Isa::kAvx512) {
        internal::LinearInt8Avx512(xq, n, s, r - s.row_begin, end - r, bs, ys, rows, num_threads);
      } else if (isa == Isa::kAvx2) {
        LinearInt8Avx2(xq, n, s, r - s.row_begin, end - r, bs, ys, rows, num_threads);
      } else {
        LinearInt8Scalar(xq, n, s, r - s.row_begin, end - r, bs, ys, rows, num_threads);
      }
    } else if (isa >= Isa::kAvx512) {
      internal::LinearF32Avx512(x, n, w, r, end - r, bs, ys, rows, num_threads);
    } else {
      LinearF32(x, n, w, r, end - r, bs, ys, rows, num_threads, isa);
    }
    r = end;
  }
}

}  // namespace ridgeserve::cpu
