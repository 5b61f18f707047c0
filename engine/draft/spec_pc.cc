#include "engine/draft/spec_pc.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/common/status_macros.h"
#include "engine/sampling/sampler.h"

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
  std::copy(q.begin(), q.begin() + q_dim,
            queries_.begin() + (row * layers().size() + layer_index) * q_dim);
}

std::vector<float> SpecPcScorer::Scores(const PagedKvCache& cache, Backend& backend,
                                        std::span<const int32_t> blocks) const {
  const int32_t P = prompt_tokens_;
  const int32_t W = params_.window;
  const int32_t T = end_position();  // cached keys: prompt + lookahead rows that ran
  const int32_t heads = config_.num_heads, kv_heads = config_.num_kv_heads;
  const int32_t d = config_.head_dim, group = heads / kv_heads;
  const size_t kv_dim = static_cast<size_t>(kv_heads) * d, q_dim = static_cast<size_t>(heads) * d;
  const int32_t block_size = cache.shape().block_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::vector<int32_t> scored = layers();
  std::vector<float> keys(static_cast<size_t>(T) * kv_dim), values(keys.size());
  std::vector<float> score(P, 0.0f), logits(T);
  for (size_t li = 0; li < scored.size(); ++li) {
    // The sequence's keys, block by block (its blocks need not be contiguous).
    for (int32_t pos = 0; pos < T; pos += block_size) {
      const int32_t count = std::min(block_size, T - pos);
      cache.CopyToHost(backend, scored[li], blocks[pos / block_size] * block_size, count,
                       keys.data() + pos * kv_dim, values.data() + pos * kv_dim);
    }
    for (int32_t row = 0; row < W + params_.lookahead_tokens - 1; ++row) {
      const int32_t p = P - W + row;  // the query's position: it sees keys 0..p
      // linspace(0, 1, W) over the prompt window; lookahead rows weigh 1.
      const float weight = row < W ? (W > 1 ? static_cast<float>(row) / (W - 1) : 1.0f) : 1.0f;
      for (int32_t h = 0; h < heads; ++h) {
        const float* q = queries_.data() + (row * scored.size() + li) * q_dim + h * d;
        const float* k = keys.data() + (h / group) * d;
        float max_logit = -INFINITY;
        for (int32_t j = 0; j <= p; ++j) {
          float dot = 0;
          for (int32_t e = 0; e < d; ++e) dot += q[e] * k[j * kv_dim + e];
          logits[j] = dot * scale;
          max_logit = std::max(max_logit, logits[j]);
        }
        float sum = 0;
        for (int32_t j = 0; j <= p; ++j) {
          logits[j] = std::exp(logits[j] - max_logit);
          sum += logits[j];
        }
        const float norm = weight / sum;
        for (int32_t j = 0; j < std::min(p + 1, P); ++j) {
          score[j] = std::max(score[j], logits[j] * norm);
        }
      }
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
  // Centred max-pool: position i sees [i - (kernel-1)/2, i + kernel/2], zero outside (scores
  // are probabilities, so starting from the padding's 0 changes nothing inside).
  const int32_t left = (kernel - 1) / 2, right = kernel - 1 - left;
  std::vector<float> pooled(P);
  for (int32_t i = 0; i < P; ++i) {
    float m = 0.0f;
    for (int32_t j = std::max(0, i - left); j <= std::min(P - 1, i + right); ++j) {
      m = std::max(m, scores[j]);
    }
    pooled[i] = m;
  }
  std::vector<int32_t> order(P);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return pooled[a] > pooled[b]; });
  // Neighbour offsets nearest first, -o before +o: 0, -1, 1, -2, 2, ...
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
  const std::vector<int32_t> layers = scorer.layers();
  const size_t q_dim = static_cast<size_t>(c.num_heads) * c.head_dim;
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<float> logits;
  // Prefill in chunks, then one row per lookahead step; the last lookahead token never runs.
  for (int32_t begin = 0; begin < scorer.end_position();) {
    const int32_t count = begin < P ? std::min(chunk, P - begin) : 1;
    ForwardBatch batch;
    batch.num_layers = params.num_layers;
    batch.AddSequence(table, kBlockSize, std::span(tokens).subspan(begin, count), begin, true);
    ForwardCapture capture;
    capture.query_layers = layers;
    for (int32_t p = begin; p < begin + count; ++p) {
      if (scorer.Wants(p)) capture.query_rows.push_back(p - begin);
    }
    RS_RETURN_IF_ERROR(draft.Forward(batch, cache, logits, &capture));
    for (size_t j = 0; j < capture.query_rows.size(); ++j) {
      for (size_t li = 0; li < layers.size(); ++li) {
        scorer.SetQuery(begin + capture.query_rows[j], static_cast<int32_t>(li),
                        std::span<const float>(capture.queries[li]).subspan(j * q_dim, q_dim));
      }
    }
    begin += count;
    if (begin >= P) {
      result.lookahead_ids.push_back(Argmax(logits));
      tokens.push_back(result.lookahead_ids.back());
    }
  }
  result.scores = scorer.Scores(cache, draft.backend(), table.blocks());
  result.kept = SelectSpecPcTokens(result.scores, params.budget, params.kernel, params.window);
  table.Release(cache.pool());
  return result;
}

}  // namespace ridgeserve
