// Decode steps on a fresh cache, for comparing how a model runs them (eager or on graphs, on a
// CPU or a GPU): every step's logits and the whole cache afterwards, on the host.
#ifndef RIDGESERVE_TESTS_ENGINE_DECODE_STEPS_H_
#define RIDGESERVE_TESTS_ENGINE_DECODE_STEPS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv/paged_kv_cache.h"
#include "engine/model/llama.h"
#include "engine/tools/bench_util.h"
#include "gtest/gtest.h"

namespace ridgeserve::testing {

struct DecodeRun {
  std::vector<std::vector<float>> logits;  // per step, [sequences, vocab]
  std::vector<float> k, v;                 // every slot of every layer, widened to f32
};

// `num_seqs` sequences with prompts of 9, 19, 29, ... tokens, prefilled together in one step;
// then a decode step per entry of `active`: one token for each of the first active[i]
// sequences (the others wait, as finished or preempted requests leave a batch). Tokens are
// drawn from `seed`, not from the logits, so two runs feed the same tokens whatever their
// logits (RandomTokenIds).
inline DecodeRun RunDecodeSteps(LlamaModel& model, int32_t num_seqs,
                                const std::vector<int32_t>& active, uint32_t seed) {
  const int32_t steps = static_cast<int32_t>(active.size());
  const ModelConfig& c = model.config();
  const int32_t block_size = 16;
  const int32_t max_len = 10 * num_seqs + steps;
  const int32_t blocks_per_seq = (max_len + block_size - 1) / block_size;
  absl::StatusOr<PagedKvCache> cache = PagedKvCache::Create(
      model.backend(), KvCacheShape{c.num_layers, c.num_kv_heads, c.head_dim, block_size,
                                    num_seqs * blocks_per_seq + 1, model.kv_cache_dtype()});
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return {};
  const int32_t slots = cache->shape().num_blocks * block_size;
  const size_t width = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  std::vector<float> k(slots * width, 0.0f), v(slots * width, 0.0f);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    cache->CopyFromHost(model.backend(), l, 0, slots, k.data(), v.data());  // no stale bits
  }
  std::vector<BlockTable> tables(num_seqs);
  std::vector<int32_t> lengths(num_seqs);
  ForwardBatch prefill;
  for (int32_t s = 0; s < num_seqs; ++s) {
    EXPECT_TRUE(tables[s].Reserve(cache->pool(), max_len, block_size).ok());
    const std::vector<int32_t> prompt = RandomTokenIds(9 + 10 * s, c.vocab_size, seed + s);
    prefill.AddSequence(tables[s], block_size, prompt, 0, true);
    lengths[s] = static_cast<int32_t>(prompt.size());
  }
  DecodeRun run;
  std::vector<float> logits;
  EXPECT_TRUE(model.Forward(prefill, *cache, logits).ok());
  for (int32_t step = 0; step < steps; ++step) {
    ForwardBatch batch;
    const std::vector<int32_t> next =
        RandomTokenIds(active[step], c.vocab_size, seed + 1000 + step);
    for (int32_t s = 0; s < active[step]; ++s) {
      batch.AddSequence(tables[s], block_size, std::span(next).subspan(s, 1), lengths[s]++, true);
    }
    const absl::Status status = model.Forward(batch, *cache, logits);
    EXPECT_TRUE(status.ok()) << status;
    run.logits.push_back(logits);
  }
  for (int32_t l = 0; l < c.num_layers; ++l) {
    cache->CopyToHost(model.backend(), l, 0, slots, k.data(), v.data());
    run.k.insert(run.k.end(), k.begin(), k.end());
    run.v.insert(run.v.end(), v.begin(), v.end());
  }
  return run;
}

}  // namespace ridgeserve::testing

#endif  // RIDGESERVE_TESTS_ENGINE_DECODE_STEPS_H_
