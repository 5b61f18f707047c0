// The compute backend interface (Backend v2): memory, weights packed by the backend, and the
// ops of a Llama-family forward pass. The CPU backend (kernels/cpu) is a full implementation;
// a CUDA backend implements the same interface. Pointers passed to ops are backend memory
// (host memory on CPU). The model names shapes; the backend owns the layout of what it
// computes on: a weight is handed over once as stored rows (HostTensor, any DType the readers
// produce) and comes back as an opaque Weight that only Linear, Embed and UnpackWeight read.
//
// Batch invariance: every op computes each row with a reduction order that does not depend
// on how many other rows are in the call or where the row sits in it, so a request's results
// are the same alone or batched, in one prefill chunk or several.
//
// Threading: a Backend is driven by one thread at a time (the engine thread); it may use
// worker threads internally.
#ifndef RIDGESERVE_KERNELS_BACKEND_H_
#define RIDGESERVE_KERNELS_BACKEND_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"
#include "kernels/sample_spec.h"

namespace ridgeserve {

class Backend;

// Owning handle to backend memory.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* backend, void* data, size_t bytes)
      : backend_(backend), data_(data), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A host view of a stored 2-D tensor: `rows` rows of `cols` elements of `dtype`, row r at
// data + r * row_bytes (block formats hold whole blocks per row). Views select the part a
// caller wants without copying (a tensor-parallel rank takes only its shard of an mmapped
// file this way).
struct HostTensor {
  const uint8_t* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;

  // Rows [begin, begin + count).
  HostTensor Rows(int64_t begin, int64_t count) const;
  // Columns [begin, begin + count); InvalidArgument unless both are whole blocks of dtype.
  absl::StatusOr<HostTensor> Cols(int64_t begin, int64_t count) const;
};

// A weight matrix [rows, cols] (PyTorch Linear layout: rows are output features) in a
// backend's own packed layout. Only the backend that packed it may read it.
class WeightStorage {
 public:
  virtual ~WeightStorage() = default;
};

class Weight {
 public:
  Weight() = default;
  Weight(std::unique_ptr<WeightStorage> storage, int64_t rows, int64_t cols, size_t bytes)
      : storage_(std::move(storage)), rows_(rows), cols_(cols), bytes_(bytes) {}

  bool empty() const { return storage_ == nullptr; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  size_t bytes() const { return bytes_; }  // resident bytes on the backend
  const WeightStorage* storage() const { return storage_.get(); }

 private:
  std::unique_ptr<WeightStorage> storage_;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  size_t bytes_ = 0;
};

// One layer of the paged KV cache: `k` and `v` are [num_blocks, block_size, num_kv_heads,
// head_dim] elements of `dtype` (F32, F16 or BF16; kernels/dtype.h). Token slot s lives in
// block s / block_size at offset s % block_size.
struct KvLayerView {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  DType dtype = DType::kF32;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

// The cache slot of place `place` of a sequence whose places sit in `blocks`, in order
// (block_size places a block).
inline int64_t PagedSlot(std::span<const int32_t> blocks, int32_t block_size, int32_t place) {
  return int64_t{blocks[place / block_size]} * block_size + place % block_size;
}

// Which cached tokens each row attends to: row r belongs to sequence s = seq[r] and sits at
// absolute position positions[r]; it attends causally to positions 0..positions[r] of its
// sequence, position p in block block_tables[block_table_offsets[s] + p / block_size]. The
// tables are packed (no padding to the longest sequence), as FlashInfer's paged_kv_indptr /
// paged_kv_indices are.
struct AttentionRows {
  int32_t num_rows = 0;
  const int32_t* positions = nullptr;            // [num_rows]
  const int32_t* seq = nullptr;                  // [num_rows]
  const int32_t* block_table_offsets = nullptr;  // [num_seqs + 1]
  const int32_t* block_tables = nullptr;         // [block_table_offsets[num_seqs]]
};

// Ops recorded once and run again (a CUDA graph). Replay runs them with the arguments they
// were recorded with: pointers stay the same, the ops read whatever those buffers hold then.
class BackendGraph {
 public:
  virtual ~BackendGraph() = default;
  // False, running nothing, when the backend's own scratch has moved since the recording (a
  // larger step grew it): record again.
  virtual bool Replay() = 0;
};

// The rows x [n, k] a Linear multiplies: f32 (any float array converts to this implicitly), or
// the backend's ActivationDType, the element type its RmsNorm, SwiGlu and Attention write (CUDA
// hands bf16 rows to cuBLASLt as they are: they must start 16-byte aligned, as a buffer from
// Alloc does).
struct LinearInput {
  LinearInput(const float* x) : data(x) {}  // NOLINT(google-explicit-constructor): f32 rows
  LinearInput(const void* x, DType element) : data(x), dtype(element) {}
  const void* data;
  DType dtype = DType::kF32;
};

// The largest step a model will run, for a backend that sizes its ops' own scratch up front
// (Backend::ReserveOps), for Linear outputs that start 16-byte aligned (a buffer from Alloc, or
// an offset of a multiple of 4 floats into one); CUDA grows scratch for any other.
struct OpShapes {
  int32_t rows = 0;                    // rows of one step
  std::vector<int64_t> linear_ks;      // every Linear input width (hidden, query width, MLP width)
  int64_t f32_linear_k = 0;            // the widest input given as f32 rows (LinearInput)
  std::vector<int64_t> linear_widths;  // every Linear and LinearRows output width
  int32_t num_heads = 0;  // attention: the rank's query and KV heads, head_dim, cache type
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType kv_dtype = DType::kF32;
};

// A device's memory at the moment of asking (cudaMemGetInfo on CUDA).
struct DeviceMemory {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // The KV cache element type --kv_cache_dtype auto picks (CPU: F16, measured in README).
  virtual DType DefaultKvCacheDType() const = 0;
  // The element type of the activations that only a Linear reads: what RmsNorm, SwiGlu and
  // Attention write (CPU: F32; CUDA: BF16, the GEMMs' input, rounded once where it is made
  // instead of in a pass of its own before each GEMM). A BF16 element is the f32 result rounded
  // to nearest even (FloatToBFloat16).
  virtual DType ActivationDType() const { return DType::kF32; }

