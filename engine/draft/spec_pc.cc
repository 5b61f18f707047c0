#include "engine/draft/spec_pc.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/common/status_macros.h"
#include "engine/draft/attention_scores.h"
#include "kernels/sample_spec.h"

namespace ridgeserve {

SpecPcParams DefaultSpecPcParams(const ModelConfig& target, int32_t draft_layers, int32_t budget,
                                 int32_t lookahead_tokens) {
  SpecPcParams p;
  p.budget = budget;
  p.lookahead_tokens = lookahead_tokens;
  const bool qwen = target.arch == Architecture::kQwen2 || target.arch == Architecture::kQwen3;
  p.kernel = qwen ? 64 : 32;
  p.num_layers = draft_layers;
  p.first_layer = draft_layers / 2;
  return p;
}

SpecPcScorer::SpecPcScorer(const ModelConfig& config, const SpecPcParams& params,
                           int32_t prompt_tokens)
    : config_(config), params_(params), prompt_tokens_(prompt_tokens) {
  const size_t rows = static_cast<size_t>(params_.window + params_.lookahead_tokens - 1);
  queries_.assign(rows * layers().size() * config_.num_heads * config_.head_dim, 0.0f);
}

std::vector<int32_t> SpecPcScorer::layers() const {
  std::vector<int32_t> out(params_.num_layers - params_.first_layer);
  std::iota(out.begin(), out.end(), params_.first_layer);
  return out;
}

void SpecPcScorer::SetQuery(int32_t position, int32_t layer_index, std::span<const float> q) {
  const size_t q_dim = static_cast<size_t>(config_.num_heads) * config_.head_dim;
  const size_t row = position - (prompt_tokens_ - params_.window);
  const size_t rows = params_.window + params_.lookahead_tokens - 1;
  std::copy(q.begin(), q.begin() + q_dim, queries_.begin() + (layer_index * rows + row) * q_dim);
}

std::vector<float> SpecPcScorer::Scores(const PagedKvCache& cache, Backend& backend,
                                        std::span<const int32_t> blocks) const {
  const int32_t P = prompt_tokens_;
  const int32_t W = params_.window;
  const int32_t rows = W + params_.lookahead_tokens - 1;
  const int32_t kv_heads = config_.num_kv_heads;
  const size_t q_dim = static_cast<size_t>(config_.num_heads) * config_.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  std::vector<int32_t> positions(rows);
  std::vector<float> weights(rows);
  for (int32_t row = 0; row < rows; ++row) {
    positions[row] = P - W + row;  // the query's position: it sees keys 0..P - W + row
    // linspace(0, 1, W) over the prompt window; lookahead rows weigh 1.
    weights[row] = row < W && W > 1 ? static_cast<float>(row) / (W - 1) : 1.0f;
  }
  const std::vector<int32_t> scored = layers();
  std::vector<float> score(P, 0.0f), by_head(static_cast<size_t>(kv_heads) * P);
  for (size_t li = 0; li < scored.size(); ++li) {
    backend.AttentionScores(cache.layer(scored[li]), blocks, queries_.data() + li * rows * q_dim,
                            config_.num_heads, positions, weights, scale, P, by_head.data());
    for (int32_t g = 0; g < kv_heads; ++g) {
      for (int32_t j = 0; j < P; ++j) score[j] = std::max(score[j], by_head[g * P + j]);
    }
  }
  return score;
}

std::vector<int32_t> SelectSpecPcTokens(std::span<const float> scores, int32_t budget,
                                        int32_t kernel, int32_t window) {
  const int32_t P = static_cast<int32_t>(scores.size());
  std::vector<int32_t> kept;
  if (budget >= P) {
    kept.resize(P);
    std::iota(kept.begin(), kept.end(), 0);
    return kept;
  }
  const std::vector<int32_t> order = ByDecreasingScore(CentredMaxPool(scores, kernel));
  // Neighbour offsets nearest first, -o before +o: 0, -1, 1, -2, 2, ...
  const int32_t left = (kernel - 1) / 2, right = kernel - 1 - left;
  std::vector<int32_t> offsets;
  for (int32_t o = -left; o <= right; ++o) offsets.push_back(o);
  std::stable_sort(offsets.begin(), offsets.end(),
                   [](int32_t a, int32_t b) { return std::abs(a) < std::abs(b); });
  std::vector<uint8_t> taken(P, 0);
  auto take = [&](int32_t i) {
    if (taken[i] == 0 && static_cast<int32_t>(kept.size()) < budget) {
      taken[i] = 1;
      kept.push_back(i);
    }
  };
  for (int32_t i = std::max(0, P - window); i < P; ++i) take(i);
  for (int32_t r = 0; r < budget && static_cast<int32_t>(kept.size()) < budget; ++r) {
    for (int32_t o : offsets) take(std::clamp(order[r] + o, 0, P - 1));
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

absl::StatusOr<std::vector<int32_t>> RunDraftLookahead(LlamaModel& draft, int32_t num_layers,
                                                       PagedKvCache& cache, const BlockTable& table,
                                                       std::span<const int32_t> prompt, int32_t n,
                                                       int32_t chunk,
                                                       std::span<const int32_t> stop_ids,
                                                       SpecPcScorer* scorer) {
  const int32_t P = static_cast<int32_t>(prompt.size());
  const ModelConfig& c = draft.config();
  const size_t q_dim = static_cast<size_t>(c.num_heads) * c.head_dim;
  const int32_t block_size = cache.shape().block_size;
  std::vector<int32_t> layers;
  if (scorer != nullptr) layers = scorer->layers();
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<int32_t> lookahead;
  SampleSpec greedy;  // the lookahead is greedy, drawn on the backend
  greedy.temperature = 0.0f;
  SampledToken next;
  // Prefill in chunks, then one row per lookahead token but the last.
  for (int32_t begin = 0; static_cast<int32_t>(lookahead.size()) < n;) {
    const int32_t count = begin < P ? std::min(chunk, P - begin) : 1;
    ForwardBatch batch;
    batch.num_layers = num_layers;
    batch.AddSequence(table, block_size, std::span(tokens).subspan(begin, count), begin, true);
    ForwardCapture capture;
    capture.query_layers = layers;
    for (int32_t p = begin; scorer != nullptr && p < begin + count; ++p) {
      if (scorer->Wants(p)) capture.query_rows.push_back(p - begin);
    }
    RS_RETURN_IF_ERROR(draft.Run(batch, cache, &capture));
    for (size_t j = 0; j < capture.query_rows.size(); ++j) {
      for (size_t li = 0; li < layers.size(); ++li) {
        scorer->SetQuery(begin + capture.query_rows[j], static_cast<int32_t>(li),
                         std::span<const float>(capture.queries[li]).subspan(j * q_dim, q_dim));
      }
    }
    begin += count;
    if (begin < P) continue;
    RS_RETURN_IF_ERROR(draft.SampleLogits(std::span(&greedy, 1), {}, &next));
    lookahead.push_back(next.token);
    tokens.push_back(lookahead.back());
    if (std::find(stop_ids.begin(), stop_ids.end(), lookahead.back()) != stop_ids.end()) break;
  }
  return lookahead;
}

absl::StatusOr<SpecPcDraftResult> RunSpecPcDraft(LlamaModel& draft, const SpecPcParams& params,
                                                 std::span<const int32_t> prompt, int32_t chunk,
                                                 DType kv_dtype) {
  const int32_t P = static_cast<int32_t>(prompt.size());
  SpecPcDraftResult result;
  if (params.budget >= P) {
    result.kept = SelectSpecPcTokens(std::vector<float>(P, 0.0f), params.budget, params.kernel,
                                     params.window);
    return result;
  }
  const ModelConfig& c = draft.config();
  constexpr int32_t kBlockSize = 16;
  const int32_t total = P + params.lookahead_tokens;
  RS_ASSIGN_OR_RETURN(
      PagedKvCache cache,
      PagedKvCache::Create(draft.backend(),
                           KvCacheShape{params.num_layers, c.num_kv_heads, c.head_dim, kBlockSize,
                                        (total + kBlockSize - 1) / kBlockSize, kv_dtype}));
  BlockTable table;
  RS_RETURN_IF_ERROR(table.Reserve(cache.pool(), total, kBlockSize));
  SpecPcScorer scorer(c, params, P);
  // SpecPC's lookahead never stops early: the engine's draft runs lookahead_tokens.
  RS_ASSIGN_OR_RETURN(result.lookahead_ids,
                      RunDraftLookahead(draft, params.num_layers, cache, table, prompt,
                                        params.lookahead_tokens, chunk, {}, &scorer));
  result.scores = scorer.Scores(cache, draft.backend(), table.blocks());
  result.kept = SelectSpecPcTokens(result.scores, params.budget, params.kernel, params.window);
  table.Release(cache.pool());
  return result;
}

}  // namespace ridgeserve
