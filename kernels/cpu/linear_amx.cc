// Linear's AMX path (Isa::kAmx): linear.h's int8 arithmetic for many rows of x. One AMX tile
// instruction gives p_b, a block's exact integer dot product, for 16 rows of x by 16 weight
// rows; AVX-512 then applies the scales in linear.h's order. An integer sum is the same however
// it is added up, so the bits are those of every other path.
//
// A thread takes the weight's 16-row tiles (linear.h) one at a time and multiplies every 16 rows
// of x against it. Their integers are already in the B tile's layout (each block's 4-byte
// groups of the 16 rows side by side); 4-bit ones are split into bytes once per tile. The
// caller pads the quantized x to a multiple of 16 rows with zeros, so every row of an A tile
// can be loaded.
//
// Every function that runs tile or AVX-512 instructions carries the target attribute
// (linear_internal.h says why); the tile instructions are GCC's inline assembly.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/linear_internal.h"

#define RS_AMX                                                                       \
  __attribute__((                                                                    \
      target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,amx-tile," \
             "amx-int8")))

namespace ridgeserve::cpu::internal {
namespace {

constexpr int kTile = kAmxRows;                       // rows of x, and weight rows, per tile
constexpr int64_t kPanelBlockBytes = kBlock * kTile;  // one block of 16 weight rows
constexpr __mmask16 kAll16 = 0xFFFF;

// Tiles 0 and 1: C, 16 x 16 int32 sums; 2 and 3: A, 16 rows of x, one block (32 bytes) each;
// 4 and 5: B, one block of 16 weight rows (8 rows of 64 bytes: a 4-byte group of each row).
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
alignas(64) constexpr TileConfig kConfig = {
    1, 0, {}, {64, 64, kBlock, kBlock, 64, 64}, {kTile, kTile, kTile, kTile, 8, 8}};

// A weight tile as the kernels read it: block b's integers in B's layout at q + q_step b
// (group g of row j at byte 64 g + 4 j), its 16 rows' d and m (m for the unsigned formats) at
// Scales(b).
struct Panel {
  const uint8_t* q;
  int64_t q_step;
  const uint8_t* tile;
  Layout layout;

  TileBlock Scales(int64_t b) const { return BlockOfTile(tile, layout, b); }
};

// The panel of one weight tile: kU8T's and kS8T's integers are read where they are; kU4T's
// are split into bytes in `bytes` (512 a block).
template <Layout L>
RS_AMX Panel PanelOf(const uint8_t* tile, int64_t nb, uint8_t* bytes) {
  if constexpr (L != Layout::kU4T) {
    return {BlockOfTile(tile, L, 0).q, TileBlockBytes(L), tile, L};
  }
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = BlockOfTile(tile, L, b).q;
    uint8_t* out = bytes + kPanelBlockBytes * b;
    for (int h = 0; h < 4; ++h) {
      const __m512i v = _mm512_loadu_si512(q + 64 * h);
      _mm512_store_si512(out + 64 * h, _mm512_and_si512(v, nibble));
      _mm512_store_si512(out + 64 * (h + 4),
                         _mm512_and_si512(_mm512_maskz_srli_epi32(kAll16, v, 4), nibble));
    }
  }
  // The tile loads are assembly that does not say it reads memory: these stores must not move
  // past them.
  __asm__ volatile("" ::: "memory");
  return {bytes, kPanelBlockBytes, tile, L};
}

// a[i] = fma(float(p_b[i][j]), dw_b[j] * dx_b[i], a[i]) for the 16 rows i of x.
RS_AMX inline void Scale(const int32_t (&sums)[kTile][kTile], const QuantizedX& xq,
                         const Panel& panel, int64_t b, __m512 (&a)[kTile]) {
  const __m512 dw = _mm512_loadu_ps(panel.Scales(b).d);
  for (int i = 0; i < kTile; ++i) {
    const __m512 p = _mm512_maskz_cvtepi32_ps(kAll16, _mm512_load_si512(sums[i]));
    a[i] = _mm512_fmadd_ps(p, _mm512_mul_ps(dw, _mm512_set1_ps(xq.d[i * xq.nb + b])), a[i]);
  }
}

// The tile work of one block b in C tile `C`: p_b for the 16 rows of x by the panel's 16 rows.
template <int C, Layout L>
RS_AMX inline void MultiplyBlock(const QuantizedX& xq, const Panel& panel, int64_t b) {
  if constexpr (C == 0) {
    _tile_loadd(2, xq.q + kBlock * b, xq.k);
    _tile_loadd(4, panel.q + panel.q_step * b, 64);
    _tile_zero(0);
    if constexpr (L == Layout::kS8T) {
      _tile_dpbssd(0, 2, 4);
    } else {
      _tile_dpbsud(0, 2, 4);  // x signed, weights unsigned
    }
  } else {
    _tile_loadd(3, xq.q + kBlock * b, xq.k);
    _tile_loadd(5, panel.q + panel.q_step * b, 64);
    _tile_zero(1);
    if constexpr (L == Layout::kS8T) {
      _tile_dpbssd(1, 3, 5);
    } else {
      _tile_dpbsud(1, 3, 5);
    }
  }
}

template <int C>
RS_AMX inline void StoreSums(int32_t (&sums)[kTile][kTile]) {
  if constexpr (C == 0) {
    _tile_stored(0, sums, 64);
  } else {
    _tile_stored(1, sums, 64);
  }
}

// The blocks of a tile in lane order (lane 0's blocks 0, 8, ..., then lane 1's, ...), run as a
// three-stage pipeline: step s multiplies the s-th block into C tile s % 2, stores the sums
// of the (s-1)-th, and scales the (s-2)-th's (stored a step earlier) into its lane, so the
// tile unit and the vector units work side by side.
struct Pipeline {
  int64_t nb;
  int32_t (*sums)[kTile][kTile];                 // 3 buffers: step s's block at s % 3
  int64_t multiply = 0, store = -1, scale = -1;  // block of each stage; -1: none
  int lane = 0;                                  // lane of the vector accumulators

  static int64_t Next(int64_t b, int64_t nb) {
    if (b < 0) return -1;
    if (b + kLanes < nb) return b + kLanes;
    const int64_t lane = b % kLanes + 1;
    return lane < std::min<int64_t>(nb, kLanes) ? lane : -1;
  }
};

template <int C, Layout L>
RS_AMX inline void PipelineStep(const QuantizedX& xq, const Panel& panel, int64_t step, Pipeline& p,
                                __m512 (&a)[kTile], float (*acc)[kTile][kTile],
                                PrefetchSweep* sweep) {
  if (p.multiply >= 0) {
    if (sweep != nullptr) sweep->Step();
    MultiplyBlock<C, L>(xq, panel, p.multiply);
  }
  if (p.store >= 0) StoreSums<1 - C>(p.sums[(step + 2) % 3]);
  if (p.scale >= 0) {
    if (p.scale % kLanes != p.lane) {
      for (int i = 0; i < kTile; ++i) _mm512_store_ps(acc[p.lane][i], a[i]);
      for (__m512& v : a) v = _mm512_setzero_ps();
      p.lane = static_cast<int>(p.scale % kLanes);
    }
    Scale(p.sums[(step + 1) % 3], xq, panel, p.scale, a);
  }
  p.scale = p.store;
  p.store = p.multiply;
  p.multiply = Pipeline::Next(p.multiply, p.nb);
}

// acc[l][i] = lane l of linear.h's acc for row i of x (16 from xq on) against the panel's 16
// weight rows, one per lane of the vector. sweep (or nullptr) steps once a block.
template <Layout L>
RS_AMX void BlockProducts(const QuantizedX& xq, const Panel& panel, float (*acc)[kTile][kTile],
                          PrefetchSweep* sweep) {
  alignas(64) int32_t sums[3][kTile][kTile];
  Pipeline p{xq.nb, sums};
  __m512 a[kTile];
  for (__m512& v : a) v = _mm512_setzero_ps();
  for (int64_t step = 0; p.multiply >= 0 || p.store >= 0 || p.scale >= 0; step += 2) {
    PipelineStep<0, L>(xq, panel, step, p, a, acc, sweep);
    PipelineStep<1, L>(xq, panel, step + 1, p, a, acc, sweep);
  }
  for (int i = 0; i < kTile; ++i) _mm512_store_ps(acc[p.lane][i], a[i]);
  // Lanes without blocks (nb < 8) add nothing.
  for (int l = static_cast<int>(std::min<int64_t>(xq.nb, kLanes)); l < kLanes; ++l) {
    for (int i = 0; i < kTile; ++i) _mm512_store_ps(acc[l][i], _mm512_setzero_ps());
  }
}

// R of linear.h over 8 lane vectors.
RS_AMX inline __m512 Reduce(const __m512 (&v)[kLanes]) {
  return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
                       _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])));
}

