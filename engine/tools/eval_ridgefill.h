// RidgeFill evaluations for ridgeserve-eval: `ttft` (prefill time, exact vs RidgeFill),
// `needle` (passkey retrieval from the filled region), `distant-loss` (next-token NLL of exact
// tail tokens, overall and on the tokens that need the distant context), `splice` (which
// part of the filled K/V carries the NLL gap) and `next-token-kl` (the distribution after the
// prompt, as the server's shadow sampling compares it). Each compares an exact prefill with a
// RidgeFill one of the same prompt (eval_prompts.h) and returns one JSON object; eval_pareto.h puts
// them beside the other methods.
//
// Threading: single-threaded; the model and the maps are used exclusively by the caller's
// thread for the duration of a call.
#ifndef RIDGESERVE_ENGINE_TOOLS_EVAL_RIDGEFILL_H_
#define RIDGESERVE_ENGINE_TOOLS_EVAL_RIDGEFILL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/tools/eval_prompts.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {

class RidgeFillMaps;  // engine/ridgefill/ridgefill_maps.h

struct TtftOptions : TtftSetup {
  int32_t exact_tail_tokens = 1024;
  std::vector<int32_t> splits;
  const RidgeFillMaps* maps = nullptr;  // loaded for the model, with every split in `splits`
};

// Prefill time to the first token's logits, exact and RidgeFill alternated in one process
// (so drift hits both alike), the minimum of `repetitions` runs each. {"results":
// [{"prompt_tokens", "split_layer", "exact_tail_tokens", "filled_tokens", "exact_seconds",
// "ridgefill_seconds", "speedup", "measured_saved_seconds", "estimated_saved_seconds" (the engine's
// in-pass estimate of the fastest RidgeFill run)}]}.
absl::StatusOr<nlohmann::json> RunTtft(Model& model, const TtftOptions& options);

struct NeedleOptions : NeedleSetup {
  std::vector<int32_t> splits;          // split layers to evaluate
  const RidgeFillMaps* maps = nullptr;  // as TtftOptions'
};

// {"results": [{"prompt_tokens", "depth", "split_layer", "exact_accuracy",
//   "ridgefill_accuracy", ...}], ...}. The needle is placed inside the filled region
// [sink, prompt_tokens - exact_tail_tokens) when it fits there, else (no filled region, e.g.
// exact_tail_tokens >= prompt_tokens) inside the whole prompt before the question; then
// RidgeFill runs with no filled rows and must equal exact.
absl::StatusOr<nlohmann::json> RunNeedle(Model& model, const NeedleOptions& options);

// The prefix (prompt_tokens - exact_tail_tokens) is filled, the tail exact.
struct DistantLossOptions : DistantLossSetup {
  std::vector<int32_t> splits;
  const RidgeFillMaps* maps = nullptr;  // as TtftOptions'
};

// Scores the tail's tokens 2..T (predicted from exact tail rows; the first tail token's
// predictor is the last prefix row, which is filled) for: exact full context, RidgeFill
// (prefix filled with split s) and the tail alone (exact).
// {"splits": [{"split_layer", "all_tokens": {"count", "exact_nll", "ridgefill_nll",
//   "tail_only_nll"}, "distant_tokens": {"count", "exact_nll", "ridgefill_nll",
//   "relative_increase"}}], ...}; with one split its fields are also at the top level.
absl::StatusOr<nlohmann::json> RunDistantLoss(Model& model, const DistantLossOptions& options);

struct NextTokenKlOptions {
  std::vector<int32_t> tokens;  // the prompt
  int32_t exact_tail_tokens = 1024;
  int32_t chunk = 512;
  std::vector<int32_t> splits;
  const RidgeFillMaps* maps = nullptr;  // as TtftOptions'
};

// Offline, what the server's shadow sampling (--ridgefill_shadow_fraction) measures of one
// RIDGEFILL request: KL(exact ‖ RidgeFill) of the next-token distributions after the prompt
// and their top-1 agreement, per split, with the server's row plan. {"prompt_tokens",
// "exact_tail_tokens", "splits": [{"split_layer", "filled_tokens", "kl", "top1_agree",
// "exact_top1", "ridgefill_top1"}]}.
absl::StatusOr<nlohmann::json> RunNextTokenKl(Model& model, const NextTokenKlOptions& options);

struct SpliceOptions {
  DistantLossOptions window;  // text, prompt_tokens, exact_tail_tokens, splits, windows, ...
  bool per_layer = false;     // also splice exact K and V into one layer at a time
};

// Where RidgeFill's NLL gap comes from. Per window and split s: the prefix rows [0, f) are
// prefilled exactly (runner A) and with RidgeFill, every row but the sinks filled (runner B).
// Layers 0..s + 1 of the filled rows are exact in both; in layers s + 2.. B's predicted K/V are
// then replaced by A's: K only, V only, both (must reproduce exact), or only the key norms
// (each predicted key head-vector rescaled to the exact one's norm; RoPE preserves norms).
// The tail is then run exactly and scored as in RunDistantLoss (all and distant-dependent
// tokens). {"exact": {...}, "splits": [{"split_layer", "variants": {"ridgefill", "exact_k",
// "exact_v", "exact_kv", "exact_key_norm"}: {"all_nll", "distant_nll", "all_gap_closed",
// "distant_gap_closed"}, "per_layer": [...]}], ...}; gap_closed = (ridgefill - variant) /
// (ridgefill - exact).
absl::StatusOr<nlohmann::json> RunSplice(Model& model, const SpliceOptions& options);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_EVAL_RIDGEFILL_H_
