// Paged attention, flash-style on the CPU.
//
// Work is split into items (tile, kv heads): a tile is up to kTileRows rows of one sequence
// (sorted by position), and the item computes, for each of its kv heads, the
// num_heads / num_kv_heads query heads of those rows that share it. With a few tiles (one
// long sequence) an item has one kv head, so the threads share the sequence; with many (decode
// of a batch) it has all of them, so it reads its cache slots whole, in address order. For
// each chunk of kAttentionChunk context positions and kv head the item gathers the chunk's K
// rows transposed ([head_dim, chunk], so one vector holds one dimension of many keys, widened
// to f32 from an F16 / BF16 cache as they are transposed) and V row pointers once, then runs
// every row of the tile that reaches the chunk against them: K and V are read from memory once
// per tile, not per row, and the next chunk's are prefetched into L2 while this one is
// computed. A tile of a few rows (decode) reads V where it is in the cache, widening each
// vector as it is used; a longer one widens the chunk's V rows once. Widening is exact, so
// neither changes a bit.
//
// Per row and query head the arithmetic is fixed by the row alone:
//   s_j   = fl(q . k_j) * scale, the dot product one FMA chain over d = 0..head_dim-1;
//   per chunk c (in increasing order), over its n visible positions:
//     m_c   = max(m, max_j s_j);  alpha = exp(m - m_c)  (0 for the first chunk)
//     p_j   = Exp(s_j - m_c)      (simd::Exp)
//     l     = l * alpha + sum_j p_j   (vector partial sums over j, then ReduceAdd)
//     acc_d = acc_d * alpha, then acc_d = fma(p_j, v_j[d], acc_d) for j in order;
//   out_d = acc_d / l.
// Which rows share a tile, how queries are blocked in registers and which thread runs an item
// change none of these operations, so results are bitwise independent of the batch.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/simd.h"

