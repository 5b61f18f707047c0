// Which prompt rows a RidgeFill request fills (DESIGN.md, "RidgeFill — our definition").
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_PLAN_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_PLAN_H_

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ridgeserve {

struct RidgeFillPlanOptions {
  int32_t exact_tail_tokens = 0;  // the prompt's last rows; the very last row is always exact
  int32_t sink_tokens = 4;        // the prompt's first rows (attention sinks)
  int32_t min_prompt_tokens = 0;  // shorter prompts are not filled at all
  std::span<const std::pair<int32_t, int32_t>> exact_spans;  // [begin, end) positions
};

// Per prompt position: 1 = filled row, 0 = exact row. Special tokens (is_special) stay exact.
// InvalidArgument for a negative tail or a span that is reversed or outside the prompt.
absl::StatusOr<std::vector<uint8_t>> PlanRidgeFillRows(
    std::span<const int32_t> prompt, const RidgeFillPlanOptions& options,
    const std::function<bool(int32_t)>& is_special);

// Prefix-cache salt of a RidgeFill request: requests whose rows hold different K/V for the
// same tokens (another split, or the same split from other maps) never share blocks. Which
// rows are filled is hashed per block on top of this (SchedRequest::filled_rows).
uint64_t RidgeFillCacheSalt(int32_t split_layer, uint64_t maps_id);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_RIDGEFILL_PLAN_H_
