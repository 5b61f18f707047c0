#include "kernels/cuda/op_scratch.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention_plan.h"

namespace ridgeserve::cuda {

absl::StatusOr<OpScratch> PlanOpScratch(const OpShapes& shapes) {
  OpScratch scratch;
  scratch.linear_input_bytes = sizeof(uint16_t) * static_cast<size_t>(shapes.rows) *
                               static_cast<size_t>(shapes.f32_linear_k);
  int64_t padded = 0;
  for (int64_t width : shapes.linear_widths) {
    if (width % 4 != 0) padded = std::max(padded, PaddedOutputWidth(width));
  }
  scratch.linear_output_bytes = sizeof(float) *
                                static_cast<size_t>(std::min(shapes.rows, kPaddedOutputRows)) *
                                static_cast<size_t>(padded);
  for (int32_t rows : {std::min(shapes.rows, kSplitMaxRows), shapes.rows}) {
    if (rows <= 0) continue;
    const absl::StatusOr<AttentionPlan> plan = PlanAttention(
        rows, shapes.num_heads, shapes.num_kv_heads, shapes.head_dim, shapes.kv_dtype);
    if (!plan.ok()) return plan.status();
    scratch.attention_bytes = std::max(scratch.attention_bytes, plan->workspace_bytes);
  }
  return scratch;
}

}  // namespace ridgeserve::cuda
