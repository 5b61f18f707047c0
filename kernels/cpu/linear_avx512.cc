// Linear's AVX-512 path (Isa::kAvx512): the arithmetic of linear.h, bit for bit, with 16-lane
// registers. f32: a zmm holds the 8 lanes of one weight row in its lower half and the same 8
// lanes of the next row in its upper half, with x's 8 lanes broadcast to both halves; each half
// then runs exactly the 8-lane accumulator the AVX2 and scalar paths run, and is reduced by the
// same tree. int8 reads the 16-row tiles: lane j of a zmm is row j of the tile, and VNNI's
// vpdpbusd adds a block's products into its exact integer sum p_b, 4 at a time.
//
// Every function here carries the AVX-512 target attribute instead of the file being compiled
// with AVX-512 flags (linear_internal.h says why).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/linear_internal.h"

#define RS_AVX512 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

namespace ridgeserve::cpu::internal {
namespace {

// GCC 12 seeds several AVX-512 intrinsics' results with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports (GCC PR 105593); their zero-masked forms with an all-ones mask
// are the same instructions without it.
constexpr __mmask16 kAll16 = 0xFFFF;
constexpr __mmask8 kAll8 = 0xFF;

// f32 tile: kMr rows of x by kNp pairs of weight rows; 24 accumulators, 4 x vectors and one
// panel vector of the 32 registers, 10 loads per 24 FMAs. The panel (12 rows, 27 KiB at
// k = 576) stays in L1 while x streams from L2.
constexpr int kMr = 4;
constexpr int kNp = 6;
constexpr int kNr = 2 * kNp;
// int8 tile: 4 rows of x by 2 pairs of weight rows.
constexpr int kMrInt8 = 4;
constexpr int kNpInt8 = 2;

RS_AVX512 inline __m512 Pair(__m256 lower, __m256 upper) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(lower), upper, 1);
}
// [*lower x 8 | *upper x 8]: two broadcast loads, the second under a mask.
RS_AVX512 inline __m512 PairOf(const float* lower, const float* upper) {
  return _mm512_mask_broadcastss_ps(_mm512_set1_ps(*lower), 0xFF00, _mm_load_ss(upper));
}
RS_AVX512 inline __m256 LowerHalf(__m512 v) { return _mm512_maskz_extractf32x8_ps(kAll8, v, 0); }
RS_AVX512 inline __m256 UpperHalf(__m512 v) { return _mm512_maskz_extractf32x8_ps(kAll8, v, 1); }
RS_AVX512 inline __m512 Widen(__m128i bytes, bool is_signed) {
  return _mm512_maskz_cvtepi32_ps(kAll16, is_signed ? _mm512_maskz_cvtepi8_epi32(kAll16, bytes)
                                                    : _mm512_maskz_cvtepu8_epi32(kAll16, bytes));
}

// ---- f32 --------------------------------------------------------------------------------

// Block `block` of rows a and b of one 32-block segment as 4 pair vectors (columns 8g..8g+7
// of a, then of b, in w[g]): the values DequantizeRow gives, fma(d, q, m) or d * q. A 4-bit
// block takes its values from two 16-entry tables, fma(d, i, m) for i < 16 of each row (the
// same operation on the same operands, so the same bits): vpermt2ps reads the low 5 bits of
// each lane's index, the nibble and, in the upper half, 16 for row b's table.
template <Layout L>
RS_AVX512 inline void ConvertPairBlock(const BlockRow& a, const BlockRow& b, int64_t block,
                                       __m512 w[4]) {
  if constexpr (L == Layout::kU4) {
    const __m512 iota = _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f,
                                       10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f);
    const __m512i upper = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16);
    const __m512 ta = _mm512_fmadd_ps(_mm512_set1_ps(a.d[block]), iota, _mm512_set1_ps(a.m[block]));
    const __m512 tb = _mm512_fmadd_ps(_mm512_set1_ps(b.d[block]), iota, _mm512_set1_ps(b.m[block]));
    const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.q + 16 * block));
    const __m128i qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.q + 16 * block));
    // Bytes 0..7 of a then of b, and bytes 8..15: low nibbles are elements 0..15, high 16..31.
    const __m512i bytes[2] = {_mm512_maskz_cvtepu8_epi32(kAll16, _mm_unpacklo_epi64(qa, qb)),
                              _mm512_maskz_cvtepu8_epi32(kAll16, _mm_unpackhi_epi64(qa, qb))};
    const __m512i nibble = _mm512_set1_epi32(0x0F);
    for (int h = 0; h < 2; ++h) {
      // (bytes & 0x0F) | upper, and (bytes >> 4) | upper.
      const __m512i low = _mm512_ternarylogic_epi32(bytes[h], nibble, upper, 0xEA);
      const __m512i high = _mm512_or_si512(_mm512_maskz_srli_epi32(kAll16, bytes[h], 4), upper);
      w[h] = _mm512_permutex2var_ps(ta, low, tb);
      w[2 + h] = _mm512_permutex2var_ps(ta, high, tb);
    }
    return;
  }
  const __m512 d = PairOf(a.d + block, b.d + block);
  __m128i chunks[4];  // 8 integers of row a, then the same 8 of row b
  for (int g = 0; g < 4; ++g) {
    chunks[g] = _mm_unpacklo_epi64(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.q + kBlock * block + 8 * g)),
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.q + kBlock * block + 8 * g)));
  }
  if constexpr (L == Layout::kS8) {
    for (int g = 0; g < 4; ++g) w[g] = _mm512_mul_ps(d, Widen(chunks[g], true));
  } else {
    const __m512 m = PairOf(a.m + block, b.m + block);
    for (int g = 0; g < 4; ++g) w[g] = _mm512_fmadd_ps(d, Widen(chunks[g], false), m);
  }
}

