#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sample.h"
#include "kernels/philox.h"

namespace ridgeserve::cuda {
namespace {

constexpr int kThreads = 256;

// The row's logits after the repetition penalty, for the ids marked in `bits`.
struct PenalizedRow {
  const float* x;
  const uint32_t* bits;
  float penalty;
  __device__ float operator()(int32_t i) const {
    const float v = x[i];
    if (((bits[i >> 5] >> (i & 31)) & 1u) == 0) return v;
    return v > 0.0f ? v / penalty : v * penalty;
  }
};

// Marks the spec's penalty ids in `bits` (shared memory, a bit per id). Every thread calls it.
__device__ PenalizedRow Penalize(const float* x, const SampleSpec& spec, const int32_t* ids,
                                 int32_t vocab, uint32_t* bits) {
  const int32_t words = (vocab + 31) / 32;
  for (int32_t w = threadIdx.x; w < words; w += kThreads) bits[w] = 0;
  __syncthreads();
  if (spec.repetition_penalty != 1.0f) {
    for (int32_t j = spec.penalty_begin + threadIdx.x; j < spec.penalty_end; j += kThreads) {
      const int32_t id = ids[j];
      if (id >= 0 && id < vocab) atomicOr(&bits[id >> 5], 1u << (id & 31));
    }
  }
  __syncthreads();
  return {x, bits, spec.repetition_penalty};
}

// A logit's bits as an unsigned integer in the logits' order (NaN as -inf, -0 as +0).
__device__ uint32_t OrderedBits(float f) {
  if (isnan(f)) f = -INFINITY;
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
__device__ float KeyLogit(uint64_t key) {
  const uint32_t u = static_cast<uint32_t>(key >> 32);
  return __uint_as_float((u & 0x80000000u) != 0 ? (u & 0x7FFFFFFFu) : ~u);
}
__device__ int32_t KeyId(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

struct ArgmaxPair {
  float value;
  int32_t index;  // -1: none yet
};
struct BetterOp {
  __device__ ArgmaxPair operator()(const ArgmaxPair& a, const ArgmaxPair& b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    return b.value > a.value || (b.value == a.value && b.index < a.index) ? b : a;
  }
};
struct MinOp {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return b < a ? b : a; }
};
struct MaxIntOp {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return b > a ? b : a; }
};
struct MaxFloatOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

using ReducePair = cub::BlockReduce<ArgmaxPair, kThreads>;
using ReduceDouble = cub::BlockReduce<double, kThreads>;
using ReduceFloat = cub::BlockReduce<float, kThreads>;
using ReduceInt = cub::BlockReduce<int32_t, kThreads>;
using ScanDouble = cub::BlockScan<double, kThreads>;
union TempStorage {
  ReducePair::TempStorage pair;
  ReduceDouble::TempStorage dbl;
  ReduceFloat::TempStorage flt;
  ReduceInt::TempStorage integer;
  ScanDouble::TempStorage scan;
};

// A block-wide result every thread reads. Each helper below starts with a barrier (the shared
// storage is reused) and ends with one (the result is published).
template <typename T>
__device__ T Broadcast(T value, T* slot) {
  if (threadIdx.x == 0) *slot = value;
  __syncthreads();
  return *slot;
}

// Argmax's definition (kernels/sample.h): the first index of the largest value, NaN never, 0
// when no value is above -inf.
template <typename Row>
__device__ int32_t BlockArgmax(const Row& row, int32_t n, TempStorage& temp) {
  __shared__ int32_t result;
  ArgmaxPair best{-INFINITY, -1};
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = row(i);
    if (v > best.value) best = {v, i};
  }
  __syncthreads();
  const ArgmaxPair r = ReducePair(temp.pair).Reduce(best, BetterOp());
  return Broadcast(r.index < 0 ? 0 : r.index, &result);
}

// Thread t's chunk of [0, n): contiguous, in order.
__device__ void Chunk(int32_t n, int32_t& begin, int32_t& end) {
  const int32_t size = (n + kThreads - 1) / kThreads;
  begin = min(n, static_cast<int32_t>(threadIdx.x) * size);
  end = min(n, begin + size);
}

// The weights' total over [0, n) (to every thread) and the sum before this thread's chunk.
template <typename Weight>
__device__ double ChunkPrefix(const Weight& weight, int32_t n, TempStorage& temp, double& total) {
  int32_t begin, end;
  Chunk(n, begin, end);
  double local = 0.0;
  for (int32_t i = begin; i < end; ++i) local += weight(i);
  double exclusive;
  __syncthreads();
  ScanDouble(temp.scan).ExclusiveSum(local, exclusive, total);
  return exclusive;
}

// The first i in [0, n) whose cumulative weight reaches `target` (>= when `inclusive`, else
// > with a positive weight of its own), each thread walking its chunk from `exclusive`; -1
// when none does. A chunk's `exclusive` (the scan's tree) may round above where the chunk
// before it ended (its own walk): without the weight test an id of weight zero at a chunk's
// start could be drawn.
template <typename Weight>
__device__ int32_t FirstPassing(const Weight& weight, int32_t n, double exclusive, double target,
                                bool inclusive, TempStorage& temp) {
  __shared__ int32_t result;
  int32_t begin, end;
  Chunk(n, begin, end);
  int32_t found = INT_MAX;
  double cumulative = exclusive;
  for (int32_t i = begin; i < end; ++i) {
    const double w = weight(i);
    cumulative += w;
    if (inclusive ? cumulative >= target : w > 0.0 && target < cumulative) {
      found = i;
      break;
    }
  }
  __syncthreads();
  const int32_t first = ReduceInt(temp.integer).Reduce(found, MinOp());
  return Broadcast(first == INT_MAX ? -1 : first, &result);
}

// The last i in [0, n) with a positive weight, -1 when none.
template <typename Weight>
__device__ int32_t LastPositive(const Weight& weight, int32_t n, TempStorage& temp) {
  __shared__ int32_t result;
  int32_t last = -1;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    if (weight(i) > 0.0) last = i;
  }
  __syncthreads();
  return Broadcast(ReduceInt(temp.integer).Reduce(last, MaxIntOp()), &result);
}

