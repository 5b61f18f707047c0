// Benchmarks of the CPU backend at the default model's shapes (SmolLM2-135M: hidden 576,
// 9 q heads / 3 kv heads of 64, FFN 1536, vocab 49152), with the machine's peak for scale.
//
//   build-kern/bin/bench_kernels --benchmark_counters_tabular=true
//
// Counters: FLOPS is useful floating-point operations per second (an FMA counts 2);
// GHz (BM_Clock) is the core clock measured with a chain of dependent integer adds, which
// retire one per cycle.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/simd.h"
#include "kernels/dtype.h"
#include "tests/kernels/kernel_test_util.h"

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::RandomFloats;
namespace simd = cpu::simd;

constexpr int kThreads = 2;

// Core clock: 1000 dependent 1-cycle adds per iteration.
void BM_Clock(benchmark::State& state) {
  constexpr int kAdds = 1000;
  uint64_t x = 0;
  for (auto _ : state) {
    for (int i = 0; i < kAdds / 10; ++i) {
      asm volatile(
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
          : "+r"(x));
    }
  }
  benchmark::DoNotOptimize(x);
  state.counters["GHz"] =
      benchmark::Counter(double(kAdds) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Clock);

// Peak FMA throughput with the build's vector width: 12 independent accumulators (more than
// FMA latency x ports), on state.range(0) threads.
void BM_PeakFma(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  constexpr int kAcc = 12;
  constexpr int kSteps = 4096;
  double sink = 0.0;
  for (auto _ : state) {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      simd::VecF acc[kAcc];
      for (int a = 0; a < kAcc; ++a) acc[a] = simd::Set1(float(a + omp_get_thread_num()));
      simd::VecF b = simd::Set1(0.999999f), c = simd::Set1(1e-7f);
      benchmark::DoNotOptimize(b);
      benchmark::DoNotOptimize(c);
      for (int s = 0; s < kSteps; ++s) {
        for (int a = 0; a < kAcc; ++a) acc[a] = simd::Fma(acc[a], b, c);
      }
      for (int a = 0; a < kAcc; ++a) sink += simd::ReduceAdd(acc[a]);
    }
  }
  benchmark::DoNotOptimize(sink);
  const double flops = 2.0 * simd::kLanes * kAcc * kSteps * threads;
  state.counters["FLOPS"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["lanes"] = simd::kLanes;
}
BENCHMARK(BM_PeakFma)->Arg(1)->Arg(2)->UseRealTime();

// Read bandwidth from memory: each of state.range(0) threads sums its half of a 512 MiB buffer
// (16x the largest L3 seen here), so decode's weight streaming has a bound to compare with:
// bytes read per token / this rate.
void BM_MemoryRead(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  constexpr size_t kBytes = size_t{512} << 20;
  std::vector<int32_t> buffer(kBytes / sizeof(int32_t), 1);
  int64_t sink = 0;
  for (auto _ : state) {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      const size_t n = buffer.size() / 8, t = omp_get_thread_num();  // in 32-byte vectors
      const __m256i* v = reinterpret_cast<const __m256i*>(buffer.data());
      __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                        _mm256_setzero_si256()};
      for (size_t i = n * t / threads; i + 4 <= n * (t + 1) / threads; i += 4) {
        for (int a = 0; a < 4; ++a)
          acc[a] = _mm256_add_epi32(acc[a], _mm256_loadu_si256(v + i + a));
      }
      const __m256i total =
          _mm256_add_epi32(_mm256_add_epi32(acc[0], acc[1]), _mm256_add_epi32(acc[2], acc[3]));
      sink += _mm256_extract_epi32(total, 0);
    }
  }
  benchmark::DoNotOptimize(sink);
  state.counters["bytes_per_s"] =
      benchmark::Counter(double(kBytes), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MemoryRead)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

