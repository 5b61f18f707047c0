#include "kernels/cuda/attention_plan.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ridgeserve::cuda {

absl::StatusOr<AttentionPlan> PlanAttention(int32_t num_rows, int32_t num_heads,
                                            int32_t num_kv_heads, int32_t head_dim, DType kv_dtype,
                                            bool allow_tiles) {
  if (head_dim <= 0 || head_dim % 32 != 0 || head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA attention: head_dim ", head_dim,
                                                   " is not a multiple of 32 up to ", kMaxHeadDim));
  }
  if (num_kv_heads <= 0 || num_heads <= 0 || num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA attention: ", num_heads, " query heads over ", num_kv_heads, " KV heads"));
  }
  const int group = num_heads / num_kv_heads;
  if (group > kMaxGroup) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA attention: ", group, " query heads per KV head (at most ", kMaxGroup, ")"));
  }
  AttentionPlan plan;
  plan.split = num_rows <= kSplitMaxRows;
  plan.tiles = allow_tiles && kv_dtype == DType::kBF16 && TilesTakeHeadDim(head_dim);
  if (plan.split) {
    plan.workspace_bytes = sizeof(float) * static_cast<size_t>(num_rows) * num_heads * kSplitSlots *
                           StateFloats(head_dim);
  }
  if (!plan.tiles) {
    plan.threads = 32 * group;
    plan.shared_bytes = AttentionSharedBytes(group, head_dim);
    return plan;
  }
  plan.threads = kTileThreads;
  plan.shared_bytes = TileSharedBytes(head_dim, !plan.split);
  plan.tile_rows = kTileSlots / group;
  const int32_t least = (num_rows + plan.tile_rows - 1) / plan.tile_rows;
  plan.grid_tiles = std::min(num_rows, least + kTileExtraCtas);
  // The states are whole multiples of kSplitSlots floats (64 bytes): the list is 16-byte aligned.
  static_assert(kSplitSlots * sizeof(float) % 16 == 0);
  plan.tile_list_offset = plan.workspace_bytes;
  plan.workspace_bytes = plan.tile_list_offset + sizeof(int32_t) * (size_t{2} + num_rows);
  return plan;
}

absl::StatusOr<bool> TilesAllowed(const char* env_value) {
  const std::string value = env_value == nullptr ? "" : env_value;
  if (value.empty() || value == "auto") return true;
  if (value == "rows") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("RIDGESERVE_CUDA_ATTENTION=", value, ": want auto or rows"));
}

}  // namespace ridgeserve::cuda
