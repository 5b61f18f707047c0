// Paged attention on tensor cores: the tiles family of attention_plan.h, for a BF16 cache.
//
// A TILE is a run of at most tile_rows consecutive rows of one sequence; BuildTiles cuts the
// step's rows into tiles (a new tile wherever the sequence changes or tile_rows are full). A
// CTA of 4 warps takes a tile and one KV head: its (row, head) pairs, row-major with the
// group's heads in order, are the rows of the warps' mma tiles (warp w: pairs 16w..16w+15;
// lane l holds pairs 16w + l/4 and 16w + l/4 + 8, as the m16n8 fragments lay them out). Per
// chunk of kTileChunk keys (positions [base, base + 64), aligned to absolute positions), the
// CTA stages K and V^T in shared memory; each warp computes its scores S = Q K^T on tensor
// cores (query rounded to bf16 once per tile), scales and masks them, takes the online-softmax
// step in registers (row max and sum over the 4 lanes of a row by a fixed butterfly), rounds
// the weights to bf16 and adds P V into its accumulators, still in the m16n8 layout. At the
// end of each partition the pair's fresh state S_p joins its slot state G (shared memory) and,
// at the slot's end, the row state T (walker) or the workspace (split-KV), as the tree of
// attention_plan.h says. Every shared accumulator element has one owning lane and the maxima
// and sums are registers repeated in a row's 4 lanes, so the partition ends need no barrier.
#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"

namespace ridgeserve::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kBuildThreads = 1024;

struct MaxOp {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; }
};

// list[0] = the number of tiles T, list[1 + t] = tile t's first row, list[1 + T] = n: tile t is
// rows [list[1 + t], list[2 + t]). One CTA, in chunks of kBuildThreads rows.
__global__ void __launch_bounds__(kBuildThreads)
    BuildTiles(const int32_t* seq, int32_t n, int32_t tile_rows, int32_t* list) {
  using Scan = cub::BlockScan<int32_t, kBuildThreads>;
  __shared__ typename Scan::TempStorage temp;
  int32_t run_start = 0, count = 0;  // carried between chunks, the same in every thread
  for (int32_t base = 0; base < n; base += kBuildThreads) {
    const int32_t r = base + static_cast<int32_t>(threadIdx.x);
    const bool valid = r < n;
    const bool starts_run = valid && (r == 0 || seq[r] != seq[r - 1]);
    int32_t start = 0, last_start = 0;
    Scan(temp).InclusiveScan(starts_run ? r : -1, start, MaxOp(), last_start);
    __syncthreads();
    start = start > run_start ? start : run_start;
    const int32_t starts_tile = valid && (r - start) % tile_rows == 0 ? 1 : 0;
    int32_t index = 0, tiles = 0;
    Scan(temp).ExclusiveSum(starts_tile, index, tiles);
    __syncthreads();
    if (starts_tile) list[1 + count + index] = r;
    run_start = last_start > run_start ? last_start : run_start;
    count += tiles;
  }
  if (threadIdx.x == 0) {
    list[0] = count;
    list[1 + count] = n;
  }
}

__device__ inline uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return bits;
}

__device__ inline uint32_t Load32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// d += a · b: a 16x16 bf16 (rows: groupID and groupID + 8), b 16x8 bf16, d 16x8 f32 (PTX ISA,
// mma.m16n8k16 fragments).
__device__ inline void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int kHeadDim>
struct TileLayout {
  static constexpr int kKStride = kHeadDim + 8;      // K chunk row (bf16)
  static constexpr int kVStride = kTileChunk + 8;    // V^T row (bf16)
  static constexpr int kAccStride = kHeadDim + 8;    // state accumulators (f32)
  static constexpr int kDimSteps = kHeadDim / 16;    // k-steps of Q K^T
  static constexpr int kDimTiles = kHeadDim / 8;     // n-tiles of P V
  static constexpr int kKeyTiles = kTileChunk / 8;   // n-tiles of S
  static constexpr int kKeySteps = kTileChunk / 16;  // k-steps of P V
};

struct TileShared {
  __nv_bfloat16* k;   // [kTileChunk, kKStride]
  __nv_bfloat16* vt;  // [kHeadDim, kVStride]
  float* slot_acc;    // [kTileSlots, kAccStride] G
  float* row_acc;     // [kTileSlots, kAccStride] T (walker only)
};

