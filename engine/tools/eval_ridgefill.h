// RidgeFill quality evaluations for ridgeserve-eval: `needle` (passkey retrieval from the
// filled region) and `distant-loss` (next-token NLL of exact tail tokens, overall and on the
// tokens that need the distant context). Both compare an exact prefill with a RidgeFill one
// of the same prompt and print one JSON object.
//
// Threading: single-threaded; the model (and the maps set on it) is used exclusively by the
// caller's thread for the duration of a call.
#ifndef RIDGESERVE_ENGINE_TOOLS_EVAL_RIDGEFILL_H_
#define RIDGESERVE_ENGINE_TOOLS_EVAL_RIDGEFILL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {

struct NeedleOptions {
  std::string haystack_text;     // filler text (repeated when short)
  std::vector<int32_t> lengths;  // prompt lengths in tokens (BOS and question included)
  std::vector<double> depths;    // needle position as a fraction of the filled region, [0, 1]
  int32_t trials = 5;            // per (length, depth): different numbers and haystack offsets
  int32_t exact_tail_tokens = 1024;
  std::vector<int32_t> splits;  // split layers to evaluate (maps must be set on the model)
  int32_t new_tokens = 8;       // greedy tokens decoded after the question
  int32_t chunk = 512;
  uint64_t seed = 1;
};

// Needs model.llama->SetRidgeFillMaps() with maps for every split in `options.splits`.
// {"results": [{"prompt_tokens", "depth", "split_layer", "exact_accuracy",
//   "ridgefill_accuracy", ...}], ...}. The needle is placed inside the filled region
// [sink, prompt_tokens - exact_tail_tokens) when it fits there, else (no filled region, e.g.
// exact_tail_tokens >= prompt_tokens) inside the whole prompt before the question; then
// RidgeFill runs with no filled rows and must equal exact.
absl::StatusOr<nlohmann::json> RunNeedle(Model& model, const NeedleOptions& options);

struct DistantLossOptions {
  std::string text;
  int32_t prompt_tokens = 4096;  // per window: filled prefix + exact tail
  int32_t exact_tail_tokens = 1024;
  std::vector<int32_t> splits;
  int32_t windows = 1;  // consecutive non-overlapping windows of the text, averaged over
  // A tail token is "distant-dependent" when its NLL with the full (exact) context is lower
  // than with the tail alone as context by more than this many nats.
  double distant_threshold_nats = 1.0;
  int32_t chunk = 512;
};

// Scores the tail's tokens 2..T (predicted from exact tail rows; the first tail token's
// predictor is the last prefix row, which is filled) for: exact full context, RidgeFill
// (prefix filled with split s) and the tail alone (exact). Needs maps as for RunNeedle.
// {"splits": [{"split_layer", "all_tokens": {"count", "exact_nll", "ridgefill_nll",
//   "tail_only_nll"}, "distant_tokens": {"count", "exact_nll", "ridgefill_nll",
//   "relative_increase"}}], ...}; with one split its fields are also at the top level.
absl::StatusOr<nlohmann::json> RunDistantLoss(Model& model, const DistantLossOptions& options);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_EVAL_RIDGEFILL_H_
