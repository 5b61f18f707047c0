// Fixed-width float vectors for the CPU kernels: AVX-512 (16 lanes) when the compiler targets
// it, otherwise AVX2 + FMA (8 lanes). Every operation is lane-wise except ReduceAdd/ReduceMax,
// whose combining tree is fixed, so a kernel's per-element arithmetic depends only on the code
// path, never on where the data sits or what else is in the batch.
#ifndef RIDGESERVE_KERNELS_CPU_SIMD_H_
#define RIDGESERVE_KERNELS_CPU_SIMD_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "the CPU backend needs AVX2 and FMA (-march=x86-64-v3 or newer)"
#endif

namespace ridgeserve::cpu::simd {

// Horizontal sum and max of 8 lanes in a fixed tree: (i, i + 4), then (i, i + 2), then (0, 1).
inline float ReduceAdd8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float ReduceMax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#if defined(__AVX512F__)

// Several GCC 12 AVX-512 intrinsics seed their result with _mm512_undefined_ps(), which
// -Wmaybe-uninitialized reports wherever they are inlined (GCC PR 105593, fixed in GCC 13).
// Their merge-masked forms with an all-ones mask are the same instruction without it.
inline constexpr __mmask16 kAll = 0xFFFF;

using VecF = __m512;
inline constexpr int kLanes = 16;

inline VecF Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline VecF Set1(float x) { return _mm512_set1_ps(x); }
inline VecF Zero() { return _mm512_setzero_ps(); }
inline VecF Add(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF Sub(VecF a, VecF b) { return _mm512_sub_ps(a, b); }
inline VecF Mul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF Div(VecF a, VecF b) { return _mm512_div_ps(a, b); }
// Returns b where either operand is NaN (x86 semantics), so Max(bound, x) keeps a NaN x.
inline VecF Max(VecF a, VecF b) { return _mm512_mask_max_ps(a, kAll, a, b); }
inline VecF Min(VecF a, VecF b) { return _mm512_mask_min_ps(a, kAll, a, b); }
// a * b + c with one rounding.
inline VecF Fma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
// c - a * b with one rounding.
inline VecF Fnma(VecF a, VecF b, VecF c) { return _mm512_fnmadd_ps(a, b, c); }
inline __m256 LowerHalf(VecF v) {
  return _mm256_castpd_ps(
      _mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), 0xFF, _mm512_castps_pd(v), 0));
}
// Upper half folded onto the lower (lanes i and i + 8), then as the AVX2 versions.
inline float ReduceAdd(VecF v) {
  const VecF swapped = _mm512_mask_shuffle_f32x4(v, kAll, v, v, 0x4E);
  return ReduceAdd8(LowerHalf(Add(v, swapped)));
}
inline float ReduceMax(VecF v) {
  const VecF swapped = _mm512_mask_shuffle_f32x4(v, kAll, v, v, 0x4E);
  return ReduceMax8(LowerHalf(Max(v, swapped)));
}
// Lanes >= n (n in [0, kLanes]) replaced by `fill`.
inline VecF KeepFirst(VecF v, int n, float fill) {
  const __mmask16 keep = n >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
  return _mm512_mask_blend_ps(keep, _mm512_set1_ps(fill), v);
}
inline VecF RoundToInt(VecF x) {
  return _mm512_mask_roundscale_ps(x, kAll, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// p * 2^n for integral n; overflows to inf and underflows through denormals to 0.
inline VecF ScaleByPow2(VecF p, VecF n) { return _mm512_mask_scalef_ps(p, kAll, p, n); }
// The kLanes f16 / bf16 values at src (little-endian) widened to f32, exactly.
inline VecF LoadF16(const uint8_t* src) {
  return _mm512_maskz_cvtph_ps(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
}
inline VecF LoadBF16(const uint8_t* src) {
  const __m512i h =
      _mm512_maskz_cvtepu16_epi32(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, h, 16));
}

#else  // AVX2

using VecF = __m256;
inline constexpr int kLanes = 8;

inline VecF Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF Set1(float x) { return _mm256_set1_ps(x); }
inline VecF Zero() { return _mm256_setzero_ps(); }
inline VecF Add(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF Sub(VecF a, VecF b) { return _mm256_sub_ps(a, b); }
inline VecF Mul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF Div(VecF a, VecF b) { return _mm256_div_ps(a, b); }
inline VecF Max(VecF a, VecF b) { return _mm256_max_ps(a, b); }
inline VecF Min(VecF a, VecF b) { return _mm256_min_ps(a, b); }
inline VecF Fma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF Fnma(VecF a, VecF b, VecF c) { return _mm256_fnmadd_ps(a, b, c); }
inline float ReduceAdd(VecF v) { return ReduceAdd8(v); }
inline float ReduceMax(VecF v) { return ReduceMax8(v); }
inline VecF KeepFirst(VecF v, int n, float fill) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
  return _mm256_blendv_ps(_mm256_set1_ps(fill), v, _mm256_castsi256_ps(keep));
}
inline VecF RoundToInt(VecF x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// p * 2^n for integral n in [-252, 254]: two exact power-of-two factors, each a normal float,
// so results in the denormal range round once more than scalef would (error < 2^-149).
inline VecF ScaleByPow2(VecF p, VecF n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i rest = _mm256_sub_epi32(ni, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const VecF f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const VecF f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}
inline VecF LoadF16(const uint8_t* src) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
}
inline VecF LoadBF16(const uint8_t* src) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

#endif

// dst[i] = src[i] for n f16 / bf16 values (little-endian) widened to f32: exact, as
// HalfToFloat and DequantizeRow convert them.
inline void WidenF16(const uint8_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store(dst + i, LoadF16(src + 2 * i));
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, sizeof(h));
    dst[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
  }
}
inline void WidenBF16(const uint8_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store(dst + i, LoadBF16(src + 2 * i));
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, sizeof(h));
    const uint32_t bits = uint32_t{h} << 16;
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
}

// dst[i] = src[i] rounded to f16 / bf16 (nearest even; overflow to infinity, NaN stays NaN),
// the bits FloatToHalf and FloatToBFloat16 (kernels/dtype.h) give, 8 at a time.
inline void NarrowF16(const float* src, int64_t n, uint8_t* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  for (; i < n; ++i) {
    const uint16_t h = static_cast<uint16_t>(
        _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(src[i]), _MM_FROUND_TO_NEAREST_INT), 0));
    std::memcpy(dst + 2 * i, &h, sizeof(h));
  }
}
inline void NarrowBF16(const float* src, int64_t n, uint8_t* dst) {
  auto narrow = [](__m256i bits) {
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, quiet, nan);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i r = narrow(_mm256_castps_si256(_mm256_loadu_ps(src + i)));
    // 16-bit halves of the 8 lanes, in order (packus works within 128-bit lanes).
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + i, sizeof(bits));
    const uint16_t h = static_cast<uint16_t>(
        _mm256_extract_epi32(narrow(_mm256_set1_epi32(static_cast<int32_t>(bits))), 0));
    std::memcpy(dst + 2 * i, &h, sizeof(h));
  }
}