// The inverse CDF at u over weights [0, n) (kernels/sample.h: the first whose cumulative
// weight exceeds u * total, else the last with any weight, else 0).
template <typename Weight>
__device__ int32_t InverseCdf(const Weight& weight, int32_t n, double u, TempStorage& temp) {
  double total;
  const double exclusive = ChunkPrefix(weight, n, temp, total);
  int32_t i = FirstPassing(weight, n, exclusive, u * total, /*inclusive=*/false, temp);
  if (i < 0) i = LastPositive(weight, n, temp);
  return i < 0 ? 0 : i;
}

// log_softmax(x)[token] in double, as LogSoftmaxAt.
__device__ float LogSoftmaxAt(const float* x, int32_t n, int32_t token, TempStorage& temp) {
  __shared__ float max_slot;
  __shared__ double sum_slot;
  float local_max = -INFINITY;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) local_max = fmaxf(local_max, x[i]);
  __syncthreads();
  const double max = Broadcast(ReduceFloat(temp.flt).Reduce(local_max, MaxFloatOp()), &max_slot);
  double local_sum = 0.0;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) local_sum += exp(double(x[i]) - max);
  __syncthreads();
  const double sum = Broadcast(ReduceDouble(temp.dbl).Sum(local_sum), &sum_slot);
  return static_cast<float>(double(x[token]) - (max + log(sum)));
}

