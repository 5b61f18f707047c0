// CPU MatMul (OpenBLAS sgemm): accuracy against a double reference, and the batch invariance
// the engine relies on: a row's bits do not depend on how many rows share the call, where the
// row sits in it, the alignment of x, or the thread count.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::FirstBitDifference;
using ::ridgeserve::testing::RandomFloats;

struct Shape {
  int32_t n, k, m;
};

TEST(CpuMatMulTest, MatchesDoubleReference) {
  auto backend = CreateCpuBackend(2);
  for (const Shape& s : {Shape{1, 576, 576}, Shape{7, 576, 192}, Shape{33, 1536, 576},
                         Shape{64, 576, 3072}, Shape{3, 5, 7}, Shape{2, 576, 49152}}) {
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "n=" << s.n << " k=" << s.k << " m=" << s.m << " bias=" << with_bias);
      const std::vector<float> x = RandomFloats(size_t(s.n) * s.k, 1);
      const std::vector<float> w = RandomFloats(size_t(s.m) * s.k, 2, -0.1f, 0.1f);
      const std::vector<float> bias = RandomFloats(s.m, 3);
      std::vector<float> y(size_t(s.n) * s.m);
      backend->MatMul(x.data(), s.n, s.k, w.data(), s.m, with_bias ? bias.data() : nullptr,
                      y.data());
      // Error in units of u * sum_k |x w| (u = 2^-24), the scale of float rounding in a dot
      // product (about 2 of them are seen here; the worst-case bound is k).
      double worst = 0.0;
      for (int32_t i = 0; i < s.n; ++i) {
        for (int32_t j = 0; j < s.m; ++j) {
          double ref = with_bias ? bias[j] : 0.0, mag = std::abs(ref);
          for (int32_t c = 0; c < s.k; ++c) {
            const double p = double{x[size_t(i) * s.k + c]} * w[size_t(j) * s.k + c];
            ref += p;
            mag += std::abs(p);
          }
          worst = std::max(worst, std::abs(y[size_t(i) * s.m + j] - ref) / (mag * 0x1p-24));
        }
      }
      EXPECT_LE(worst, 6.0);
    }
  }
}

// Computes y for rows [first, first + count) of x, with x copied to a buffer offset by
// `misalign` floats so its alignment differs from the batch call's.
std::vector<float> RowsOf(Backend& backend, const std::vector<float>& x, const Shape& s,
                          const std::vector<float>& w, const float* bias, int32_t first,
                          int32_t count, int misalign) {
  std::vector<float> xs(size_t(count) * s.k + misalign);
  std::memcpy(xs.data() + misalign, &x[size_t(first) * s.k], size_t(count) * s.k * sizeof(float));
  std::vector<float> y(size_t(count) * s.m);
  backend.MatMul(xs.data() + misalign, count, s.k, w.data(), s.m, bias, y.data());
  return y;
}

TEST(CpuMatMulTest, RowsAreBitwiseBatchInvariant) {
  // The default model's projections: qkv-ish, k/v, gate+up, down, and the LM head.
  for (const Shape& s : {Shape{512, 576, 576}, Shape{96, 576, 192}, Shape{96, 576, 3072},
                         Shape{96, 1536, 576}, Shape{9, 576, 49152}}) {
    SCOPED_TRACE(::testing::Message() << "k=" << s.k << " m=" << s.m);
    const std::vector<float> x = RandomFloats(size_t(s.n) * s.k, 4);
    const std::vector<float> w = RandomFloats(size_t(s.m) * s.k, 5, -0.1f, 0.1f);
    const std::vector<float> bias = RandomFloats(s.m, 6);
    for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
      auto two = CreateCpuBackend(2);
      const std::vector<float> full = RowsOf(*two, x, s, w, b, 0, s.n, 0);
      auto check = [&](Backend& backend, int32_t first, int32_t count, int misalign) {
        const std::vector<float> part = RowsOf(backend, x, s, w, b, first, count, misalign);
        const int64_t diff =
            FirstBitDifference(part.data(), &full[size_t(first) * s.m], part.size());
        EXPECT_EQ(diff, -1) << "rows [" << first << ", " << first + count << ") misalign "
                            << misalign << ": first differing row "
                            << (diff < 0 ? -1 : first + diff / s.m);
      };
      // Batches of many sizes at several offsets, with 2 threads.
      for (int32_t count : {1, 2, 3, 4, 5, 7, 8, 16, 17, 31, 32, 33, 64}) {
        for (int32_t first : {0, 1, 5, s.n - count}) {
          if (first < 0 || first + count > s.n) continue;
          check(*two, first, count, (first + count) % 3);
        }
      }
      // Rows alone and the whole batch on one thread.
      auto one = CreateCpuBackend(1);
      for (int32_t row = 0; row < s.n; row += 11) check(*one, row, 1, row % 2);
      check(*one, 0, s.n, 0);
    }
  }
}

}  // namespace
}  // namespace ridgeserve
