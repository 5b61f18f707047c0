// The CPU backend: OpenBLAS sgemm for MatMul, OpenMP + AVX2/AVX-512 kernels for the rest, all
// threaded by one OpenMP pool.
#include "kernels/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/row_ops.h"

namespace ridgeserve {
namespace {

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
  explicit CpuBackend(int num_threads) : num_threads_(num_threads) {}

  std::string_view name() const override { return "cpu"; }

  DeviceBuffer Alloc(size_t bytes) override {
    if (bytes == 0) return DeviceBuffer();
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* data = std::aligned_alloc(kAlignment, rounded);
    if (data == nullptr) return DeviceBuffer();
    return DeviceBuffer(this, data, bytes);
  }
  void FreeRaw(void* data) override { std::free(data); }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void Synchronize() override {}

  void Embed(const float* table, int32_t dim, const int32_t* ids, int32_t n, float* out) override {
    CopyRows(table, dim, ids, n, out);
  }

  void RmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps,
               float* out) override {
    cpu::RmsNorm(x, w, n, dim, eps, out, num_threads_);
  }

  void RmsNormHeads(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                    const float* w, float eps) override {
    cpu::RmsNormHeads(x, ld, n, num_heads, head_dim, w, eps, num_threads_);
  }

  void MatMul(const float* x, int32_t n, int32_t k, const float* w, int32_t m, const float* bias,
              float* y) override {
    cpu::MatMul(x, n, k, w, m, bias, y, num_threads_, matmul_scratch_);
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
      assert(slots[i] >= 0 && slots[i] < capacity);
      (void)capacity;
      std::memcpy(cache.k + slots[i] * width, k + int64_t{i} * ld, width * sizeof(float));
      std::memcpy(cache.v + slots[i] * width, v + int64_t{i} * ld, width * sizeof(float));
    }
  }

  void Attention(const float* q, int32_t ld, int32_t num_heads, const KvLayerView& cache,
                 const AttentionRows& rows, float scale, float* out) override {
    cpu::PagedAttention(q, ld, num_heads, cache, rows, scale, out, num_threads_);
  }

  void SwiGlu(const float* gate_up, int32_t n, int32_t ff, float* out) override {
    cpu::SwiGlu(gate_up, n, ff, out, num_threads_);
  }

  void Add(float* x, const float* y, size_t count) override { cpu::Add(x, y, count, num_threads_); }

  void GatherRows(const float* src, int32_t dim, const int32_t* index, int32_t n,
                  float* dst) override {
    CopyRows(src, dim, index, n, dst);
  }

 private:
  const int num_threads_;
  cpu::MatMulScratch matmul_scratch_;
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(int num_threads) {
  if (num_threads <= 0) num_threads = omp_get_num_procs();
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace ridgeserve