// exp(x), lane-wise, within 2 ulp of the exact value for normal results; 0 for x < -103,
// inf for x > 88.8, NaN for NaN. exp(x) = 2^n * e^r with n = round(x / ln 2) and
// r = x - n ln 2 (Cody-Waite split, |r| <= ln2 / 2); e^r from Cephes' expf polynomial.
inline VecF Exp(VecF x) {
  x = Min(Set1(89.0f), Max(Set1(-104.0f), x));  // NaN-preserving operand order
  const VecF n = RoundToInt(Mul(x, Set1(1.44269504088896341f)));
  VecF r = Fnma(n, Set1(0.693359375f), x);
  r = Fnma(n, Set1(-2.12194440e-4f), r);
  VecF y = Set1(1.9875691500e-4f);
  y = Fma(y, r, Set1(1.3981999507e-3f));
  y = Fma(y, r, Set1(8.3334519073e-3f));
  y = Fma(y, r, Set1(4.1665795894e-2f));
  y = Fma(y, r, Set1(1.6666665459e-1f));
  y = Fma(y, r, Set1(5.0000001201e-1f));
  y = Add(Fma(y, Mul(r, r), r), Set1(1.0f));
  return ScaleByPow2(y, n);
}

}  // namespace ridgeserve::cpu::simd

#endif  // RIDGESERVE_KERNELS_CPU_SIMD_H_