template <Layout L>
RS_AVX512 void PairRowsToPanel(const BlockRow& a, const BlockRow& b, int64_t nb, float* out,
                               PrefetchSweep& sweep) {
  for (int64_t block = 0; block < nb; ++block, out += 2 * kBlock) {
    sweep.Step();
    __m512 w[4];
    ConvertPairBlock<L>(a, b, block, w);
    for (int g = 0; g < 4; ++g) _mm512_store_ps(out + 16 * g, w[g]);
  }
}

// Rows [row, row + nr) of w, all in segment s, as the f32 panel of the tile: pair p's floats
// for columns [c, c + 8) at panel[2 * (p * kpad + c)], row 2p's in the first 8 and row
// 2p + 1's in the next 8; zero past k and for the missing row of an odd nr. `rows` is scratch
// for 2 * kpad floats.
RS_AVX512 void FillPairPanel(const CpuWeight& w, const CpuWeight::Segment& s, int64_t row, int nr,
                             int64_t kpad, float* panel, float* rows) {
  const int64_t k = w.cols(), nb = k / kBlock;
  // The next tile's rows (a thread's tiles are contiguous rows) stream in while this one's
  // are converted.
  PrefetchSweep sweep(s.data + (row + nr - s.row_begin) * static_cast<int64_t>(s.row_bytes),
                      nr * static_cast<int64_t>(s.row_bytes), std::max<int64_t>(nr / 2 * nb, 1));
  for (int p = 0; p < (nr + 1) / 2; ++p) {
    float* out = panel + 2 * p * kpad;
    const int64_t r0 = row + 2 * p;
    if (s.layout != Layout::kStored && 2 * p + 1 < nr) {
      const BlockRow a = RowOf(s, r0 - s.row_begin, nb), b = RowOf(s, r0 + 1 - s.row_begin, nb);
      switch (s.layout) {
        case Layout::kU4:
          PairRowsToPanel<Layout::kU4>(a, b, nb, out, sweep);
          break;
        case Layout::kU8:
          PairRowsToPanel<Layout::kU8>(a, b, nb, out, sweep);
          break;
        default:
          PairRowsToPanel<Layout::kS8>(a, b, nb, out, sweep);
      }
      continue;
    }
    const int have = std::min(2, nr - 2 * p);
    DequantizeRows(w, r0, have, rows, kpad, Isa::kAvx2);
    for (int j = 0; j < 2; ++j) {
      std::fill(rows + j * kpad + (j < have ? k : 0), rows + (j + 1) * kpad, 0.0f);
    }
    for (int64_t c = 0; c < kpad; c += kLanes) {
      _mm512_store_ps(out + 2 * c, Pair(_mm256_load_ps(rows + c), _mm256_load_ps(rows + kpad + c)));
    }
  }
}

// y[r * ldy + j] = R(half j % 2 of acc[r][j / 2]) (+ bias[j]) for r < MR, j < nr.
template <int MR, int NP>
RS_AVX512 inline void StorePairs(const __m512 (&acc)[MR][NP], const float* bias, int nr, float* y,
                                 int64_t ldy) {
  for (int r = 0; r < MR; ++r) {
    for (int p = 0; p < NP && 2 * p < nr; ++p) {
      const float lower = ReduceAvx2(LowerHalf(acc[r][p]));
      y[r * ldy + 2 * p] = bias != nullptr ? lower + bias[2 * p] : lower;
      if (2 * p + 1 < nr) {
        const float upper = ReduceAvx2(UpperHalf(acc[r][p]));
        y[r * ldy + 2 * p + 1] = bias != nullptr ? upper + bias[2 * p + 1] : upper;
      }
    }
  }
}

