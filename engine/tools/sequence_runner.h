// Runs one sequence through a model with its own paged KV cache: the offline tools'
// (eval, calibrate) way to prefill and decode without the serving engine.
#ifndef RIDGESERVE_ENGINE_TOOLS_SEQUENCE_RUNNER_H_
#define RIDGESERVE_ENGINE_TOOLS_SEQUENCE_RUNNER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/llama.h"

namespace ridgeserve {

class SequenceRunner {
 public:
  // Room for `max_tokens` tokens in the cache.
  SequenceRunner(LlamaModel& model, int32_t max_tokens, int32_t block_size = 16);
  ~SequenceRunner();

  // Appends `tokens` in forward passes of at most `chunk` rows. `logits` receives the logits
  // of every appended row ([tokens, vocab]) when all_logits, else of the last one ([vocab]).
  absl::Status Append(std::span<const int32_t> tokens, int32_t chunk, bool all_logits,
                      std::vector<float>& logits);
  // Forgets the sequence (blocks go back to the pool).
  void Reset();
  int32_t length() const { return length_; }

 private:
  LlamaModel& model_;
  PagedKvCache cache_;
  BlockTable table_;
  int32_t length_ = 0;
  std::vector<float> chunk_logits_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOOLS_SEQUENCE_RUNNER_H_
