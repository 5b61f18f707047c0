// The settings of ridgeserve-eval's draft-based methods (SpecPC, SpecKV: eval_spec_pc.h,
// eval_spec_kv.h): every (draft, budget) pair to evaluate.
#ifndef RIDGESERVE_ENGINE_TOOLS_EVAL_DRAFTS_H_
#define RIDGESERVE_ENGINE_TOOLS_EVAL_DRAFTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/draft/draft_model.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {

struct DraftSetting {
  const DraftModel* draft = nullptr;
  int32_t budget = 0;

  // {"draft_model", "budget"}: how result rows name the setting.
  nlohmann::json Describe() const;
};

// Every (draft, budget), drafts outermost. InvalidArgument naming `method` without drafts or
// budgets, for a budget below `min_budget` or a lookahead outside [1, kSpecPcMaxLookahead].
absl::StatusOr<std::vector<DraftSetting>> DraftSettings(
    const std::string& method, const std::vector<const DraftModel*>& drafts,
    const std::vector<int32_t>& budgets, int32_t min_budget, int32_t lookahead);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_EVAL_DRAFTS_H_
