// Row-wise ops of the CPU backend: each output row depends only on the same input row, so
// these are batch invariant by construction. Exact formulas are in kernels/backend.h.
#ifndef RIDGESERVE_KERNELS_CPU_ROW_OPS_H_
#define RIDGESERVE_KERNELS_CPU_ROW_OPS_H_

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cpu {

// Each function runs on up to `num_threads` OpenMP threads (fewer for small inputs).
void RmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps, float* out,
             int num_threads);
void RmsNormHeads(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                  const float* w, float eps, int num_threads);
void Rope(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
          const int32_t* positions, const float* inv_freq, int num_threads);
void SwiGlu(const float* gate_up, int32_t n, int32_t ff, float* out, int num_threads);
void Add(float* x, const float* y, size_t count, int num_threads);

}  // namespace ridgeserve::cpu

#endif  // RIDGESERVE_KERNELS_CPU_ROW_OPS_H_