// A packed [m, k] weight of `type` (F32, Q8_0 or Q4_1) with random values of weight scale.
Weight RandomWeight(Backend& backend, DType type, int64_t m, int64_t k, uint32_t seed) {
  const size_t row_bytes = *StorageBytes(type, k);
  std::vector<uint8_t> bytes(row_bytes * m);
  std::mt19937 rng(seed);
  if (type == DType::kF32) {
    const std::vector<float> w = RandomFloats(size_t(m) * k, seed, -0.05f, 0.05f);
    std::memcpy(bytes.data(), w.data(), bytes.size());
  } else {
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    const size_t block = type == DType::kQ8_0 ? 34 : 20;
    const uint16_t d = 0x1C00, neg_m = 0xA400;  // f16 2^-8 and -2^-6
    for (size_t b = 0; b < bytes.size(); b += block) {
      std::memcpy(&bytes[b], &d, 2);
      if (type == DType::kQ4_1) std::memcpy(&bytes[b + 2], &neg_m, 2);
    }
  }
  const HostTensor view{bytes.data(), type, m, k, row_bytes};
  return *backend.PackWeight({&view, 1});
}

// y[n, m] = x[n, k] · w[m, k]ᵀ for w stored as F32 (0), Q8_0 (8) or Q4_1 (3), with f32 (int8 = 0)
// or int8 activations (int8 = 1), on the path RIDGESERVE_CPU_ISA names (default: the best this
// CPU has).
void BM_Linear(benchmark::State& state) {
  const int32_t n = state.range(0), k = state.range(1), m = state.range(2);
  const DType type = static_cast<DType>(state.range(3));
  const cpu::Activations activations =
      state.range(4) != 0 ? cpu::Activations::kInt8 : cpu::Activations::kF32;
  auto backend = *CreateCpuBackendFromEnvironment(kThreads, activations);
  const std::vector<float> x = RandomFloats(size_t(n) * k, 1);
  const Weight w = RandomWeight(*backend, type, m, k, 2);
  std::vector<float> y(size_t(n) * m);
  for (auto _ : state) {
    backend->Linear(x.data(), n, w, nullptr, y.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * n * k * m, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_bytes_per_s"] =
      benchmark::Counter(w.bytes(), benchmark::Counter::kIsIterationInvariantRate);
}
// Prefill shapes of the default model, then decode rows (one row: weight bandwidth bound; 16:
// a batch).
void LinearArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "k", "m", "type", "int8"});
  for (int type : {0, 8, 3}) {
    for (int int8 : {0, 1}) {
      if (type == 0 && int8 == 1) continue;   // F32 weights have no int8 path
      b->Args({512, 576, 960, type, int8});   // fused q, k, v
      b->Args({512, 576, 576, type, int8});   // o projection
      b->Args({512, 576, 3072, type, int8});  // fused gate and up
      b->Args({512, 1536, 576, type, int8});  // down
      b->Args({1, 576, 3072, type, int8});    // decode gate and up
      b->Args({1, 1536, 576, type, int8});    // decode down
      b->Args({1, 576, 49152, type, int8});   // LM head for one decode row
      b->Args({16, 576, 3072, type, int8});   // gate and up for 16 decode rows
    }
  }
}
BENCHMARK(BM_Linear)->Apply(LinearArgs)->UseRealTime();

