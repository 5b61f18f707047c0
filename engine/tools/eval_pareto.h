// ridgeserve-eval `pareto`: exact prefill, RidgeFill splits and SpecPC settings on the same
// ttft, needle, distant-loss and KV-bytes evaluations (eval_ridgefill.h, eval_spec_pc.h), one
// point per method and setting at each prompt length, the Pareto-optimal points marked.
//
// Threading: single-threaded; the model (and the maps set on it) is used exclusively by the
// caller's thread for the duration of a call.
#ifndef RIDGESERVE_ENGINE_TOOLS_EVAL_PARETO_H_
#define RIDGESERVE_ENGINE_TOOLS_EVAL_PARETO_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/tools/eval_ridgefill.h"
#include "engine/tools/eval_spec_kv.h"
#include "engine/tools/eval_spec_pc.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {

struct ParetoOptions {
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> tails;  // exact_tail_tokens values
  std::vector<int32_t> splits;
  const RidgeFillMaps* maps = nullptr;  // with every split in `splits`
  TtftOptions ttft;      // prompt_source, repetitions, chunk (lengths, tail, splits, maps set)
  NeedleOptions needle;  // haystack_text, depths, trials, seed, chunk
  DistantLossOptions distant;  // text, windows, distant_threshold_nats, chunk
  SpecPcEvalOptions spec_pc;   // no drafts: no SpecPC points
  SpecKvEvalOptions spec_kv;   // no drafts: no SpecKV points
};

// One operating point at one prompt length: larger speedup, smaller needle accuracy drop
// (exact - method) and smaller distant-token NLL increase (relative to exact) are better.
struct ParetoPoint {
  double speedup = 0;
  double needle_drop = 0;
  double distant_nll_increase = 0;
  bool pareto_optimal = false;
};

// Marks the points no other point dominates (at least as good in all three, better in one).
void MarkPareto(std::vector<ParetoPoint>& points);

// For every (prompt length, tail): RunTtft, RunNeedle and RunDistantLoss for all splits, and
// with SpecPC / SpecKV settings their needle and distant-loss runs on the same prompts (the tail
// sets the needle's region and the scored tail), their ttft once per length. One point per
// (prompt length, tail, method setting), Pareto marked over all methods per prompt length.
// Every point: {"method" ("ridgefill" | "spec_pc" | "spec_kv"), "prompt_tokens",
// "exact_tail_tokens",
//   "speedup", "exact_seconds", "<method>_seconds", "needle_trials", "needle_exact_accuracy",
//   "needle_<method>_accuracy", "distant_tokens", "distant_exact_nll", "distant_<method>_nll",
//   "distant_nll_increase", "all_exact_nll", "all_<method>_nll", "all_nll_increase",
//   "kv_bytes" (the target's KV after prefill), "exact_kv_bytes", "meets_target",
//   "pareto_optimal"}; RidgeFill points add "split_layer", "measured_saved_seconds",
//   "estimated_saved_seconds"; SpecPC points "draft_model", "budget", "lookahead_tokens",
//   "kept_tokens", "draft_seconds", "target_prefill_seconds", "draft_kv_bytes"; SpecKV points
//   "draft_model", "budget", "lookahead_tokens", "spec_kv_seconds".
//   {"points": [...], "pareto_objectives", "target": {...}}.
absl::StatusOr<nlohmann::json> RunPareto(Model& model, const ParetoOptions& options);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_EVAL_PARETO_H_
