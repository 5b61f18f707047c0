// What linear.cc and linear_avx512.cc share: the packed block rows, the quantized activations
// of one call, the arithmetic's lane count and its reductions, and the thread split. Private to
// kernels/cpu (linear.h is the interface).
//
// The AVX-512 path lives in its own file and is compiled with function target attributes, not
// per-file flags, so inline functions from headers it uses (these, the standard library's) are
// never emitted with AVX-512 instructions for a binary that runs on AVX2 machines.
#ifndef RIDGESERVE_KERNELS_CPU_LINEAR_INTERNAL_H_
#define RIDGESERVE_KERNELS_CPU_LINEAR_INTERNAL_H_

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/cpu/linear.h"

namespace ridgeserve::cpu::internal {

constexpr int kLanes = 8;   // the arithmetic's lane count (linear.h), whatever the vector width
constexpr int kBlock = 32;  // weights per block of the repacked formats
constexpr size_t kAlignment = 64;

using Layout = CpuWeight::Layout;

inline int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Packed row of a 32-block layout: scales, then the integers.
struct BlockRow {
  const float* d;
  const float* m;  // nullptr for kS8
  const uint8_t* q;
};

inline BlockRow RowOf(const CpuWeight::Segment& s, int64_t local_row, int64_t nb) {
  const uint8_t* p = s.data + static_cast<size_t>(local_row) * s.row_bytes;
  const float* d = reinterpret_cast<const float*>(p);
  if (s.layout == Layout::kS8) return {d, nullptr, reinterpret_cast<const uint8_t*>(d + nb)};
  return {d, d + nb, reinterpret_cast<const uint8_t*>(d + 2 * nb)};
}

// The 16-row tiles (kU4T, kU8T, kS8T; linear.h).
constexpr int kTileRows = 16;

inline bool IsTiled(Layout layout) {
  return layout == Layout::kU4T || layout == Layout::kU8T || layout == Layout::kS8T;
}

// Block b of a tile: its 16 rows' scales and their integers.
struct TileBlock {
  const float* d;
  const float* m;  // nullptr for kS8T
  const uint8_t* q;
};

// Bytes of one block of a tile: d, m, the integers.
inline int64_t TileBlockBytes(Layout layout) {
  return layout == Layout::kU4T ? 64 + 64 + 256 : layout == Layout::kU8T ? 64 + 64 + 512 : 64 + 512;
}

// The first byte of tile `tile` (rows [16 tile, 16 tile + 16) of the segment).
inline const uint8_t* TileOf(const CpuWeight::Segment& s, int64_t tile) {
  return s.data + tile * kTileRows * static_cast<int64_t>(s.row_bytes);
}

inline TileBlock BlockOfTile(const uint8_t* tile, Layout layout, int64_t b) {
  const uint8_t* p = tile + b * TileBlockBytes(layout);
  const float* d = reinterpret_cast<const float*>(p);
  if (layout == Layout::kS8T) return {d, nullptr, p + 64};
  return {d, d + kTileRows, p + 128};
}

// How far ahead of the weight bytes it reads a decode tile asks for the next ones.
constexpr int64_t kPrefetchBytes = 4096;

// Asks for `bytes` bytes from `from` on, a line at a time, in `steps` equal steps (Step once
// per block): a tile streams in the weight bytes it reads next while its FMAs run (a
// segment's rows are contiguous, so the bytes after a tile's rows are the next tile's).
class PrefetchSweep {
 public:
  PrefetchSweep(const void* from, int64_t bytes, int64_t steps)
      : next_(static_cast<const char*>(from)), wanted_(next_), step_((bytes + steps - 1) / steps) {}
  void Step() {
    wanted_ += step_;
    for (; next_ < wanted_; next_ += 64) _mm_prefetch(next_, _MM_HINT_T0);
  }

