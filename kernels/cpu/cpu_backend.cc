// The CPU backend: our own kernels (Linear in linear.h, attention in attention.h, row-wise ops
// in row_ops.h), all threaded by one OpenMP pool.
#include "kernels/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_scores.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/row_ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/sample.h"

namespace ridgeserve {
namespace {

// StoreKv's conversion to the cache's type: ConvertFromFloat's rounding, vectorized.
void Narrow(const float* src, int64_t n, DType dtype, uint8_t* dst) {
  switch (dtype) {
    case DType::kF16:
      return cpu::simd::NarrowF16(src, n, dst);
    case DType::kBF16:
      return cpu::simd::NarrowBF16(src, n, dst);
    default:
      std::memcpy(dst, src, sizeof(float) * n);
  }
}

constexpr size_t kAlignment = 64;

// dst[i, :] = src[index[i], :] for rows of `dim` floats.
void CopyRows(const float* src, int32_t dim, const int32_t* index, int32_t n, float* dst) {
  const size_t row_bytes = size_t(dim) * sizeof(float);
  for (int32_t i = 0; i < n; ++i) {
    std::memcpy(dst + int64_t{i} * dim, src + int64_t{index[i]} * dim, row_bytes);
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, cpu::Isa isa, cpu::Activations activations)
      : num_threads_(num_threads), isa_(isa), activations_(activations) {}

  std::string_view name() const override { return "cpu"; }
  // Half the bytes of F32 at a perplexity change below 0.01% on the default model, and faster
  // batched decode at long contexts (README, "KV cache dtype").
  DType DefaultKvCacheDType() const override { return DType::kF16; }

  absl::StatusOr<DeviceBuffer> Alloc(size_t bytes) override {
    if (bytes == 0) return DeviceBuffer();
    if (bytes > SIZE_MAX - kAlignment) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* data = std::aligned_alloc(kAlignment, rounded);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
    }
    return DeviceBuffer(this, data, bytes);
  }
  void FreeRaw(void* data) override { std::free(data); }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void Synchronize() override {}

  absl::StatusOr<Weight> PackWeight(std::span<const HostTensor> parts) override {
    return cpu::CpuWeight::Pack(parts,
                                activations_ == cpu::Activations::kInt8 && isa_ >= cpu::Isa::kAvx2);
  }

  absl::Status UnpackWeight(const Weight& w, int64_t row_begin, int64_t rows,
                            float* host) override {
    if (row_begin < 0 || rows < 0 || row_begin + rows > w.rows()) {
      return absl::OutOfRangeError(absl::StrCat("UnpackWeight: rows [", row_begin, ", ",
                                                row_begin + rows, ") of ", w.rows()));
    }
    cpu::DequantizeRows(Packed(w), row_begin, rows, host, w.cols(), isa_);
    return absl::OkStatus();
  }

  void Embed(const Weight& table, int64_t id_begin, const int32_t* ids, int32_t n,
             float* out) override {
    const cpu::CpuWeight& packed = Packed(table);
    for (int32_t i = 0; i < n; ++i) {
      float* row = out + int64_t{i} * table.cols();
      const int64_t r = ids[i] - id_begin;
      if (r >= 0 && r < table.rows()) {
        cpu::DequantizeRows(packed, r, 1, row, table.cols(), isa_);
      } else {
        std::fill(row, row + table.cols(), 0.0f);
      }
    }
  }

  void RmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps,
               void* out) override {
    cpu::RmsNorm(x, w, n, dim, eps, static_cast<float*>(out), num_threads_);
  }

  void RmsNormHeads(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                    const float* w, float eps) override {
    cpu::RmsNormHeads(x, ld, n, num_heads, head_dim, w, eps, num_threads_);
  }

  void LinearRows(LinearInput x, int32_t n, const Weight& w, int64_t row_begin, int64_t rows,
                  const float* bias, float* y) override {
    assert(row_begin >= 0 && row_begin + rows <= w.rows());
    assert(x.dtype == DType::kF32);  // the CPU's activations are f32
    cpu::Linear(static_cast<const float*>(x.data), n, Packed(w), row_begin, rows, bias, y,
                num_threads_, isa_, activations_, linear_scratch_);
  }

  void Rope(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
            const int32_t* positions, const float* inv_freq) override {
    cpu::Rope(x, ld, n, num_heads, head_dim, positions, inv_freq, num_threads_);
  }

  void StoreKv(const KvLayerView& cache, const float* k, const float* v, int32_t ld, int32_t n,
               const int32_t* slots) override {
    const int64_t width = int64_t{cache.num_kv_heads} * cache.head_dim;
    const int64_t capacity = int64_t{cache.num_blocks} * cache.block_size;
    for (int32_t i = 0; i < n; ++i) {
      if (slots[i] < 0) continue;  // a padding row
      assert(slots[i] < capacity);
      (void)capacity;
      const size_t offset = ElementBytes(cache.dtype) * slots[i] * width;
      Narrow(k + int64_t{i} * ld, width, cache.dtype, cache.k + offset);
      Narrow(v + int64_t{i} * ld, width, cache.dtype, cache.v + offset);
    }
  }

  void Attention(const float* q, int32_t ld, int32_t num_heads, const KvLayerView& cache,
                 const AttentionRows& rows, float scale, void* out) override {
    cpu::PagedAttention(q, ld, num_heads, cache, rows, scale, static_cast<float*>(out),
                        num_threads_);
  }

  void SwiGlu(const float* gate_up, int32_t n, int32_t ff, void* out) override {
    cpu::SwiGlu(gate_up, n, ff, static_cast<float*>(out), num_threads_);
  }

