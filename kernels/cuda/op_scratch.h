// The scratch the CUDA backend's ops keep (kernels/cuda/cuda_backend.cc) for steps within a
// shape, as plain host code: Backend::ReserveOps allocates it at start and the memory plan
// (engine/parallel/memory_plan.cc) counts it, from this one definition.
#ifndef RIDGESERVE_KERNELS_CUDA_OP_SCRATCH_H_
#define RIDGESERVE_KERNELS_CUDA_OP_SCRATCH_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace ridgeserve::cuda {

// A Linear whose output rows are not 16-byte aligned (a width not a multiple of 4: an LM head
// over a vocabulary of 32,001) computes through a scratch with padded rows, at most this many
// rows a GEMM (cuBLASLt's algorithm is fixed per k, so a row's bits do not depend on it).
inline constexpr int32_t kPaddedOutputRows = 256;

// The padded width of such a Linear's output.
inline int64_t PaddedOutputWidth(int64_t width) { return (width + 3) / 4 * 4; }

struct OpScratch {
  size_t linear_input_bytes = 0;  // Linear's bf16 copy of f32 input: rows x OpShapes::f32_linear_k
  // Linear's padded output: min(rows, kPaddedOutputRows) x the widest padded width among the
  // linear_widths that are not multiples of 4 (0 when all are).
  size_t linear_output_bytes = 0;
  // Attention's workspace: the most any call of up to `rows` rows plans (attention_plan.h),
  // the split form's states at min(rows, kSplitMaxRows) rows or the tile list at `rows`.
  size_t attention_bytes = 0;
  size_t total() const { return linear_input_bytes + linear_output_bytes + attention_bytes; }
};

// InvalidArgument for an attention shape the kernels do not take (PlanAttention's message).
absl::StatusOr<OpScratch> PlanOpScratch(const OpShapes& shapes);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_OP_SCRATCH_H_
