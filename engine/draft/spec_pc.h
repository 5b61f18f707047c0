// SpecPC's scoring and selection (DESIGN.md, "SpecPC and SpecKV"; the reference
// implementation of arXiv 2506.08373). The draft prefills the P prompt tokens and decodes
// lookahead_tokens greedily; its post-RoPE queries of the last `window` prompt rows and of
// every lookahead decode row are captured (ForwardCapture::query_rows) in the scored layers
// [first_layer, draft layers). Then, from the draft's cached keys:
//   score[j] = max over scored layers, query heads and captured queries q at position p of
//              w(q) * softmax_{k <= p}(q · K_k / sqrt(head_dim))[j]          for j < P
// with w = linspace(0, 1, window) over the prompt window's rows and 1 for lookahead rows.
// Selection (SelectSpecPcTokens): scores max-pooled over `kernel` centred positions (zero
// padding), the top `budget` positions by pooled score (ties: lower position first), each
// expanded to its `kernel` neighbours [i - (kernel-1)/2, i + kernel/2] nearest first (−1 before
// +1), clamped to the prompt; then the window rows [P - window, P), then the expanded
// positions, duplicates dropped, the first `budget` kept, sorted by position.
#ifndef RIDGESERVE_ENGINE_DRAFT_SPEC_PC_H_
#define RIDGESERVE_ENGINE_DRAFT_SPEC_PC_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/config.h"
#include "engine/model/llama.h"
#include "kernels/backend.h"

namespace ridgeserve {

// The window the reference always keeps; budgets below it are refused.
inline constexpr int32_t kSpecPcWindow = 64;
inline constexpr int32_t kSpecPcMinBudget = kSpecPcWindow;
inline constexpr int32_t kSpecPcMaxLookahead = 64;

struct SpecPcParams {
  int32_t budget = 0;
  int32_t lookahead_tokens = 1;
  int32_t window = kSpecPcWindow;
  int32_t kernel = 32;      // pooling and neighbour width
  int32_t first_layer = 0;  // first scored draft layer
  int32_t num_layers = 0;   // draft layers run
};

// The reference's parameters for a draft of `draft_layers` layers of a model like `target`:
// kernel 64 for Qwen-family targets and 32 otherwise; scoring from layer 8 of 16 scaled to the
// draft's depth (first_layer = draft_layers / 2).
SpecPcParams DefaultSpecPcParams(const ModelConfig& target, int32_t draft_layers, int32_t budget,
                                 int32_t lookahead_tokens);

// One request's captured queries, and its scores once the lookahead has run.
class SpecPcScorer {
 public:
  // `config`: the draft's architecture; `prompt_tokens` P > params.window.
  SpecPcScorer(const ModelConfig& config, const SpecPcParams& params, int32_t prompt_tokens);

  // The draft rows whose queries are captured: positions [P - window, P + lookahead - 1).
  bool Wants(int32_t position) const {
    return position >= prompt_tokens_ - params_.window && position < end_position();
  }
  int32_t end_position() const { return prompt_tokens_ + params_.lookahead_tokens - 1; }
  const SpecPcParams& params() const { return params_; }
  // Scored draft layers: first_layer .. num_layers - 1.
  std::vector<int32_t> layers() const;
  // The queries of `position` at scored layer index `layer_index` (into layers()), q_dim floats.
  // A recompute (preemption) overwrites them with the same values.
  void SetQuery(int32_t position, int32_t layer_index, std::span<const float> q);

  // score[j] for j < P (see the file comment), from the draft cache's keys at `blocks`
  // (the request's block table; positions [0, end_position()) must be cached).
  std::vector<float> Scores(const PagedKvCache& cache, Backend& backend,
                            std::span<const int32_t> blocks) const;

 private:
  ModelConfig config_;
  SpecPcParams params_;
  int32_t prompt_tokens_ = 0;
  // [scored layer][captured position - (P - window)][q_dim]
  std::vector<float> queries_;
};

// The kept prompt positions (sorted, size min(budget, P)) for `scores` (size P).
std::vector<int32_t> SelectSpecPcTokens(std::span<const float> scores, int32_t budget,
                                        int32_t kernel, int32_t window);

// The draft's greedy continuation of `prompt`: prefilled in forward passes of `chunk` rows at
// cache places 0.. of `table` (reserved for prompt + n - 1 tokens) in `cache` (its first
// num_layers layers run), then decoded one row at a time until n tokens or one of `stop_ids`
// (included). With `scorer`, the rows it wants have their queries captured.
absl::StatusOr<std::vector<int32_t>> RunDraftLookahead(LlamaModel& draft, int32_t num_layers,
                                                       PagedKvCache& cache, const BlockTable& table,
                                                       std::span<const int32_t> prompt, int32_t n,
                                                       int32_t chunk,
                                                       std::span<const int32_t> stop_ids,
                                                       SpecPcScorer* scorer);

struct SpecPcDraftResult {
  std::vector<int32_t> lookahead_ids;  // the draft's greedy tokens
  std::vector<float> scores;           // [P]
  std::vector<int32_t> kept;           // sorted prompt positions
};

// SpecPC's draft phase for one prompt outside the engine (offline tools, tests): the draft
// runs the prompt and its lookahead (RunDraftLookahead) in its own KV cache on its backend (of
// `kv_dtype`), then scores and selects as the engine does. A budget >= the prompt keeps
// everything without running the draft.
absl::StatusOr<SpecPcDraftResult> RunSpecPcDraft(LlamaModel& draft, const SpecPcParams& params,
                                                 std::span<const int32_t> prompt, int32_t chunk,
                                                 DType kv_dtype);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_DRAFT_SPEC_PC_H_