  void Add(float* x, const float* y, size_t count) override { cpu::Add(x, y, count, num_threads_); }

  void GatherRows(const float* src, int32_t dim, const int32_t* index, int32_t n,
                  float* dst) override {
    CopyRows(src, dim, index, n, dst);
  }

  void ShiftedRowDots(const float* a, const float* shift, const float* b, int32_t n, int32_t dim,
                      double* out) override {
    for (int32_t i = 0; i < n; ++i) {
      const float* ai = a + int64_t{i} * dim;
      const float* bi = b + int64_t{i} * dim;
      double sum = 0.0;
      for (int32_t j = 0; j < dim; ++j) {
        sum += (static_cast<double>(ai[j]) - shift[j]) * bi[j];
      }
      out[i] = sum;
    }
  }

  void ShiftRows(const float* a, const float* shift, int32_t n, int32_t dim, float* out) override {
    for (int64_t i = 0; i < n; ++i) {
      for (int32_t j = 0; j < dim; ++j) out[i * dim + j] = a[i * dim + j] - shift[j];
    }
  }

  void CopyColumns(const float* src, int64_t src_ld, int32_t rows, int32_t cols, float* dst,
                   int64_t dst_ld) override {
    for (int32_t i = 0; i < rows; ++i) {
      std::memcpy(dst + i * dst_ld, src + i * src_ld, sizeof(float) * cols);
    }
  }

  void AttentionScores(const KvLayerView& cache, std::span<const int32_t> blocks, const float* q,
                       int32_t num_heads, std::span<const int32_t> positions,
                       std::span<const float> weights, float scale, int32_t count,
                       float* scores) override {
    cpu::AttentionScores(cache, blocks, q, num_heads, positions, weights, scale, count, scores,
                         num_threads_);
  }

  void CompactKv(const KvLayerView& cache, std::span<const int32_t> blocks,
                 std::span<const int32_t> from, int32_t n) override {
    const size_t head_bytes = ElementBytes(cache.dtype) * cache.head_dim;
    const size_t slot_bytes = head_bytes * cache.num_kv_heads;
    const auto at = [&](uint8_t* base, int32_t place, int32_t g) {
      return base + PagedSlot(blocks, cache.block_size, place) * slot_bytes + g * head_bytes;
    };
    std::vector<uint8_t> moved(head_bytes * cache.num_kv_heads * n);
    for (uint8_t* base : {cache.k, cache.v}) {
      for (int32_t g = 0; g < cache.num_kv_heads; ++g) {
        for (int32_t i = 0; i < n; ++i) {
          std::memcpy(&moved[(static_cast<size_t>(g) * n + i) * head_bytes],
                      at(base, from[g * n + i], g), head_bytes);
        }
      }
      for (int32_t g = 0; g < cache.num_kv_heads; ++g) {
        for (int32_t i = 0; i < n; ++i) {
          std::memcpy(at(base, i, g), &moved[(static_cast<size_t>(g) * n + i) * head_bytes],
                      head_bytes);
        }
      }
    }
  }

  // Rows that draw at a temperature or compute log-probabilities run exp over the vocabulary:
  // those are spread over the threads. Greedy rows (one argmax pass each) run on the calling
  // thread: on the threads they made a batch-64 step 0.4-0.6 ms slower (README).
  void Sample(float* logits, int32_t vocab, std::span<const SampleSpec> specs,
              std::span<const int32_t> penalty_ids, SampledToken* out) override {
    if (samplers_.empty()) samplers_.resize(num_threads_);
    const auto draw = [&](size_t i, RowSampler& sampler) {
      const SampleSpec& spec = specs[i];
      out[i] = sampler.Sample(
          std::span<float>(logits + int64_t{spec.row} * vocab, vocab), spec,
          penalty_ids.subspan(spec.penalty_begin, spec.penalty_end - spec.penalty_begin));
    };
    std::vector<size_t> costly;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].temperature != 0.0f || specs[i].logprob != 0) {
        costly.push_back(i);
      } else {
        draw(i, samplers_[0]);
      }
    }
    const int64_t num_costly = static_cast<int64_t>(costly.size());
    if (num_costly > 1 && num_threads_ > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_)
      for (int64_t j = 0; j < num_costly; ++j) draw(costly[j], samplers_[omp_get_thread_num()]);
    } else {
      for (size_t i : costly) draw(i, samplers_[0]);
    }
  }

 private:
  // Weights reach this backend only from its own PackWeight.
  static const cpu::CpuWeight& Packed(const Weight& w) {
    assert(dynamic_cast<const cpu::CpuWeight*>(w.storage()) != nullptr);
    return *static_cast<const cpu::CpuWeight*>(w.storage());
  }

  const int num_threads_;
  const cpu::Isa isa_;
  const cpu::Activations activations_;
  cpu::LinearScratch linear_scratch_;
  std::vector<RowSampler> samplers_;  // Sample's, one per thread
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(int num_threads, cpu::Isa isa,
                                          cpu::Activations activations) {
  if (num_threads <= 0) num_threads = omp_get_num_procs();
  return std::make_unique<CpuBackend>(num_threads, isa, activations);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackendFromEnvironment(
    int num_threads, cpu::Activations activations) {
  absl::StatusOr<cpu::Isa> isa = cpu::IsaFromEnvironment();
  if (!isa.ok()) return isa.status();
  return CreateCpuBackend(num_threads, *isa, activations);
}

}  // namespace ridgeserve