namespace ridgeserve::cpu {
namespace {

using simd::kLanes;
using simd::VecF;

constexpr int kChunk = kAttentionChunk;
static_assert(kChunk % kLanes == 0);
// Rows per tile: enough to amortize the K transpose of each chunk, few enough that a long
// prefill still yields many items for the threads.
constexpr int kTileRows = 32;
// Tiles per thread from which an item covers every kv head of its tile.
constexpr int kTilesPerThread = 4;
// Register blocking: queries x key vectors in ScoreTile, queries x head_dim vectors in
// AccumulateTile. AVX-512 has 32 vector registers, AVX2 16.
constexpr int kMaxVecBlock = 4;
constexpr int kMaxQueryBlock = kLanes == 16 ? 4 : 3;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Tiles of at most this many rows read V from an F16 / BF16 cache in place, widening each
// vector as it is used; longer ones widen a chunk's V rows once into scratch and read them
// there (a row of V is used once per row of the tile and block of query heads).
constexpr int kInPlaceRows = 4;

// Elements [d, d + kLanes) and element d of a K or V row whose elements are of type D (the
// cache's, or F32 for a row widened into scratch), widened to f32 exactly.
template <DType D>
inline VecF LoadRow(const uint8_t* row, int d) {
  if constexpr (D == DType::kF32) return simd::Load(reinterpret_cast<const float*>(row) + d);
  if constexpr (D == DType::kF16) return simd::LoadF16(row + 2 * d);
  if constexpr (D == DType::kBF16) return simd::LoadBF16(row + 2 * d);
}
template <DType D>
inline float RowElement(const uint8_t* row, int d) {
  float x;
  if constexpr (D == DType::kF32) std::memcpy(&x, row + 4 * d, sizeof(x));
  if constexpr (D == DType::kF16) simd::WidenF16(row + 2 * d, 1, &x);
  if constexpr (D == DType::kBF16) simd::WidenBF16(row + 2 * d, 1, &x);
  return x;
}

// s[qb * kChunk + kb * kLanes + lane] = scale * (q_qb . Kt[:, kb * kLanes + lane]) for QB
// queries (rows of q, `head_dim` apart) and KB key vectors of kt ([head_dim, kChunk]).
template <int QB, int KB>
inline void ScoreTile(const float* q, const float* kt, int head_dim, float scale, float* s) {
  VecF acc[QB][KB];
  for (int a = 0; a < QB; ++a) {
    for (int b = 0; b < KB; ++b) acc[a][b] = simd::Zero();
  }
  for (int d = 0; d < head_dim; ++d) {
    VecF qd[QB];
    for (int a = 0; a < QB; ++a) qd[a] = simd::Set1(q[a * head_dim + d]);
    for (int b = 0; b < KB; ++b) {
      VecF k = simd::Load(kt + d * kChunk + b * kLanes);
      // Keeps k in a register: GCC otherwise folds the load into each of the QB FMAs that use
      // it, and the loop becomes load-bound.
      asm("" : "+v"(k));
      for (int a = 0; a < QB; ++a) acc[a][b] = simd::Fma(qd[a], k, acc[a][b]);
    }
  }
  const VecF vscale = simd::Set1(scale);
  for (int a = 0; a < QB; ++a) {
    for (int b = 0; b < KB; ++b)
      simd::Store(s + a * kChunk + b * kLanes, simd::Mul(acc[a][b], vscale));
  }
}

template <int QB>
inline void ScoreTileAnyKb(int kb, const float* q, const float* kt, int head_dim, float scale,
                           float* s) {
  switch (kb) {
    case 1:
      return ScoreTile<QB, 1>(q, kt, head_dim, scale, s);
    case 2:
      return ScoreTile<QB, 2>(q, kt, head_dim, scale, s);
    case 3:
      return ScoreTile<QB, 3>(q, kt, head_dim, scale, s);
    default:
      return ScoreTile<QB, 4>(q, kt, head_dim, scale, s);
  }
}

inline void ScoreTileAny(int qb, int kb, const float* q, const float* kt, int head_dim, float scale,
                         float* s) {
  switch (qb) {
    case 1:
      return ScoreTileAnyKb<1>(kb, q, kt, head_dim, scale, s);
    case 2:
      return ScoreTileAnyKb<2>(kb, q, kt, head_dim, scale, s);
    case 3:
      return ScoreTileAnyKb<3>(kb, q, kt, head_dim, scale, s);
    default:
      if constexpr (kMaxQueryBlock >= 4) return ScoreTileAnyKb<4>(kb, q, kt, head_dim, scale, s);
  }
}

// For QB queries (acc rows `head_dim` apart, p rows kChunk apart) and DV vectors of head
// dimensions starting at d0: acc = acc * alpha, then acc += p_j * v_j for j < n in order.
template <DType VD, int QB, int DV>
inline void AccumulateTile(const float* p, const uint8_t* const* v, int n, int d0,
                           const float* alpha, int head_dim, float* acc) {
  VecF a[QB][DV];
  for (int x = 0; x < QB; ++x) {
    const VecF ax = simd::Set1(alpha[x]);
    for (int y = 0; y < DV; ++y) {
      a[x][y] = simd::Mul(simd::Load(acc + x * head_dim + d0 + y * kLanes), ax);
    }
  }
  // QB broadcasts and one V vector live at a time: 3 x 4 accumulators fit AVX2's 16 registers
  // (holding all DV vectors of v_j spilled one accumulator to the stack).
  for (int j = 0; j < n; ++j) {
    VecF pj[QB];
    for (int x = 0; x < QB; ++x) pj[x] = simd::Set1(p[x * kChunk + j]);
    for (int y = 0; y < DV; ++y) {
      VecF vj = LoadRow<VD>(v[j], d0 + y * kLanes);
      asm("" : "+v"(vj));  // one load, not one folded into each of the QB FMAs
      for (int x = 0; x < QB; ++x) a[x][y] = simd::Fma(pj[x], vj, a[x][y]);
    }
  }
  for (int x = 0; x < QB; ++x) {
    for (int y = 0; y < DV; ++y) simd::Store(acc + x * head_dim + d0 + y * kLanes, a[x][y]);
  }
}

template <DType VD, int QB>
inline void AccumulateTileAnyDv(int dv, const float* p, const uint8_t* const* v, int n, int d0,
                                const float* alpha, int head_dim, float* acc) {
  switch (dv) {
    case 1:
      return AccumulateTile<VD, QB, 1>(p, v, n, d0, alpha, head_dim, acc);
    case 2:
      return AccumulateTile<VD, QB, 2>(p, v, n, d0, alpha, head_dim, acc);
    case 3:
      return AccumulateTile<VD, QB, 3>(p, v, n, d0, alpha, head_dim, acc);
    default:
      return AccumulateTile<VD, QB, 4>(p, v, n, d0, alpha, head_dim, acc);
  }
}

template <DType VD>
inline void AccumulateTileAny(int qb, int dv, const float* p, const uint8_t* const* v, int n,
                              int d0, const float* alpha, int head_dim, float* acc) {
  switch (qb) {
    case 1:
      return AccumulateTileAnyDv<VD, 1>(dv, p, v, n, d0, alpha, head_dim, acc);
    case 2:
      return AccumulateTileAnyDv<VD, 2>(dv, p, v, n, d0, alpha, head_dim, acc);
    case 3:
      return AccumulateTileAnyDv<VD, 3>(dv, p, v, n, d0, alpha, head_dim, acc);
    default:
      if constexpr (kMaxQueryBlock >= 4) {
        return AccumulateTileAnyDv<VD, 4>(dv, p, v, n, d0, alpha, head_dim, acc);
      }
  }
}

#if defined(__AVX512F__)
// Merge-masked forms with an all-ones mask: see simd.h on GCC 12's -Wmaybe-uninitialized.
inline __m512 UnpackLo(__m512 a, __m512 b) { return _mm512_mask_unpacklo_ps(a, 0xFFFF, a, b); }
inline __m512 UnpackHi(__m512 a, __m512 b) { return _mm512_mask_unpackhi_ps(a, 0xFFFF, a, b); }
inline __m512 UnpackLo64(__m512 a, __m512 b) {
  const __m512d x = _mm512_castps_pd(a);
  return _mm512_castpd_ps(_mm512_mask_unpacklo_pd(x, 0xFF, x, _mm512_castps_pd(b)));
}
inline __m512 UnpackHi64(__m512 a, __m512 b) {
  const __m512d x = _mm512_castps_pd(a);
  return _mm512_castpd_ps(_mm512_mask_unpackhi_pd(x, 0xFF, x, _mm512_castps_pd(b)));
}
template <int kImm>
inline __m512 Shuffle128(__m512 a, __m512 b) {
  return _mm512_mask_shuffle_f32x4(a, 0xFFFF, a, b, kImm);
}

// dst[d * kChunk + i] = rows[i][d0 + d] for i, d < 16: a 16 x 16 transpose in registers.
template <DType D>
inline void TransposeBlock(const uint8_t* const* rows, int d0, float* dst) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = LoadRow<D>(rows[i], d0);
  // t[2i], t[2i+1]: rows 2i, 2i+1 interleaved.
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = UnpackLo(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = UnpackHi(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + c], 128-bit lane L: rows 4i..4i+3 at dimension 4L + c.
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = UnpackLo64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = UnpackHi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = UnpackLo64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = UnpackHi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // A 4 x 4 transpose of 128-bit lanes for each c.
  for (int c = 0; c < 4; ++c) {
    const __m512 u0 = Shuffle128<0x88>(r[c], r[4 + c]);
    const __m512 u1 = Shuffle128<0xDD>(r[c], r[4 + c]);
    const __m512 u2 = Shuffle128<0x88>(r[8 + c], r[12 + c]);
    const __m512 u3 = Shuffle128<0xDD>(r[8 + c], r[12 + c]);
    _mm512_storeu_ps(dst + c * kChunk, Shuffle128<0x88>(u0, u2));
    _mm512_storeu_ps(dst + (4 + c) * kChunk, Shuffle128<0x88>(u1, u3));
    _mm512_storeu_ps(dst + (8 + c) * kChunk, Shuffle128<0xDD>(u0, u2));
    _mm512_storeu_ps(dst + (12 + c) * kChunk, Shuffle128<0xDD>(u1, u3));
  }
}
#else
// dst[d * kChunk + i] = rows[i][d0 + d] for i, d < 8: an 8 x 8 transpose in registers.
template <DType D>
inline void TransposeBlock(const uint8_t* const* rows, int d0, float* dst) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = LoadRow<D>(rows[i], d0);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4h + c], 128-bit lane L: rows 4h..4h+3 at dimension 4L + c.
  for (int h = 0; h < 2; ++h) {
    r[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    r[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    r[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    r[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * kChunk, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
    _mm256_storeu_ps(dst + (4 + c) * kChunk, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
  }
}
#endif

// kt[d * kChunk + j] = rows[j][d] widened to f32 for j < n, d < head_dim, from rows of the
// cache's element type D: full kLanes x kLanes blocks in registers, the ragged edges in scalar
// code.
template <DType D>
void TransposeKeys(const uint8_t* const* rows, int n, int head_dim, float* kt) {
  const int full_rows = n / kLanes * kLanes;
  const int full_dims = head_dim / kLanes * kLanes;
  for (int j0 = 0; j0 < full_rows; j0 += kLanes) {
    for (int d0 = 0; d0 < full_dims; d0 += kLanes) {
      TransposeBlock<D>(rows + j0, d0, kt + d0 * kChunk + j0);
    }
    for (int j = j0; j < j0 + kLanes; ++j) {
      for (int d = full_dims; d < head_dim; ++d) kt[d * kChunk + j] = RowElement<D>(rows[j], d);
    }
  }
  for (int j = full_rows; j < n; ++j) {
    for (int d = 0; d < head_dim; ++d) kt[d * kChunk + j] = RowElement<D>(rows[j], d);
  }
}

// 64-byte aligned float scratch that only grows.
class AlignedFloats {
 public:
  AlignedFloats() = default;
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  ~AlignedFloats() { std::free(data_); }

  float* Get(size_t count) {
    if (count > capacity_) {
      std::free(data_);
      capacity_ = (count + 15) / 16 * 16;
      data_ = static_cast<float*>(std::aligned_alloc(64, capacity_ * sizeof(float)));
      // Zeroed so that key columns of a partial chunk that are never written hold finite
      // values (their scores are masked anyway).
      std::fill(data_, data_ + capacity_, 0.0f);
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  size_t capacity_ = 0;
};

// Per-thread working memory of one item.
struct Scratch {
  AlignedFloats kt;     // [head_dim, kChunk]: the chunk's K, transposed
  AlignedFloats p;      // [group, kChunk]: scores, then probabilities
  AlignedFloats acc;    // [kTileRows, group, head_dim]: unnormalized outputs
  AlignedFloats ml;     // [2, kTileRows, group]: running max m, then running sum l
  AlignedFloats alpha;  // [group]: this chunk's rescale factor of acc and l
  AlignedFloats vw;     // [kChunk, head_dim]: an F16 / BF16 chunk's V widened to f32
  // [kChunk] K rows in the cache, and V rows in the cache or in vw.
  std::vector<const uint8_t*> k = std::vector<const uint8_t*>(kChunk);
  std::vector<const uint8_t*> v = std::vector<const uint8_t*>(kChunk);
  std::vector<int64_t> offsets = std::vector<int64_t>(2 * kChunk);  // RunItem's chunk offsets
};

struct Geometry {
  int group;      // query heads per kv head
  int head_dim;   // elements per head
  int kv_stride;  // floats between consecutive slots of a cache (num_kv_heads * head_dim)
};

// One row's step over one chunk: `q` holds the group's query heads ([group, head_dim]),
// n (>= 1) positions of the chunk are visible to the row. Updates m, l ([group]) and acc
// ([group, head_dim]).
// V's rows hold elements of type VD.
template <DType VD>
void RowChunk(const Geometry& g, const float* q, const float* kt, const uint8_t* const* v, int n,
              bool first, float scale, float* p, float* alpha, float* m, float* l, float* acc) {
  const int num_vecs = (n + kLanes - 1) / kLanes;
  // Scores, in blocks of queries x up to kMaxVecBlock key vectors.
  for (int h0 = 0; h0 < g.group; h0 += kMaxQueryBlock) {
    const int qb = std::min(kMaxQueryBlock, g.group - h0);
    for (int k0 = 0; k0 < num_vecs; k0 += kMaxVecBlock) {
      ScoreTileAny(qb, std::min(kMaxVecBlock, num_vecs - k0), q + h0 * g.head_dim, kt + k0 * kLanes,
                   g.head_dim, scale, p + h0 * kChunk + k0 * kLanes);
    }
  }
  // Online softmax update; lanes at or past n are masked out of the max and the sum.
  for (int h = 0; h < g.group; ++h) {
    float* ph = p + h * kChunk;
    VecF vmax = simd::Set1(kNegInf);
    for (int i = 0; i < num_vecs; ++i) {
      VecF s = simd::Load(ph + i * kLanes);
      if ((i + 1) * kLanes > n) s = simd::KeepFirst(s, n - i * kLanes, kNegInf);
      vmax = simd::Max(vmax, s);
    }
    const float m_new = std::max(m[h], simd::ReduceMax(vmax));
    // exp(0) is exactly 1, so skipping the call when the max holds changes no bits.
    alpha[h] = first ? 0.0f : m_new == m[h] ? 1.0f : std::exp(m[h] - m_new);
    const VecF vm = simd::Set1(m_new);
    VecF sum = simd::Zero();
    for (int i = 0; i < num_vecs; ++i) {
      VecF e = simd::Exp(simd::Sub(simd::Load(ph + i * kLanes), vm));
      if ((i + 1) * kLanes > n) e = simd::KeepFirst(e, n - i * kLanes, 0.0f);
      simd::Store(ph + i * kLanes, e);
      sum = simd::Add(sum, e);
    }
    l[h] = l[h] * alpha[h] + simd::ReduceAdd(sum);
    m[h] = m_new;
  }
  // acc = acc * alpha + P V, in blocks of queries x up to kMaxVecBlock head_dim vectors; the
  // head_dim tail that fills no vector takes the same FMA sequence in scalar code.
  const int vec_dims = g.head_dim / kLanes * kLanes;
  for (int h0 = 0; h0 < g.group; h0 += kMaxQueryBlock) {
    const int qb = std::min(kMaxQueryBlock, g.group - h0);
    for (int d0 = 0; d0 < vec_dims; d0 += kMaxVecBlock * kLanes) {
      const int dv = std::min(kMaxVecBlock, (vec_dims - d0) / kLanes);
      AccumulateTileAny<VD>(qb, dv, p + h0 * kChunk, v, n, d0, alpha + h0, g.head_dim,
                            acc + h0 * g.head_dim);
    }
  }
  for (int h = 0; h < g.group; ++h) {
    for (int d = vec_dims; d < g.head_dim; ++d) {
      float a = acc[h * g.head_dim + d] * alpha[h];
      for (int j = 0; j < n; ++j) a = std::fma(p[h * kChunk + j], RowElement<VD>(v[j], d), a);
      acc[h * g.head_dim + d] = a;
    }
  }
}

struct Item {
  int32_t begin;             // into the position-sorted row order
  int32_t count;             // rows in the tile
  int32_t kv_begin, kv_end;  // kv heads [kv_begin, kv_end)
  int64_t cost;              // chunk visits, for scheduling the longest items first
};

// Computes the groups of query heads sharing kv heads [kv_begin, kv_end) for the tile's rows,
// chunk by chunk, every kv head of a chunk before the next chunk: the chunk's cache slots are
// read as whole rows, so consecutive slots are adjacent in memory. D: the cache's element type.
template <DType D>
void RunItem(const Item& item, const int32_t* order, const float* q, int32_t ld,
             const KvLayerView& cache, const AttentionRows& rows, const Geometry& g, float scale,
             int32_t out_ld, float* out, Scratch& scratch) {
  const int32_t* tile = order + item.begin;
  const int n_rows = item.count;
  const int heads = item.kv_end - item.kv_begin;
  const int32_t seq = rows.seq[tile[0]];
  const int32_t* block_table = rows.block_tables + rows.block_table_offsets[seq];
  int32_t max_pos = 0;
  for (int t = 0; t < n_rows; ++t) max_pos = std::max(max_pos, rows.positions[tile[t]]);

  const int state = g.group * g.head_dim;  // acc floats per row and kv head
  const size_t head_state = size_t(n_rows) * state;
  const int ml_stride = kTileRows * g.group;  // m (and l) floats per kv head
  float* kt = scratch.kt.Get(size_t(g.head_dim) * kChunk);
  float* p = scratch.p.Get(size_t(g.group) * kChunk);
  float* acc = scratch.acc.Get(heads * head_state);
  float* alpha = scratch.alpha.Get(g.group);
  float* m = scratch.ml.Get(2 * size_t(heads) * ml_stride);
  float* l = m + heads * ml_stride;
  std::fill(acc, acc + heads * head_state, 0.0f);
  std::fill(m, m + heads * ml_stride, kNegInf);
  std::fill(l, l + heads * ml_stride, 0.0f);
  const uint8_t** k = scratch.k.data();
  const uint8_t** v = scratch.v.data();
  const bool v_in_place = D == DType::kF32 || n_rows <= kInPlaceRows;
  float* vw = v_in_place ? nullptr : scratch.vw.Get(size_t(kChunk) * g.head_dim);

  const int64_t elem = static_cast<int64_t>(ElementBytes(D));
  // Byte offsets in a cache layer of the item's part of the K and V rows of a chunk's
  // positions: this chunk's, then the next one's.
  int64_t* offsets = scratch.offsets.data();
  int64_t* next_offsets = offsets + kChunk;
  const int64_t first_byte = int64_t{item.kv_begin} * g.head_dim * elem;
  const int64_t item_bytes = int64_t{heads} * g.head_dim * elem;
  const auto chunk_offsets = [&](int32_t base, int64_t* out) {
    const int count = std::min<int32_t>(kChunk, max_pos - base + 1);
    int32_t block = base / cache.block_size, offset = base % cache.block_size;
    for (int j = 0; j < count; ++j) {
      out[j] = (int64_t{block_table[block]} * cache.block_size + offset) * g.kv_stride * elem +
               first_byte;
      if (++offset == cache.block_size) {
        offset = 0;
        ++block;
      }
    }
    return count;
  };
  // Asks for a chunk's K and V into L2.
  const auto prefetch = [&](const int64_t* chunk, int count) {
    for (int j = 0; j < count; ++j) {
      for (int64_t b = 0; b < item_bytes; b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(cache.k + chunk[j] + b), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(cache.v + chunk[j] + b), _MM_HINT_T1);
      }
    }
  };
  // The first chunk's loads are all asked for at once, not one demand miss after another as
  // its rows are read; each next chunk streams in while this one is computed.
  prefetch(offsets, chunk_offsets(0, offsets));
  for (int32_t base = 0; base <= max_pos; base += kChunk) {
    const int nk = std::min<int32_t>(kChunk, max_pos - base + 1);
    if (base + kChunk <= max_pos) {
      prefetch(next_offsets, chunk_offsets(base + kChunk, next_offsets));
    }
    for (int h = 0; h < heads; ++h) {
      const int32_t kv_head = item.kv_begin + h;
      const int64_t head_byte = int64_t{h} * g.head_dim * elem;
      for (int j = 0; j < nk; ++j) {
        k[j] = cache.k + offsets[j] + head_byte;
        v[j] = cache.v + offsets[j] + head_byte;
        if constexpr (D != DType::kF32) {
          if (!v_in_place) {
            float* row = vw + int64_t{j} * g.head_dim;
            if constexpr (D == DType::kF16) simd::WidenF16(v[j], g.head_dim, row);
            if constexpr (D == DType::kBF16) simd::WidenBF16(v[j], g.head_dim, row);
            v[j] = reinterpret_cast<const uint8_t*>(row);
          }
        }
      }
      TransposeKeys<D>(k, nk, g.head_dim, kt);
      for (int t = 0; t < n_rows; ++t) {
        const int32_t r = tile[t];
        const int32_t pos = rows.positions[r];
        if (pos < base) continue;
        const int n = std::min<int32_t>(kChunk, pos - base + 1);
        float* mh = m + h * ml_stride + t * g.group;
        const float* qr = q + int64_t{r} * ld + kv_head * state;
        float* at = acc + h * head_state + size_t(t) * state;
        if (v_in_place) {
          RowChunk<D>(g, qr, kt, v, n, base == 0, scale, p, alpha, mh, mh + heads * ml_stride, at);
        } else {
          RowChunk<DType::kF32>(g, qr, kt, v, n, base == 0, scale, p, alpha, mh,
                                mh + heads * ml_stride, at);
        }
      }
    }
    std::swap(offsets, next_offsets);
  }
  for (int h = 0; h < heads; ++h) {
    for (int t = 0; t < n_rows; ++t) {
      float* o = out + int64_t{tile[t]} * out_ld + (item.kv_begin + h) * state;
      const float* a = acc + h * head_state + size_t(t) * state;
      const float* lt = l + h * ml_stride + t * g.group;
      for (int qh = 0; qh < g.group; ++qh) {
        for (int d = 0; d < g.head_dim; ++d) {
          o[qh * g.head_dim + d] = a[qh * g.head_dim + d] / lt[qh];
        }
      }
    }
  }
}

}  // namespace

void PagedAttention(const float* q, int32_t ld, int32_t num_heads, const KvLayerView& cache,
                    const AttentionRows& rows, float scale, float* out, int num_threads) {
  if (rows.num_rows <= 0) return;
  assert(cache.num_kv_heads > 0 && num_heads % cache.num_kv_heads == 0);
  assert(std::all_of(rows.positions, rows.positions + rows.num_rows,
                     [](int32_t p) { return p >= 0; }));
  const Geometry g{num_heads / cache.num_kv_heads, cache.head_dim,
                   cache.num_kv_heads * cache.head_dim};

  // Rows sorted by (sequence, position), cut into tiles of one sequence.
  std::vector<int32_t> order(rows.num_rows);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (rows.seq[a] != rows.seq[b]) return rows.seq[a] < rows.seq[b];
    return rows.positions[a] < rows.positions[b];
  });
  struct Tile {
    int32_t begin, count;
    int64_t cost;
  };
  std::vector<Tile> tiles;
  for (int32_t begin = 0; begin < rows.num_rows;) {
    int32_t end = begin;
    int64_t cost = 0;
    while (end < rows.num_rows && end - begin < kTileRows &&
           rows.seq[order[end]] == rows.seq[order[begin]]) {
      cost += rows.positions[order[end]] / kChunk + 1;
      ++end;
    }
    tiles.push_back({begin, end - begin, cost});
    begin = end;
  }
  // An item takes every kv head of its tile (whole cache rows, read in address order) when
  // there are enough tiles to keep the threads busy, else one kv head.
  const int32_t heads_per_item =
      int64_t(tiles.size()) >= kTilesPerThread * std::max(num_threads, 1) ? cache.num_kv_heads : 1;
  std::vector<Item> items;
  for (const Tile& t : tiles) {
    for (int32_t h = 0; h < cache.num_kv_heads; h += heads_per_item) {
      const int32_t h_end = std::min(h + heads_per_item, cache.num_kv_heads);
      items.push_back({t.begin, t.count, h, h_end, t.cost * (h_end - h)});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });

  const int32_t out_ld = num_heads * cache.head_dim;
  const auto run = cache.dtype == DType::kF16    ? RunItem<DType::kF16>
                   : cache.dtype == DType::kBF16 ? RunItem<DType::kBF16>
                                                 : RunItem<DType::kF32>;
  const int64_t num_items = static_cast<int64_t>(items.size());
  const int threads = static_cast<int>(std::min<int64_t>(std::max(num_threads, 1), num_items));
#pragma omp parallel num_threads(threads)
  {
    thread_local Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_items; ++i) {
      run(items[i], order.data(), q, ld, cache, rows, g, scale, out_ld, out, scratch);
    }
  }
}

}  // namespace ridgeserve::cpu
