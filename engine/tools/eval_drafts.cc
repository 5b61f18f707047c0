#include "engine/tools/eval_drafts.h"

#include "absl/strings/str_cat.h"
#include "engine/draft/spec_pc.h"

namespace ridgeserve {

nlohmann::json DraftSetting::Describe() const {
  return {{"draft_model", draft->name}, {"budget", budget}};
}

absl::StatusOr<std::vector<DraftSetting>> DraftSettings(
    const std::string& method, const std::vector<const DraftModel*>& drafts,
    const std::vector<int32_t>& budgets, int32_t min_budget, int32_t lookahead) {
  if (drafts.empty() || budgets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(method, ": need a draft model and budgets"));
  }
  if (lookahead < 1 || lookahead > kSpecPcMaxLookahead) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": lookahead tokens must be in [1, ", kSpecPcMaxLookahead, "]"));
  }
  std::vector<DraftSetting> settings;
  for (const DraftModel* draft : drafts) {
    for (int32_t budget : budgets) {
      if (budget < min_budget) {
        return absl::InvalidArgumentError(
            absl::StrCat(method, ": budget ", budget, " is below ", min_budget));
      }
      settings.push_back({draft, budget});
    }
  }
  return settings;
}

}  // namespace ridgeserve
