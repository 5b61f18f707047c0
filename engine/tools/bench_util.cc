#include "engine/tools/bench_util.h"

#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/common/status_macros.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/sampling/sampler.h"
#include "engine/tools/tool_util.h"

namespace ridgeserve {

std::vector<int32_t> RandomTokenIds(int32_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(256, vocab - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = pick(rng);
  return ids;
}

double PrefillFlops(const ModelConfig& c, double n) {
  const double h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), ff = c.ffn;
  const double dense = 2 * n * c.num_layers * (h * (q + 2 * kv) + h * q + 3 * h * ff);
  const double attention = 4 * c.num_layers * q * n * (n + 1) / 2;
  return dense + attention + 2 * h * c.vocab_size;
}

absl::StatusOr<double> TimeBatchedDecode(LlamaModel& model, int32_t streams, int32_t prompt_tokens,
                                         int32_t steps, uint32_t seed) {
  constexpr int32_t kBlock = 16;
  const ModelConfig& c = model.config();
  if (streams < 1 || prompt_tokens < 1 || steps < 1 ||
      prompt_tokens + steps + 1 > c.context_length) {
    return absl::InvalidArgumentError(
        "batched decode: want streams, prompt and steps >= 1 and prompt + steps < context");
  }
  const int32_t per_seq = (prompt_tokens + steps + 1 + kBlock - 1) / kBlock;
  RS_ASSIGN_OR_RETURN(
      PagedKvCache cache,
      PagedKvCache::Create(model.backend(),
                           KvCacheShape{c.num_layers, model.shard().num_kv_heads, c.head_dim,
                                        kBlock, streams * per_seq, model.kv_cache_dtype()}));
  std::vector<BlockTable> tables(streams);
  std::vector<int32_t> last(streams);
  std::vector<float> logits;
  for (int32_t s = 0; s < streams; ++s) {
    RS_RETURN_IF_ERROR(tables[s].Reserve(cache.pool(), prompt_tokens + steps + 1, kBlock));
    const std::vector<int32_t> prompt =
        RandomTokenIds(prompt_tokens, c.vocab_size, seed + static_cast<uint32_t>(s));
    ForwardBatch batch;
    batch.AddSequence(tables[s], kBlock, prompt, 0, true);
    RS_RETURN_IF_ERROR(model.Forward(batch, cache, logits));
    last[s] = Argmax(logits);
  }
  // Greedy on the backend, as the engine draws: only the tokens come back.
  std::vector<SampleSpec> greedy(streams);
  for (int32_t s = 0; s < streams; ++s) {
    greedy[s].row = s;
    greedy[s].temperature = 0.0f;
  }
  std::vector<SampledToken> tokens(streams);
  // Step 0 is not timed: a model on decode graphs records its bucket then.
  ToolClock::time_point start;
  for (int32_t step = 0; step <= steps; ++step) {
    if (step == 1) start = ToolClock::now();
    ForwardBatch batch;
    for (int32_t s = 0; s < streams; ++s) {
      const int32_t one[] = {last[s]};
      batch.AddSequence(tables[s], kBlock, one, prompt_tokens + step, true);
    }
    RS_RETURN_IF_ERROR(model.Run(batch, cache));
    RS_RETURN_IF_ERROR(model.SampleLogits(greedy, {}, tokens.data()));
    for (int32_t s = 0; s < streams; ++s) last[s] = tokens[s].token;
  }
  return SecondsSince(start);
}

}  // namespace ridgeserve
