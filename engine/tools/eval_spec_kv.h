// SpecKV evaluations for ridgeserve-eval (DESIGN.md, "SpecPC and SpecKV"; engine/draft/spec_kv.h):
// exact prefill against SpecKV on exactly the prompts of the RidgeFill and SpecPC evaluations
// (eval_prompts.h). SpecKV of a prompt of P tokens: the draft's lookahead answer, the target's
// prefill of prompt + lookahead, `budget` entries kept per layer and KV head, decoding over
// them at the prompt's positions (SpecKvSequence). A budget >= P keeps everything without
// running the draft, which reproduces exact.
//   ttft: exact prefill (to the first token's logits) against SpecKV's whole prefill: draft
//     lookahead + target prefill of prompt + lookahead + selection and compaction; alternated,
//     the minimum of `repetitions` runs each. SpecKV costs TTFT: it saves KV memory.
//   needle: each needle prompt through SpecKV (the draft's lookahead answers the question,
//     min(lookahead_tokens, new_tokens) tokens), then greedy decoding over the kept entries.
//   distant-loss: per window, the context prefix window[0, f) through SpecKV (the draft
//     continues the prefix), then the tail window[f, P) appended exactly over the kept entries
//     and scored as RunDistantLoss scores it.
//   KV bytes: budget × the target's bytes per token after the prefill, against P × the same.
#ifndef RIDGESERVE_ENGINE_TOOLS_EVAL_SPEC_KV_H_
#define RIDGESERVE_ENGINE_TOOLS_EVAL_SPEC_KV_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/draft/draft_model.h"
#include "engine/model/model.h"
#include "engine/tools/eval_prompts.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {

// The SpecKV settings to evaluate: every (draft, budget), drafts outermost.
struct SpecKvEvalOptions {
  std::vector<const DraftModel*> drafts;
  std::vector<int32_t> budgets;   // entries kept per layer and KV head, each >= kSpecKvMinBudget
  int32_t lookahead_tokens = 64;  // the draft's answer at most
};

// {"results": [{"prompt_tokens", "draft_model", "budget", "exact_seconds", "spec_kv_seconds",
//   "speedup" (exact / spec_kv, below 1), "kv_bytes", "exact_kv_bytes"}], ...}.
absl::StatusOr<nlohmann::json> RunSpecKvTtft(Model& model, const SpecKvEvalOptions& spec_kv,
                                             const TtftSetup& setup);

// RunNeedleTrials' rows with "draft_model", "budget" and "spec_kv_accuracy".
absl::StatusOr<nlohmann::json> RunSpecKvNeedle(Model& model, const SpecKvEvalOptions& spec_kv,
                                               const NeedleSetup& setup);

// {"results": [{"draft_model", "budget", "all_tokens": {..., "spec_kv_nll", ...},
//   "distant_tokens": {...}}], "prompt_tokens", "exact_tail_tokens", "prefix_tokens", ...}.
absl::StatusOr<nlohmann::json> RunSpecKvDistantLoss(Model& model, const SpecKvEvalOptions& spec_kv,
                                                    const DistantLossSetup& setup);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_EVAL_SPEC_KV_H_
