#include "engine/tools/sequence_runner.h"

#include <algorithm>
#include <cassert>

#include "engine/common/status_macros.h"

namespace ridgeserve {

SequenceRunner::SequenceRunner(LlamaModel& model, int32_t max_tokens, int32_t block_size)
    : SequenceRunner(std::vector<LlamaModel*>{&model}, max_tokens, block_size) {
  // One rank alone would wait forever in its first collective.
  if (model.shard().size > 1) {
    init_ = absl::FailedPreconditionError(
        "SequenceRunner: a tensor-parallel rank runs only with its group (pass the Model)");
  }
}

SequenceRunner::SequenceRunner(const Model& model, int32_t max_tokens, int32_t block_size)
    : SequenceRunner(model.rank_models(), max_tokens, block_size) {}

SequenceRunner::SequenceRunner(std::vector<LlamaModel*> ranks, int32_t max_tokens,
                               int32_t block_size)
    : model_(*ranks.front()) {
  const ModelConfig& c = model_.config();
  for (LlamaModel* rank : ranks) {
    absl::StatusOr<PagedKvCache> cache = PagedKvCache::Create(
        rank->backend(),
        KvCacheShape{c.num_layers, rank->shard().num_kv_heads, c.head_dim, block_size,
                     (max_tokens + block_size - 1) / block_size, rank->kv_cache_dtype()});
    if (!cache.ok()) {
      init_ = cache.status();
      caches_.clear();
      return;
    }
    caches_.push_back(std::make_unique<PagedKvCache>(*std::move(cache)));
  }
  if (ranks.size() > 1) {
    std::vector<PagedKvCache*> rank_caches;
    for (const std::unique_ptr<PagedKvCache>& cache : caches_) rank_caches.push_back(cache.get());
    executor_ = std::make_unique<TensorParallelExecutor>(std::move(ranks), rank_caches);
  }
}

SequenceRunner::~SequenceRunner() { Reset(); }

absl::Status SequenceRunner::Append(std::span<const int32_t> tokens, int32_t chunk, bool all_logits,
                                    std::vector<float>& logits, const RidgeFillRun* fill) {
  RS_RETURN_IF_ERROR(init_);
  PagedKvCache& cache = *caches_.front();
  const int32_t vocab = model_.config().vocab_size;
  const int32_t block_size = cache.shape().block_size;
  if (fill != nullptr) {
    if (all_logits) return absl::InvalidArgumentError("RidgeFill append: all_logits unsupported");
    if (fill->filled_rows.size() != tokens.size()) {
      return absl::InvalidArgumentError("RidgeFill append: one filled_rows entry per token");
    }
    if (fill->filled_rows.back() != 0) {
      return absl::InvalidArgumentError("RidgeFill append: the last token must be exact");
    }
  }
  RS_RETURN_IF_ERROR(
      table_.Reserve(cache.pool(), length_ + static_cast<int32_t>(tokens.size()), block_size));
  logits.clear();
  estimated_saved_seconds_ = 0;
  promoted_rows_ = 0;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const size_t count = std::min<size_t>(chunk, tokens.size() - begin);
    ForwardBatch batch;
    // Only the last chunk's last row is sure to be exact under RidgeFill.
    batch.AddSequence(table_, block_size, tokens.subspan(begin, count), length_,
                      /*want_logits=*/fill == nullptr || begin + count == tokens.size());
    if (fill != nullptr) {
      batch.fill_split.resize(count, -1);
      batch.row_fill.resize(count, nullptr);
      for (size_t i = 0; i < count; ++i) {
        if (fill->filled_rows[begin + i] == 0) continue;
        batch.fill_split[i] = fill->split_layer;
        batch.row_fill[i] = fill->maps;
      }
    }
    if (all_logits) batch.RequestAllLogits();
    if (!rope_positions_.empty()) {
      const auto mapped = static_cast<int32_t>(rope_positions_.size());
      for (int32_t place : batch.positions) {
        batch.rope_positions.push_back(
            place < mapped ? rope_positions_[place] : rope_positions_.back() + 1 + place - mapped);
      }
    }
    ForwardProfile profile;
    ForwardProfile* wanted = fill != nullptr ? &profile : nullptr;
    if (executor_ != nullptr) {
      RS_RETURN_IF_ERROR(executor_->Run(batch, wanted));
      executor_->head().CopyAllLogits(chunk_logits_);
    } else {
      RS_RETURN_IF_ERROR(model_.Forward(batch, cache, chunk_logits_, nullptr, wanted));
    }
    if (fill != nullptr) {
      profile.ReadTimes();
      const auto filled = std::count_if(batch.fill_split.begin(), batch.fill_split.end(),
                                        [](int32_t s) { return s >= 0; }) -
                          static_cast<int64_t>(profile.promoted_rows.size());
      promoted_rows_ += static_cast<int32_t>(profile.promoted_rows.size());
      estimated_saved_seconds_ +=
          filled * profile.SavedSecondsPerRow(fill->split_layer, model_.config().num_layers);
    }
    length_ += static_cast<int32_t>(count);
    if (all_logits) {
      logits.insert(logits.end(), chunk_logits_.begin(), chunk_logits_.end());
    } else if (begin + count == tokens.size()) {
      logits.assign(chunk_logits_.end() - vocab, chunk_logits_.end());
    }
  }
  return absl::OkStatus();
}

void SequenceRunner::Truncate(int32_t length) {
  assert(length >= 0 && length <= length_);
  length_ = length;
}

void SequenceRunner::Reset() {
  if (!caches_.empty()) table_.Release(caches_.front()->pool());
  length_ = 0;
  rope_positions_.clear();
}

}  // namespace ridgeserve
