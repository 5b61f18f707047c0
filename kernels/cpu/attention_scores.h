// SpecPC's and SpecKV's attention scores on the CPU (Backend::AttentionScores).
#ifndef RIDGESERVE_KERNELS_CPU_ATTENTION_SCORES_H_
#define RIDGESERVE_KERNELS_CPU_ATTENTION_SCORES_H_

#include <cstdint>
#include <span>

#include "kernels/backend.h"

namespace ridgeserve::cpu {

// Same contract as Backend::AttentionScores, on up to `num_threads` OpenMP threads (the result
// does not depend on the count). Per row and query head, with the keys widened to f32 exactly:
//   s_j = (q · k_j) * scale in float, the dot product as eight running sums (sum u takes
//         elements u, u + 8, ...), added ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), then the
//         elements past the last multiple of 8 in order;
//   m = max_j s_j;  e_j = exp(s_j - m);  l = the sum of e_j in j order;  p_j = e_j / l.
void AttentionScores(const KvLayerView& cache, std::span<const int32_t> blocks, const float* q,
                     int32_t num_heads, std::span<const int32_t> positions,
                     std::span<const float> weights, float scale, int32_t count, float* scores,
                     int num_threads);

}  // namespace ridgeserve::cpu

#endif  // RIDGESERVE_KERNELS_CPU_ATTENTION_SCORES_H_
