// Runs one sequence through a model with its own paged KV cache: the offline tools'
// (eval, calibrate) way to prefill and decode without the serving engine.
#ifndef RIDGESERVE_ENGINE_TOOLS_SEQUENCE_RUNNER_H_
#define RIDGESERVE_ENGINE_TOOLS_SEQUENCE_RUNNER_H_

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/llama.h"
#include "engine/model/model.h"
#include "engine/parallel/tensor_parallel_executor.h"

namespace ridgeserve {

// A RidgeFill Append: per appended token, 1 = filled at split_layer by `maps`, 0 = exact — the
// rows PlanRidgeFillRows picks for the server (engine/ridgefill/ridgefill_plan.h), so tools
// measure the policy that is served.
struct RidgeFillRun {
  int32_t split_layer = -1;
  std::vector<uint8_t> filled_rows;
  const RowFill* maps = nullptr;  // RidgeFillMaps (engine/ridgefill/ridgefill_maps.h)

  int32_t filled() const {
    return static_cast<int32_t>(std::count(filled_rows.begin(), filled_rows.end(), uint8_t{1}));
  }
};

class SequenceRunner {
 public:
  // Room for `max_tokens` tokens in the cache.
  SequenceRunner(LlamaModel& model, int32_t max_tokens, int32_t block_size = 16);
  // Every rank of `model` (tensor parallel: each with its own cache, run by a
  // TensorParallelExecutor).
  SequenceRunner(const Model& model, int32_t max_tokens, int32_t block_size = 16);
  ~SequenceRunner();

  // RoPE positions of the cache places: place i < positions.size() runs at positions[i], a
  // later place at positions.back() + 1 + (i - positions.size()); empty (and after Reset):
  // each place at its own index. SpecPC with original positions gathers the kept tokens to
  // places 0.. at their prompt positions, and what follows continues after the prompt.
  void SetRopePositions(std::vector<int32_t> positions) { rope_positions_ = std::move(positions); }
  // Appends `tokens` in forward passes of at most `chunk` rows. `logits` receives the logits
  // of every appended row ([tokens, vocab]) when all_logits, else of the last one ([vocab]).
  // With `fill` (RidgeFill), all_logits must be false and the last token must be exact.
  absl::Status Append(std::span<const int32_t> tokens, int32_t chunk, bool all_logits,
                      std::vector<float>& logits, const RidgeFillRun* fill = nullptr);
  // The cache (rank 0's; tests read K/V; the sequence's slots follow block_table()).
  const PagedKvCache& cache() const { return *caches_.front(); }
  const BlockTable& block_table() const { return table_; }
  // The cache for writing (eval's splice test overwrites filled rows' K/V between Appends).
  PagedKvCache& mutable_cache() { return *caches_.front(); }
  // Forgets the sequence (blocks go back to the pool).
  void Reset();
  // Forgets the tokens at positions >= `length` (<= length()): their blocks stay reserved and
  // the next Append overwrites their K/V.
  void Truncate(int32_t length);
  int32_t length() const { return length_; }
  // RidgeFill: the last Append's estimated seconds saved by its filled rows, from the layer
  // timings of its own forward passes (ForwardProfile); 0 without fill.
  double estimated_saved_seconds() const { return estimated_saved_seconds_; }
  // RidgeFill: the last Append's filled rows that the leverage test ran exactly instead.
  int32_t promoted_rows() const { return promoted_rows_; }

 private:
  SequenceRunner(std::vector<LlamaModel*> ranks, int32_t max_tokens, int32_t block_size);

  LlamaModel& model_;                                  // rank 0's
  absl::Status init_;                                  // an allocation failure is Append's error
  std::vector<std::unique_ptr<PagedKvCache>> caches_;  // per rank
  std::unique_ptr<TensorParallelExecutor> executor_;   // TP > 1
  BlockTable table_;
  int32_t length_ = 0;
  double estimated_saved_seconds_ = 0;
  int32_t promoted_rows_ = 0;
  std::vector<int32_t> rope_positions_;  // SetRopePositions
  std::vector<float> chunk_logits_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_SEQUENCE_RUNNER_H_
