#include <cmath>

#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/attention_scores.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"

namespace ridgeserve::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarps = 8;
constexpr int kDimsPerLane = kScoresMaxHeadDim / 32;

// Key j of KV head g in registers: element lane + 32 i in k[i] (0 past head_dim).
template <int kCode>
__device__ inline void LoadKey(const AttentionScoresParams& p, int g, int32_t j, int lane,
                               float (&k)[kDimsPerLane]) {
  const int64_t slot = PagedSlot(p.blocks, p.block_size, j);
  const int64_t base = (slot * p.num_kv_heads + g) * p.head_dim;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    k[i] = d < p.head_dim ? LoadKvElement<kCode>(p.k, base + d) : 0.0f;
  }
}

// s = (q · k) * scale, the lanes' partial sums added in a fixed butterfly (every lane gets it).
__device__ inline float Logit(const float* q, const float (&k)[kDimsPerLane], int head_dim,
                              int lane, float scale) {
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) dot = __fmaf_rn(q[d], k[i], dot);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    dot = __fadd_rn(dot, __shfl_xor_sync(kFullMask, dot, offset));
  }
  return __fmul_rn(dot, scale);
}

// grid (num_kv_heads, rows), kWarps warps.
template <int kCode>
__global__ void __launch_bounds__(32 * kWarps) StatsKernel(AttentionScoresParams p) {
  __shared__ float q[kScoresMaxGroup * kScoresMaxHeadDim];
  __shared__ float m_of[kWarps][kScoresMaxGroup];
  __shared__ float l_of[kWarps][kScoresMaxGroup];
  const int g = blockIdx.x, r = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* q_row = p.q + (int64_t{r} * p.num_heads + int64_t{g} * group) * p.head_dim;
  for (int e = threadIdx.x; e < group * p.head_dim; e += blockDim.x) q[e] = q_row[e];
  __syncthreads();
  float m[kScoresMaxGroup], l[kScoresMaxGroup];
#pragma unroll
  for (int h = 0; h < kScoresMaxGroup; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
  }
  float k[kDimsPerLane];
  for (int32_t j = warp; j <= p.positions[r]; j += kWarps) {
    LoadKey<kCode>(p, g, j, lane, k);
#pragma unroll
    for (int h = 0; h < kScoresMaxGroup; ++h) {
      if (h >= group) break;
      const float s = Logit(q + h * p.head_dim, k, p.head_dim, lane, p.scale);
      const float next = fmaxf(m[h], s);
      l[h] = __fadd_rn(__fmul_rn(l[h], expf(__fsub_rn(m[h], next))), expf(__fsub_rn(s, next)));
      m[h] = next;
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < kScoresMaxGroup; ++h) {
      m_of[warp][h] = m[h];
      l_of[warp][h] = l[h];
    }
  }
  __syncthreads();
  if (threadIdx.x >= group) return;
  const int h = threadIdx.x;
  float mh = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mh = fmaxf(mh, m_of[w][h]);
  float lh = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (l_of[w][h] > 0.0f)
      lh = __fadd_rn(lh, __fmul_rn(l_of[w][h], expf(__fsub_rn(m_of[w][h], mh))));
  }
  p.stats[int64_t{r} * p.num_heads + int64_t{g} * group + h] = make_float2(mh, lh);
}

// grid (ceil(count / kWarps), num_kv_heads), kWarps warps: warp w scores key
// blockIdx.x * kWarps + w.
template <int kCode>
__global__ void __launch_bounds__(32 * kWarps) ScoresKernel(AttentionScoresParams p) {
  const int g = blockIdx.y;
  const int32_t j = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (j >= p.count) return;
  if (j > p.max_position) {  // no row sees it
    if (lane == 0) p.scores[int64_t{g} * p.count + j] = 0.0f;
    return;
  }
  const int group = p.num_heads / p.num_kv_heads;
  float k[kDimsPerLane];
  LoadKey<kCode>(p, g, j, lane, k);
  float best = 0.0f;
  for (int32_t r = 0; r < p.rows; ++r) {
    if (p.positions[r] < j) continue;
    for (int hh = 0; hh < group; ++hh) {
      const int h = g * group + hh;
      const float* q = p.q + (int64_t{r} * p.num_heads + h) * p.head_dim;
      const float s = Logit(q, k, p.head_dim, lane, p.scale);
      const float2 st = p.stats[int64_t{r} * p.num_heads + h];
      best = fmaxf(best, __fmul_rn(p.weights[r], __fdiv_rn(expf(__fsub_rn(s, st.x)), st.y)));
    }
  }
  if (lane == 0) p.scores[int64_t{g} * p.count + j] = best;
}

template <int kCode>
void Launch(const AttentionScoresParams& p, cudaStream_t stream) {
  StatsKernel<kCode><<<dim3(p.num_kv_heads, p.rows), 32 * kWarps, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH(stream);
  ScoresKernel<kCode>
      <<<dim3((p.count + kWarps - 1) / kWarps, p.num_kv_heads), 32 * kWarps, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace

void LaunchAttentionScores(const AttentionScoresParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.count <= 0) return;
  switch (p.dtype_code) {
    case 0:
      return Launch<0>(p, stream);
    case 1:
      return Launch<1>(p, stream);
    default:
      return Launch<2>(p, stream);
  }
}

}  // namespace ridgeserve::cuda