// y[r * ldy + j] for r < MR, j < nr (nr <= 2 NP) from MR rows of x (ldx apart) and the pair
// panel of FillPairPanel.
template <int MR, int NP>
RS_AVX512 void Tile(const float* x, int64_t ldx, const float* panel, int64_t kpad, int64_t k,
                    const float* bias, int nr, float* y, int64_t ldy) {
  __m512 acc[MR][NP];
  for (int r = 0; r < MR; ++r) {
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  const int64_t full = k / kLanes * kLanes;
  for (int64_t c = 0; c < full; c += kLanes) {
    __m512 xv[MR];
    for (int r = 0; r < MR; ++r) {
      xv[r] = _mm512_maskz_broadcast_f32x8(kAll16, _mm256_loadu_ps(x + r * ldx + c));
    }
    for (int p = 0; p < NP; ++p) {
      __m512 wv = _mm512_load_ps(panel + 2 * (p * kpad + c));
      // Keep wv in a register rather than folding its load into each of the MR FMAs.
      __asm__("" : "+v"(wv));
      for (int r = 0; r < MR; ++r) acc[r][p] = _mm512_fmadd_ps(xv[r], wv, acc[r][p]);
    }
  }
  if (full < kpad) {
    const __mmask8 mask = static_cast<__mmask8>((1u << (k - full)) - 1);
    for (int r = 0; r < MR; ++r) {
      const __m512 xv =
          _mm512_maskz_broadcast_f32x8(kAll16, _mm256_maskz_loadu_ps(mask, x + r * ldx + full));
      for (int p = 0; p < NP; ++p) {
        acc[r][p] = _mm512_fmadd_ps(xv, _mm512_load_ps(panel + 2 * (p * kpad + full)), acc[r][p]);
      }
    }
  }
  StorePairs<MR, NP>(acc, bias, nr, y, ldy);
}

using TileFn = void (*)(const float* x, int64_t ldx, const float* panel, int64_t kpad, int64_t k,
                        const float* bias, int nr, float* y, int64_t ldy);
template <int MR, int NP>
struct PanelTile {
  static constexpr TileFn fn = &Tile<MR, NP>;
};
// kTiles[mr - 1][np - 1] = Tile<mr, np>.
constexpr auto kTiles = TileTable<TileFn, PanelTile, kMr, kNp>();

// ---- f32, a few rows of x: weights converted in registers -------------------------------

// For n <= kMr rows of x (decode) a panel costs more than it saves: each block of a pair of
// rows is converted in registers and multiplied into every row of x at once. The pairs of a
// tile run one after another, each over all its blocks, so a tile reads its rows as a few
// sequential streams: taking the pairs side by side block by block (8 rows' scales and
// integers interleaved) measured 1.7-1.9x slower on the 49152-row LM head, where the weights
// come from memory. A tile's rows are contiguous (a segment's rows are), and it asks for the
// bytes kPrefetchBytes ahead of those it reads, so they stream in while its FMAs run. The same
// arithmetic as Tile.
constexpr int kNpFused = 4;
constexpr int kNrFused = 2 * kNpFused;

// xb: row r of x with each 8 columns twice, [x_c..x_c+7, x_c..x_c+7] at xb[r * 2k + 2c];
// w[0, kNrFused): rows of one 32-block segment, row_bytes apart from w[0] on (w[j] for
// j >= nr repeats a real row).
template <int MR, Layout L>
RS_AVX512 void FusedTile(const float* xb, int64_t k, const BlockRow* w, int64_t row_bytes,
                         const float* bias, int nr, float* y, int64_t ldy) {
  const int64_t nb = k / kBlock;
  PrefetchSweep sweep(reinterpret_cast<const char*>(w[0].d) + kPrefetchBytes, kNrFused * row_bytes,
                      kNpFused * nb);
  __m512 acc[MR][kNpFused];
  for (int r = 0; r < MR; ++r) {
    for (int p = 0; p < kNpFused; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int p = 0; p < kNpFused; ++p) {
    for (int64_t b = 0; b < nb; ++b) {
      sweep.Step();
      __m512 wv[4];
      ConvertPairBlock<L>(w[2 * p], w[2 * p + 1], b, wv);
      for (int g = 0; g < 4; ++g) {
        for (int r = 0; r < MR; ++r) {
          const __m512 xv = _mm512_load_ps(xb + r * 2 * k + 2 * (kBlock * b + 8 * g));
          acc[r][p] = _mm512_fmadd_ps(xv, wv[g], acc[r][p]);
        }
      }
    }
  }
  StorePairs<MR, kNpFused>(acc, bias, nr, y, ldy);
}

using FusedTileFn = void (*)(const float* xb, int64_t k, const BlockRow* w, int64_t row_bytes,
                             const float* bias, int nr, float* y, int64_t ldy);

FusedTileFn PickFusedTile(Layout layout, int mr) {
  static constexpr FusedTileFn kTable[3][kMr] = {
      {FusedTile<1, Layout::kU4>, FusedTile<2, Layout::kU4>, FusedTile<3, Layout::kU4>,
       FusedTile<4, Layout::kU4>},
      {FusedTile<1, Layout::kU8>, FusedTile<2, Layout::kU8>, FusedTile<3, Layout::kU8>,
       FusedTile<4, Layout::kU8>},
      {FusedTile<1, Layout::kS8>, FusedTile<2, Layout::kS8>, FusedTile<3, Layout::kS8>,
       FusedTile<4, Layout::kS8>},
  };
  const int l = layout == Layout::kU4 ? 0 : layout == Layout::kU8 ? 1 : 2;
  return kTable[l][mr - 1];
}

// x's rows with each 8 columns written twice (FusedTile's xb).
RS_AVX512 void BroadcastRows(const float* x, int32_t n, int64_t k, float* xb) {
  for (int64_t i = 0; i < int64_t{n} * k; i += kLanes) {
    _mm512_store_ps(xb + 2 * i, _mm512_maskz_broadcast_f32x8(kAll16, _mm256_loadu_ps(x + i)));
  }
}

void LinearF32Fused(const float* x, int32_t n, const CpuWeight::Segment& s, int64_t local0,
                    int64_t k, int64_t rows, const float* bias, float* y, int64_t ldy,
                    int num_threads) {
  float* xb = PanelBuffer(2 * int64_t{n} * k);
  BroadcastRows(x, n, k, xb);
  const FusedTileFn tile_fn = PickFusedTile(s.layout, n);
  ForBlockTiles<kNrFused>(n, s, local0, rows, k / kBlock, kMr, num_threads,
                          [&](int32_t, int, int64_t c0, int nr, const BlockRow* w) {
                            tile_fn(xb, k, w, static_cast<int64_t>(s.row_bytes),
                                    bias != nullptr ? bias + c0 : nullptr, nr, y + c0, ldy);
                          });
}

// ---- int8, on 16-row tiles ---------------------------------------------------------

// Block b's integers of a tile's 16 rows as 8 vectors: group g (elements 4g..4g+3) of row j in
// lanes j of vector g.
template <Layout L>
RS_AVX512 inline void LoadGroups(const uint8_t* q, __m512i (&groups)[kLanes]) {
  if constexpr (L == Layout::kU4T) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < 4; ++h) {
      const __m512i v = _mm512_loadu_si512(q + 64 * h);
      groups[h] = _mm512_and_si512(v, nibble);
      groups[h + 4] = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll16, v, 4), nibble);
    }
  } else {
    for (int g = 0; g < kLanes; ++g) groups[g] = _mm512_loadu_si512(q + 64 * g);
  }
}

