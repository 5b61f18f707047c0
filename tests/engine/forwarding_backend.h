// ForwardingBackend: a test backend that passes every call on to another; tests derive from it
// and override the calls they count, hold or change.
#ifndef RIDGESERVE_TESTS_ENGINE_FORWARDING_BACKEND_H_
#define RIDGESERVE_TESTS_ENGINE_FORWARDING_BACKEND_H_

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "kernels/backend.h"

namespace ridgeserve::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  std::string_view name() const override { return inner_.name(); }
  DType DefaultKvCacheDType() const override { return inner_.DefaultKvCacheDType(); }
  DType ActivationDType() const override { return inner_.ActivationDType(); }
  absl::StatusOr<DeviceBuffer> Alloc(size_t bytes) override {
    return inner_.Alloc(bytes);  // the inner backend's buffer, freed by it
  }
  void FreeRaw(void* data) override { inner_.FreeRaw(data); }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    inner_.CopyToDevice(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    inner_.CopyToHost(dst, src, bytes);
  }
  void Synchronize() override { inner_.Synchronize(); }
  std::optional<DeviceMemory> MemoryInfo() override { return inner_.MemoryInfo(); }
  void ResetTimeMarks() override { inner_.ResetTimeMarks(); }
  int32_t MarkTime() override { return inner_.MarkTime(); }
  double SecondsBetween(int32_t a, int32_t b) override { return inner_.SecondsBetween(a, b); }
  absl::StatusOr<Weight> PackWeight(std::span<const HostTensor> parts) override {
    return inner_.PackWeight(parts);
  }
  absl::Status UnpackWeight(const Weight& w, int64_t row_begin, int64_t rows,
                            float* host) override {
    return inner_.UnpackWeight(w, row_begin, rows, host);
  }
  void Embed(const Weight& table, int64_t id_begin, const int32_t* ids, int32_t n,
             float* out) override {
    inner_.Embed(table, id_begin, ids, n, out);
  }
  void RmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps,
               void* out) override {
    inner_.RmsNorm(x, w, n, dim, eps, out);
  }
  void RmsNormHeads(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                    const float* w, float eps) override {
    inner_.RmsNormHeads(x, ld, n, num_heads, head_dim, w, eps);
  }
  void LinearRows(LinearInput x, int32_t n, const Weight& w, int64_t row_begin, int64_t rows,
                  const float* bias, float* y) override {
    inner_.LinearRows(x, n, w, row_begin, rows, bias, y);
  }
  void Rope(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
            const int32_t* positions, const float* inv_freq) override {
    inner_.Rope(x, ld, n, num_heads, head_dim, positions, inv_freq);
  }
  void StoreKv(const KvLayerView& cache, const float* k, const float* v, int32_t ld, int32_t n,
               const int32_t* slots) override {
    inner_.StoreKv(cache, k, v, ld, n, slots);
  }
  void Attention(const float* q, int32_t ld, int32_t num_heads, const KvLayerView& cache,
                 const AttentionRows& rows, float scale, void* out) override {
    inner_.Attention(q, ld, num_heads, cache, rows, scale, out);
  }
  void SwiGlu(const float* gate_up, int32_t n, int32_t ff, void* out) override {
    inner_.SwiGlu(gate_up, n, ff, out);
  }
  void Add(float* x, const float* y, size_t count) override { inner_.Add(x, y, count); }
  void GatherRows(const float* src, int32_t dim, const int32_t* index, int32_t n,
                  float* dst) override {
    inner_.GatherRows(src, dim, index, n, dst);
  }
  void ShiftedRowDots(const float* a, const float* shift, const float* b, int32_t n, int32_t dim,
                      double* out) override {
    inner_.ShiftedRowDots(a, shift, b, n, dim, out);
  }
  void ShiftRows(const float* a, const float* shift, int32_t n, int32_t dim, float* out) override {
    inner_.ShiftRows(a, shift, n, dim, out);
  }
  void CopyColumns(const float* src, int64_t src_ld, int32_t rows, int32_t cols, float* dst,
                   int64_t dst_ld) override {
    inner_.CopyColumns(src, src_ld, rows, cols, dst, dst_ld);
  }
  void AttentionScores(const KvLayerView& cache, std::span<const int32_t> blocks, const float* q,
                       int32_t num_heads, std::span<const int32_t> positions,
                       std::span<const float> weights, float scale, int32_t count,
                       float* scores) override {
    inner_.AttentionScores(cache, blocks, q, num_heads, positions, weights, scale, count, scores);
  }
  void CompactKv(const KvLayerView& cache, std::span<const int32_t> blocks,
                 std::span<const int32_t> from, int32_t n) override {
    inner_.CompactKv(cache, blocks, from, n);
  }
  void Sample(float* logits, int32_t vocab, std::span<const SampleSpec> specs,
              std::span<const int32_t> penalty_ids, SampledToken* out) override {
    inner_.Sample(logits, vocab, specs, penalty_ids, out);
  }
  bool SupportsGraphs() const override { return inner_.SupportsGraphs(); }
  absl::StatusOr<std::unique_ptr<BackendGraph>> Record(
      const std::function<absl::Status()>& ops) override {
    return inner_.Record(ops);
  }
  absl::Status ReserveOps(const OpShapes& shapes) override { return inner_.ReserveOps(shapes); }
  absl::Status ReserveSampling(int32_t rows, int32_t vocab, int64_t penalty_ids) override {
    return inner_.ReserveSampling(rows, vocab, penalty_ids);
  }

 protected:
  Backend& inner_;
};

}  // namespace ridgeserve::testing

#endif  // RIDGESERVE_TESTS_ENGINE_FORWARDING_BACKEND_H_
