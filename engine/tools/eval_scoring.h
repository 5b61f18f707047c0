// How ridgeserve-eval's evaluations measure a prefill method against exact prefill on the
// prompts of eval_prompts.h, for every method alike: prefill times, greedy needle answers and
// next-token NLLs of an exact tail, and the loops and sums that turn them into accuracies and
// mean NLLs.
//
// Threading: single-threaded; the model is used exclusively by the caller's thread.
#ifndef RIDGESERVE_ENGINE_TOOLS_EVAL_SCORING_H_
#define RIDGESERVE_ENGINE_TOOLS_EVAL_SCORING_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/tools/eval_prompts.h"
#include "engine/tools/sequence_runner.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {

// ttft's clock: prefills of prompts up to `max_tokens` long, each from an empty cache, in one
// runner that is reused so allocation stays out of the times.
class PrefillTimer {
 public:
  PrefillTimer(Model& model, int32_t max_tokens, int32_t chunk)
      : runner_(*model.llama, max_tokens), chunk_(chunk) {}

  // Seconds to prefill `prompt` (RidgeFill when `fill`) to its last token's logits.
  absl::StatusOr<double> Time(std::span<const int32_t> prompt, const RidgeFillRun* fill = nullptr);
  // The last prefill's runner (RidgeFill's in-pass estimates).
  const SequenceRunner& runner() const { return runner_; }

 private:
  SequenceRunner runner_;
  int32_t chunk_;
  std::vector<float> logits_;
};

// Prefills `prompt` (RidgeFill when `fill`) and greedily decodes `new_tokens` exact tokens.
// `rope_positions`: SequenceRunner::SetRopePositions (empty: the places).
absl::StatusOr<std::string> GreedyAnswer(Model& model, std::span<const int32_t> prompt,
                                         const RidgeFillRun* fill, int32_t new_tokens,
                                         int32_t chunk,
                                         std::span<const int32_t> rope_positions = {});

// Appends seq[runner.length() .. end) exactly, in pieces of `chunk` rows so the logits stay
// small ([chunk, vocab]), and appends each appended row i's next-token NLL (of seq[i + 1]) to
// `nll`; end < seq.size().
absl::Status AppendScored(Model& model, SequenceRunner& runner, std::span<const int32_t> seq,
                          int32_t end, int32_t chunk, std::vector<double>& nll);

// Next-token NLLs of seq[r + 1 ..] given seq[.. r], ..., i.e. from rows r .. size - 2. Row r
// and everything before it is one Append (RidgeFill when `fill`; row r itself must be exact),
// the rest exact (AppendScored). `rope_positions` as for GreedyAnswer.
absl::StatusOr<std::vector<double>> ScoreFrom(Model& model, std::span<const int32_t> seq, int32_t r,
                                              const RidgeFillRun* fill, int32_t chunk,
                                              std::span<const int32_t> rope_positions = {});

// NLLs of window[f + 1 ..] with the tail window[f ..] alone as context, behind the same BOS
// (without it the first rows lack their attention sink and would look "distant-dependent" for
// the wrong reason). `exact` holds the full-context NLLs of the same targets (used when f = 0).
absl::StatusOr<std::vector<double>> TailOnlyNll(Model& model, std::span<const int32_t> window,
                                                int32_t f, const std::vector<double>& exact,
                                                int32_t chunk);

// Tail tokens whose NLL drops by more than `threshold` nats when the distant context is there.
std::vector<bool> DistantMask(const std::vector<double>& exact,
                              const std::vector<double>& tail_only, double threshold);

// sum / count, null when count is 0.
nlohmann::json MeanOrNull(double sum, int64_t count);

// One setting of an approximate method in a needle run.
struct NeedleVariant {
  nlohmann::json fields;  // copied into its result rows, e.g. {"split_layer": 14}
  std::string name;       // keys its answers in the samples, e.g. "ridgefill_14"
};

// Variant v's greedy answer to `prompt`.
using NeedleAnswer =
    std::function<absl::StatusOr<std::string>(size_t v, const NeedlePrompt& prompt)>;

// needle's trials: per (length, depth) and trial the prompt (NeedlePrompts), the exact greedy
// answer and each variant's; a hit is an answer that contains the number. One row per (length,
// depth, variant): {"prompt_tokens", "depth", fields..., "exact_tail_tokens",
// "needle_in_filled_region", "trials", "exact_accuracy", "<method>_accuracy", "samples" (the
// first two trials' numbers and answers)}.
absl::StatusOr<nlohmann::json> RunNeedleTrials(Model& model, const NeedleSetup& setup,
                                               const std::vector<NeedleVariant>& variants,
                                               const std::string& method,
                                               const NeedleAnswer& answer);

// distant-loss's sums over windows: the exact full-context and tail-only NLLs of each window's
// scored targets window[f + 1 ..] and the distant-dependent ones among them, and the NLLs of
// any number of approximate runs ("variants") of the same targets.
class DistantLossTally {
 public:
  DistantLossTally(size_t variants, double threshold_nats);

  // Scores `window` exactly with the full context and with the tail window[f ..] alone.
  absl::Status AddWindow(Model& model, std::span<const int32_t> window, int32_t f, int32_t chunk);
  // Variant v's NLLs of the last AddWindow's targets.
  void AddVariant(size_t v, const std::vector<double>& nll);

  int64_t distant_count() const { return distant_.count; }
  // {"all_tokens": {"count", "exact_nll", nll_key, "tail_only_nll", "relative_increase"},
  //  "distant_tokens": {...}} for variant v; relative_increase = (nll - exact) / exact, null
  // without tokens.
  nlohmann::json Summary(size_t v, const std::string& nll_key) const;

 private:
  struct Sums {
    double exact = 0, tail_only = 0;
    int64_t count = 0;
  };

  double threshold_nats_;
  Sums all_, distant_;
  std::vector<double> variant_all_, variant_distant_;  // per variant
  std::vector<bool> is_distant_;                       // the last window's targets
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_EVAL_SCORING_H_
