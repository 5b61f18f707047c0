// Paged attention kernels of the rows family (attention_plan.h): split-KV (+ merge) and walker,
// computing the same arithmetic tree with the same device functions below. The merge kernel
// also folds the slots of the tiles' split-KV form (attention_tiles.cu).
//
// A CTA serves one row and one KV head: warp h holds query head kv_head * group + h; the K/V
// chunk (32 positions) is loaded once into shared memory for all the group's warps (GQA).
// Within a warp, lane j scores key j of the chunk (a sequential FMA chain over head_dim) and
// lane l accumulates the output dims l, l + 32, ... (sequential over the chunk's keys). The
// chunk max is a warp max (exact in any order); the chunk sum a butterfly over fixed lane
// pairs, which leaves the same bits in every lane. All roundings are explicit (__f*_rn), so
// nvcc's FMA contraction cannot make the two kernels differ.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"

namespace ridgeserve::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

// Online-softmax state of one query head, spread over a warp: m and l are the same in every
// lane; acc[i] is output dim lane + 32 i.
struct State {
  float m;
  float l;
  float acc[kDimsPerLane];
};

__device__ inline void Clear(State& s) {
  s.m = -INFINITY;
  s.l = 0.0f;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) s.acc[i] = 0.0f;
}

// a = a ⊕ b (log-sum-exp merge). Both states are non-empty (finite m).
__device__ inline void Merge(State& a, const State& b) {
  const MergeWeights w = MergeWeightsOf(a.m, b.m);
  a.l = Merged(a.l, b.l, w);
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) a.acc[i] = Merged(a.acc[i], b.acc[i], w);
  a.m = w.m;
}

struct Shared {
  float* q;         // [group, head_dim]
  float* k;         // [32, head_dim + 1]
  float* v;         // [32, head_dim]
  int64_t* offset;  // [32] element offset of each chunk position's row for this KV head
};

__device__ inline Shared CarveShared(int group, int head_dim) {
  extern __shared__ __align__(16) unsigned char smem[];
  Shared s;
  s.offset = reinterpret_cast<int64_t*>(smem);
  s.q = reinterpret_cast<float*>(smem + sizeof(int64_t) * kAttentionChunk);
  s.k = s.q + group * head_dim;
  s.v = s.k + kAttentionChunk * (head_dim + 1);
  return s;
}

// Loads this CTA's row's query heads into shared memory.
__device__ inline void LoadQueries(const AttentionParams& p, int row, int kv_head, int group,
                                   const Shared& sh) {
  const float* q = p.q + int64_t{row} * p.ld + int64_t{kv_head} * group * p.head_dim;
  for (int e = threadIdx.x; e < group * p.head_dim; e += blockDim.x) sh.q[e] = q[e];
  __syncthreads();
}

// Loads positions [base, base + nk) of the row's sequence into sh.k / sh.v as f32.
template <int kCode>
__device__ inline void LoadChunk(const AttentionParams& p, const int32_t* table, int kv_head,
                                 int32_t base, int nk, const Shared& sh) {
  const int64_t stride = int64_t{p.num_kv_heads} * p.head_dim;
  __syncthreads();  // the previous chunk is consumed
  if (threadIdx.x < nk) {
    const int32_t pos = base + threadIdx.x;
    const int64_t slot = PagedSlot(table, p.block_size, pos);
    sh.offset[threadIdx.x] = slot * stride + int64_t{kv_head} * p.head_dim;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nk * p.head_dim; e += blockDim.x) {
    const int j = e / p.head_dim, d = e % p.head_dim;
    sh.k[j * (p.head_dim + 1) + d] = LoadKvElement<kCode>(p.k, sh.offset[j] + d);
    sh.v[j * p.head_dim + d] = LoadKvElement<kCode>(p.v, sh.offset[j] + d);
  }
  __syncthreads();
}

