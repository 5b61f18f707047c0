#include "engine/ridgefill/ridgefill_plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/kv/block_pool.h"

namespace ridgeserve {

absl::StatusOr<std::vector<uint8_t>> PlanRidgeFillRows(
    std::span<const int32_t> prompt, const RidgeFillPlanOptions& options,
    const std::function<bool(int32_t)>& is_special) {
  const int32_t n = static_cast<int32_t>(prompt.size());
  if (options.exact_tail_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("exact_tail_tokens must be >= 0, got ", options.exact_tail_tokens));
  }
  for (size_t i = 0; i < options.exact_spans.size(); ++i) {
    const auto [begin, end] = options.exact_spans[i];
    if (begin < 0 || end < begin || end > n) {
      return absl::InvalidArgumentError(absl::StrCat("exact_spans[", i, "] = [", begin, ", ", end,
                                                     ") is not a range in the ", n,
                                                     "-token prompt"));
    }
  }
  std::vector<uint8_t> filled(n, 0);
  if (n < options.min_prompt_tokens) return filled;
  // Rows [sinks, n - tail) are filled; the last row always stays exact (its logits).
  const int32_t end = std::min(n - 1, n - options.exact_tail_tokens);
  for (int32_t p = std::max(0, options.sink_tokens); p < end; ++p) {
    filled[p] = is_special(prompt[p]) ? 0 : 1;
  }
  for (const auto& [begin, span_end] : options.exact_spans) {
    std::fill(filled.begin() + begin, filled.begin() + span_end, 0);
  }
  return filled;
}

uint64_t RidgeFillCacheSalt(int32_t split_layer, uint64_t maps_id) {
  const int32_t key[] = {split_layer, 0x52464c4c};  // "RFLL": a namespace apart from exact
  const uint64_t salt = HashBlockTokens(maps_id, key);
  return salt == 0 ? 1 : salt;  // 0 is the exact requests' salt
}

}  // namespace ridgeserve