  // --- memory ---------------------------------------------------------------------------
  // Uninitialized memory, 64-byte aligned on the CPU; an empty buffer when bytes == 0.
  // ResourceExhausted naming the byte count when it cannot be allocated.
  virtual absl::StatusOr<DeviceBuffer> Alloc(size_t bytes) = 0;
  virtual void FreeRaw(void* data) = 0;  // called by DeviceBuffer
  // A copy of zero bytes does nothing, whatever the pointers (an empty vector's data() may be
  // null).
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Waits for queued work (no-op on CPU).
  virtual void Synchronize() = 0;
  // The device's memory, which sizes the KV cache (--gpu_memory_utilization); nullopt for a
  // backend on host memory (its cache is --kv_cache_tokens).
  virtual std::optional<DeviceMemory> MemoryInfo() { return std::nullopt; }

  // --- weights ----------------------------------------------------------------------------
  // Packs `parts` stacked along rows (all with the same cols) into one weight. Each part keeps
  // its values exactly as DequantizeRow gives them (the CPU keeps the stored blocks; a GPU
  // backend may convert, and says so in its header). Unimplemented for a DType the backend
  // cannot compute with, naming the type.
  virtual absl::StatusOr<Weight> PackWeight(std::span<const HostTensor> parts) = 0;
  // Rows [row_begin, row_begin + rows) of `w` as f32 on the host, [rows, w.cols()]: the values
  // Linear multiplies by (offline tools read projections back this way).
  virtual absl::Status UnpackWeight(const Weight& w, int64_t row_begin, int64_t rows,
                                    float* host) = 0;