// The CUDA backend's host work to store a quantized weight as bf16, per 8 MiB staging chunk
// (kPackChunkBytes) of Llama-3.1-8B rows: [1024, 4096] of `type` (F16 1, Q8_0 8, Q4_K 12) by
// DequantizeRowsToBf16 on `threads` threads; threads 0 is what it did before: f32 rows by
// DequantizeRow on one thread (and twice the bytes to upload). values_per_s x 2 bytes is the
// rate the chunks could feed the upload.
void BM_WeightToBf16(benchmark::State& state) {
  const DType type = static_cast<DType>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const int64_t rows = 1024, cols = 4096;
  const size_t row_bytes = *StorageBytes(type, cols);
  std::vector<uint8_t> bytes(row_bytes * rows);
  std::mt19937 rng(5);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng() & 0x3B);  // finite f16 fields
  std::vector<uint16_t> bf16(size_t(rows) * cols);
  std::vector<float> f32(size_t(rows) * cols);
  for (auto _ : state) {
    if (threads == 0) {
      for (int64_t r = 0; r < rows; ++r) {
        benchmark::DoNotOptimize(
            DequantizeRow(type, bytes.data() + r * row_bytes, cols, f32.data() + r * cols));
      }
    } else {
      benchmark::DoNotOptimize(
          DequantizeRowsToBf16(type, bytes.data(), row_bytes, rows, cols, bf16.data(), threads));
    }
    benchmark::ClobberMemory();
  }
  state.counters["values_per_s"] =
      benchmark::Counter(double(rows) * cols, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_WeightToBf16)
    ->ArgNames({"type", "threads"})
    ->ArgsProduct({{1, 8, 12}, {0, 1, kThreads}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// `rows` decode rows (1: one stream, 16: a batch of 16) through 120 distinct [3072, 576]
// weights of `type` (133 MB of Q4_1, more than the model's 112 MB and than the L3 seen here),
// one after another, so the weights come from memory as in a decode step, with f32 or int8
// (`act` 0 / 1) activations; weight_bytes_per_s against BM_MemoryRead/2 says how close
// decode's Linear gets to the bandwidth bound.
void BM_LinearFromMemory(benchmark::State& state) {
  const DType type = static_cast<DType>(state.range(0));
  const int32_t n = static_cast<int32_t>(state.range(1));
  const auto activations = state.range(2) == 0 ? cpu::Activations::kF32 : cpu::Activations::kInt8;
  constexpr int kWeights = 120;
  constexpr int32_t k = 576, m = 3072;
  auto backend = *CreateCpuBackendFromEnvironment(kThreads, activations);
  const std::vector<float> x = RandomFloats(size_t(n) * k, 1);
  std::vector<Weight> weights;
  size_t bytes = 0;
  for (int i = 0; i < kWeights; ++i) {
    weights.push_back(RandomWeight(*backend, type, m, k, 2 + i));
    bytes += weights.back().bytes();
  }
  std::vector<float> y(size_t(n) * m);
  for (auto _ : state) {
    for (const Weight& w : weights) backend->Linear(x.data(), n, w, nullptr, y.data());
    benchmark::ClobberMemory();
  }
  state.counters["weight_bytes_per_s"] =
      benchmark::Counter(double(bytes), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LinearFromMemory)
    ->ArgNames({"type", "rows", "act"})
    ->ArgsProduct({{8, 3}, {1, 16}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// One layer's K/V (as `dtype`) for `num_seqs` sequences of `context` tokens in a cache of
// 16-token blocks handed out in shuffled order, and query rows for the last `rows_per_seq`
// positions of each.
struct AttentionSetup {
  static constexpr int32_t kHeads = 9, kKvHeads = 3, kHeadDim = 64, kBlock = 16;

  AttentionSetup(int32_t num_seqs, int32_t context, int32_t rows_per_seq, DType dtype) {
    const int32_t kv_width = kKvHeads * kHeadDim;
    max_blocks = (context + kBlock - 1) / kBlock;
    const int32_t num_blocks = max_blocks * num_seqs;
    const size_t elements = size_t(num_blocks) * kBlock * kv_width;
    for (auto [cache, seed] : {std::pair{&k, 3u}, std::pair{&v, 4u}}) {
      cache->resize(elements * ElementBytes(dtype));
      ConvertFromFloat(RandomFloats(elements, seed).data(), elements, dtype, cache->data());
    }
    view = {k.data(), v.data(), dtype, num_blocks, kBlock, kKvHeads, kHeadDim};
    tables.resize(num_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), std::mt19937(5));
    for (int32_t s = 0; s < num_seqs; ++s) {
      for (int32_t p = context - rows_per_seq; p < context; ++p) {
        positions.push_back(p);
        seqs.push_back(s);
        flops += 4.0 * kHeads * kHeadDim * (p + 1);  // q·k and p·v, 2 FLOPs per FMA
      }
    }
    const int32_t n = static_cast<int32_t>(positions.size());
    q = RandomFloats(size_t(n) * kHeads * kHeadDim, 6);
    out.resize(q.size());
    for (int32_t s = 0; s <= num_seqs; ++s) offsets.push_back(s * max_blocks);
    rows = {n, positions.data(), seqs.data(), offsets.data(), tables.data()};
  }
  void Run(Backend& backend) {
    backend.Attention(q.data(), kHeads * kHeadDim, kHeads, view, rows, 0.125f, out.data());
  }

  std::vector<uint8_t> k, v;
  std::vector<float> q, out;
  std::vector<int32_t> tables, offsets, positions, seqs;
  int32_t max_blocks;
  KvLayerView view;
  AttentionRows rows;
  double flops = 0.0;
};

// Prefill of state.range(0) rows over a context of the same length: the O(n^2) part, with the
// cache's DType id state.range(2) (0 F32, 1 F16, 30 BF16).
void BM_AttentionPrefill(benchmark::State& state) {
  auto backend = CreateCpuBackend(static_cast<int>(state.range(1)));
  const int32_t n = static_cast<int32_t>(state.range(0));
  AttentionSetup setup(1, n, n, static_cast<DType>(state.range(2)));
  for (auto _ : state) setup.Run(*backend);
  state.counters["FLOPS"] =
      benchmark::Counter(setup.flops, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionPrefill)
    ->ArgNames({"rows", "threads", "kv"})
    ->ArgsProduct({{2048}, {2, 1}, {0, 1, 30}})
    ->Args({512, 2, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Decode: one row for each of state.range(0) sequences at context state.range(1), cache DType
// id state.range(2).
void BM_AttentionDecode(benchmark::State& state) {
  auto backend = CreateCpuBackend(kThreads);
  AttentionSetup setup(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)),
                       1, static_cast<DType>(state.range(2)));
  for (auto _ : state) setup.Run(*backend);
  state.counters["FLOPS"] =
      benchmark::Counter(setup.flops, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionDecode)
    ->ArgNames({"seqs", "context", "kv"})
    ->ArgsProduct({{1, 16}, {192, 2048}, {0, 1, 30}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Decode as a step of the model runs it: one row for each of 16 sequences at context 512 in
// each of 30 layers' f16 caches (189 MB, more than the L3 seen here), one layer after another,
// so K and V come from memory; kv_bytes_per_s against BM_MemoryRead/2.
void BM_AttentionDecodeFromMemory(benchmark::State& state) {
  constexpr int kLayers = 30;
  auto backend = CreateCpuBackend(kThreads);
  std::vector<std::unique_ptr<AttentionSetup>> layers;
  double bytes = 0.0;
  for (int i = 0; i < kLayers; ++i) {
    layers.push_back(std::make_unique<AttentionSetup>(16, 512, 1, DType::kF16));
    bytes += double(layers.back()->k.size() + layers.back()->v.size());
  }
  for (auto _ : state) {
    for (auto& layer : layers) layer->Run(*backend);
    benchmark::ClobberMemory();
  }
  state.counters["kv_bytes_per_s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionDecodeFromMemory)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_RmsNorm(benchmark::State& state) {
  auto backend = CreateCpuBackend(kThreads);
  const int32_t n = 512, dim = 576;
  const std::vector<float> x = RandomFloats(size_t(n) * dim, 7), w = RandomFloats(dim, 8);
  std::vector<float> y(x.size());
  for (auto _ : state) backend->RmsNorm(x.data(), w.data(), n, dim, 1e-5f, y.data());
}
BENCHMARK(BM_RmsNorm)->UseRealTime();

void BM_Rope(benchmark::State& state) {
  auto backend = CreateCpuBackend(kThreads);
  const int32_t n = 512, heads = 9, head_dim = 64;
  std::vector<float> x = RandomFloats(size_t(n) * heads * head_dim, 9);
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 1000);
  std::vector<float> inv_freq(head_dim / 2);
  for (int32_t j = 0; j < head_dim / 2; ++j) inv_freq[j] = std::pow(1e5f, -2.0f * j / head_dim);
  for (auto _ : state) {
    backend->Rope(x.data(), heads * head_dim, n, heads, head_dim, positions.data(),
                  inv_freq.data());
  }
}
BENCHMARK(BM_Rope)->UseRealTime();

void BM_SwiGlu(benchmark::State& state) {
  auto backend = CreateCpuBackend(kThreads);
  const int32_t n = 512, ff = 1536;
  const std::vector<float> x = RandomFloats(size_t(n) * 2 * ff, 10, -6.0f, 6.0f);
  std::vector<float> y(size_t(n) * ff);
  for (auto _ : state) backend->SwiGlu(x.data(), n, ff, y.data());
}
BENCHMARK(BM_SwiGlu)->UseRealTime();

// One decoder layer of a 512-row prefill chunk at positions [context - 512, context), in the
// order the engine runs it, with Q4_1 projections as in the default model and a KV cache of
// DType id state.range(1).
void BM_PrefillLayer(benchmark::State& state) {
  constexpr int32_t n = 512, dim = 576, ff = 1536, heads = 9, kv_heads = 3, hd = 64;
  constexpr int32_t qkv = (heads + 2 * kv_heads) * hd;
  const int32_t context = static_cast<int32_t>(state.range(0));
  auto backend = *CreateCpuBackendFromEnvironment(kThreads);
  AttentionSetup setup(1, context, n, static_cast<DType>(state.range(1)));
  const Weight w_qkv = RandomWeight(*backend, DType::kQ4_1, qkv, dim, 11);
  const Weight w_o = RandomWeight(*backend, DType::kQ4_1, dim, dim, 12);
  const Weight w_gu = RandomWeight(*backend, DType::kQ4_1, 2 * ff, dim, 13);
  const Weight w_down = RandomWeight(*backend, DType::kQ4_1, dim, ff, 14);
  const std::vector<float> norm_w = RandomFloats(dim, 15, 0.5f, 1.5f);
  std::vector<float> inv_freq(hd / 2);
  for (int32_t j = 0; j < hd / 2; ++j) inv_freq[j] = std::pow(1e5f, -2.0f * j / hd);
  std::vector<float> h = RandomFloats(size_t(n) * dim, 16), x(size_t(n) * dim);
  std::vector<float> qkv_buf(size_t(n) * qkv), attn(size_t(n) * dim), proj(size_t(n) * dim);
  std::vector<float> gu(size_t(n) * 2 * ff), act(size_t(n) * ff);
  std::vector<int32_t> slots(n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = setup.positions[i];
    slots[i] = setup.tables[p / AttentionSetup::kBlock] * AttentionSetup::kBlock +
               p % AttentionSetup::kBlock;
  }
  double flops = setup.flops + 2.0 * n * dim * (qkv + dim + 3 * ff);
  for (auto _ : state) {
    backend->RmsNorm(h.data(), norm_w.data(), n, dim, 1e-5f, x.data());
    backend->Linear(x.data(), n, w_qkv, nullptr, qkv_buf.data());
    backend->Rope(qkv_buf.data(), qkv, n, heads, hd, setup.positions.data(), inv_freq.data());
    backend->Rope(qkv_buf.data() + heads * hd, qkv, n, kv_heads, hd, setup.positions.data(),
                  inv_freq.data());
    backend->StoreKv(setup.view, qkv_buf.data() + heads * hd,
                     qkv_buf.data() + (heads + kv_heads) * hd, qkv, n, slots.data());
    backend->Attention(qkv_buf.data(), qkv, heads, setup.view, setup.rows, 0.125f, attn.data());
    backend->Linear(attn.data(), n, w_o, nullptr, proj.data());
    backend->Add(h.data(), proj.data(), proj.size());
    backend->RmsNorm(h.data(), norm_w.data(), n, dim, 1e-5f, x.data());
    backend->Linear(x.data(), n, w_gu, nullptr, gu.data());
    backend->SwiGlu(gu.data(), n, ff, act.data());
    backend->Linear(act.data(), n, w_down, nullptr, proj.data());
    backend->Add(h.data(), proj.data(), proj.size());
    // Keep the residual stream bounded across iterations.
    backend->RmsNorm(h.data(), norm_w.data(), n, dim, 1e-5f, h.data());
  }
  state.counters["FLOPS"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PrefillLayer)
    ->ArgNames({"context", "kv"})
    ->ArgsProduct({{512, 2048, 8192}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ridgeserve

BENCHMARK_MAIN();
