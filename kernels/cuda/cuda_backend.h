// The CUDA backend (Backend v2 on one NVIDIA GPU). Ops run asynchronously on the backend's own
// stream in call order; CopyToHost and Synchronize wait for it. Pointers passed to ops are
// device memory from Alloc.
//
// What differs from the CPU backend (kernels/cpu), by design (DESIGN.md, "Backend v2"):
//   - PackWeight stores every type as bf16: each part's rows are dequantized and rounded to
//     bf16 (nearest even) on the host's cores (DequantizeRowsToBf16, kernels/dtype.h) in chunks
//     of kPackChunkBytes, one chunk converted while the one before it uploads; bf16 parts are
//     copied as they are. So a weight holds bf16(DequantizeRow(x)), not the stored value;
//     UnpackWeight returns that.
//   - ActivationDType is BF16: RmsNorm, SwiGlu and Attention compute in f32 as on the CPU and
//     store their result rounded to bf16 (nearest even), the GEMM's input with no pass of its
//     own. The residual stream, the projections' f32 outputs, q/k/v and RoPE stay f32.
//   - LinearRows: cuBLASLt bf16 x bf16 -> f32 with f32 accumulation (kernels/cuda/linear.h,
//     including what holds for batch invariance) on bf16 rows as given, or on f32 rows rounded
//     to bf16 by a kernel first (the same bits an activation op would have stored); the bias is
//     added in f32 after the product.
//   - Embed gives the bf16 table row widened to f32 (exact).
//   - Attention: kernels/cuda/attention_plan.h (a fixed tree per row: batch invariant bitwise).
//     F32 and F16 caches: the rows kernels, within f32 rounding of the CPU. BF16 caches with
//     head_dim 64 or 128: the tensor-core tiles, with the query and softmax weights rounded to
//     bf16 for the products; RIDGESERVE_CUDA_ATTENTION=rows keeps them on the rows kernels.
//   - RmsNorm, RmsNormHeads, Rope, SwiGlu, Add, ShiftRows, GatherRows, StoreKv: the header's
//     arithmetic per element; only reduction orders (RmsNorm's double sum) differ from the CPU.
//   - ShiftedRowDots: kernels/cuda/row_dots.h (a fixed tree, not the CPU's j order).
//   - Sample: kernels/cuda/sample.h (the CPU's token except where rounding decides).
//   - AttentionScores: kernels/cuda/attention_scores.h (the logits' dot products and each
//     softmax's sum in other orders, CUDA's expf: within a few ulp of the CPU's scores).
//     CompactKv: the CPU's bits.
//   - DefaultKvCacheDType: BF16 (the activations' precision already; half the bytes of F32).
// Op failures (a device fault, a launch error) abort with one line naming the call and its
// file:line (kernels/cuda/cuda_check.h): Backend v2's ops have no status to return.
#ifndef RIDGESERVE_KERNELS_CUDA_CUDA_BACKEND_H_
#define RIDGESERVE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace ridgeserve {

// PackWeight's host staging: bf16 rows converted per upload (8 MiB, in two pinned chunks: the
// host never holds more of a converted weight than 16 MiB, or two rows, whatever the tensor's
// size).
inline constexpr size_t kPackChunkBytes = size_t{8} << 20;

// CUDA devices the runtime sees (0 without a driver or a device).
int CudaDeviceCount();

// A backend on device `device`; FailedPrecondition "no CUDA device visible" when there is
// none, InvalidArgument for an ordinal past the count, Internal for other CUDA failures.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device = 0);

// The cudaStream_t (as void*) and device ordinal of a backend CreateCudaBackend made, for code
// that enqueues its own work in the same order (engine/parallel's NCCL communicator).
void* CudaBackendStream(Backend& backend);
int CudaBackendDevice(const Backend& backend);

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_CUDA_CUDA_BACKEND_H_