  // --- ops (shapes in elements; `ld` is the row stride) -----------------------------------
  // out[i, :] = table[ids[i] - id_begin, :] as f32 when that row is in the table, else zeros
  // (a vocabulary-parallel rank holds rows [id_begin, id_begin + table.rows()) of the
  // embedding); table [rows, dim] packed by this backend.
  virtual void Embed(const Weight& table, int64_t id_begin, const int32_t* ids, int32_t n,
                     float* out) = 0;
  // out[i, :] = x[i, :] / rms(x[i, :]) * w; x [n, dim] f32, out [n, dim] of ActivationDType
  // (the same memory as x only where that is F32). CPU: the sum of squares is accumulated in
  // double (fixed order), r = float(1 / sqrt(sum / dim + eps)) in double, then out = (x * r) * w
  // in float.
  virtual void RmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps,
                       void* out) = 0;
  // In place, per head: x[i, h*head_dim : (h+1)*head_dim] normalized with w [head_dim]
  // (Qwen3 QK-norm), with RmsNorm's arithmetic. x rows are `ld` apart.
  virtual void RmsNormHeads(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                            const float* w, float eps) = 0;
  // y[n, rows] = x[n, w.cols()] · w[row_begin : row_begin + rows, :]ᵀ (+ bias[rows], added
  // after the product), y in f32. Element (i, j) depends only on row i of x and row j of w: not
  // on n, the row's place in x, the row range, or the thread count. The backend's header states
  // the arithmetic (CPU: kernels/cpu/linear.h).
  virtual void LinearRows(LinearInput x, int32_t n, const Weight& w, int64_t row_begin,
                          int64_t rows, const float* bias, float* y) = 0;
  // y[n, w.rows()] = x · wᵀ (+ bias).
  void Linear(LinearInput x, int32_t n, const Weight& w, const float* bias, float* y) {
    LinearRows(x, n, w, 0, w.rows(), bias, y);
  }
  // In place rotary embedding, half-split ("NeoX"/Hugging Face) layout: within each head,
  // pairs (j, j + head_dim/2) rotate by positions[i] * inv_freq[j]. x rows are `ld` apart.
  // The angle is a float product, as Hugging Face computes it in float32:
  //   theta = float(positions[i]) * inv_freq[j]              (rounded to float)
  //   c = float(cos(double(theta))), s = float(sin(double(theta)))
  //   with a = x[j], b = x[j + half]: x[j] = a * c - b * s, x[j + half] = b * c + a * s
  //   in float (a product may be fused into an FMA)
  // NumPy: theta = np.float32(pos) * inv_freq (float32 arrays), then
  //   c = np.cos(theta.astype(np.float64)).astype(np.float32), likewise s.
  virtual void Rope(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                    const int32_t* positions, const float* inv_freq) = 0;
  // Writes row i of k and v (each num_kv_heads*head_dim wide, rows `ld` apart) to slots[i],
  // converted to the cache's dtype by ConvertFromFloat (round to nearest even). A row whose
  // slot is negative (a padding row of a graph-sized batch) is not written.
  virtual void StoreKv(const KvLayerView& cache, const float* k, const float* v, int32_t ld,
                       int32_t n, const int32_t* slots) = 0;
  // out[i, h*head_dim...] = softmax(q_h · Kᵀ * scale) · V over the row's causal context,
  // with GQA (query head h uses KV head h / (num_heads / num_kv_heads)). q rows are `ld`
  // apart; out [n, num_heads*head_dim] of ActivationDType. A row's context is consumed in
  // increasing position order (CPU: online softmax over chunks of 64 positions, running max and
  // sum), so its result depends only on its query, its position and the cached K/V: not on the
  // other rows, on how a prefill is chunked, or on the block size and which blocks hold the tokens.
  // On the CPU, F16 and BF16 entries are widened to f32 exactly, so the result equals that of an
  // F32 cache holding the rounded values; a backend that rounds more (CUDA on a BF16 cache:
  // the query and softmax weights in bf16 for tensor cores) says so in its header.
  virtual void Attention(const float* q, int32_t ld, int32_t num_heads, const KvLayerView& cache,
                         const AttentionRows& rows, float scale, void* out) = 0;
  // out[i, j] = silu(gate_up[i, j]) * gate_up[i, ff + j]; gate_up [n, 2*ff] f32, out [n, ff] of
  // ActivationDType. silu(g) = g / (1 + exp(-g)) in float (CPU: exp within 2 ulp).
  virtual void SwiGlu(const float* gate_up, int32_t n, int32_t ff, void* out) = 0;
  // x[i] += y[i] for i < count.
  virtual void Add(float* x, const float* y, size_t count) = 0;
  // dst[i, :] = src[index[i], :], rows `dim` wide.
  virtual void GatherRows(const float* src, int32_t dim, const int32_t* index, int32_t n,
                          float* dst) = 0;
  // out[i] = Σ_j (a[i, j] − shift[j]) · b[i, j] over j < dim, in double (each product of the
  // float values widened to double); a and b [n, dim], shift [dim], out [n] doubles. CPU: in j
  // order; a backend may add in another fixed order (its header says which).
  virtual void ShiftedRowDots(const float* a, const float* shift, const float* b, int32_t n,
                              int32_t dim, double* out) = 0;
  // out[i, j] = a[i, j] − shift[j] in float; a and out [n, dim] (may be the same), shift
  // [dim].
  virtual void ShiftRows(const float* a, const float* shift, int32_t n, int32_t dim,
                         float* out) = 0;
  // dst[i * dst_ld + j] = src[i * src_ld + j] for i < rows, j < cols.
  virtual void CopyColumns(const float* src, int64_t src_ld, int32_t rows, int32_t cols, float* dst,
                           int64_t dst_ld) = 0;
  // SpecPC's and SpecKV's scores (engine/draft/): the attention weights a few query rows of one
  // sequence give its cached keys, each key's largest. For KV head g and place j < count:
  //   scores[g * count + j] = max(0, max of weights[r] * p_rh[j] over the rows r with
  //                                   positions[r] >= j and the query heads h of g)
  //   p_rh[j] = softmax over j' <= positions[r] of (q[r, h] · K[j', g] * scale), in float
  // (query head h belongs to KV head h / (num_heads / num_kv_heads)). The sequence's place p is
  // slot blocks[p / block_size] * block_size + p % block_size. q [rows, num_heads * head_dim],
  // positions and weights [rows], blocks and scores [num_kv_heads, count] are on the host; this
  // returns once scores are there. A key past every row's position scores 0 and is not read
  // (`blocks` need only reach the largest position). CPU: kernels/cpu/attention_scores.h; a
  // backend that computes in another order says so in its header.
  virtual void AttentionScores(const KvLayerView& cache, std::span<const int32_t> blocks,
                               const float* q, int32_t num_heads,
                               std::span<const int32_t> positions, std::span<const float> weights,
                               float scale, int32_t count, float* scores) = 0;
  // SpecKV's compaction: moves a sequence's cached entries within it, per KV head. For
  // g < num_kv_heads and i < n, head g's K and V at place from[g * n + i] go to place i, bits
  // unchanged, every entry read before any is written. blocks (host) as for AttentionScores;
  // from (host) [num_kv_heads, n].
  virtual void CompactKv(const KvLayerView& cache, std::span<const int32_t> blocks,
                         std::span<const int32_t> from, int32_t n) = 0;
  // One token for each spec from its row of `logits` ([rows, vocab]), by kernels/sample.h's
  // definition; `penalty_ids` (host) holds the specs' penalty ranges. Specs draw from distinct
  // rows. `out` (host) gets specs.size() results; this returns once they are there. A token
  // depends only on its row, its spec and its penalty ids, not on the other specs. The logits
  // hold their values again on return (the CPU penalizes in place and undoes it).
  virtual void Sample(float* logits, int32_t vocab, std::span<const SampleSpec> specs,
                      std::span<const int32_t> penalty_ids, SampledToken* out) = 0;
  // --- timing ---------------------------------------------------------------------------
  // Time marks in the queued work, to time a part of a step without waiting for it (the
  // RidgeFill profile). MarkTime notes the point after every op queued so far and returns its
  // number (counted from the last ResetTimeMarks); SecondsBetween(a, b) waits until the work
  // before mark b has run and gives the seconds from a to b. This default is the wall clock
  // after Synchronize (the CPU's ops have run by the time they return); CUDA records events on
  // its stream instead, so a mark costs no wait.
  virtual void ResetTimeMarks() { time_marks_.clear(); }
  virtual int32_t MarkTime() {
    Synchronize();
    time_marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int32_t>(time_marks_.size()) - 1;
  }
  virtual double SecondsBetween(int32_t a, int32_t b) {
    return std::chrono::duration<double>(time_marks_.at(b) - time_marks_.at(a)).count();
  }