// accm[l][i] = lane l of linear.h's accm (unsigned formats) for row i of x (16 from xq on)
// against the panel's 16 weight rows: fma(mw_b, sx_b, .) over blocks b = l, l + 8, ...
RS_AMX void MinTerms(const QuantizedX& xq, const Panel& panel, float (*accm)[kTile][kTile]) {
  for (int l = 0; l < kLanes; ++l) {
    __m512 am[kTile];
    for (__m512& v : am) v = _mm512_setzero_ps();
    for (int64_t b = l; b < xq.nb; b += kLanes) {
      const __m512 mw = _mm512_loadu_ps(panel.Scales(b).m);
      for (int i = 0; i < kTile; ++i) {
        am[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xq.s[i * xq.nb + b]), am[i]);
      }
    }
    for (int i = 0; i < kTile; ++i) _mm512_store_ps(accm[l][i], am[i]);
  }
}

// y[i * ldy + j - j0] for i < mr, j in [j0, j1): R(acc) (+ R(accm) for the unsigned formats)
// (+ bias[j - j0]).
template <Layout L>
RS_AMX void StoreTile(const float (*acc)[kTile][kTile], const float (*accm)[kTile][kTile], int mr,
                      int j0, int j1, const float* bias, float* y, int64_t ldy) {
  const __mmask16 lanes = static_cast<__mmask16>(((1u << j1) - 1) & ~((1u << j0) - 1));
  const __mmask16 first = static_cast<__mmask16>((1u << (j1 - j0)) - 1);
  const __m512 bv = bias != nullptr ? _mm512_maskz_loadu_ps(first, bias) : _mm512_setzero_ps();
  for (int i = 0; i < mr; ++i) {
    __m512 v[kLanes];
    for (int l = 0; l < kLanes; ++l) v[l] = _mm512_load_ps(acc[l][i]);
    __m512 sum = Reduce(v);
    if constexpr (L != Layout::kS8T) {
      for (int l = 0; l < kLanes; ++l) v[l] = _mm512_load_ps(accm[l][i]);
      sum = _mm512_add_ps(sum, Reduce(v));
    }
    sum = _mm512_maskz_compress_ps(lanes, sum);
    if (bias != nullptr) sum = _mm512_add_ps(sum, bv);
    _mm512_mask_storeu_ps(y + i * ldy, first, sum);
  }
}