// R of linear.h over 8 lane vectors.
RS_AVX512 inline __m512 Reduce(const __m512 (&v)[kLanes]) {
  return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
                       _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])));
}

// Tile rows [j0, j1) for one row of x (xq at it): y[j - j0] = R(acc) (+ R(accm)) (+ bias[j - j0]),
// the 16 rows side by side in the lanes. p_b for the 16 rows is the sum of 8 vpdpbusd (one a
// group of 4 integers, x's 4 bytes broadcast). The blocks run 8 at a time, block b0 + t into
// lane vector t. prefetch_bytes: how many bytes of the next tile to stream in (0: none).
template <Layout L>
RS_AVX512 void TileRow(const QuantizedX& xq, const uint8_t* tile, int j0, int j1,
                       int64_t prefetch_bytes, const float* bias, float* y) {
  PrefetchSweep sweep(tile + xq.nb * TileBlockBytes(L), prefetch_bytes, xq.nb);
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[kLanes], accm[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = accm[l] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < xq.nb; b0 += kLanes) {
    const int count = static_cast<int>(std::min<int64_t>(kLanes, xq.nb - b0));
    for (int t = 0; t < kLanes; ++t) {
      if (t >= count) break;
      const int64_t b = b0 + t;
      if (prefetch_bytes > 0) sweep.Step();
      const TileBlock block = BlockOfTile(tile, L, b);
      __m512i groups[kLanes];
      LoadGroups<L>(block.q, groups);
      const int8_t* xb = xq.q + kBlock * b;
      __m512i p = zero;
      if constexpr (L == Layout::kS8T) {
        // vpdpbusd multiplies unsigned by signed bytes: x + 128 as the unsigned side, and
        // 128 Σ w off again.
        const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
        __m512i shift = zero;
        for (int g = 0; g < kLanes; ++g) {
          int32_t four;
          std::memcpy(&four, xb + 4 * g, 4);
          p = _mm512_dpbusd_epi32(p, _mm512_xor_si512(_mm512_set1_epi32(four), flip), groups[g]);
          shift = _mm512_dpbusd_epi32(shift, flip, groups[g]);
        }
        p = _mm512_sub_epi32(p, shift);
      } else {
        for (int g = 0; g < kLanes; ++g) {
          int32_t four;
          std::memcpy(&four, xb + 4 * g, 4);
          p = _mm512_dpbusd_epi32(p, groups[g], _mm512_set1_epi32(four));
        }
      }
      const __m512 dw = _mm512_loadu_ps(block.d);
      acc[t] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(kAll16, p),
                               _mm512_mul_ps(dw, _mm512_set1_ps(xq.d[b])), acc[t]);
      if constexpr (L != Layout::kS8T) {
        accm[t] = _mm512_fmadd_ps(_mm512_loadu_ps(block.m), _mm512_set1_ps(xq.s[b]), accm[t]);
      }
    }
  }
  __m512 sum = Reduce(acc);
  if constexpr (L != Layout::kS8T) sum = _mm512_add_ps(sum, Reduce(accm));
  // Lanes [j0, j1) to the front.
  const __mmask16 lanes = static_cast<__mmask16>(((1u << j1) - 1) & ~((1u << j0) - 1));
  const __mmask16 first = static_cast<__mmask16>((1u << (j1 - j0)) - 1);
  sum = _mm512_maskz_compress_ps(lanes, sum);
  if (bias != nullptr) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(first, bias));
  _mm512_mask_storeu_ps(y, first, sum);
}