  // --- graphs ---------------------------------------------------------------------------
  // Whether Record works (CUDA: yes; the CPU runs every step as it comes).
  virtual bool SupportsGraphs() const { return false; }
  // Records the ops `ops` enqueues, without running them, into a graph. The ops must not
  // allocate, copy between host and backend, or synchronize (run them once unrecorded first, so
  // every scratch they need exists). Unimplemented where SupportsGraphs is false; `ops`' own
  // error ends the recording and is returned.
  virtual absl::StatusOr<std::unique_ptr<BackendGraph>> Record(
      const std::function<absl::Status()>& ops) {
    (void)ops;
    return absl::UnimplementedError(
        absl::StrCat("the ", std::string(name()), " backend has no graphs"));
  }

  // Allocates the ops' own scratch now for steps within `shapes` (the engine does at start), so
  // such a step's ops allocate nothing (CUDA graphs keep their addresses, and a device that is
  // full fails the start, not a request); ResourceExhausted naming the bytes when it cannot
  // (CUDA: PlanOpScratch in kernels/cuda/op_scratch.h, which the memory plan counts).
  virtual absl::Status ReserveOps(const OpShapes& shapes) {
    (void)shapes;
    return absl::OkStatus();
  }

  // Allocates Sample's own scratch now for up to `rows` specs over `vocab` ids with up to
  // `penalty_ids` ids of repetition-penalty context in all (the engine does at start), so a
  // call within them allocates nothing; ResourceExhausted naming the bytes when it cannot
  // (CUDA: SampleScratchBytes in kernels/cuda/sample_plan.h, which the memory plan counts).
  virtual absl::Status ReserveSampling(int32_t rows, int32_t vocab, int64_t penalty_ids) {
    (void)rows;
    (void)vocab;
    (void)penalty_ids;
    return absl::OkStatus();
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> time_marks_;  // the default MarkTime's
};

// A --kv_cache_dtype value: "auto" (the backend's default) or one ParseKvCacheDType takes.
absl::StatusOr<DType> ResolveKvCacheDType(std::string_view name, const Backend& backend);

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_BACKEND_H_