// One online-softmax step of warp `h` over the nk (1..32) keys in shared memory.
__device__ inline void ChunkStep(const Shared& sh, int h, int nk, int head_dim, float scale,
                                 State& st) {
  const int lane = threadIdx.x % 32;
  float s = -INFINITY;
  if (lane < nk) {
    const float* q = sh.q + h * head_dim;
    const float* k = sh.k + lane * (head_dim + 1);
    float dot = 0.0f;
    for (int d = 0; d < head_dim; ++d) dot = __fmaf_rn(q[d], k[d], dot);
    s = __fmul_rn(dot, scale);
  }
  float chunk_max = s;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    chunk_max = fmaxf(chunk_max, __shfl_xor_sync(kFullMask, chunk_max, offset));
  }
  const float m_new = fmaxf(st.m, chunk_max);
  const float alpha = st.m == -INFINITY ? 0.0f : expf(__fsub_rn(st.m, m_new));
  const float prob = lane < nk ? expf(__fsub_rn(s, m_new)) : 0.0f;
  float sum = prob;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    sum = __fadd_rn(sum, __shfl_xor_sync(kFullMask, sum, offset));
  }
  st.l = __fadd_rn(__fmul_rn(st.l, alpha), sum);
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) st.acc[i] = __fmul_rn(st.acc[i], alpha);
  for (int j = 0; j < nk; ++j) {
    const float pj = __shfl_sync(kFullMask, prob, j);
    const float* vj = sh.v + j * head_dim;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) st.acc[i] = __fmaf_rn(pj, vj[d], st.acc[i]);
    }
  }
  st.m = m_new;
}

// G_z of attention_plan.h for the CTA's row (at `pos`) and warp h; z < SlotsUsed(pos).
template <int kCode>
__device__ inline void ComputeSlot(const AttentionParams& p, const int32_t* table, int kv_head,
                                   int32_t pos, int z, const Shared& sh, State& slot) {
  const int h = threadIdx.x / 32;
  State part;
  for (int partition = SlotBegin(pos, z); partition < SlotEnd(pos, z); ++partition) {
    Clear(part);
    const int32_t end = min(pos + 1, (partition + 1) * kPartition);
    for (int32_t base = partition * kPartition; base < end; base += kAttentionChunk) {
      const int nk = min(kAttentionChunk, end - base);
      LoadChunk<kCode>(p, table, kv_head, base, nk, sh);
      ChunkStep(sh, h, nk, p.head_dim, p.scale, part);
    }
    if (partition == SlotBegin(pos, z)) {
      slot = part;
    } else {
      Merge(slot, part);
    }
  }
}

__device__ inline void WriteOutput(const AttentionParams& p, int row, int head, const State& st) {
  const int lane = threadIdx.x % 32;
  uint16_t* out = p.out + int64_t{row} * p.num_heads * p.head_dim + int64_t{head} * p.head_dim;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < p.head_dim) out[d] = Bf16Bits(__fdiv_rn(st.acc[i], st.l));
  }
}

// Workspace state of (row, query head, slot).
__device__ inline float* StateAt(const AttentionParams& p, float* workspace, int row, int head,
                                 int z) {
  return workspace + StateOffset(row, head, z, p.num_heads, p.head_dim);
}

// grid (num_rows, num_kv_heads), block 32 * group.
template <int kCode>
__global__ void __launch_bounds__(32 * kMaxGroup) WalkerKernel(AttentionParams p) {
  const int row = blockIdx.x, kv_head = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;
  const Shared sh = CarveShared(group, p.head_dim);
  const int32_t pos = p.positions[row];
  const int32_t* table = p.block_tables + p.block_table_offsets[p.seq[row]];
  LoadQueries(p, row, kv_head, group, sh);
  State total, slot;
  for (int z = 0; z < SlotsUsed(pos); ++z) {
    ComputeSlot<kCode>(p, table, kv_head, pos, z, sh, slot);
    if (z == 0) {
      total = slot;
    } else {
      Merge(total, slot);
    }
  }
  WriteOutput(p, row, kv_head * group + threadIdx.x / 32, total);
}