__global__ void __launch_bounds__(kThreads) SortKeysKernel(SampleArgs a) {
  extern __shared__ uint32_t bits[];
  const int32_t slot = blockIdx.x;
  const SampleSpec spec = a.specs[a.slot_spec[slot]];
  const PenalizedRow row =
      Penalize(a.logits + int64_t{spec.row} * a.vocab, spec, a.penalty_ids, a.vocab, bits);
  uint64_t* keys = a.keys[0] + a.slot_offsets[slot];
  for (int32_t i = threadIdx.x; i < a.vocab; i += kThreads) {
    keys[i] = (uint64_t{OrderedBits(row(i))} << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
  }
}

// `sorted_keys`: the buffer the sort left the keys in.
__global__ void __launch_bounds__(kThreads) DrawKernel(SampleArgs a, const uint64_t* sorted_keys) {
  extern __shared__ uint32_t bits[];
  __shared__ TempStorage temp;
  const int32_t vocab = a.vocab;
  const SampleSpec spec = a.specs[blockIdx.x];
  const float* x = a.logits + int64_t{spec.row} * vocab;
  const int32_t slot = a.sort_slot[blockIdx.x];
  // A row walking in rank order reads its sorted keys, which SortKeysKernel penalized: it
  // needs no bitmap here (and never reads `row`).
  const PenalizedRow row = slot < 0 ? Penalize(x, spec, a.penalty_ids, vocab, bits)
                                    : PenalizedRow{x, bits, spec.repetition_penalty};
  int32_t token;
  if (spec.temperature == 0.0f) {
    token = BlockArgmax(row, vocab, temp);
  } else {
    const double u = DrawUniform(spec.seed, spec.draw);
    const float t = spec.temperature;
    const float min_p = spec.min_p;
    if (slot < 0) {
      // Id order: every id a candidate, weights from the logits.
      const float max = row(BlockArgmax(row, vocab, temp));
      const auto weight = [&](int32_t i) -> double {
        const float w = expf((row(i) - max) / t);
        return min_p > 0.0f && w < min_p ? 0.0 : w;
      };
      token = InverseCdf(weight, vocab, u, temp);
    } else {
      // Rank order: the sorted keys, top-k a prefix, top-p the nucleus within it.
      const uint64_t* keys = sorted_keys + a.slot_offsets[slot];
      const float max = KeyLogit(keys[0]);
      const auto ranked = [&](int32_t r) -> double { return expf((KeyLogit(keys[r]) - max) / t); };
      int32_t kept = spec.top_k > 0 && spec.top_k < vocab ? spec.top_k : vocab;
      if (spec.top_p < 1.0f) {
        double total;
        const double exclusive = ChunkPrefix(ranked, kept, temp, total);
        const int32_t last =
            FirstPassing(ranked, kept, exclusive, spec.top_p * total, /*inclusive=*/true, temp);
        if (last >= 0) kept = last + 1;
      }
      const auto weight = [&](int32_t r) -> double {
        const double w = ranked(r);
        return min_p > 0.0f && w < min_p ? 0.0 : w;
      };
      token = KeyId(keys[InverseCdf(weight, kept, u, temp)]);
    }
  }
  const float logprob = spec.logprob != 0 ? LogSoftmaxAt(x, vocab, token, temp) : 0.0f;
  if (threadIdx.x == 0) a.out[blockIdx.x] = SampledToken{token, logprob};
}

}  // namespace

size_t SampleSortTempBytes(int32_t num_slots, int32_t vocab) {
  if (num_slots == 0) return 0;
  size_t bytes = 0;
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(
      nullptr, bytes, keys, num_slots * vocab, num_slots, static_cast<const int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr)));
  return bytes;
}

absl::StatusOr<size_t> PrepareSampleKernels(int optin_bytes) {
  const void* kernels[] = {reinterpret_cast<const void*>(SortKeysKernel),
                           reinterpret_cast<const void*>(DrawKernel)};
  const size_t optin = static_cast<size_t>(optin_bytes);
  // What every kernel may have beside its own static shared memory.
  size_t own = 0;
  for (const void* kernel : kernels) {
    cudaFuncAttributes attributes;
    CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
    own = std::max(own, attributes.sharedSizeBytes);
  }
  const size_t limit = optin > own ? optin - own : 0;
  for (const void* kernel : kernels) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(limit)));
  }
  return limit;
}

void LaunchSample(const SampleArgs& a, cudaStream_t stream) {
  if (a.num_specs == 0) return;
  const uint64_t* sorted = nullptr;
  if (a.num_slots > 0) {
    SortKeysKernel<<<a.num_slots, kThreads, a.bitmap_bytes, stream>>>(a);
    CUDA_CHECK_LAUNCH(stream);
    size_t bytes = a.sort_temp_bytes;
    cub::DoubleBuffer<uint64_t> keys(a.keys[0], a.keys[1]);
    CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(
        a.sort_temp, bytes, keys, a.num_slots * a.vocab, a.num_slots, a.slot_offsets,
        a.slot_offsets + 1, 0, 64, stream));
    sorted = keys.Current();
  }
  DrawKernel<<<a.num_specs, kThreads, a.bitmap_bytes, stream>>>(a, sorted);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
