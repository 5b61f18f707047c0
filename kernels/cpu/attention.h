// Paged causal attention with GQA on the CPU (Backend::Attention).
#ifndef RIDGESERVE_KERNELS_CPU_ATTENTION_H_
#define RIDGESERVE_KERNELS_CPU_ATTENTION_H_

#include <cstdint>

#include "kernels/backend.h"

namespace ridgeserve::cpu {

// Positions per online-softmax step: a row's context is consumed in chunks
// [c * kAttentionChunk, (c + 1) * kAttentionChunk), c = 0, 1, ..., whatever the cache's
// block size, so a row's arithmetic depends only on its query, its position and the cache.
inline constexpr int kAttentionChunk = 64;

// Same contract as Backend::Attention. q rows are `ld` apart; out is [rows.num_rows,
// num_heads * cache.head_dim]. Runs on up to `num_threads` OpenMP threads; the result does
// not depend on the thread count.
void PagedAttention(const float* q, int32_t ld, int32_t num_heads, const KvLayerView& cache,
                    const AttentionRows& rows, float scale, float* out, int num_threads);

}  // namespace ridgeserve::cpu

#endif  // RIDGESERVE_KERNELS_CPU_ATTENTION_H_
