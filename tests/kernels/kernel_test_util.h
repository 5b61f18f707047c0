// Helpers shared by the kernel tests: seeded random data and error measures.
#ifndef RIDGESERVE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
#define RIDGESERVE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

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

}  // namespace ridgeserve::testing

#endif  // RIDGESERVE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
