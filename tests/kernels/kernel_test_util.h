// Helpers shared by the kernel tests: seeded random data and error measures.
#ifndef RIDGESERVE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
#define RIDGESERVE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/sample_spec.h"

namespace ridgeserve::testing {

// n values uniform in [lo, hi), reproducible from `seed`.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// True when both arrays hold the same bits (NaN-safe, distinguishes -0 from +0).
inline bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Index of the first element whose bits differ, or -1.
inline int64_t FirstBitDifference(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

// x rounded to the nearest f16 (GCC's _Float16 conversion, libgcc's IEEE rounding) and to
// the nearest bfloat16, ties to even, written from the definition: of the two bfloat16 values
// around x (x's bits truncated, and the next one up in magnitude) the nearer, on a tie the one
// with an even last bit. Independent of the code under test (kernels/dtype.cc).
inline float RoundToHalfReference(float x) { return static_cast<float>(static_cast<_Float16>(x)); }
inline float RoundToBFloat16Reference(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return x;  // NaN
  auto as_float = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof(f));
    return f;
  };
  const uint32_t down = bits & 0xFFFF0000u, up = down + 0x10000u;
  const double d_down = std::abs(double{x} - as_float(down));
  // `up` may be infinity; the distance to it counts as to 2^128 (where rounding goes).
  const double up_value =
      (up & 0x7FFFFFFFu) == 0x7F800000u ? std::copysign(0x1p128, double{x}) : double{as_float(up)};
  const double d_up = std::abs(double{x} - up_value);
  if (d_down < d_up) return as_float(down);
  if (d_up < d_down) return as_float(up);
  return as_float(((down >> 16) & 1u) == 0 ? down : up);
}

// Backend::Sample specs for `rows` rows of a vocabulary of at least 2000 ids, covering greedy,
// plain draws, each filter and top-k with top-p, repetition penalties (their ids appended to
// `penalty_ids`, one repeated) and log-probabilities; spec r draws from row rows - 1 - r.
inline std::vector<SampleSpec> MixedSampleSpecs(int32_t rows, std::vector<int32_t>& penalty_ids) {
  std::vector<SampleSpec> specs;
  for (int32_t r = 0; r < rows; ++r) {
    SampleSpec s;
    s.row = rows - 1 - r;
    s.temperature = r % 4 == 0 ? 0.0f : 0.5f + 0.1f * (r % 10);
    s.top_k = r % 4 == 1 ? 20 : 0;
    s.top_p = r % 4 == 2 ? 0.9f : r % 8 == 5 ? 0.8f : 1.0f;  // r % 8 == 5: with top-k
    s.min_p = r % 5 == 3 ? 0.05f : 0.0f;
    s.seed = 100 + r;
    s.draw = 7 * r;
    s.logprob = r % 3 == 0;
    if (r % 2 == 0) {
      s.repetition_penalty = 1.5f;
      s.penalty_begin = static_cast<int32_t>(penalty_ids.size());
      for (int32_t j = 0; j < 30; ++j) penalty_ids.push_back((r * 131 + j * 17) % 2000);
      penalty_ids.push_back(penalty_ids[s.penalty_begin]);  // a repeat: penalized once
      penalty_ids.push_back(-1);                            // outside the vocabulary: ignored
      s.penalty_end = static_cast<int32_t>(penalty_ids.size());
    }
    specs.push_back(s);
  }
  return specs;
}

}  // namespace ridgeserve::testing

#endif  // RIDGESERVE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
