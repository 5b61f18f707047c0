#include "kernels/cpu/row_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cmath>

#include "kernels/cpu/simd.h"

namespace ridgeserve::cpu {
namespace {

// Below this many elements an op runs on the calling thread: waking workers costs more.
constexpr int64_t kMinParallelElements = 1 << 15;

int ThreadsFor(int64_t elements, int num_threads) {
  return elements < kMinParallelElements ? 1 : std::max(num_threads, 1);
}

// Sum of x[i]^2 in double: products are exact, sums go to 8 interleaved partial sums
// (element i to partial i % 8) combined in a fixed tree, then the tail in order.
double SumSquares(const float* x, int32_t n) {
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    acc0 = _mm256_fmadd_pd(lo, lo, acc0);
    acc1 = _mm256_fmadd_pd(hi, hi, acc1);
  }
  const __m256d s4 = _mm256_add_pd(acc0, acc1);
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  double sum = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
  for (; i < n; ++i) sum += double{x[i]} * x[i];
  return sum;
}

// out = (x * r) * w with r = float(1 / sqrt(mean(x^2) + eps)); out may alias x.
void NormalizeRow(const float* x, const float* w, int32_t dim, float eps, float* out) {
  const double mean = SumSquares(x, dim) / dim;
  const float r = static_cast<float>(1.0 / std::sqrt(mean + double{eps}));
  for (int32_t i = 0; i < dim; ++i) out[i] = (x[i] * r) * w[i];
}

}  // namespace

void RmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps, float* out,
             int num_threads) {
#pragma omp parallel for num_threads(ThreadsFor(int64_t{n} * dim, num_threads)) schedule(static)
  for (int32_t i = 0; i < n; ++i) {
    NormalizeRow(x + int64_t{i} * dim, w, dim, eps, out + int64_t{i} * dim);
  }
}

void RmsNormHeads(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                  const float* w, float eps, int num_threads) {
  const int threads = ThreadsFor(int64_t{n} * num_heads * head_dim, num_threads);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t h = 0; h < num_heads; ++h) {
      float* head = x + int64_t{i} * ld + int64_t{h} * head_dim;
      NormalizeRow(head, w, head_dim, eps, head);
    }
  }
}

void Rope(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
          const int32_t* positions, const float* inv_freq, int num_threads) {
  constexpr int32_t kMaxHalf = 512;
  const int32_t half = head_dim / 2;
  assert(head_dim % 2 == 0 && half <= kMaxHalf);
#pragma omp parallel for num_threads(ThreadsFor(int64_t{n} * num_heads * head_dim, num_threads)) \
    schedule(static)
  for (int32_t i = 0; i < n; ++i) {
    // Angles shared by all heads of the row: theta rounded to float, cos/sin in double.
    float cos_t[kMaxHalf];
    float sin_t[kMaxHalf];
    const float pos = static_cast<float>(positions[i]);
    for (int32_t j = 0; j < half; ++j) {
      const float theta = pos * inv_freq[j];
      cos_t[j] = static_cast<float>(std::cos(double{theta}));
      sin_t[j] = static_cast<float>(std::sin(double{theta}));
    }
    for (int32_t h = 0; h < num_heads; ++h) {
      float* x0 = x + int64_t{i} * ld + int64_t{h} * head_dim;
      float* x1 = x0 + half;
      for (int32_t j = 0; j < half; ++j) {
        const float a = x0[j];
        const float b = x1[j];
        x0[j] = a * cos_t[j] - b * sin_t[j];
        x1[j] = b * cos_t[j] + a * sin_t[j];
      }
    }
  }
}

void SwiGlu(const float* gate_up, int32_t n, int32_t ff, float* out, int num_threads) {
  using simd::kLanes;
  using simd::VecF;
#pragma omp parallel for num_threads(ThreadsFor(int64_t{n} * ff, num_threads)) schedule(static)
  for (int32_t i = 0; i < n; ++i) {
    const float* gate = gate_up + int64_t{i} * 2 * ff;
    const float* up = gate + ff;
    float* o = out + int64_t{i} * ff;
    const VecF one = simd::Set1(1.0f);
    int32_t j = 0;
    for (; j + kLanes <= ff; j += kLanes) {
      const VecF g = simd::Load(gate + j);
      const VecF e = simd::Exp(simd::Sub(simd::Zero(), g));
      simd::Store(o + j, simd::Mul(simd::Div(g, simd::Add(one, e)), simd::Load(up + j)));
    }
    for (; j < ff; ++j) o[j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
  }
}

void Add(float* x, const float* y, size_t count, int num_threads) {
  const int64_t total = static_cast<int64_t>(count);
#pragma omp parallel for num_threads(ThreadsFor(total, num_threads)) schedule(static)
  for (int64_t i = 0; i < total; ++i) x[i] += y[i];
}

}  // namespace ridgeserve::cpu
