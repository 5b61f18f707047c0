// Threading: OpenBLAS's own pthread pool and our OpenMP pool, both spinning while idle, fight
// over the cores when ops alternate (measured: a SmolLM2 prefill layer took 2.5x as long).
// So OpenBLAS runs single-threaded and calls are split here over the OpenMP threads: into
// blocks of rows when there are many (prefill), else into slices of w's rows (decode), so the
// threads share the reading of w.
//
// Batch invariance: OpenBLAS's regular sgemm path computes each element of y with a K order
// that depends only on k, so slicing w and changing n leave every element's bits alone
// (tests/kernels/matmul_test.cc asserts it on the machine that runs the tests). Two other
// paths would not: OpenBLAS 0.3.21's SKYLAKEX/COOPERLAKE "small matrix" kernel, which takes
// this x·wᵀ when (columns of the call) * n <= 1200 (and k >= 32, columns * n * k <= 1e6), and
// the gemv forwarding of n == 1 in releases >= 0.3.27. Calls that could reach them run on
// zero-padded rows instead, so a decode row gets the same bits as in a prefill batch.
#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>

namespace ridgeserve::cpu {
namespace {

// kernel/x86_64/sgemm_small_kernel_permit_skylakex.c in OpenBLAS 0.3.21: a transposed-A
// sgemm with M * N at most this may take the small-matrix kernel.
constexpr int64_t kSmallGemmMaxMn = 1200;
// Slices are whole multiples of this many columns (a multiple of every sgemm kernel's M
// unroll), so a column lands in the same micro-tile position whatever the slicing.
constexpr int32_t kSliceAlign = 64;

// Rows per thread below which a call splits columns rather than rows.
constexpr int32_t kMinRowsPerThread = 32;

// y[n, cols] (rows ldy apart) = x[n, k] · w[cols, k]ᵀ.
void Sgemm(const float* x, int32_t n, int32_t k, const float* w, int32_t cols, int32_t ldy,
           float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, cols, k, 1.0f, x, k, w, k, 0.0f, y, ldy);
}

void AddBias(const float* bias, int32_t n, int32_t m, float* y) {
  if (bias == nullptr) return;
  for (int32_t i = 0; i < n; ++i) {
    float* row = y + int64_t{i} * m;
    for (int32_t j = 0; j < m; ++j) row[j] += bias[j];
  }
}

}  // namespace

void MatMul(const float* x, int32_t n, int32_t k, const float* w, int32_t m, const float* bias,
            float* y, int num_threads, MatMulScratch& scratch) {
  if (n <= 0 || m <= 0) return;
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  num_threads = std::max(num_threads, 1);

  if (n >= kMinRowsPerThread * num_threads) {
    // Many rows (prefill): contiguous row blocks, each against all of w. Blocks must be too
    // tall for the small-matrix path (true unless m is tiny).
    const int32_t per = (n + num_threads - 1) / num_threads;
    const int32_t blocks = (n + per - 1) / per;
    const int32_t shortest = n - (blocks - 1) * per;
    if (int64_t{shortest} * m > kSmallGemmMaxMn) {
#pragma omp parallel for num_threads(blocks) schedule(static, 1)
      for (int32_t b = 0; b < blocks; ++b) {
        const int32_t r0 = b * per;
        Sgemm(x + int64_t{r0} * k, std::min(per, n - r0), k, w, m, m, y + int64_t{r0} * m);
      }
      AddBias(bias, n, m, y);
      return;
    }
  }

  // Few rows (decode): slices of columns [s * per, min(m, (s + 1) * per)), so the threads
  // share the reading of w.
  const int32_t max_slices =
      std::max(1, std::min(num_threads, (m + kSliceAlign - 1) / kSliceAlign));
  const int32_t per =
      ((m + max_slices - 1) / max_slices + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
  const int32_t slices = (m + per - 1) / per;
  const int32_t narrowest = m - (slices - 1) * per;
  const int32_t min_rows =
      static_cast<int32_t>(std::max<int64_t>(2, kSmallGemmMaxMn / narrowest + 1));
  const float* xs = x;
  float* ys = y;
  int32_t rows = n;
  if (n < min_rows) {
    scratch.x.assign(size_t(min_rows) * k, 0.0f);
    scratch.y.resize(size_t(min_rows) * m);
    std::copy_n(x, size_t(n) * k, scratch.x.data());
    xs = scratch.x.data();
    ys = scratch.y.data();
    rows = min_rows;
  }
#pragma omp parallel for num_threads(slices) schedule(static, 1)
  for (int32_t s = 0; s < slices; ++s) {
    const int32_t m0 = s * per;
    Sgemm(xs, rows, k, w + int64_t{m0} * k, std::min(per, m - m0), m, ys + m0);
  }
  if (ys != y) std::copy_n(ys, size_t(n) * m, y);
  AddBias(bias, n, m, y);
}

}  // namespace ridgeserve::cpu
