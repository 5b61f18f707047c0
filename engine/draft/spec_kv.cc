#include "engine/draft/spec_kv.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/draft/attention_scores.h"
#include "engine/draft/spec_pc.h"

namespace ridgeserve {
namespace {

constexpr int32_t kBlockSize = 16;

}  // namespace

std::vector<std::vector<int32_t>> SelectSpecKvLayer(
    Backend& backend, const KvLayerView& kv, std::span<const int32_t> blocks,
    const ModelConfig& config, std::span<const float> queries,
    std::span<const int32_t> query_positions, int32_t prompt_tokens, const SpecKvParams& params) {
  const int32_t kv_heads = config.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  const int32_t scored = prompt_tokens - params.window;  // keys outside the window
  std::vector<float> score(static_cast<size_t>(kv_heads) * scored);
  const std::vector<float> weights(query_positions.size(), 1.0f);
  backend.AttentionScores(kv, blocks, queries.data(), config.num_heads, query_positions, weights,
                          scale, scored, score.data());
  std::vector<std::vector<int32_t>> kept(kv_heads);
  for (int32_t g = 0; g < kv_heads; ++g) {
    const std::vector<int32_t> order = ByDecreasingScore(CentredMaxPool(
        std::span(score).subspan(static_cast<size_t>(g) * scored, scored), params.kernel));
    kept[g].assign(order.begin(), order.begin() + (params.budget - params.window));
    for (int32_t j = scored; j < prompt_tokens; ++j) kept[g].push_back(j);
    std::sort(kept[g].begin(), kept[g].end());
  }
  return kept;
}

void CompactKvLayer(Backend& backend, const KvLayerView& kv, std::span<const int32_t> blocks,
                    const std::vector<std::vector<int32_t>>& kept) {
  std::vector<int32_t> from;
  for (const std::vector<int32_t>& head : kept) from.insert(from.end(), head.begin(), head.end());
  backend.CompactKv(kv, blocks, from, static_cast<int32_t>(kept.front().size()));
}

SpecKvSequence::SpecKvSequence(LlamaModel& target, int32_t max_prompt_tokens,
                               int32_t max_new_tokens, DType kv_dtype)
    : target_(target) {
  const ModelConfig& c = target.config();
  const int32_t tokens = max_prompt_tokens + std::max(max_new_tokens, kSpecPcMaxLookahead);
  absl::StatusOr<PagedKvCache> cache = PagedKvCache::Create(
      target.backend(), KvCacheShape{c.num_layers, c.num_kv_heads, c.head_dim, kBlockSize,
                                     (tokens + kBlockSize - 1) / kBlockSize, kv_dtype});
  if (cache.ok()) {
    cache_ = std::make_unique<PagedKvCache>(std::move(*cache));
  } else {
    init_ = cache.status();
  }
}

SpecKvSequence::~SpecKvSequence() {
  if (cache_ != nullptr) table_.Release(cache_->pool());
}

absl::Status SpecKvSequence::Append(std::span<const int32_t> tokens, int32_t chunk, bool all_logits,
                                    std::vector<float>& logits) {
  RS_RETURN_IF_ERROR(init_);
  const int32_t n = static_cast<int32_t>(tokens.size());
  RS_RETURN_IF_ERROR(table_.Reserve(cache_->pool(), places_ + n, kBlockSize));
  const int32_t vocab = target_.config().vocab_size;
  std::vector<float> chunk_logits;
  logits.clear();
  for (int32_t begin = 0; begin < n; begin += chunk) {
    const int32_t count = std::min(chunk, n - begin);
    ForwardBatch batch;
    batch.AddSequence(table_, kBlockSize, tokens.subspan(begin, count), places_, true);
    if (all_logits) batch.RequestAllLogits();
    for (int32_t i = 0; i < count; ++i) batch.rope_positions.push_back(next_position_ + i);
    RS_RETURN_IF_ERROR(target_.Forward(batch, *cache_, chunk_logits));
    places_ += count;
    next_position_ += count;
    if (all_logits || begin + count == n) {
      logits.insert(logits.end(), chunk_logits.end() - (all_logits ? count * vocab : vocab),
                    chunk_logits.end());
    }
  }
  return absl::OkStatus();
}

absl::Status SpecKvSequence::Prefill(LlamaModel& draft, int32_t draft_layers,
                                     const SpecKvParams& params, std::span<const int32_t> prompt,
                                     int32_t chunk, std::span<const int32_t> stop_ids,
                                     std::vector<float>& first_logits) {
  RS_RETURN_IF_ERROR(init_);
  if (places_ != 0) return absl::FailedPreconditionError("SpecKV prefill: sequence not empty");
  if (target_.shard().size != 1) {
    return absl::FailedPreconditionError("SpecKV runs at tensor parallel 1 only");
  }
  const int32_t P = static_cast<int32_t>(prompt.size());
  if (params.budget >= P) return Append(prompt, chunk, false, first_logits);
  if (params.budget <= params.window || params.lookahead_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("SpecKV: budget ", params.budget,
                                                   " must exceed the window (", params.window,
                                                   ") and lookahead_tokens be >= 1"));
  }
  const DType kv_dtype = cache_->shape().dtype;
  {
    // The draft's lookahead answer, in its own cache.
    const ModelConfig& dc = draft.config();
    const int32_t total = P + params.lookahead_tokens;
    RS_ASSIGN_OR_RETURN(
        PagedKvCache draft_cache,
        PagedKvCache::Create(draft.backend(),
                             KvCacheShape{draft_layers, dc.num_kv_heads, dc.head_dim, kBlockSize,
                                          (total + kBlockSize - 1) / kBlockSize, kv_dtype}));
    BlockTable draft_table;
    RS_RETURN_IF_ERROR(draft_table.Reserve(draft_cache.pool(), total, kBlockSize));
    RS_ASSIGN_OR_RETURN(lookahead_,
                        RunDraftLookahead(draft, draft_layers, draft_cache, draft_table, prompt,
                                          params.lookahead_tokens, chunk, stop_ids, nullptr));
    draft_table.Release(draft_cache.pool());
  }
  // The target over prompt + lookahead; the window's and the lookahead's queries captured at
  // every layer, the first token's logits from the last prompt row.
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  tokens.insert(tokens.end(), lookahead_.begin(), lookahead_.end());
  const int32_t T = static_cast<int32_t>(tokens.size());
  RS_RETURN_IF_ERROR(table_.Reserve(cache_->pool(), T, kBlockSize));
  const ModelConfig& c = target_.config();
  std::vector<std::vector<float>> queries(c.num_layers);
  std::vector<int32_t> query_positions;
  std::vector<float> logits;
  for (int32_t begin = 0; begin < T; begin += chunk) {
    const int32_t count = std::min(chunk, T - begin);
    ForwardBatch batch;
    batch.AddSequence(table_, kBlockSize, std::span(tokens).subspan(begin, count), begin, false);
    const bool last_prompt_row = begin <= P - 1 && P - 1 < begin + count;
    if (last_prompt_row) batch.logit_rows = {P - 1 - begin};
    ForwardCapture capture;
    for (int32_t l = 0; l < c.num_layers; ++l) capture.query_layers.push_back(l);
    for (int32_t p = std::max(begin, P - params.window); p < begin + count; ++p) {
      capture.query_rows.push_back(p - begin);
      query_positions.push_back(p);
    }
    RS_RETURN_IF_ERROR(target_.Forward(batch, *cache_, logits, &capture));
    if (last_prompt_row) first_logits = logits;
    for (int32_t l = 0; l < c.num_layers; ++l) {
      queries[l].insert(queries[l].end(), capture.queries[l].begin(), capture.queries[l].end());
    }
  }
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const KvLayerView kv = cache_->layer(l);
    kept_.push_back(SelectSpecKvLayer(target_.backend(), kv, table_.blocks(), c, queries[l],
                                      query_positions, P, params));
    CompactKvLayer(target_.backend(), kv, table_.blocks(), kept_.back());
  }
  places_ = params.budget;
  next_position_ = P;
  return absl::OkStatus();
}

}  // namespace ridgeserve
