// Weights packed for the CPU backend and y = x · wᵀ on them (Backend::PackWeight, Linear,
// Embed, UnpackWeight). No BLAS: the arithmetic is ours, fixed, and the same on every CPU.
//
// Packing keeps weights quantized. The formats whose values are d q + m over 32-weight blocks
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the sub-blocks of Q4_K, Q5_K; kernels/dtype.h) are
// repacked per row as f32 d[nb], f32 m[nb] and the integers q (4-bit pairs, bytes, or int8),
// so a Q4_1 model stays at 6 bits a weight; other types (F32, F16, BF16, Q6_K, Q2_K, Q3_K)
// keep their stored rows. A backend with int8 activations on AVX2 or better packs the 32-block
// formats in tiles of 16 rows instead (the same bytes a row), laid out for the integer dot
// products of AVX2, VNNI and AMX: 16 rows' group of 4 integers side by side. Parts of different
// types stay separate segments of one weight (Q4_K_M files mix Q4_K and Q6_K rows in one fused
// projection).
//
// Two arithmetics, chosen per backend (Activations) and fixed for every row, n, thread count,
// row range and dispatch path:
//
// kF32 — x in f32 against w_j = row j converted to f32 exactly as DequantizeRow converts it:
//   K8 = k rounded up to a multiple of 8, x and w_j read as 0 past k;
//   acc[l] = 0 (l < 8); for c = 0, 8, ..., K8 - 8 and each l: acc[l] = fma(x[c+l], w_j[c+l],
//   acc[l]) y = R(acc) (+ bias[j]), R(a) = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
//
// kInt8 — for the repacked 32-block formats (other segments use kF32's arithmetic): each row
// of x is quantized per 32-block b (k is a multiple of 32) as
//   amax = max |x_e|, dx = amax / 127, q_e = nearbyint(x_e * (127 / amax)) (0 when amax = 0),
//   sx = dx * float(Σ q_e);
// then with the block's integer dot product p_b = Σ_{e < 32} qw_e qx_e (exact):
//   acc[b mod 8] = fma(float(p_b), dw_b * dx_b, acc[b mod 8]) over b in order;
//   accm[b mod 8] = fma(mw_b, sx_b, accm[b mod 8]) over b in order (unsigned formats only);
//   y = (R(acc) + R(accm)) (+ bias[j])  (R(acc) alone for Q8_0).
// This is ggml's q8 activation scheme with a fixed order: fewer operations per weight than
// converting w to f32, at a quantization error of 2^-8 of a block's largest activation. On the
// default model that flips near-tied greedy choices (README, "CPU kernels"), so f32 is the
// default and int8 is asked for. A block's sum is one integer however it is added up, so a
// path may take it from any integer instructions: VNNI's four-product lanes, or AMX tiles.
//
// The AVX2 path keeps each accumulator in one 8-lane register (int8: one lane for each of 8
// rows of a tile, p_b from vpmaddubsw and vpmaddwd); the AVX-512 path
// (linear_avx512.cc) keeps two for f32, one weight row's in each half of a 16-lane register,
// and for int8 sixteen, one lane for each row of a 16-row tile, with p_b from VNNI's vpdpbusd;
// the AMX path (linear_amx.cc, int8 on 16 or more rows of x) takes p_b for 16 rows of x by 16
// weight rows from one tile instruction; the scalar path is the same loops written lane by
// lane. So every path agrees bitwise (tests/kernels/linear_test.cc holds
// them to it, and to an emulation of this text), for finite inputs.
#ifndef RIDGESERVE_KERNELS_CPU_LINEAR_H_
#define RIDGESERVE_KERNELS_CPU_LINEAR_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_features.h"

namespace ridgeserve::cpu {

enum class Activations { kF32, kInt8 };
std::string_view ActivationsName(Activations a);
// "f32" or "int8"; InvalidArgument naming the value otherwise.
absl::StatusOr<Activations> ParseActivations(std::string_view name);

// A packed weight: rows stacked from the parts, each run of same-type rows one segment.
class CpuWeight final : public WeightStorage {
 public:
  enum class Layout {
    kStored,  // rows as stored (dtype), converted by DequantizeRow's rules
    kU4,      // d[nb], m[nb], then 16 bytes a block: q_e in the low nibble of byte e % 16 for
              // e < 16, the high nibble for e >= 16 (as Q4_1 stores them)
    kU8,      // d[nb], m[nb], then 32 bytes a block, q in [0, 31]
    kS8,      // d[nb], then 32 int8 a block (m = 0)
    // Tiles of 16 rows (the segment's rows padded with zero rows to a multiple of 16), each
    // tile block by block: d of its 16 rows (16 floats), m (16 floats; not for kS8T), then the
    // integers with group g (elements 4g..4g+3) of row j at byte 64 g + 4 j (AMX's B tile):
    kU4T,  // two groups a byte: group g < 4 in the low nibbles of bytes 64 g + 4 j + e, group
           // g + 4 in their high nibbles (256 bytes a block)
    kU8T,  // q in [0, 31], 512 bytes a block
    kS8T,  // int8, 512 bytes a block
  };
  struct Segment {
    DType dtype = DType::kF32;  // the source type
    Layout layout = Layout::kStored;
    int64_t row_begin = 0;  // first row of the weight in this segment
    int64_t rows = 0;
    size_t row_bytes = 0;  // bytes of one packed row (a tile's bytes / 16 for the tiles)
    const uint8_t* data = nullptr;
  };

  // tiles: the 32-block formats in 16-row tiles (int8 activations on AVX2 and better).
  static absl::StatusOr<Weight> Pack(std::span<const HostTensor> parts, bool tiles);

  int64_t cols() const { return cols_; }
  const std::vector<Segment>& segments() const { return segments_; }
  // The segment holding `row`.
  const Segment& SegmentOf(int64_t row) const;

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  int64_t cols_ = 0;
  std::vector<Segment> segments_;
  std::unique_ptr<uint8_t, FreeDeleter> storage_;
};

// Converts `count` rows of `w` starting at `row` to f32, rows `ld` floats apart (ld >= cols;
// the floats past cols are left alone).
void DequantizeRows(const CpuWeight& w, int64_t row, int64_t count, float* out, int64_t ld,
                    Isa isa);

// Reused buffers for the quantized activations of one call (owned by the backend; Linear is
// driven by one thread at a time).
struct LinearScratch {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

// y[n, rows] = x[n, w.cols()] · w[row_begin : row_begin + rows, :]ᵀ (+ bias[rows]) with the
// arithmetic above, on up to num_threads OpenMP threads (split over w's rows).
void Linear(const float* x, int32_t n, const CpuWeight& w, int64_t row_begin, int64_t rows,
            const float* bias, float* y, int num_threads, Isa isa, Activations activations,
            LinearScratch& scratch);

}  // namespace ridgeserve::cpu

#endif  // RIDGESERVE_KERNELS_CPU_LINEAR_H_