// Weight tiles [tile_begin, tile_end) (of the segment) against every row of x, on this thread;
// of their rows, only local rows [local0, local0 + rows) are stored.
template <Layout L>
RS_AMX void MultiplyTiles(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s,
                          int64_t local0, int64_t rows, const float* bias, float* y, int64_t ldy,
                          int64_t tile_begin, int64_t tile_end) {
  const int64_t nb = xq.nb;
  // 4-bit integers split into bytes (512 a block), then the lane accumulators of one tile of
  // the output: acc, accm.
  float* buffer = PanelBuffer(nb * kPanelBlockBytes / 4 + 2 * kLanes * kTile * kTile);
  auto* acc = reinterpret_cast<float(*)[kTile][kTile]>(buffer + nb * kPanelBlockBytes / 4);
  auto* accm = acc + kLanes;
  _tile_loadconfig(&kConfig);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const Panel panel = PanelOf<L>(TileOf(s, t), nb, reinterpret_cast<uint8_t*>(buffer));
    const int64_t r0 = std::max(local0, t * kTile);
    const int64_t r1 = std::min(local0 + rows, (t + 1) * kTile);
    const int j0 = static_cast<int>(r0 - t * kTile), j1 = static_cast<int>(r1 - t * kTile);
    // The first 16 rows of x stream in the next tile's bytes (a thread's tiles are one run).
    PrefetchSweep sweep(TileOf(s, t + 1), kTile * static_cast<int64_t>(s.row_bytes), nb);
    for (int32_t i0 = 0; i0 < n; i0 += kTile) {
      const QuantizedX x = xq.From(i0);
      BlockProducts<L>(x, panel, acc, i0 == 0 ? &sweep : nullptr);
      if constexpr (L != Layout::kS8T) MinTerms(x, panel, accm);
      StoreTile<L>(acc, accm, std::min(kTile, n - i0), j0, j1,
                   bias != nullptr ? bias + (r0 - local0) : nullptr,
                   y + int64_t{i0} * ldy + (r0 - local0), ldy);
    }
  }
  _tile_release();
}

using MultiplyFn = void (*)(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s,
                            int64_t local0, int64_t rows, const float* bias, float* y, int64_t ldy,
                            int64_t tile_begin, int64_t tile_end);

}  // namespace

void LinearInt8Amx(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s, int64_t local0,
                   int64_t rows, const float* bias, float* y, int64_t ldy, int num_threads) {
  const MultiplyFn multiply = s.layout == Layout::kU4T   ? MultiplyTiles<Layout::kU4T>
                              : s.layout == Layout::kU8T ? MultiplyTiles<Layout::kU8T>
                                                         : MultiplyTiles<Layout::kS8T>;
  const int64_t first = local0 / kTile, last = (local0 + rows - 1) / kTile;
  ForTiles(last - first + 1, num_threads, [&](int64_t tile_begin, int64_t tile_end) {
    multiply(xq, n, s, local0, rows, bias, y, ldy, first + tile_begin, first + tile_end);
  });
}

}  // namespace ridgeserve::cpu::internal
