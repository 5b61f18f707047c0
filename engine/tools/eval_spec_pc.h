// SpecPC evaluations for ridgeserve-eval (DESIGN.md, "SpecPC and SpecKV"): exact prefill
// against SpecPC on exactly the prompts of the RidgeFill evaluations (eval_prompts.h). SpecPC
// of a prompt of P tokens: the draft phase (RunSpecPcDraft, engine/draft/spec_pc.h) keeps
// C = min(budget, P) positions; the target then prefills the kept tokens as an ordinary prompt
// (positions renumbered 0..C-1, or kept: SpecPcEvalOptions::original_positions) and decodes
// from there. Every result row has "original_positions". A budget >= P keeps every token without
// running the draft, which reproduces exact.
//   ttft: the ttft prompt's exact prefill (to the first token's logits) against SpecPC's time
//     = the draft phase + the target's prefill of the kept tokens, alternated in one process;
//     the minimum of `repetitions` runs each (for SpecPC, the run with the smallest sum).
//   needle: each needle prompt compressed (the draft sees all of it, question included), then
//     greedy decoding; a hit is an answer that contains the number, as in RunNeedle.
//   distant-loss: per window of P tokens, the context prefix window[0, f), f = P -
//     exact_tail_tokens, is compressed (the draft sees the prefix only); the tail window[f, P)
//     follows the C kept tokens exactly. Scored as RunDistantLoss scores it: the next-token NLLs
//     of window[f + 1 ..] from the tail's rows, over all of them and over the distant-dependent
//     ones (exact full-context NLL lower than with the tail alone as context by more than
//     distant_threshold_nats), averaged over windows.
//   KV bytes: the target's KV after prefill, C × its bytes per token (KvCacheShape::
//     BytesPerToken: layers, KV heads, head dim, KV dtype), against P × the same for exact; and
//     the draft's transient KV while it runs, (P + lookahead - 1) × the draft's bytes per token.
//
// Threading: single-threaded; the model and the drafts are used exclusively by the caller's
// thread for the duration of a call.
#ifndef RIDGESERVE_ENGINE_TOOLS_EVAL_SPEC_PC_H_
#define RIDGESERVE_ENGINE_TOOLS_EVAL_SPEC_PC_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/draft/draft_model.h"
#include "engine/model/model.h"
#include "engine/tools/eval_prompts.h"
#include "kernels/dtype.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {

// The SpecPC settings to evaluate: every (draft, budget), drafts outermost.
struct SpecPcEvalOptions {
  std::vector<const DraftModel*> drafts;  // of the evaluated model (LoadDraftModel)
  std::vector<int32_t> budgets;           // kept prompt tokens, each >= kSpecPcMinBudget
  int32_t lookahead_tokens = 1;
  int32_t kernel = 0;  // pooling / neighbour width; 0 = DefaultSpecPcParams'
  // The kept tokens keep their prompt positions (RoPE), and what follows them (the tail, the
  // answer) continues after the prompt, as the server's --spec_pc_original_positions; else
  // they are renumbered 0..C-1. The prefill costs the same either way.
  bool original_positions = false;
};

// K plus V bytes of one token in `layers` layers of a model shaped like `config`.
size_t KvBytesPerToken(const ModelConfig& config, int32_t layers, DType dtype);

// {"results": [{"prompt_tokens", "draft_model", "budget", "kept_tokens", "exact_seconds",
//   "draft_seconds", "target_prefill_seconds", "spec_pc_seconds" (their sum), "speedup"
//   (exact / spec_pc), "kv_bytes", "exact_kv_bytes", "draft_kv_bytes"}], "repetitions", ...}.
absl::StatusOr<nlohmann::json> RunSpecPcTtft(Model& model, const SpecPcEvalOptions& spec_pc,
                                             const TtftSetup& setup);

// {"results": [{"prompt_tokens", "depth", "draft_model", "budget", "exact_tail_tokens",
//   "needle_in_filled_region", "trials", "exact_accuracy", "spec_pc_accuracy", "samples"}], ...}
// (RunNeedleTrials' rows).
absl::StatusOr<nlohmann::json> RunSpecPcNeedle(Model& model, const SpecPcEvalOptions& spec_pc,
                                               const NeedleSetup& setup);

// {"results": [{"draft_model", "budget", "kept_tokens" (of the prefix), "all_tokens": {"count",
//   "exact_nll", "spec_pc_nll", "tail_only_nll", "relative_increase"}, "distant_tokens": {...}}],
//  "prompt_tokens", "exact_tail_tokens", "prefix_tokens", "windows", "distant_threshold_nats"}.
absl::StatusOr<nlohmann::json> RunSpecPcDistantLoss(Model& model, const SpecPcEvalOptions& spec_pc,
                                                    const DistantLossSetup& setup);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_EVAL_SPEC_PC_H_