 private:
  const char* next_;    // the next byte to ask for
  const char* wanted_;  // where the sweep is to be after this step
  int64_t step_;
};

// Rows of x in an AMX tile: the quantized x is padded with zero rows to a multiple of it.
constexpr int32_t kAmxRows = kTileRows;
// Calls with at least this many rows of x take the AMX path where it is present.
constexpr int32_t kAmxMinRows = 16;

// x quantized for one call: q [n, k], d and s [n, nb] (linear.h's dx and sx), padded to a
// multiple of kAmxRows rows with zeros.
struct QuantizedX {
  const int8_t* q;
  const float* d;
  const float* s;
  int64_t k, nb;

  // The rows from row i on.
  QuantizedX From(int32_t i) const { return {q + i * k, d + i * nb, s + i * nb, k, nb}; }
};

// R(acc) of linear.h on 8 lanes: lanes (i, i + 4), then (i, i + 2), then (0, 1).
inline float ReduceAvx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// This thread's buffer of at least `floats` floats, 64-byte aligned, reused across calls.
float* PanelBuffer(int64_t floats);

// Runs body(first_tile, end_tile) on each of up to num_threads threads, splitting `tiles`.
template <typename Body>
void ForTiles(int64_t tiles, int num_threads, const Body& body) {
  const int threads = static_cast<int>(std::clamp<int64_t>(tiles, 1, std::max(num_threads, 1)));
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    body(tiles * t / nt, tiles * (t + 1) / nt);
  }
}

// Rows of x per pass over a thread's weight rows, a multiple of mr: as many as fit in 512 KiB
// (half the smallest L2 seen here) while the panels stream by; each panel is converted once
// per pass.
inline int32_t RowBlock(int64_t k, int mr) {
  return static_cast<int32_t>(
      std::clamp<int64_t>((512 << 10) / (4 * std::max<int64_t>(k, 1)), mr, 1024) / mr * mr);
}

// The loop of the f32 panel kernels: `rows` weight rows in tiles of nr_tile, split over the
// threads; per pass of RowBlock rows of x, fill(c0, nr, panel) converts tile rows
// [c0, c0 + nr) into this thread's panel (panel_floats floats) and run(i, mr, c0, nr, panel)
// multiplies rows [i, i + mr) of x (mr <= mr_tile) by it.
template <typename Fill, typename Run>
void ForPanelTiles(int32_t n, int64_t k, int64_t rows, int nr_tile, int mr_tile,
                   int64_t panel_floats, int num_threads, const Fill& fill, const Run& run) {
  ForTiles((rows + nr_tile - 1) / nr_tile, num_threads, [&](int64_t tile_begin, int64_t tile_end) {
    float* panel = PanelBuffer(panel_floats);
    const int32_t row_block = RowBlock(k, mr_tile);
    for (int32_t i0 = 0; i0 < n; i0 += row_block) {
      const int32_t i1 = std::min(n, i0 + row_block);
      for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
        const int64_t c0 = tile * nr_tile;
        const int nr = static_cast<int>(std::min<int64_t>(nr_tile, rows - c0));
        fill(c0, nr, panel);
        for (int32_t i = i0; i < i1; i += mr_tile) run(i, std::min(mr_tile, i1 - i), c0, nr, panel);
      }
    }
  });
}

// The loop of the kernels that read a 32-block segment's packed rows directly (int8, and f32
// decode on AVX-512): local rows [local0, local0 + rows) in tiles of NR, split over the
// threads; run(i, mr, c0, nr, w) multiplies rows [i, i + mr) of x (mr <= mr_tile) by tile
// rows [c0, c0 + nr), w[0, NR) (w[j] for j >= nr repeats the tile's last row, so a kernel may
// read every w[j] and drop what it computes from them).
template <int NR, typename Run>
void ForBlockTiles(int32_t n, const CpuWeight::Segment& s, int64_t local0, int64_t rows, int64_t nb,
                   int mr_tile, int num_threads, const Run& run) {
  ForTiles((rows + NR - 1) / NR, num_threads, [&](int64_t tile_begin, int64_t tile_end) {
    for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
      const int64_t c0 = tile * NR;
      const int nr = static_cast<int>(std::min<int64_t>(NR, rows - c0));
      BlockRow w[NR];
      for (int j = 0; j < NR; ++j) w[j] = RowOf(s, local0 + c0 + std::min(j, nr - 1), nb);
      for (int32_t i = 0; i < n; i += mr_tile) run(i, std::min(mr_tile, n - i), c0, nr, w);
    }
  });
}

