// The CUDA backend: device memory from cudaMalloc, one stream, bf16 weights, cuBLASLt for
// Linear and our kernels (one op per .cu, launchers in the headers included below) for the rest.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/add.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/attention_scores.h"
#include "kernels/cuda/compact_kv.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embed.h"
#include "kernels/cuda/gather_rows.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/op_scratch.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/row_dots.h"
#include "kernels/cuda/sample.h"
#include "kernels/cuda/sample_plan.h"
#include "kernels/cuda/shift_rows.h"
#include "kernels/cuda/store_kv.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/dtype.h"

namespace ridgeserve {
namespace {

// A packed weight: [rows, cols] bf16 (uint16_t bits), rows cols apart, in device memory.
class CudaWeight final : public WeightStorage {
 public:
  explicit CudaWeight(DeviceBuffer data) : data_(std::move(data)) {}
  const uint16_t* data() const { return data_.as<const uint16_t>(); }
  uint16_t* mutable_data() { return data_.as<uint16_t>(); }

 private:
  DeviceBuffer data_;
};

int KvDTypeCode(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 2;
    default:
      cuda::Fatal(absl::InvalidArgumentError("CUDA backend: a KV cache must be F32, F16 or BF16"));
  }
}

float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

class CudaBackend;

// An instantiated CUDA graph of the backend's stream.
class CudaGraph final : public BackendGraph {
 public:
  CudaGraph(CudaBackend* backend, cudaGraphExec_t exec, uint64_t scratch_generation)
      : backend_(backend), exec_(exec), scratch_generation_(scratch_generation) {}
  ~CudaGraph() override;
  bool Replay() override;

 private:
  CudaBackend* backend_;
  cudaGraphExec_t exec_;
  uint64_t scratch_generation_;  // the backend's when recorded
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    linear_.reset();
    // Buffers free through FreeRaw, which needs this object alive: release them here.
    gemm_workspace_ = DeviceBuffer();
    x_bf16_ = DeviceBuffer();
    y_scratch_ = DeviceBuffer();
    attention_workspace_ = DeviceBuffer();
    sample_upload_ = DeviceBuffer();
    sample_keys_[0] = DeviceBuffer();
    sample_keys_[1] = DeviceBuffer();
    sample_sort_temp_ = DeviceBuffer();
    sample_out_ = DeviceBuffer();
    selection_ = DeviceBuffer();
    if (pack_host_ != nullptr) cudaFreeHost(pack_host_);
    for (cudaEvent_t event : pack_uploaded_) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    for (cudaEvent_t event : time_marks_) cudaEventDestroy(event);
    if (sample_host_ != nullptr) cudaFreeHost(sample_host_);
    cudaStreamDestroy(stream_);
  }

  // Called once by CreateCudaBackend.
  absl::Status Init() {
    absl::StatusOr<DeviceBuffer> ws = Alloc(cuda::kGemmWorkspaceBytes);
    if (!ws.ok()) return ws.status();
    gemm_workspace_ = std::move(*ws);
    absl::StatusOr<int64_t> reference_n =
        cuda::GemmReferenceN(std::getenv("RIDGESERVE_CUDA_GEMM_REFERENCE_N"));
    if (!reference_n.ok()) return reference_n.status();
    absl::StatusOr<std::unique_ptr<cuda::CublasLinear>> linear = cuda::CublasLinear::Create(
        gemm_workspace_.as<void>(), cuda::kGemmWorkspaceBytes, stream_, *reference_n);
    if (!linear.ok()) return linear.status();
    linear_ = std::move(*linear);
    // The tiles run where RIDGESERVE_CUDA_ATTENTION allows them and a CTA may hold their shared
    // memory (sm_86/89 and consumer parts allow 99 KiB, less than the walker at head_dim 128).
    absl::StatusOr<bool> tiles = cuda::TilesAllowed(std::getenv("RIDGESERVE_CUDA_ATTENTION"));
    if (!tiles.ok()) return tiles.status();
    // Read again at the first launch (CUDA_CHECK_LAUNCH); a bad value fails the start here.
    if (absl::StatusOr<bool> sync =
            cuda::SyncLaunches(std::getenv("RIDGESERVE_CUDA_SYNC_LAUNCHES"));
        !sync.ok()) {
      return sync.status();
    }
    int shared_optin = 0;
    CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
    attention_tiles_ = *tiles && static_cast<size_t>(shared_optin) >=
                                     cuda::TileSharedBytes(cuda::kMaxTileHeadDim, /*walk=*/true);
    CUDA_RETURN_IF_ERROR(cuda::PrepareAttentionKernels(attention_tiles_));
    absl::StatusOr<size_t> bitmap_limit = cuda::PrepareSampleKernels(shared_optin);
    if (!bitmap_limit.ok()) return bitmap_limit.status();
    sample_bitmap_limit_ = *bitmap_limit;
    return absl::OkStatus();
  }