template <int kHeadDim>
__device__ inline TileShared CarveTileShared() {
  using L = TileLayout<kHeadDim>;
  extern __shared__ __align__(16) unsigned char smem[];
  TileShared s;
  s.k = reinterpret_cast<__nv_bfloat16*>(smem);
  s.vt = s.k + kTileChunk * L::kKStride;
  s.slot_acc = reinterpret_cast<float*>(s.vt + kHeadDim * L::kVStride);
  s.row_acc = s.slot_acc + kTileSlots * L::kAccStride;
  return s;
}

// Vectors of 8 bf16 a thread stages per chunk of K (and of V), and how many it holds in
// registers at a time (all of a batch's loads are issued before its stores).
template <int kHeadDim>
inline constexpr int kStagedVectors = kHeadDim / 8 * kTileChunk / kTileThreads;
constexpr int kStageBatch = 2;

// Stages positions [base, base + nk) of the tile's sequence: K rows and V transposed, zeros
// past nk (their weights are 0, and 0 · 0 adds nothing). A thread always takes key
// threadIdx.x % kTileChunk (so it finds that key's cache row once) and dims 8 (threadIdx.x /
// kTileChunk) + 16 i; lanes take consecutive keys, so the transposed stores of a warp are
// conflict-free.
template <int kHeadDim>
__device__ inline void LoadTileChunk(const AttentionParams& p, const int32_t* table, int kv_head,
                                     int32_t base, int nk, const TileShared& sh) {
  using L = TileLayout<kHeadDim>;
  static_assert(kTileThreads % kTileChunk == 0);
  static_assert(kStagedVectors<kHeadDim> % kStageBatch == 0);
  constexpr int kDimStride = 8 * (kTileThreads / kTileChunk);
  const int key = static_cast<int>(threadIdx.x) % kTileChunk;
  const int d_first = 8 * (static_cast<int>(threadIdx.x) / kTileChunk);
  const bool present = key < nk;
  int64_t row = 0;
  if (present) {
    const int32_t pos = base + key;
    const int64_t slot = PagedSlot(table, p.block_size, pos);
    row = slot * p.num_kv_heads * kHeadDim + int64_t{kv_head} * kHeadDim;
  }
  const __nv_bfloat16* kc = static_cast<const __nv_bfloat16*>(p.k) + row;
  const __nv_bfloat16* vc = static_cast<const __nv_bfloat16*>(p.v) + row;
  __syncthreads();  // the previous chunk is consumed
#pragma unroll
  for (int b = 0; b < kStagedVectors<kHeadDim>; b += kStageBatch) {
    uint4 kv[kStageBatch], vv[kStageBatch];
#pragma unroll
    for (int i = 0; i < kStageBatch; ++i) {
      const int d0 = d_first + (b + i) * kDimStride;
      kv[i] = present ? *reinterpret_cast<const uint4*>(kc + d0) : make_uint4(0, 0, 0, 0);
      vv[i] = present ? *reinterpret_cast<const uint4*>(vc + d0) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kStageBatch; ++i) {
      const int d0 = d_first + (b + i) * kDimStride;
      *reinterpret_cast<uint4*>(sh.k + key * L::kKStride + d0) = kv[i];
      const __nv_bfloat16* v8 = reinterpret_cast<const __nv_bfloat16*>(&vv[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) sh.vt[(d0 + j) * L::kVStride + key] = v8[j];
    }
  }
  __syncthreads();
}

// One lane's view of a (row, head) pair of the tile: half h of the lane is pair 16w + l/4 + 8h.
struct Pair {
  bool real;      // a pair of the tile (else padding)
  int32_t row;    // batch row
  int32_t head;   // query head
  int32_t pos;    // the row's position
  int32_t begin;  // partitions [begin, end) this CTA computes for it
  int32_t end;
};

// Partitions of a row at `pos` that a CTA of slot z computes (all of them, walking).
template <bool kWalk>
__device__ inline void PartitionRange(int32_t pos, int z, int32_t& begin, int32_t& end) {
  if (kWalk) {
    begin = 0;
    end = NumPartitions(pos);
  } else {
    begin = SlotBegin(pos, z);
    end = SlotEnd(pos, z);
  }
}

// Folds a state (max bm, sum bl, accumulators src(j): the lane's float2 j) into one held as
// (m, l) in registers and the lane's float2s dst[4j]: a copy when `first`, else the merge of
// attention_plan.h (S_p into G, and G into T, the same way).
template <int kDimTiles, typename Source>
__device__ inline void Fold(bool first, float& m, float& l, float2* dst, float bm, float bl,
                            Source src) {
  if (first) {
    m = bm;
    l = bl;
#pragma unroll
    for (int j = 0; j < kDimTiles; ++j) dst[4 * j] = src(j);
    return;
  }
  const MergeWeights w = MergeWeightsOf(m, bm);
  l = Merged(l, bl, w);
  m = w.m;
#pragma unroll
  for (int j = 0; j < kDimTiles; ++j) {
    const float2 a = dst[4 * j], b = src(j);
    dst[4 * j] = make_float2(Merged(a.x, b.x, w), Merged(a.y, b.y, w));
  }
}

// grid (grid_tiles, num_kv_heads, kWalk ? 1 : kSplitSlots), kTileThreads threads. Walking, it
// writes `out`; split, slot z's states G_z to `states` (StateOffset).
template <int kHeadDim, bool kWalk>
__global__ void __launch_bounds__(kTileThreads)
    TileKernel(AttentionParams p, const int32_t* list, float* states) {
  using L = TileLayout<kHeadDim>;
  const TileShared sh = CarveTileShared<kHeadDim>();
  const int kv_head = blockIdx.y;
  const int z = kWalk ? 0 : static_cast<int>(blockIdx.z);
  const int group = p.num_heads / p.num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;  // mma groupID, thread in group
  const int32_t num_tiles = list[0];
  for (int32_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int32_t row0 = list[1 + tile], rows = list[2 + tile] - row0;
    const int32_t* table = p.block_tables + p.block_table_offsets[p.seq[row0]];
    // The CTA's partitions (the union of its rows') and keys (up to its highest position).
    int32_t first = INT_MAX, last = 0, key_end = 0;
    for (int32_t i = 0; i < rows; ++i) {
      const int32_t pos = p.positions[row0 + i];
      int32_t b, e;
      PartitionRange<kWalk>(pos, z, b, e);
      if (b < e) {
        first = min(first, b);
        last = max(last, e);
      }
      key_end = max(key_end, pos + 1);
    }
    if (first >= last) continue;  // no row has slot z: uniform over the CTA
    Pair pair[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = warp * 16 + gid + 8 * h;
      Pair& q = pair[h];
      q.real = m < rows * group;
      q.row = row0 + (q.real ? m / group : 0);
      q.head = kv_head * group + m % group;
      q.pos = q.real ? p.positions[q.row] : -1;
      q.begin = q.end = 0;
      if (q.real) PartitionRange<kWalk>(q.pos, z, q.begin, q.end);
    }
    const bool busy = warp * 16 < rows * group;  // any real pair in this warp (warp-uniform)
    // The query fragments, rounded to bf16 once: qa[kk] holds dims 16kk.. of the lane's pairs.
    uint32_t qa[L::kDimSteps][4];
#pragma unroll
    for (int kk = 0; kk < L::kDimSteps; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const Pair& q = pair[i & 1];
        const int col = 16 * kk + 2 * tig + (i >= 2 ? 8 : 0);
        const float* src = p.q + int64_t{q.row} * p.ld + int64_t{q.head} * kHeadDim + col;
        qa[kk][i] = q.real ? PackBf16(src[0], src[1]) : 0u;
      }
    }
    // The slot and row states' maxima and sums, repeated in the 4 lanes of each pair's row.
    float slot_m[2] = {}, slot_l[2] = {}, row_m[2] = {}, row_l[2] = {};
    for (int32_t part = first; part < last; ++part) {
      // Split, the rows' slot ranges may leave partitions between them that no row has.
      bool needed = kWalk;
      for (int32_t i = 0; i < rows && !needed; ++i) {
        int32_t b, e;
        PartitionRange<kWalk>(p.positions[row0 + i], z, b, e);
        needed = b <= part && part < e;
      }
      if (!needed) continue;  // uniform over the CTA
      float run_m[2] = {-INFINITY, -INFINITY}, run_l[2] = {0.0f, 0.0f};
      float acc[L::kDimTiles][4];
#pragma unroll
      for (int j = 0; j < L::kDimTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
      const int32_t part_end = min((part + 1) * kPartition, key_end);
      for (int32_t base = part * kPartition; base < part_end; base += kTileChunk) {
        const int nk = min(kTileChunk, part_end - base);
        LoadTileChunk<kHeadDim>(p, table, kv_head, base, nk, sh);
        if (!busy) continue;
        // Scores, scaled, with the keys a pair does not see at -inf.
        float s[L::kKeyTiles][4];
#pragma unroll
        for (int j = 0; j < L::kKeyTiles; ++j) {
          s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
          const __nv_bfloat16* krow = sh.k + (8 * j + gid) * L::kKStride + 2 * tig;
#pragma unroll
          for (int kk = 0; kk < L::kDimSteps; ++kk) {
            Mma(s[j], qa[kk], Load32(krow + 16 * kk), Load32(krow + 16 * kk + 8));
          }
        }
        float chunk_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < L::kKeyTiles; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const Pair& q = pair[i >> 1];
            const int32_t key = base + 8 * j + 2 * tig + (i & 1);
            const bool sees = key < base + nk && key <= q.pos && part >= q.begin && part < q.end;
            s[j][i] = sees ? __fmul_rn(s[j][i], p.scale) : -INFINITY;
            chunk_max[i >> 1] = fmaxf(chunk_max[i >> 1], s[j][i]);
          }
        }
        float alpha[2], new_m[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          chunk_max[h] = fmaxf(chunk_max[h], __shfl_xor_sync(kFullMask, chunk_max[h], 1));
          chunk_max[h] = fmaxf(chunk_max[h], __shfl_xor_sync(kFullMask, chunk_max[h], 2));
          new_m[h] = fmaxf(run_m[h], chunk_max[h]);
          alpha[h] = run_m[h] == -INFINITY ? 0.0f : expf(__fsub_rn(run_m[h], new_m[h]));
        }
        // The weights in bf16 (pa[j][h]: keys 8j + 2 tig, +1 of half h) and their row sums.
        uint32_t pa[L::kKeyTiles][2];
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < L::kKeyTiles; ++j) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float s0 = s[j][2 * h], s1 = s[j][2 * h + 1];
            const float p0 = s0 == -INFINITY ? 0.0f : expf(__fsub_rn(s0, new_m[h]));
            const float p1 = s1 == -INFINITY ? 0.0f : expf(__fsub_rn(s1, new_m[h]));
            const __nv_bfloat162 w = __floats2bfloat162_rn(p0, p1);
            sum[h] = __fadd_rn(__fadd_rn(sum[h], __low2float(w)), __high2float(w));
            memcpy(&pa[j][h], &w, sizeof(uint32_t));
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sum[h] = __fadd_rn(sum[h], __shfl_xor_sync(kFullMask, sum[h], 1));
          sum[h] = __fadd_rn(sum[h], __shfl_xor_sync(kFullMask, sum[h], 2));
          run_l[h] = __fadd_rn(__fmul_rn(run_l[h], alpha[h]), sum[h]);
          run_m[h] = new_m[h];
        }
#pragma unroll
        for (int j = 0; j < L::kDimTiles; ++j) {
          acc[j][0] = __fmul_rn(acc[j][0], alpha[0]);
          acc[j][1] = __fmul_rn(acc[j][1], alpha[0]);
          acc[j][2] = __fmul_rn(acc[j][2], alpha[1]);
          acc[j][3] = __fmul_rn(acc[j][3], alpha[1]);
        }
#pragma unroll
        for (int kk = 0; kk < L::kKeySteps; ++kk) {
          const uint32_t a[4] = {pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0],
                                 pa[2 * kk + 1][1]};
#pragma unroll
          for (int j = 0; j < L::kDimTiles; ++j) {
            const __nv_bfloat16* vrow = sh.vt + (8 * j + gid) * L::kVStride + 16 * kk + 2 * tig;
            Mma(acc[j], a, Load32(vrow), Load32(vrow + 8));
          }
        }
      }
      if (!busy) continue;
        // The partition's end: S_p -> G, and G -> T or the workspace at the slot's end. A lane's
        // accumulator elements are dims 8j + 2 tig, +1: float2 4j of its row from dim 2 tig on.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const Pair& q = pair[h];
        if (!q.real || part < q.begin || part >= q.end) continue;
        const int m = warp * 16 + gid + 8 * h;
        const int zr = part / PartitionsPerSlot(q.pos);
        const bool opens = part == SlotBegin(q.pos, zr), closes = part + 1 == SlotEnd(q.pos, zr);
        float2* g = reinterpret_cast<float2*>(sh.slot_acc + m * L::kAccStride + 2 * tig);
        Fold<L::kDimTiles>(opens, slot_m[h], slot_l[h], g, run_m[h], run_l[h],
                           [&](int j) { return make_float2(acc[j][2 * h], acc[j][2 * h + 1]); });
        if (!closes) continue;
        if (!kWalk) {
          float* dst = states + StateOffset(q.row, q.head, zr, p.num_heads, kHeadDim);
          if (tig == 0) *reinterpret_cast<float2*>(dst) = make_float2(slot_m[h], slot_l[h]);
          float2* dst2 = reinterpret_cast<float2*>(dst + 2 + 2 * tig);
#pragma unroll
          for (int j = 0; j < L::kDimTiles; ++j) dst2[4 * j] = g[4 * j];
          continue;
        }
        float2* t = reinterpret_cast<float2*>(sh.row_acc + m * L::kAccStride + 2 * tig);
        Fold<L::kDimTiles>(zr == 0, row_m[h], row_l[h], t, slot_m[h], slot_l[h],
                           [&](int j) { return g[4 * j]; });
      }
    }
    if (kWalk && busy) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const Pair& q = pair[h];
        if (!q.real) continue;
        const int m = warp * 16 + gid + 8 * h;
        const float2* t = reinterpret_cast<const float2*>(sh.row_acc + m * L::kAccStride + 2 * tig);
        // Two bf16 of adjacent dims in one 32-bit store (2 * tig is even, rows even-aligned).
        uint32_t* out = reinterpret_cast<uint32_t*>(
            p.out + int64_t{q.row} * p.num_heads * kHeadDim + int64_t{q.head} * kHeadDim + 2 * tig);