// grid (num_rows, num_kv_heads, kSplitSlots), block 32 * group.
template <int kCode>
__global__ void __launch_bounds__(32 * kMaxGroup) SplitKernel(AttentionParams p, float* workspace) {
  const int row = blockIdx.x, kv_head = blockIdx.y, z = blockIdx.z;
  const int32_t pos = p.positions[row];
  if (z >= SlotsUsed(pos)) return;  // uniform over the CTA
  const int group = p.num_heads / p.num_kv_heads;
  const Shared sh = CarveShared(group, p.head_dim);
  const int32_t* table = p.block_tables + p.block_table_offsets[p.seq[row]];
  LoadQueries(p, row, kv_head, group, sh);
  State slot;
  ComputeSlot<kCode>(p, table, kv_head, pos, z, sh, slot);
  const int head = kv_head * group + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float* dst = StateAt(p, workspace, row, head, z);
  if (lane == 0) {
    dst[0] = slot.m;
    dst[1] = slot.l;
  }
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < p.head_dim) dst[2 + d] = slot.acc[i];
  }
}

// One warp per (row, query head), 8 per CTA: folds the row's slots in order.
constexpr int kMergeWarps = 8;

__global__ void MergeKernel(AttentionParams p, const float* workspace) {
  const int64_t item = int64_t{blockIdx.x} * kMergeWarps + threadIdx.x / 32;
  if (item >= int64_t{p.num_rows} * p.num_heads) return;
  const int row = static_cast<int>(item / p.num_heads);
  const int head = static_cast<int>(item % p.num_heads);
  const int lane = threadIdx.x % 32;
  const int32_t pos = p.positions[row];
  State total, slot;
  for (int z = 0; z < SlotsUsed(pos); ++z) {
    const float* src = StateAt(p, const_cast<float*>(workspace), row, head, z);
    slot.m = src[0];
    slot.l = src[1];
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      slot.acc[i] = d < p.head_dim ? src[2 + d] : 0.0f;
    }
    if (z == 0) {
      total = slot;
    } else {
      Merge(total, slot);
    }
  }
  WriteOutput(p, row, head, total);
}

void LaunchMerge(const AttentionParams& p, const float* workspace, cudaStream_t stream) {
  const int64_t items = int64_t{p.num_rows} * p.num_heads;
  const unsigned blocks = static_cast<unsigned>((items + kMergeWarps - 1) / kMergeWarps);
  MergeKernel<<<blocks, 32 * kMergeWarps, 0, stream>>>(p, workspace);
  CUDA_CHECK_LAUNCH(stream);
}

template <int kCode>
void Launch(const AttentionParams& p, const AttentionPlan& plan, float* workspace,
            cudaStream_t stream) {
  if (plan.split) {
    const dim3 grid(p.num_rows, p.num_kv_heads, kSplitSlots);
    SplitKernel<kCode><<<grid, plan.threads, plan.shared_bytes, stream>>>(p, workspace);
    CUDA_CHECK_LAUNCH(stream);
    LaunchMerge(p, workspace, stream);
  } else {
    const dim3 grid(p.num_rows, p.num_kv_heads);
    WalkerKernel<kCode><<<grid, plan.threads, plan.shared_bytes, stream>>>(p);
    CUDA_CHECK_LAUNCH(stream);
  }
}

template <int kCode>
cudaError_t RaiseSharedLimit(int bytes) {
  cudaError_t e =
      cudaFuncSetAttribute(WalkerKernel<kCode>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(SplitKernel<kCode>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              bytes);
}

}  // namespace

cudaError_t PrepareAttentionKernels(bool tiles) {
  const int bytes = static_cast<int>(AttentionSharedBytes(kMaxGroup, kMaxHeadDim));
  for (cudaError_t e :
       {RaiseSharedLimit<0>(bytes), RaiseSharedLimit<1>(bytes), RaiseSharedLimit<2>(bytes),
        tiles ? PrepareAttentionTiles() : cudaSuccess}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

void LaunchAttention(const AttentionParams& p, const AttentionPlan& plan, void* workspace_bytes,
                     cudaStream_t stream) {
  if (p.num_rows <= 0) return;
  float* workspace = static_cast<float*>(workspace_bytes);
  if (plan.tiles) {
    LaunchAttentionTiles(p, plan, workspace_bytes, stream);
    if (plan.split) LaunchMerge(p, workspace, stream);
    return;
  }
  switch (p.dtype_code) {
    case 0:
      return Launch<0>(p, plan, workspace, stream);
    case 1:
      return Launch<1>(p, plan, workspace, stream);
    default:
      return Launch<2>(p, plan, workspace, stream);
  }
}

}  // namespace ridgeserve::cuda
