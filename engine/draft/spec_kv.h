// SpecKV (DESIGN.md, "SpecPC and SpecKV"; the reference implementation of arXiv 2506.08373):
// KV dropping guided by a draft's lookahead answer. The draft decodes a lookahead answer
// (greedy, up to lookahead_tokens or an end-of-generation token); the target prefills
// prompt + lookahead once, its post-RoPE queries of the last `window` prompt rows and of every
// lookahead row captured at every layer. Per layer and KV head g, for prompt keys j < P - window:
//   score[j] = max over the group's query heads and the captured queries q at position p of
//              softmax_{k <= p}(q · K_k / sqrt(head_dim))[j]
// max-pooled over `kernel` centred positions; the top (budget - window) positions (ties: lower
// first) plus the window [P - window, P) are kept, sorted by position, so every layer and KV
// head keeps exactly `budget` entries, each its own. The lookahead's KV is dropped; decoding
// starts after the prompt (RoPE positions P, P + 1, ...) over the kept entries, which keep
// their RoPE positions. The first token comes from the prefill's exact logits at the last prompt
// row. Differences from the reference, which reruns the last prompt token over the compressed
// cache at position `budget` and keeps the window one row earlier: ours keeps the last prompt row
// and decodes at the prompt's own positions.
#ifndef RIDGESERVE_ENGINE_DRAFT_SPEC_KV_H_
#define RIDGESERVE_ENGINE_DRAFT_SPEC_KV_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/llama.h"

namespace ridgeserve {

inline constexpr int32_t kSpecKvWindow = 32;
inline constexpr int32_t kSpecKvMinBudget = kSpecKvWindow + 1;

struct SpecKvParams {
  int32_t budget = 0;             // entries kept per layer and KV head
  int32_t lookahead_tokens = 64;  // the draft's answer, at most
  int32_t window = kSpecKvWindow;
  int32_t kernel = 7;
};

// One layer's kept positions, [kv_heads][budget] each sorted, from `queries` ([rows, q_dim] at
// `query_positions`, host) against the layer's keys `kv` of the sequence at `blocks` (places up to
// max(query_positions) cached), scored on the backend (Backend::AttentionScores).
std::vector<std::vector<int32_t>> SelectSpecKvLayer(
    Backend& backend, const KvLayerView& kv, std::span<const int32_t> blocks,
    const ModelConfig& config, std::span<const float> queries,
    std::span<const int32_t> query_positions, int32_t prompt_tokens, const SpecKvParams& params);

// Moves the layer's kept entries (kept[g] for KV head g) of the sequence at `blocks` to its
// places 0..budget-1, in order, on the backend (Backend::CompactKv).
void CompactKvLayer(Backend& backend, const KvLayerView& kv, std::span<const int32_t> blocks,
                    const std::vector<std::vector<int32_t>>& kept);

// One SpecKV sequence outside the engine (offline tools, tests): the draft's lookahead, the
// target's prefill of prompt + lookahead, selection and compaction, then decoding over the
// kept entries.
class SpecKvSequence {
 public:
  // Room for the prompt + lookahead, and `max_new_tokens` after the compaction.
  SpecKvSequence(LlamaModel& target, int32_t max_prompt_tokens, int32_t max_new_tokens,
                 DType kv_dtype);
  ~SpecKvSequence();

  // Runs SpecKV for `prompt` (draft: `draft` running its first draft_layers layers, cache of
  // kv_dtype); `first_logits` gets the target's logits after the prompt. A budget >= the prompt
  // keeps every entry (the draft does not run).
  absl::Status Prefill(LlamaModel& draft, int32_t draft_layers, const SpecKvParams& params,
                       std::span<const int32_t> prompt, int32_t chunk,
                       std::span<const int32_t> stop_ids, std::vector<float>& first_logits);
  // Appends tokens (the prompt itself when Prefill keeps everything) at the next cache places
  // and RoPE positions; logits of every row when all_logits, else of the last.
  absl::Status Append(std::span<const int32_t> tokens, int32_t chunk, bool all_logits,
                      std::vector<float>& logits);
  // Entries per layer and KV head in the cache now.
  int32_t cached_entries() const { return places_; }
  const std::vector<int32_t>& lookahead_ids() const { return lookahead_; }
  // The kept prompt positions, [layer][kv head][budget] (empty when everything was kept).
  const std::vector<std::vector<std::vector<int32_t>>>& kept() const { return kept_; }

 private:
  LlamaModel& target_;
  absl::Status init_;
  std::unique_ptr<PagedKvCache> cache_;
  BlockTable table_;
  int32_t places_ = 0;         // cache entries per layer and head
  int32_t next_position_ = 0;  // RoPE position of the next appended token
  std::vector<int32_t> lookahead_;
  std::vector<std::vector<std::vector<int32_t>>> kept_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_DRAFT_SPEC_KV_H_
