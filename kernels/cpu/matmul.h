// y = x · wᵀ (+ bias) on the CPU (Backend::MatMul): single-threaded OpenBLAS sgemm calls on
// blocks of x's rows or slices of w's rows, one per OpenMP thread.
#ifndef RIDGESERVE_KERNELS_CPU_MATMUL_H_
#define RIDGESERVE_KERNELS_CPU_MATMUL_H_

#include <cstdint>
#include <vector>

namespace ridgeserve::cpu {

// Zero-padded copies of x and y for calls with few rows (see matmul.cc).
struct MatMulScratch {
  std::vector<float> x;
  std::vector<float> y;
};

// y[n, m] = x[n, k] · w[m, k]ᵀ (+ bias[m] when not null), each row of y with the same bits
// whatever n, the row's place in x, or num_threads. Sets OpenBLAS to one thread (a
// process-wide setting): this function does the threading.
void MatMul(const float* x, int32_t n, int32_t k, const float* w, int32_t m, const float* bias,
            float* y, int num_threads, MatMulScratch& scratch);

}  // namespace ridgeserve::cpu

#endif  // RIDGESERVE_KERNELS_CPU_MATMUL_H_
