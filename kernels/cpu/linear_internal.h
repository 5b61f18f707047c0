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
#include <cstddef>
#include <cstdint>

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

// x quantized for one call: q [n, k], d and s [n, nb] (linear.h's dx and sx).
struct QuantizedX {
  const int8_t* q;
  const float* d;
  const float* s;
  int64_t k, nb;
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

// The AVX-512 path (linear_avx512.cc; call only where AvailableIsas() has Isa::kAvx512).
// f32: rows [row, row + rows) of w (rows of the whole weight, any segments), y rows ldy apart.
void LinearF32Avx512(const float* x, int32_t n, const CpuWeight& w, int64_t row, int64_t rows,
                     const float* bias, float* y, int64_t ldy, int num_threads);
// int8: local rows [local0, local0 + rows) of one 32-block segment.
void LinearInt8Avx512(const QuantizedX& xq, int32_t n, const CpuWeight::Segment& s, int64_t local0,
                      int64_t rows, const float* bias, float* y, int64_t ldy, int num_threads);

}  // namespace ridgeserve::cpu::internal

#endif  // RIDGESERVE_KERNELS_CPU_LINEAR_INTERNAL_H_