#pragma unroll
        for (int j = 0; j < L::kDimTiles; ++j) {
          out[4 * j] = uint32_t{Bf16Bits(__fdiv_rn(t[4 * j].x, row_l[h]))} |
                       uint32_t{Bf16Bits(__fdiv_rn(t[4 * j].y, row_l[h]))} << 16;
        }
      }
    }
  }
}

template <int kHeadDim, bool kWalk>
void LaunchTiles(const AttentionParams& p, const AttentionPlan& plan, const int32_t* list,
                 float* states, cudaStream_t stream) {
  const dim3 grid(plan.grid_tiles, p.num_kv_heads, kWalk ? 1 : kSplitSlots);
  TileKernel<kHeadDim, kWalk><<<grid, kTileThreads, plan.shared_bytes, stream>>>(p, list, states);
  CUDA_CHECK_LAUNCH(stream);
}

template <int kHeadDim>
cudaError_t RaiseTileLimits() {
  cudaError_t e =
      cudaFuncSetAttribute(TileKernel<kHeadDim, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(TileSharedBytes(kHeadDim, true)));
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(TileKernel<kHeadDim, false>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(TileSharedBytes(kHeadDim, false)));
}

}  // namespace

cudaError_t PrepareAttentionTiles() {
  const cudaError_t e = RaiseTileLimits<64>();
  return e != cudaSuccess ? e : RaiseTileLimits<128>();
}

void LaunchAttentionTiles(const AttentionParams& p, const AttentionPlan& plan, void* workspace,
                          cudaStream_t stream) {
  float* states = static_cast<float*>(workspace);
  int32_t* list =
      reinterpret_cast<int32_t*>(static_cast<unsigned char*>(workspace) + plan.tile_list_offset);
  BuildTiles<<<1, kBuildThreads, 0, stream>>>(p.seq, p.num_rows, plan.tile_rows, list);
  CUDA_CHECK_LAUNCH(stream);
  if (p.head_dim == 64) {
    plan.split ? LaunchTiles<64, false>(p, plan, list, states, stream)
               : LaunchTiles<64, true>(p, plan, list, states, stream);
  } else {
    plan.split ? LaunchTiles<128, false>(p, plan, list, states, stream)
               : LaunchTiles<128, true>(p, plan, list, states, stream);
  }
}

}  // namespace ridgeserve::cuda