  std::string_view name() const override { return "cuda"; }
  DType DefaultKvCacheDType() const override { return DType::kBF16; }
  DType ActivationDType() const override { return DType::kBF16; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  absl::StatusOr<DeviceBuffer> Alloc(size_t bytes) override {
    if (bytes == 0) return DeviceBuffer();
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* data = nullptr;
    const cudaError_t error = cudaMalloc(&data, bytes);
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // out of memory is not sticky: reset the last error
      size_t free_bytes = 0, total_bytes = 0;
      CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", bytes, " bytes of device memory on GPU ", device_, " (", free_bytes,
          " of ", total_bytes, " bytes free): ", cudaGetErrorString(error)));
    }
    // Anything else (a fault earlier on the device) is no shortage of memory.
    if (error != cudaSuccess) return cuda::CudaError(error, "cudaMalloc", __FILE__, __LINE__);
    return DeviceBuffer(this, data, bytes);
  }
  std::optional<DeviceMemory> MemoryInfo() override {
    SetDevice();
    DeviceMemory memory;
    CUDA_CHECK(cudaMemGetInfo(&memory.free_bytes, &memory.total_bytes));
    return memory;
  }
  void FreeRaw(void* data) override {
    cudaSetDevice(device_);
    // cudaFree waits for the device first, so queued kernels using the buffer finish.
    CUDA_CHECK(cudaFree(data));
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    SetDevice();
    // From pageable memory this returns once `src` is staged, so the caller may reuse it.
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    SetDevice();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void Synchronize() override {
    SetDevice();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Time marks are events recorded on the stream, made on first need and reused.
  void ResetTimeMarks() override { time_marks_used_ = 0; }
  int32_t MarkTime() override {
    SetDevice();
    if (time_marks_used_ == time_marks_.size()) {
      cudaEvent_t event;
      CUDA_CHECK(cudaEventCreate(&event));
      time_marks_.push_back(event);
    }
    CUDA_CHECK(cudaEventRecord(time_marks_[time_marks_used_], stream_));
    return static_cast<int32_t>(time_marks_used_++);
  }
  double SecondsBetween(int32_t a, int32_t b) override {
    SetDevice();
    CUDA_CHECK(cudaEventSynchronize(time_marks_.at(b)));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, time_marks_.at(a), time_marks_.at(b)));
    return 1e-3 * ms;
  }

  absl::StatusOr<Weight> PackWeight(std::span<const HostTensor> parts) override {
    if (parts.empty()) return absl::InvalidArgumentError("PackWeight: no parts");
    SetDevice();  // the staging's events are made on the current device
    const int64_t cols = parts[0].cols;
    // Checked here, at the load, rather than at a request's first Linear (CublasLinear::Run).
    if (cols <= 0 || cols % 8 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("PackWeight: a weight of ", cols,
                       " columns; the CUDA GEMMs take rows of a positive multiple of 8 (16-byte "
                       "aligned bf16 rows)"));
    }
    int64_t rows = 0;
    for (const HostTensor& part : parts) {
      if (part.cols != cols) {
        return absl::InvalidArgumentError(
            absl::StrCat("PackWeight: parts have ", cols, " and ", part.cols, " columns"));
      }
      if (part.dtype == DType::kI32) {
        return absl::UnimplementedError("PackWeight: I32 is not a weight type");
      }
      absl::StatusOr<size_t> stored = StorageBytes(part.dtype, part.cols);
      if (!stored.ok()) {
        return absl::Status(stored.status().code(),
                            absl::StrCat("PackWeight: ", stored.status().message()));
      }
      if (part.row_bytes < *stored) {
        return absl::InvalidArgumentError(
            absl::StrCat("PackWeight: rows ", part.row_bytes, " bytes apart hold ", *stored));
      }
      rows += part.rows;
    }
    const size_t bytes = sizeof(uint16_t) * static_cast<size_t>(rows) * cols;
    absl::StatusOr<DeviceBuffer> buffer = Alloc(bytes);
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat("PackWeight: [", rows, ", ", cols,
                                       "] bf16 weight: ", buffer.status().message()));
    }
    auto weight = std::make_unique<CudaWeight>(std::move(*buffer));
    // Rows per upload: as many bf16 rows as kPackChunkBytes holds (at least one), converted on
    // the host's cores into one half of the pinned staging while the other half uploads.
    const int64_t chunk_rows =
        std::max<int64_t>(1, static_cast<int64_t>(kPackChunkBytes / (sizeof(uint16_t) * cols)));
    const size_t chunk_elements = static_cast<size_t>(chunk_rows * cols);
    if (absl::Status s = EnsurePackStaging(2 * chunk_elements); !s.ok()) return s;
    int half = 0;
    int64_t out_row = 0;
    for (const HostTensor& part : parts) {
      if (part.dtype == DType::kBF16) {
        // Already bf16: its rows straight to their place, half the bytes and no host work.
        CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
            weight->mutable_data() + out_row * cols, sizeof(uint16_t) * cols, part.data,
            part.row_bytes, sizeof(uint16_t) * cols, part.rows, cudaMemcpyHostToDevice, stream_));
        out_row += part.rows;
        continue;
      }
      for (int64_t r0 = 0; r0 < part.rows; r0 += chunk_rows) {
        const int64_t count = std::min(chunk_rows, part.rows - r0);
        uint16_t* staging = pack_host_ + half * chunk_elements;
        // This half's previous upload (two chunks ago) must be done before it is refilled.
        CUDA_RETURN_IF_ERROR(cudaEventSynchronize(pack_uploaded_[half]));
        if (absl::Status s = DequantizeRowsToBf16(
                part.dtype, part.data + static_cast<size_t>(r0) * part.row_bytes, part.row_bytes,
                count, cols, staging, /*threads=*/0);
            !s.ok()) {
          CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // no upload reads it after
          return s;
        }
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(weight->mutable_data() + out_row * cols, staging,
                                             sizeof(uint16_t) * count * cols,
                                             cudaMemcpyHostToDevice, stream_));
        CUDA_RETURN_IF_ERROR(cudaEventRecord(pack_uploaded_[half], stream_));
        half ^= 1;
        out_row += count;
      }
    }
    // The caller may free the parts on return (a bf16 part's copy can still be in flight).
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Weight(std::move(weight), rows, cols, bytes);
  }

  absl::Status UnpackWeight(const Weight& w, int64_t row_begin, int64_t rows,
                            float* host) override {
    if (row_begin < 0 || rows < 0 || row_begin + rows > w.rows()) {
      return absl::OutOfRangeError(absl::StrCat("UnpackWeight: rows [", row_begin, ", ",
                                                row_begin + rows, ") of ", w.rows()));
    }
    std::vector<uint16_t> bits(static_cast<size_t>(rows) * w.cols());
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bits.data(), Packed(w).data() + row_begin * w.cols(),
                                         sizeof(uint16_t) * bits.size(), cudaMemcpyDeviceToHost,
                                         stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < bits.size(); ++i) host[i] = Bf16ToFloat(bits[i]);
    return absl::OkStatus();
  }

  void Embed(const Weight& table, int64_t id_begin, const int32_t* ids, int32_t n,
             float* out) override {
    SetDevice();
    cuda::LaunchEmbed(Packed(table).data(), table.rows(), table.cols(), id_begin, ids, n, out,
                      stream_);
  }

  void RmsNorm(const float* x, const float* w, int32_t n, int32_t dim, float eps,
               void* out) override {
    SetDevice();
    cuda::LaunchRmsNorm(x, w, n, dim, eps, static_cast<uint16_t*>(out), stream_);
  }

  void RmsNormHeads(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
                    const float* w, float eps) override {
    SetDevice();
    cuda::LaunchRmsNormHeads(x, ld, n, num_heads, head_dim, w, eps, stream_);
  }

  void LinearRows(LinearInput x, int32_t n, const Weight& w, int64_t row_begin, int64_t rows,
                  const float* bias, float* y) override {
    assert(row_begin >= 0 && row_begin + rows <= w.rows());
    assert(x.dtype == DType::kF32 || x.dtype == DType::kBF16);
    if (n <= 0 || rows <= 0) return;
    SetDevice();
    const int64_t k = w.cols();
    // bf16 rows (an activation op's output) go to the GEMM as they are; f32 rows (the residual
    // stream: RidgeFill's maps, the leverage test) are rounded here first.
    const uint16_t* xb = static_cast<const uint16_t*>(x.data);
    if (x.dtype == DType::kF32) {
      const size_t x_elements = static_cast<size_t>(n) * k;
      Ensure(x_bf16_, sizeof(uint16_t) * x_elements);
      cuda::LaunchF32ToBF16(static_cast<const float*>(x.data), x_elements, x_bf16_.as<uint16_t>(),
                            stream_);
      xb = x_bf16_.as<uint16_t>();
    }
    const uint16_t* wr = Packed(w).data() + row_begin * k;
    // cuBLASLt's algorithms want 16-byte aligned rows of y; otherwise compute into a scratch
    // with padded rows, kPaddedOutputRows at a time, and copy (the same algorithm, so the same
    // bits). ReserveOps sized that scratch for the model's widths that are not multiples of 4;
    // the model's outputs start buffers, so a width that is a multiple of 4 goes direct.
    const bool direct = rows % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
    if (direct) {
      linear_->Run(xb, n, wr, rows, k, y, rows);
    } else {
      const int64_t ld = cuda::PaddedOutputWidth(rows);
      const int32_t chunk = std::min(n, cuda::kPaddedOutputRows);
      Ensure(y_scratch_, sizeof(float) * static_cast<size_t>(chunk) * ld);
      for (int32_t r = 0; r < n; r += chunk) {
        const int32_t m = std::min(chunk, n - r);
        linear_->Run(xb + r * k, m, wr, rows, k, y_scratch_.as<float>(), ld);
        CUDA_CHECK(cudaMemcpy2DAsync(y + r * rows, sizeof(float) * rows, y_scratch_.as<void>(),
                                     sizeof(float) * ld, sizeof(float) * rows, m,
                                     cudaMemcpyDeviceToDevice, stream_));
      }
    }
    if (bias != nullptr) cuda::LaunchAddBias(y, rows, n, rows, bias, stream_);
  }

  void Rope(float* x, int32_t ld, int32_t n, int32_t num_heads, int32_t head_dim,
            const int32_t* positions, const float* inv_freq) override {
    SetDevice();
    cuda::LaunchRope(x, ld, n, num_heads, head_dim, positions, inv_freq, stream_);
  }

  void StoreKv(const KvLayerView& cache, const float* k, const float* v, int32_t ld, int32_t n,
               const int32_t* slots) override {
    SetDevice();
    cuda::LaunchStoreKv(cache.k, cache.v, KvDTypeCode(cache.dtype), k, v, ld, n,
                        cache.num_kv_heads * cache.head_dim, slots, stream_);
  }

  void Attention(const float* q, int32_t ld, int32_t num_heads, const KvLayerView& cache,
                 const AttentionRows& rows, float scale, void* out) override {
    if (rows.num_rows <= 0) return;
    SetDevice();
    absl::StatusOr<cuda::AttentionPlan> plan =
        cuda::PlanAttention(rows.num_rows, num_heads, cache.num_kv_heads, cache.head_dim,
                            cache.dtype, attention_tiles_);
    if (!plan.ok()) cuda::Fatal(plan.status());
    Ensure(attention_workspace_, plan->workspace_bytes);
    cuda::AttentionParams p;
    p.q = q;
    p.ld = ld;
    p.num_heads = num_heads;
    p.k = cache.k;
    p.v = cache.v;
    p.dtype_code = KvDTypeCode(cache.dtype);
    p.block_size = cache.block_size;
    p.num_kv_heads = cache.num_kv_heads;
    p.head_dim = cache.head_dim;
    p.num_rows = rows.num_rows;
    p.positions = rows.positions;
    p.seq = rows.seq;
    p.block_table_offsets = rows.block_table_offsets;
    p.block_tables = rows.block_tables;
    p.scale = scale;
    p.out = static_cast<uint16_t*>(out);
    cuda::LaunchAttention(p, *plan, attention_workspace_.as<void>(), stream_);
  }

  void SwiGlu(const float* gate_up, int32_t n, int32_t ff, void* out) override {
    SetDevice();
    cuda::LaunchSwiGlu(gate_up, n, ff, static_cast<uint16_t*>(out), stream_);
  }

  void Add(float* x, const float* y, size_t count) override {
    SetDevice();
    cuda::LaunchAdd(x, y, count, stream_);
  }

  void GatherRows(const float* src, int32_t dim, const int32_t* index, int32_t n,
                  float* dst) override {
    SetDevice();
    cuda::LaunchGatherRows(src, dim, index, n, dst, stream_);
  }

  void ShiftedRowDots(const float* a, const float* shift, const float* b, int32_t n, int32_t dim,
                      double* out) override {
    SetDevice();
    cuda::LaunchShiftedRowDots(a, shift, b, n, dim, out, stream_);
  }

  void ShiftRows(const float* a, const float* shift, int32_t n, int32_t dim, float* out) override {
    SetDevice();
    cuda::LaunchShiftRows(a, shift, n, dim, out, stream_);
  }

  void CopyColumns(const float* src, int64_t src_ld, int32_t rows, int32_t cols, float* dst,
                   int64_t dst_ld) override {
    if (rows <= 0 || cols <= 0) return;
    SetDevice();
    CUDA_CHECK(cudaMemcpy2DAsync(dst, sizeof(float) * dst_ld, src, sizeof(float) * src_ld,
                                 sizeof(float) * cols, rows, cudaMemcpyDeviceToDevice, stream_));
  }

  // The inputs uploaded, the kernels (kernels/cuda/attention_scores.h), the scores copied back.
  void AttentionScores(const KvLayerView& cache, std::span<const int32_t> blocks, const float* q,
                       int32_t num_heads, std::span<const int32_t> positions,
                       std::span<const float> weights, float scale, int32_t count,
                       float* scores) override {
    const int32_t rows = static_cast<int32_t>(positions.size());
    const size_t score_floats = static_cast<size_t>(cache.num_kv_heads) * count;
    if (rows == 0 || count <= 0) {
      std::fill(scores, scores + score_floats, 0.0f);
      return;
    }
    if (cache.num_kv_heads <= 0 || num_heads % cache.num_kv_heads != 0 ||
        num_heads / cache.num_kv_heads > cuda::kScoresMaxGroup ||
        cache.head_dim > cuda::kScoresMaxHeadDim) {
      cuda::Fatal(absl::InvalidArgumentError(absl::StrCat(
          "CUDA AttentionScores: ", num_heads, " query heads over ", cache.num_kv_heads,
          " KV heads of dim ", cache.head_dim, " (at most ", cuda::kScoresMaxGroup,
          " per KV head and dim ", cuda::kScoresMaxHeadDim, ")")));
    }
    SetDevice();
    const size_t q_floats = static_cast<size_t>(rows) * num_heads * cache.head_dim;
    SelectionStaging staging;
    const size_t q_at = staging.Take(sizeof(float) * q_floats);
    const size_t positions_at = staging.Take(sizeof(int32_t) * rows);
    const size_t weights_at = staging.Take(sizeof(float) * rows);
    const size_t blocks_at = staging.Take(sizeof(int32_t) * blocks.size());
    const size_t stats_at = staging.Take(sizeof(float2) * rows * num_heads);
    const size_t scores_at = staging.Take(sizeof(float) * score_floats);
    uint8_t* base = EnsureSelection(staging.bytes);
    CopyToDevice(base + q_at, q, sizeof(float) * q_floats);
    CopyToDevice(base + positions_at, positions.data(), sizeof(int32_t) * rows);
    CopyToDevice(base + weights_at, weights.data(), sizeof(float) * rows);
    CopyToDevice(base + blocks_at, blocks.data(), sizeof(int32_t) * blocks.size());
    cuda::AttentionScoresParams p;
    p.q = reinterpret_cast<const float*>(base + q_at);
    p.positions = reinterpret_cast<const int32_t*>(base + positions_at);
    p.weights = reinterpret_cast<const float*>(base + weights_at);
    p.blocks = reinterpret_cast<const int32_t*>(base + blocks_at);
    p.k = cache.k;
    p.dtype_code = KvDTypeCode(cache.dtype);
    p.block_size = cache.block_size;
    p.num_kv_heads = cache.num_kv_heads;
    p.head_dim = cache.head_dim;
    p.num_heads = num_heads;
    p.rows = rows;
    p.max_position = *std::max_element(positions.begin(), positions.end());
    p.count = count;
    p.scale = scale;
    p.stats = reinterpret_cast<float2*>(base + stats_at);
    p.scores = reinterpret_cast<float*>(base + scores_at);
    cuda::LaunchAttentionScores(p, stream_);
    CUDA_CHECK(cudaMemcpyAsync(scores, p.scores, sizeof(float) * score_floats,
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void CompactKv(const KvLayerView& cache, std::span<const int32_t> blocks,
                 std::span<const int32_t> from, int32_t n) override {
    if (n <= 0) return;
    SetDevice();
    const int32_t element = static_cast<int32_t>(ElementBytes(cache.dtype));
    SelectionStaging staging;
    const size_t blocks_at = staging.Take(sizeof(int32_t) * blocks.size());
    const size_t from_at = staging.Take(sizeof(int32_t) * from.size());
    const size_t moved_at =
        staging.Take(cuda::CompactKvScratchBytes(element, cache.num_kv_heads, cache.head_dim, n));
    uint8_t* base = EnsureSelection(staging.bytes);
    CopyToDevice(base + blocks_at, blocks.data(), sizeof(int32_t) * blocks.size());
    CopyToDevice(base + from_at, from.data(), sizeof(int32_t) * from.size());
    cuda::CompactKvParams p;
    p.k = cache.k;
    p.v = cache.v;
    p.element_bytes = element;
    p.block_size = cache.block_size;
    p.num_kv_heads = cache.num_kv_heads;
    p.head_dim = cache.head_dim;
    p.blocks = reinterpret_cast<const int32_t*>(base + blocks_at);
    p.from = reinterpret_cast<const int32_t*>(base + from_at);
    p.n = n;
    p.moved = reinterpret_cast<uint16_t*>(base + moved_at);
    cuda::LaunchCompactKv(p, stream_);
    // The staging is reused by the next call's uploads, which are ordered after this on the
    // stream; the host's arrays may go (CopyToDevice stages them before it returns).
  }

  bool SupportsGraphs() const override { return true; }

  // Stream capture in thread-local mode: the ops enqueue onto the capturing stream. A status
  // from `ops` or a capture the driver invalidated is returned. A call that synchronizes
  // (CopyToHost, Synchronize, Sample) is not allowed in a recording: CUDA refuses it and its
  // CUDA_CHECK stops the process naming the call, as an op whose scratch would grow does
  // (Ensure) and as any op failure does.
  absl::StatusOr<std::unique_ptr<BackendGraph>> Record(
      const std::function<absl::Status()>& ops) override {
    SetDevice();
    const uint64_t generation = scratch_generation_;
    CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    const absl::Status recorded = ops();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (!recorded.ok() || ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();  // an invalidated capture leaves a sticky error
      if (!recorded.ok()) return recorded;
      return cuda::CudaError(ended, "cudaStreamEndCapture", __FILE__, __LINE__);
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_RETURN_IF_ERROR(instantiated);
    return std::make_unique<CudaGraph>(this, exec, generation);
  }
  uint64_t scratch_generation() const { return scratch_generation_; }

  absl::Status ReserveOps(const OpShapes& shapes) override {
    SetDevice();
    absl::StatusOr<cuda::OpScratch> need = cuda::PlanOpScratch(shapes);
    if (!need.ok()) return need.status();
    const std::pair<DeviceBuffer*, size_t> parts[] = {
        {&x_bf16_, need->linear_input_bytes},
        {&y_scratch_, need->linear_output_bytes},
        {&attention_workspace_, need->attention_bytes}};
    for (const auto& [buffer, bytes] : parts) {
      if (buffer->bytes() >= bytes) continue;
      ++scratch_generation_;  // recorded graphs point at the old buffer
      if (absl::Status s = Grow(*buffer, bytes); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("op scratch for steps of ", shapes.rows,
                                                   " rows: ", s.message()));
      }
    }
    // Each k's GEMM algorithm now: a k cuBLASLt has none for fails the start, not a request.
    for (int64_t k : shapes.linear_ks) {
      if (absl::StatusOr<cublasLtMatmulAlgo_t> algo = linear_->AlgorithmFor(k); !algo.ok()) {
        return absl::Status(algo.status().code(),
                            absl::StrCat("the GEMMs with k = ", k, ": ", algo.status().message()));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReserveSampling(int32_t rows, int32_t vocab, int64_t penalty_ids) override {
    SetDevice();
    // Every row sorted: the most the keys and the sort's storage can need.
    std::vector<SampleSpec> all(static_cast<size_t>(rows));
    for (SampleSpec& spec : all) spec.top_p = 0.5f;
    absl::StatusOr<cuda::SamplePlan> plan =
        cuda::PlanSample(all, vocab, static_cast<size_t>(penalty_ids));
    if (!plan.ok()) return plan.status();
    if (absl::Status s = EnsureSampling(*plan, vocab, all.size()); !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("sampling scratch for ", rows, " rows of ", vocab, " ids and ",
                                 penalty_ids, " penalty ids: ", s.message()));
    }
    return absl::OkStatus();
  }

  // One upload (specs, the plan, the penalty ids) from pinned memory, the kernels
  // (kernels/cuda/sample.h), and the tokens back: nothing of the logits leaves the device.
  void Sample(float* logits, int32_t vocab, std::span<const SampleSpec> specs,
              std::span<const int32_t> penalty_ids, SampledToken* out) override {
    if (specs.empty()) return;
    SetDevice();
    absl::StatusOr<cuda::SamplePlan> plan = cuda::PlanSample(specs, vocab, penalty_ids.size());
    if (!plan.ok()) cuda::Fatal(plan.status());
    if (absl::Status s = EnsureSampling(*plan, vocab, specs.size()); !s.ok()) cuda::Fatal(s);
    // The staging is free: the previous call waited for its results.
    cuda::PackSampleUpload(*plan, specs, penalty_ids, sample_host_);
    CUDA_CHECK(cudaMemcpyAsync(sample_upload_.as<void>(), sample_host_, plan->upload_bytes,
                               cudaMemcpyHostToDevice, stream_));
    const int32_t slots = plan->num_slots();
    const uint8_t* upload = sample_upload_.as<const uint8_t>();
    cuda::SampleArgs args;
    args.logits = logits;
    args.vocab = vocab;
    args.bitmap_bytes = cuda::PenaltyBitmapBytes(vocab);
    args.num_specs = static_cast<int32_t>(specs.size());
    args.num_slots = slots;
    args.specs = reinterpret_cast<const SampleSpec*>(upload + plan->specs_offset);
    args.sort_slot = reinterpret_cast<const int32_t*>(upload + plan->sort_slot_offset);
    args.slot_spec = reinterpret_cast<const int32_t*>(upload + plan->slot_spec_offset);
    args.slot_offsets = reinterpret_cast<const int32_t*>(upload + plan->slot_offsets_offset);
    args.penalty_ids = reinterpret_cast<const int32_t*>(upload + plan->penalty_offset);
    args.keys[0] = sample_keys_[0].as<uint64_t>();
    args.keys[1] = sample_keys_[1].as<uint64_t>();
    args.sort_temp = sample_sort_temp_.as<void>();
    args.sort_temp_bytes = sample_sort_temp_.bytes();
    args.out = sample_out_.as<SampledToken>();
    cuda::LaunchSample(args, stream_);
    CUDA_CHECK(cudaMemcpyAsync(out, args.out, sizeof(SampledToken) * specs.size(),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  // Weights reach this backend only from its own PackWeight.
  static const CudaWeight& Packed(const Weight& w) {
    assert(dynamic_cast<const CudaWeight*>(w.storage()) != nullptr);
    return *static_cast<const CudaWeight*>(w.storage());
  }

  // The engine thread may not be the thread that created the backend: every entry point makes
  // this backend's device current (a no-op when it already is).
  void SetDevice() const { CUDA_CHECK(cudaSetDevice(device_)); }

  // Grows a scratch buffer to at least `bytes` (never shrinks, so steady-state steps reuse the
  // same addresses). Failure to grow inside an op has no status to go to: fatal.
  // An op's scratch (graphs record its address): growing it makes recordings stale.
  void Ensure(DeviceBuffer& buffer, size_t bytes) {
    if (buffer.bytes() >= bytes) return;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) {
      cuda::Fatal(absl::FailedPreconditionError(
          absl::StrCat("an op needs ", bytes,
                       " bytes of scratch while its graph is recorded (Record's ops "
                       "must run once unrecorded first)")));
    }
    ++scratch_generation_;  // recorded graphs point at the old buffer
    if (absl::Status s = Grow(buffer, bytes); !s.ok()) cuda::Fatal(s);
  }

  // Sample's buffers for `plan` (no graph reads them), each grown to at least twice its size
  // when it is too small, so a penalty list that lengthens every step does not reallocate
  // every step. InvalidArgument first when the vocabulary's penalty bitmap is over the sampling
  // kernels' shared memory (the start's ReserveSampling, and any Sample, check it here).
  absl::Status EnsureSampling(const cuda::SamplePlan& plan, int32_t vocab, size_t num_specs) {
    if (absl::Status s = cuda::CheckPenaltyBitmap(vocab, sample_bitmap_limit_); !s.ok()) return s;
    const size_t key_bytes = sizeof(uint64_t) * static_cast<size_t>(plan.num_slots()) * vocab;
    const size_t sizes[] = {plan.upload_bytes, key_bytes, key_bytes,
                            cuda::SampleSortTempBytes(plan.num_slots(), vocab),
                            sizeof(SampledToken) * num_specs};
    DeviceBuffer* buffers[] = {&sample_upload_, &sample_keys_[0], &sample_keys_[1],
                               &sample_sort_temp_, &sample_out_};
    for (size_t i = 0; i < std::size(buffers); ++i) {
      if (buffers[i]->bytes() >= sizes[i]) continue;
      const absl::Status grown = Grow(*buffers[i], std::max(sizes[i], 2 * buffers[i]->bytes()));
      if (!grown.ok()) return grown;
    }
    if (sample_host_bytes_ < plan.upload_bytes) {
      const size_t bytes = std::max(plan.upload_bytes, 2 * sample_host_bytes_);
      if (sample_host_ != nullptr) CUDA_RETURN_IF_ERROR(cudaFreeHost(sample_host_));
      sample_host_ = nullptr;
      sample_host_bytes_ = 0;
      CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&sample_host_), bytes));
      sample_host_bytes_ = bytes;
    }
    return absl::OkStatus();
  }

  // The parts of AttentionScores' and CompactKv's device staging, each 16-byte aligned.
  struct SelectionStaging {
    size_t bytes = 0;
    size_t Take(size_t part) {
      const size_t at = bytes;
      bytes += (part + 15) / 16 * 16;
      return at;
    }
  };
  // That staging, grown to at least `bytes` (no graph reads it); the start of it.
  uint8_t* EnsureSelection(size_t bytes) {
    if (selection_.bytes() < bytes) {
      // (Freeing the old buffer waits for the work that may still read it: cudaFree.)
      if (absl::Status s = Grow(selection_, std::max(bytes, 2 * selection_.bytes())); !s.ok()) {
        cuda::Fatal(s);
      }
    }
    return selection_.as<uint8_t>();
  }
  // Frees `buffer`, then allocates `bytes` in its place.
  absl::Status Grow(DeviceBuffer& buffer, size_t bytes) {
    buffer = DeviceBuffer();
    absl::StatusOr<DeviceBuffer> grown = Alloc(bytes);
    if (!grown.ok()) return grown.status();
    buffer = std::move(*grown);
    return absl::OkStatus();
  }

  // PackWeight's pinned staging of `elements` bf16 values and its two halves' events, once no
  // upload reads the staging (PackWeight returns only when its uploads are done).
  absl::Status EnsurePackStaging(size_t elements) {
    for (cudaEvent_t& event : pack_uploaded_) {
      if (event == nullptr) {
        CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      }
    }
    if (pack_host_elements_ >= elements) return absl::OkStatus();
    if (pack_host_ != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaFreeHost(pack_host_));
      pack_host_ = nullptr;
      pack_host_elements_ = 0;
    }
    CUDA_RETURN_IF_ERROR(
        cudaMallocHost(reinterpret_cast<void**>(&pack_host_), sizeof(uint16_t) * elements));
    pack_host_elements_ = elements;
    return absl::OkStatus();
  }

  const int device_;
  const cudaStream_t stream_;
  uint64_t scratch_generation_ = 0;  // bumped whenever an op's scratch moves
  std::unique_ptr<cuda::CublasLinear> linear_;
  DeviceBuffer gemm_workspace_;       // cuBLASLt's, kGemmWorkspaceBytes
  DeviceBuffer x_bf16_;               // f32 Linear input rounded to bf16
  DeviceBuffer y_scratch_;            // Linear's output when y's rows are not 16-byte aligned
  DeviceBuffer attention_workspace_;  // split-KV slot states, the tile list
  bool attention_tiles_ = false;      // bf16 caches on the tiles (Init)
  uint16_t* pack_host_ = nullptr;     // PackWeight's bf16 rows (pinned), in two halves
  size_t pack_host_elements_ = 0;
  cudaEvent_t pack_uploaded_[2] = {nullptr, nullptr};  // each half's last upload
  std::vector<cudaEvent_t> time_marks_;  // MarkTime's events; the first time_marks_used_ in use
  size_t time_marks_used_ = 0;
  size_t sample_bitmap_limit_ = 0;  // the sampling kernels' shared memory (Init)
  // Sample's: the upload (pinned on the host, and on the device), keys, sort storage, tokens.
  uint8_t* sample_host_ = nullptr;
  size_t sample_host_bytes_ = 0;
  DeviceBuffer sample_upload_;
  DeviceBuffer sample_keys_[2];
  DeviceBuffer sample_sort_temp_;
  DeviceBuffer sample_out_;
  DeviceBuffer selection_;  // AttentionScores' and CompactKv's inputs and scratch
};

CudaGraph::~CudaGraph() { cudaGraphExecDestroy(exec_); }

bool CudaGraph::Replay() {
  if (backend_->scratch_generation() != scratch_generation_) return false;
  CUDA_CHECK(cudaSetDevice(CudaBackendDevice(*backend_)));
  CUDA_CHECK(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(CudaBackendStream(*backend_))));
  return true;
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count == 0) {
    return absl::FailedPreconditionError("no CUDA device visible");
  }
  if (error != cudaSuccess) {
    cudaGetLastError();
    std::string why = cudaGetErrorString(error);
    if (error == cudaErrorInsufficientDriver) {
      int runtime = 0;
      cudaRuntimeGetVersion(&runtime);
      why = absl::StrCat("no NVIDIA driver, or one older than CUDA ", runtime / 1000, ".",
                         runtime % 1000 / 10, " needs: ", why);
    }
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device visible (", why, ")"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " visible)"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto backend = std::make_unique<CudaBackend>(device, stream);
  if (absl::Status s = backend->Init(); !s.ok()) return s;
  return backend;
}

void* CudaBackendStream(Backend& backend) {
  assert(dynamic_cast<CudaBackend*>(&backend) != nullptr);
  return static_cast<CudaBackend&>(backend).stream();
}

int CudaBackendDevice(const Backend& backend) {
  assert(dynamic_cast<const CudaBackend*>(&backend) != nullptr);
  return static_cast<const CudaBackend&>(backend).device();
}

}  // namespace ridgeserve