// The int8 loop over a tiled segment: the tiles covering local rows [local0, local0 + rows),
// split over the threads; each thread runs its tiles for every row of x.
// row_fn(x, tile, j0, j1, prefetch_bytes, bias, y) computes tile rows [j0, j1) for row x of x
// into y[0, j1 - j0) (with bias[0, j1 - j0) or nullptr); the first row of x streams in the
// next tile (prefetch_bytes of it, 0 for the other rows).
template <typename RowFn>
void ForTileRows(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s, int64_t local0,
                 int64_t rows, const float* bias, float* y, int64_t ldy, int num_threads,
                 RowFn row_fn) {
  const int64_t first = local0 / kTileRows, last = (local0 + rows - 1) / kTileRows;
  const int64_t tile_bytes = kTileRows * static_cast<int64_t>(s.row_bytes);
  ForTiles(last - first + 1, num_threads, [&](int64_t tile_begin, int64_t tile_end) {
    for (int64_t t = first + tile_begin; t < first + tile_end; ++t) {
      const int64_t r0 = std::max(local0, t * kTileRows);
      const int64_t r1 = std::min(local0 + rows, (t + 1) * kTileRows);
      const int j0 = static_cast<int>(r0 - t * kTileRows),
                j1 = static_cast<int>(r1 - t * kTileRows);
      const float* b = bias != nullptr ? bias + (r0 - local0) : nullptr;
      for (int32_t i = 0; i < n; ++i) {
        row_fn(xq.From(i), TileOf(s, t), j0, j1, i == 0 ? tile_bytes : 0, b,
               y + int64_t{i} * ldy + (r0 - local0));
      }
    }
  });
}

// table[m - 1][j - 1] = Tile<m, j>::fn for m <= M, j <= N: a tile kernel for every partial
// tile, picked at run time.
template <typename Fn, template <int, int> class Tile, int M, int... J>
constexpr std::array<Fn, sizeof...(J)> TileTableRow(std::integer_sequence<int, J...>) {
  return {Tile<M, J + 1>::fn...};
}
template <typename Fn, template <int, int> class Tile, int N, int... M>
constexpr std::array<std::array<Fn, N>, sizeof...(M)> TileTableRows(
    std::integer_sequence<int, M...>) {
  return {TileTableRow<Fn, Tile, M + 1>(std::make_integer_sequence<int, N>())...};
}
template <typename Fn, template <int, int> class Tile, int M, int N>
constexpr std::array<std::array<Fn, N>, M> TileTable() {
  return TileTableRows<Fn, Tile, N>(std::make_integer_sequence<int, M>());
}

// The AVX-512 path (linear_avx512.cc; call only where AvailableIsas() has Isa::kAvx512).
// f32: rows [row, row + rows) of w (rows of the whole weight, any segments), y rows ldy apart.
void LinearF32Avx512(const float* x, int32_t n, const CpuWeight& w, int64_t row, int64_t rows,
                     const float* bias, float* y, int64_t ldy, int num_threads);
// int8: local rows [local0, local0 + rows) of one segment in 16-row tiles.
void LinearInt8Avx512(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s, int64_t local0,
                      int64_t rows, const float* bias, float* y, int64_t ldy, int num_threads);

// The AMX path (linear_amx.cc; call only where AvailableIsas() has Isa::kAmx): int8, as
// LinearInt8Avx512, for at least kAmxMinRows rows of x.
void LinearInt8Amx(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s, int64_t local0,
                   int64_t rows, const float* bias, float* y, int64_t ldy, int num_threads);

}  // namespace ridgeserve::cpu::internal

#endif  // RIDGESERVE_KERNELS_CPU_LINEAR_INTERNAL_H_
