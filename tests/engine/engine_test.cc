// The serving engine on the default model: whatever the batching, chunking, prefix caching and
// preemption, a greedy request produces the tokens a plain one-sequence decode loop
// (SequenceRunner, no scheduler) produces; aborts free KV blocks; limits are enforced.
#include "engine/engine.h"

#include <chrono>
#include <future>
#include <thread>

#include "engine/tools/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/engine/default_model_fixture.h"

namespace ridgeserve {
namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  absl::Status status;
};

class EngineTest : public DefaultModelTest {
 protected:
  // Greedy decoding without the engine: one sequence, one token per forward pass.
  static std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_new) {
    SequenceRunner runner(*model_->llama, static_cast<int32_t>(prompt.size()) + max_new);
    SamplingParams greedy;
    greedy.temperature = 0;
    Sampler sampler(greedy);
    std::vector<float> logits;
    EXPECT_TRUE(runner.Append(prompt, 512, false, logits).ok());
    std::vector<int32_t> context = prompt, out;
    while (static_cast<int>(out.size()) < max_new) {
      const int32_t token = sampler.Sample(logits, context).token;
      if (sampler.IsStop(token, model_->tokenizer->end_of_generation_ids())) break;
      out.push_back(token);
      context.push_back(token);
      const int32_t one[] = {token};
      EXPECT_TRUE(runner.Append(one, 1, false, logits).ok());
    }
    return out;
  }

  static EngineRequest Greedy(std::vector<int32_t> prompt, int max_new,
                              std::shared_ptr<std::promise<Outcome>> done) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.max_new_tokens = max_new;
    auto outcome = std::make_shared<Outcome>();
    r.on_event = [outcome, done](const TokenEvent& e) {
      outcome->tokens.insert(outcome->tokens.end(), e.tokens.begin(), e.tokens.end());
      if (e.finished) {
        outcome->reason = e.finish_reason;
        outcome->status = e.status;
        done->set_value(*outcome);
      }
    };
    return r;
  }

  static void WaitForFreeBlocks(const Engine& engine) {
    for (int i = 0; i < 2000; ++i) {
      const EngineStats s = engine.stats();
      if (s.num_running == 0 && s.num_waiting == 0 && s.kv_blocks_free == s.kv_blocks_total) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ADD_FAILURE() << "KV blocks not freed: " << engine.stats().kv_blocks_free << " of "
                  << engine.stats().kv_blocks_total;
  }

  // Submits all prompts at once and checks each against the reference. The references are
  // computed first: a LlamaModel serves one thread at a time, and the engine thread owns it
  // while requests run.
  static void RunConcurrently(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<int>& max_new) {
    std::vector<std::vector<int32_t>> expected;
    for (size_t i = 0; i < prompts.size(); ++i)
      expected.push_back(Reference(prompts[i], max_new[i]));
    std::vector<std::future<Outcome>> futures;
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto done = std::make_shared<std::promise<Outcome>>();
      futures.push_back(done->get_future());
      ASSERT_TRUE(engine.Submit(Greedy(prompts[i], max_new[i], done)).ok());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Outcome out = futures[i].get();
      ASSERT_TRUE(out.status.ok()) << out.status;
      EXPECT_EQ(out.tokens, expected[i]) << "request " << i;
      EXPECT_TRUE(out.reason == FinishReason::kLength || out.reason == FinishReason::kStop);
    }
  }
};

TEST_F(EngineTest, ConcurrentChunkedRequestsMatchSingleSequenceDecoding) {
  EngineOptions options;
  options.scheduler.max_batch_tokens = 48;  // forces chunked prefill mixed with decodes
  options.kv_cache_tokens = 4096;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_new;
  const std::vector<int32_t> shared = RandomTokens(40, 99);
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = RandomTokens(5 + 23 * i, 10 + i);
    if (i % 3 == 0) p.insert(p.begin(), shared.begin(), shared.end());  // prefix-cache hits
    prompts.push_back(p);
    max_new.push_back(3 + 2 * i);
  }
  RunConcurrently(**engine, prompts, max_new);
  EXPECT_GT((*engine)->stats().num_prefix_hit_tokens, 0);
  WaitForFreeBlocks(**engine);
}

TEST_F(EngineTest, PreemptionLeavesOutputsUnchanged) {
  EngineOptions options;
  options.scheduler.max_batch_tokens = 64;
  options.kv_cache_tokens = 192;  // 12 blocks of 16: too few for all six at once
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_new;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(RandomTokens(40 + 7 * i, 50 + i));
    max_new.push_back(24);
  }
  RunConcurrently(**engine, prompts, max_new);
  EXPECT_GT((*engine)->stats().num_preemptions, 0);
  WaitForFreeBlocks(**engine);
}

TEST_F(EngineTest, AbortEndsRequestAndFreesBlocks) {
  auto engine = Engine::Create(*model_, EngineOptions{});
  ASSERT_TRUE(engine.ok());
  auto done = std::make_shared<std::promise<Outcome>>();
  auto finished = done->get_future();
  auto id = (*engine)->Submit(Greedy(RandomTokens(64, 7), 2000, done));
  ASSERT_TRUE(id.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (*engine)->Abort(*id);
  ASSERT_EQ(finished.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(finished.get().reason, FinishReason::kAborted);
  WaitForFreeBlocks(**engine);
}

TEST_F(EngineTest, RejectsWhatCannotRun) {
  EngineOptions options;
  options.scheduler.max_queued_requests = 1;
  options.scheduler.max_running_requests = 1;
  options.kv_cache_tokens = 1024;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  auto ignore = std::make_shared<std::promise<Outcome>>();
  EXPECT_EQ(e.Submit(Greedy({}, 4, ignore)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.Submit(Greedy({model_->config.vocab_size}, 4, ignore)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.Submit(Greedy(RandomTokens(10, 1), 8190, ignore)).status().code(),
            absl::StatusCode::kOutOfRange);  // over the 8192-token context
  EXPECT_EQ(e.Submit(Greedy(RandomTokens(10, 1), 2000, ignore)).status().code(),
            absl::StatusCode::kOutOfRange);  // over the 1024-token KV cache
  // One runs, one waits; the third finds the queue full.
  std::vector<std::future<Outcome>> admitted;
  int exhausted = 0;
  for (int i = 0; i < 3; ++i) {
    auto done = std::make_shared<std::promise<Outcome>>();
    auto future = done->get_future();
    auto id = e.Submit(Greedy(RandomTokens(8, 20 + i), 200, done));
    if (id.ok()) {
      admitted.push_back(std::move(future));
    } else {
      EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
      ++exhausted;
    }
  }
  EXPECT_GE(exhausted, 1);
  for (auto& f : admitted) EXPECT_TRUE(f.get().status.ok());
}

}  // namespace
}  // namespace ridgeserve