using TileRowFn = void (*)(const QuantizedX& xq, const uint8_t* tile, int j0, int j1,
                           int64_t prefetch_bytes, const float* bias, float* y);

}  // namespace

void LinearInt8Avx512(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s, int64_t local0,
                      int64_t rows, const float* bias, float* y, int64_t ldy, int num_threads) {
  const TileRowFn row_fn = s.layout == Layout::kU4T   ? TileRow<Layout::kU4T>
                           : s.layout == Layout::kU8T ? TileRow<Layout::kU8T>
                                                      : TileRow<Layout::kS8T>;
  ForTileRows(xq, n, s, local0, rows, bias, y, ldy, num_threads, row_fn);
}

void LinearF32Avx512(const float* x, int32_t n, const CpuWeight& w, int64_t row, int64_t rows,
                     const float* bias, float* y, int64_t ldy, int num_threads) {
  const CpuWeight::Segment& s = w.SegmentOf(row);
  const int64_t k = w.cols();
  if (n <= kMr && s.layout != Layout::kStored) {
    return LinearF32Fused(x, n, s, row - s.row_begin, k, rows, bias, y, ldy, num_threads);
  }
  const int64_t kpad = RoundUp(std::max<int64_t>(k, 1), kLanes);
  // Each thread's panel, then 2 kpad floats of scratch for FillPairPanel.
  ForPanelTiles(
      n, k, rows, kNr, kMr, (kNr + 2) * kpad, num_threads,
      [&](int64_t c0, int nr, float* panel) {
        FillPairPanel(w, s, row + c0, nr, kpad, panel, panel + kNr * kpad);
      },
      [&](int32_t i, int mr, int64_t c0, int nr, const float* panel) {
        kTiles[mr - 1][(nr + 1) / 2 - 1](x + int64_t{i} * k, k, panel, kpad, k,
                                         bias != nullptr ? bias + c0 : nullptr, nr,
                                         y + int64_t{i} * ldy + c0, ldy);
      });
}

}  // namespace ridgeserve::cpu::internal
