// The serving engine on the default model: whatever the batching, chunking, prefix caching and
// preemption, a greedy request produces the tokens a plain one-sequence decode loop
// (SequenceRunner, no scheduler) produces; aborts free KV blocks; limits are enforced.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <thread>

#include "engine/kv/paged_kv_cache.h"
#include "engine/parallel/rank_group.h"
#include "engine/parallel/tensor_parallel_executor.h"
#include "engine/tools/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/engine/counting_graph_backend.h"
#include "tests/engine/default_model_fixture.h"

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::CountingGraphBackend;

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  absl::Status status;
};

class EngineTest : public DefaultModelTest {
 protected:
  // Decoding without the engine: one sequence, one token per forward pass (greedy unless
  // `sampling` says otherwise).
  static std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_new,
                                        const SamplingParams& sampling = GreedyParams()) {
    SequenceRunner runner(*model_->llama, static_cast<int32_t>(prompt.size()) + max_new);
    Sampler sampler(sampling);
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

  static SamplingParams GreedyParams() {
    SamplingParams greedy;
    greedy.temperature = 0;
    return greedy;
  }

  static EngineRequest Greedy(std::vector<int32_t> prompt, int max_new,
                              std::shared_ptr<std::promise<Outcome>> done,
                              const SamplingParams& sampling = GreedyParams()) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.sampling = sampling;
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
  // `sampling` (empty: greedy) is request i's.
  // The default model on `counting` and an engine over it (`options` with a 1024-token cache);
  // null, the failure reported, when either does not start.
  static std::pair<std::unique_ptr<Model>, std::unique_ptr<Engine>> CountingEngine(
      Backend& counting, int32_t max_batch_tokens, int32_t max_running,
      EngineOptions options = {}) {
    absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(RIDGESERVE_DEFAULT_MODEL, counting);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    options.scheduler.max_batch_tokens = max_batch_tokens;
    options.scheduler.max_running_requests = max_running;
    options.kv_cache_tokens = 1024;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(**model, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return {};
    return {*std::move(model), *std::move(engine)};
  }

  static void RunConcurrently(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<int>& max_new,
                              const std::vector<SamplingParams>& sampling = {}) {
    const auto params = [&](size_t i) { return sampling.empty() ? GreedyParams() : sampling[i]; };
    std::vector<std::vector<int32_t>> expected;
    for (size_t i = 0; i < prompts.size(); ++i)
      expected.push_back(Reference(prompts[i], max_new[i], params(i)));
    std::vector<std::future<Outcome>> futures;
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto done = std::make_shared<std::promise<Outcome>>();
      futures.push_back(done->get_future());
      ASSERT_TRUE(engine.Submit(Greedy(prompts[i], max_new[i], done, params(i))).ok());
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

// Seeded requests at a temperature, batched and sampled by the backend on its threads (all of
// the machine's), draw the tokens each draws alone with the host's Sampler: every row keeps
// its own spec and logits whichever thread samples it.
TEST_F(EngineTest, SeededSamplingOnTheBackendMatchesSingleSequenceDecoding) {
  EngineOptions options;
  options.kv_cache_tokens = 4096;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_new;
  std::vector<SamplingParams> sampling;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(RandomTokens(6 + 5 * i, 30 + i));
    max_new.push_back(12);
    SamplingParams p;
    p.temperature = 1.2f;
    p.top_k = i % 2 == 0 ? 0 : 40;  // the unfiltered draw and the filtered one
    p.repetition_penalty = i % 3 == 0 ? 1.3f : 1.0f;
    p.seed = 1000 + i;
    p.has_seed = true;
    sampling.push_back(p);
  }
  RunConcurrently(**engine, prompts, max_new, sampling);
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

// Online calibration's rows (EngineOptions::calibration_rows): every prompt position >= the
// first position (4) and a multiple of the stride (3) is handed over exactly once, although
// preemption makes the engine prefill some prompts twice; no generated row is. A row is recognised
// by its depth-0 state (its token's embedding; the prompts' tokens are distinct).
TEST_F(EngineTest, CalibrationRowsAreEachPromptRowOnceThroughPreemption) {
  EngineOptions options;
  options.scheduler.max_batch_tokens = 64;
  options.kv_cache_tokens = 192;  // as in PreemptionLeavesOutputsUnchanged
  std::map<std::vector<float>, int> taken;
  const int32_t hidden = model_->config.hidden;
  options.calibration_rows = {
      {0, model_->config.num_layers},
      4,
      3,
      [&](std::span<const std::vector<float>> states, std::span<const int32_t> rows) {
        for (int32_t r : rows) {
          const float* row = states[0].data() + static_cast<size_t>(r) * hidden;
          ++taken[std::vector<float>(row, row + hidden)];
        }
      }};
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> all = RandomTokens(6 * 75, 77);
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  std::shuffle(all.begin(), all.end(), std::mt19937(5));
  std::vector<int> max_new;
  size_t next = 0;
  for (int i = 0; i < 6; ++i) {
    const size_t n = 40 + 7 * i;
    prompts.emplace_back(all.begin() + next, all.begin() + next + n);
    next += n;
    max_new.push_back(24);
  }
  ASSERT_LE(next, all.size());
  RunConcurrently(**engine, prompts, max_new);
  EXPECT_GT((*engine)->stats().num_preemptions, 0);
  // The depth-0 rows expected, from a forward of each prompt alone.
  std::map<std::vector<float>, int> want;
  const ModelConfig& c = model_->config;
  for (const std::vector<int32_t>& prompt : prompts) {
    auto cache =
        PagedKvCache::Create(*backend_, KvCacheShape{c.num_layers, c.num_kv_heads, c.head_dim, 16,
                                                     8, model_->llama->kv_cache_dtype()});
    ASSERT_TRUE(cache.ok());
    BlockTable table;
    ASSERT_TRUE(table.Reserve(cache->pool(), static_cast<int32_t>(prompt.size()), 16).ok());
    ForwardBatch batch;
    batch.AddSequence(table, 16, prompt, 0, false);
    ForwardCapture capture;
    capture.depths = {0};
    std::vector<float> logits;
    ASSERT_TRUE(model_->llama->Forward(batch, *cache, logits, &capture).ok());
    for (size_t p = 6; p < prompt.size(); p += 3) {  // p >= 4 with p % 3 == 0
      const float* row = capture.states[0].data() + p * hidden;
      ++want[std::vector<float>(row, row + hidden)];
    }
  }
  EXPECT_EQ(taken.size(), want.size());
  EXPECT_TRUE(taken == want);
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

TEST_F(EngineTest, AStepBudgetWithoutRoomForItsScratchFailsTheStart) {
  // The scratch of 2^28 rows of this model is terabytes: refused when the engine starts, naming
  // the bytes, not when the first long prompt arrives.
  EngineOptions options;
  options.kv_cache_tokens = 1024;
  options.scheduler.max_batch_tokens = 1 << 28;
  auto engine = Engine::Create(*model_, options);
  ASSERT_EQ(engine.status().code(), absl::StatusCode::kResourceExhausted) << engine.status();
  EXPECT_NE(engine.status().message().find("cannot allocate"), std::string::npos)
      << engine.status();
}

// Every buffer a step uses is reserved when the engine starts (what lets CUDA graphs keep their
// addresses, and a full device fail the start rather than a request): after Create, steps within
// the budget allocate nothing. Here the decode-graph path runs (padded buckets, replays), the
// step budget (6 rows) is below the running requests (16), so a decode step padded past 6 rows
// would outgrow the reservation, and the requests share a cached 12-block prefix, so a step's
// block tables name more blocks than the 64-block cache has. Their tokens are the references'.
TEST_F(EngineTest, StepsWithinTheBudgetAllocateNothingAfterTheStart) {
  CountingGraphBackend counting(*backend_);
  auto [model, engine] = CountingEngine(counting, /*max_batch_tokens=*/6, /*max_running=*/16);
  ASSERT_NE(engine, nullptr);
  const int at_start = counting.allocs;
  const std::vector<int32_t> shared = RandomTokens(200, 7);
  RunConcurrently(*engine, {shared}, {2});  // its 12 full blocks stay cached
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p = shared;
    const std::vector<int32_t> own = RandomTokens(3, 20 + i);
    p.insert(p.end(), own.begin(), own.end());
    prompts.push_back(p);
  }
  RunConcurrently(*engine, prompts, std::vector<int>(prompts.size(), 32));
  EXPECT_GE(engine->stats().num_prefix_hit_tokens, 12 * 192);
  EXPECT_GT(counting.replays, 0) << counting.records << " decode graphs recorded, none replayed";
  EXPECT_EQ(counting.allocs, at_start) << "allocations after the start";
  std::printf("%d decode graphs recorded, %d replays\n", counting.records.load(),
              counting.replays.load());
  WaitForFreeBlocks(*engine);
}

// The decode graphs are recorded when the engine starts, one per bucket, so that no request's
// step waits for a recording: serving replays them and records none. Five requests of different
// lengths decode at 5, 4, ... 1 rows (buckets 8, 4, 2, 1); their tokens are the references'.
TEST_F(EngineTest, DecodeGraphsAreRecordedAtTheStartAndOnlyReplayedWhileServing) {
  CountingGraphBackend counting(*backend_);
  auto [model, engine] = CountingEngine(counting, /*max_batch_tokens=*/2048, /*max_running=*/12);
  ASSERT_NE(engine, nullptr);
  const int buckets = static_cast<int>(LlamaModel::DecodeGraphBuckets(12).size());  // 1 2 4 8 12
  EXPECT_EQ(counting.records, buckets);
  const int replays_at_start = counting.replays;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_new;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(RandomTokens(20 + i, 40 + i));
    max_new.push_back(8 + 6 * i);
  }
  RunConcurrently(*engine, prompts, max_new);
  EXPECT_EQ(counting.records, buckets) << "decode graphs recorded while serving";
  EXPECT_GT(counting.replays, replays_at_start);
  WaitForFreeBlocks(*engine);
}

// The default model sharded over 3 ranks (its 9 heads / 3 KV heads) of CPU backends, each rank's
// wrapped in a CountingGraphBackend: graphs that replay the recorded ops, collectives among them.
struct CountedShards {
  RankGroup group;
  std::vector<std::unique_ptr<CountingGraphBackend>> counting;  // [rank]
  std::unique_ptr<Model> model;
};
std::unique_ptr<CountedShards> ShardOnCountingBackends() {
  const absl::StatusOr<cpu::Isa> isa = cpu::IsaFromEnvironment();  // the fixture's path
  EXPECT_TRUE(isa.ok()) << isa.status();
  absl::StatusOr<RankGroup> group = CreateRankGroup("cpu", 3, {.isa = isa.value_or(cpu::Isa{})});
  EXPECT_TRUE(group.ok()) << group.status();
  if (!isa.ok() || !group.ok()) return nullptr;
  auto shards = std::make_unique<CountedShards>(CountedShards{*std::move(group), {}, nullptr});
  std::vector<Backend*> backends;
  for (const std::unique_ptr<Backend>& b : shards->group.backends) {
    shards->counting.push_back(std::make_unique<CountingGraphBackend>(*b));
    backends.push_back(shards->counting.back().get());
  }
  absl::StatusOr<std::unique_ptr<Model>> model =
      LoadModel(RIDGESERVE_DEFAULT_MODEL, backends, shards->group.comms);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  shards->model = *std::move(model);
  return shards;
}

// Decode graphs at tensor parallel 3: every rank records every bucket when the engine starts,
// together, and decode steps replay them on every rank alike; the greedy answers of requests
// served together are those of the same sharded model with every step run as it comes
// (unpadded, unrecorded).
TEST_F(EngineTest, DecodeGraphsAtTensorParallel3ReplayOnEveryRankAndAnswerAsEagerSteps) {
  const std::unique_ptr<CountedShards> shards = ShardOnCountingBackends();
  ASSERT_NE(shards, nullptr);
  const auto& counting = shards->counting;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(RandomTokens(20 + 7 * i, 60 + i));
  const auto serve = [&](bool graphs) {
    EngineOptions options;
    options.decode_graphs = graphs;
    options.scheduler.max_running_requests = 12;
    options.kv_cache_tokens = 1024;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*shards->model, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    std::vector<std::vector<int32_t>> answers(prompts.size());
    if (!engine.ok()) return answers;
    const int buckets = static_cast<int>(LlamaModel::DecodeGraphBuckets(12).size());
    const int replays_at_start = counting[0]->replays;
    for (const auto& c : counting) {
      EXPECT_EQ(c->records, graphs ? buckets : 0) << "recordings on a rank at the start";
      EXPECT_EQ(c->replays, replays_at_start);
    }
    std::vector<std::future<Outcome>> futures;
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto done = std::make_shared<std::promise<Outcome>>();
      futures.push_back(done->get_future());
      EXPECT_TRUE((*engine)->Submit(Greedy(prompts[i], 10 + 5 * static_cast<int>(i), done)).ok());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Outcome out = futures[i].get();
      EXPECT_TRUE(out.status.ok()) << out.status;
      answers[i] = out.tokens;
    }
    if (graphs) {
      EXPECT_GT(counting[0]->replays, replays_at_start);
    }
    for (size_t r = 0; r < counting.size(); ++r) {
      EXPECT_EQ(counting[r]->records, graphs ? buckets : 0) << "rank " << r << " recorded later";
      EXPECT_EQ(counting[r]->replays, counting[0]->replays) << "rank " << r << " replayed apart";
    }
    return answers;
  };
  const std::vector<std::vector<int32_t>> eager = serve(false);
  const std::vector<std::vector<int32_t>> graphed = serve(true);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(graphed[i].size(), 10 + 5 * i);
    EXPECT_EQ(graphed[i], eager[i]) << "request " << i;
  }
}

// A decode-graph recording writes to the cache memory it was made with, so a step on other
// caches makes it stale. At tensor parallel 3 such a step runs padded but eagerly on every rank
// (no rank records or replays apart from the others: the recordings hold the ranks'
// collectives), with the logits of steps run as they come; back on the recorded caches, every
// rank replays again. Two sequences decode three steps at 2 rows (bucket 2) and one at 1.
TEST_F(EngineTest, StaleDecodeGraphsAtTensorParallel3RunEagerlyOnEveryRank) {
  const std::unique_ptr<CountedShards> shards = ShardOnCountingBackends();
  ASSERT_NE(shards, nullptr);
  const std::vector<LlamaModel*> ranks = shards->model->rank_models();
  const auto& counting = shards->counting;
  const ModelConfig& c = shards->model->config;
  constexpr int32_t kBlock = 16;
  // A set of caches, one per rank, and an executor over them.
  struct CacheSet {
    std::vector<std::unique_ptr<PagedKvCache>> caches;
    std::unique_ptr<TensorParallelExecutor> executor;
  };
  const auto make_set = [&] {
    CacheSet set;
    std::vector<PagedKvCache*> ptrs;
    for (LlamaModel* rank : ranks) {
      absl::StatusOr<PagedKvCache> cache = PagedKvCache::Create(
          rank->backend(), KvCacheShape{c.num_layers, rank->shard().num_kv_heads, c.head_dim,
                                        kBlock, 8, rank->kv_cache_dtype()});
      EXPECT_TRUE(cache.ok()) << cache.status();
      if (!cache.ok()) return set;
      set.caches.push_back(std::make_unique<PagedKvCache>(*std::move(cache)));
      ptrs.push_back(set.caches.back().get());
    }
    set.executor = std::make_unique<TensorParallelExecutor>(ranks, ptrs);
    return set;
  };
  // Every decode step's logits, [rows, vocab], after a prefill of 9 and 19 tokens.
  const std::vector<int32_t> active = {2, 2, 2, 1};
  const auto decode = [&](CacheSet& set) {
    std::vector<std::vector<float>> steps;
    if (set.executor == nullptr) return steps;
    BlockTable tables[2];
    int32_t lengths[2];
    ForwardBatch prefill;
    for (int32_t s = 0; s < 2; ++s) {
      EXPECT_TRUE(tables[s].Reserve(set.caches[0]->pool(), 40, kBlock).ok());
      const std::vector<int32_t> prompt = RandomTokens(9 + 10 * s, 80 + s);
      prefill.AddSequence(tables[s], kBlock, prompt, 0, true);
      lengths[s] = static_cast<int32_t>(prompt.size());
    }
    EXPECT_TRUE(set.executor->Run(prefill, nullptr).ok());
    for (size_t i = 0; i < active.size(); ++i) {
      const std::vector<int32_t> next = RandomTokens(active[i], 90 + static_cast<int>(i));
      ForwardBatch batch;
      for (int32_t s = 0; s < active[i]; ++s) {
        batch.AddSequence(tables[s], kBlock, std::span(next).subspan(s, 1), lengths[s]++, true);
      }
      const absl::Status status = set.executor->Run(batch, nullptr);
      EXPECT_TRUE(status.ok()) << status;
      set.executor->head().CopyAllLogits(steps.emplace_back());
    }
    return steps;
  };
  const auto expect_counts = [&](int records, int replays, const char* when) {
    for (size_t r = 0; r < counting.size(); ++r) {
      EXPECT_EQ(counting[r]->records, records) << "rank " << r << " " << when;
      EXPECT_EQ(counting[r]->replays, replays) << "rank " << r << " " << when;
    }
  };

  CacheSet plain = make_set();
  const std::vector<std::vector<float>> eager = decode(plain);  // no buckets: as they come
  ASSERT_EQ(eager.size(), active.size());
  expect_counts(0, 0, "without buckets");

  CacheSet recorded = make_set(), other = make_set();
  ASSERT_NE(recorded.executor, nullptr);
  const std::vector<int32_t> buckets = LlamaModel::DecodeGraphBuckets(4);  // 1 2 4
  for (LlamaModel* rank : ranks) {
    // As the engine does before recording: no step below grows a scratch (which would make the
    // recordings stale for another reason). Prefill: 28 rows; decode: up to 4 padded sequences.
    ASSERT_TRUE(rank->ReserveWorkspace(28, 4, 4 * 3).ok());
    rank->SetDecodeGraphBuckets(buckets);
  }
  const absl::Status status = recorded.executor->OnEveryRank(
      [&](int32_t r) { return ranks[r]->RecordDecodeGraphs(*recorded.caches[r]); });
  ASSERT_TRUE(status.ok()) << status;
  const int num_buckets = static_cast<int>(buckets.size());
  expect_counts(num_buckets, 0, "after recording");

  EXPECT_TRUE(decode(other) == eager) << "steps on caches the graphs were not recorded on";
  expect_counts(num_buckets, 0, "stepping on other caches");

  EXPECT_TRUE(decode(recorded) == eager) << "steps replaying the recordings";
  expect_counts(num_buckets, static_cast<int>(active.size()), "back on the recorded caches");
  for (LlamaModel* rank : ranks) rank->SetDecodeGraphBuckets({});  // they write to `recorded`
}

// A rank whose recording fails at tensor parallel 3 fails the start with its own error (the
// other ranks, released by its abort, fail with Aborted), and the group is usable again: an
// engine without graphs then serves.
TEST_F(EngineTest, ARankThatCannotRecordFailsTheStartAndTheGroupServesOn) {
  const std::unique_ptr<CountedShards> shards = ShardOnCountingBackends();
  ASSERT_NE(shards, nullptr);
  shards->counting[1]->fail_record = true;
  EngineOptions options;
  options.kv_cache_tokens = 1024;
  options.scheduler.max_running_requests = 4;
  const absl::Status refused = Engine::Create(*shards->model, options).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInternal) << refused;
  EXPECT_NE(refused.message().find("recording refused by the test"), std::string::npos) << refused;
  shards->counting[1]->fail_record = false;
  options.decode_graphs = false;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*shards->model, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto done = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> outcome = done->get_future();
  ASSERT_TRUE((*engine)->Submit(Greedy(RandomTokens(30, 70), 6, done)).ok());
  const Outcome out = outcome.get();
  EXPECT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.tokens.size(), 6u);
}

// A group that cannot be reset after a failed step (NCCL's) drops every rank's decode graphs at
// once: they would never replay, and NCCL's abort waits until the graphs holding the aborted
// collectives are destroyed. Here rank 1 fails the third step (a decode step on the graphs) and
// the group is not reset: the request fails, the engine is broken, and every graph recorded at
// the start is destroyed while the engine still exists.
TEST_F(EngineTest, AGroupThatCannotBeResetDropsEveryRanksDecodeGraphs) {
  const std::unique_ptr<CountedShards> shards = ShardOnCountingBackends();
  ASSERT_NE(shards, nullptr);
  EngineOptions options;
  options.kv_cache_tokens = 1024;
  options.scheduler.max_running_requests = 4;
  ASSERT_EQ(setenv("RIDGESERVE_TEST_TP_FAULT", "1:3:unrecoverable", 1), 0);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*shards->model, options);
  ASSERT_EQ(unsetenv("RIDGESERVE_TEST_TP_FAULT"), 0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int buckets = static_cast<int>(LlamaModel::DecodeGraphBuckets(4).size());
  for (const auto& c : shards->counting) {
    ASSERT_EQ(c->records, buckets);
    EXPECT_EQ(c->destroyed, 0);
  }
  auto done = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> outcome = done->get_future();
  ASSERT_TRUE((*engine)->Submit(Greedy(RandomTokens(30, 71), 8, done)).ok());
  const Outcome out = outcome.get();
  EXPECT_FALSE(out.status.ok()) << out.tokens.size() << " tokens";
  EXPECT_TRUE((*engine)->stats().broken);
  for (size_t r = 0; r < shards->counting.size(); ++r) {
    EXPECT_GT(shards->counting[r]->replays, 0) << "rank " << r;  // the second step replayed
    EXPECT_EQ(shards->counting[r]->destroyed, buckets) << "rank " << r;
  }
}

// A step that hangs (here its sampling waits, as a device that never finishes the step would)
// stalls the engine once it passes the step timeout: the engine is reported broken while the
// step still hangs, new requests are refused UNAVAILABLE at once, and the hung step's request
// fails UNAVAILABLE when the step returns. Steps within the timeout do not trip it.
TEST_F(EngineTest, AStepPastTheTimeoutStallsTheEngine) {
  for (double refused : {1e-4, 2e6, std::numeric_limits<double>::infinity(), -1.0}) {
    EngineOptions bad;
    bad.step_timeout_seconds = refused;
    EXPECT_EQ(Engine::Create(*model_, bad).status().code(), absl::StatusCode::kInvalidArgument)
        << refused;  // an unrepresentable deadline, or one the watchdog would spin on
  }
  CountingGraphBackend counting(*backend_);
  EngineOptions options;
  // Far above the steps of the short requests below: under ASan, beside other tests, a step of
  // 80 prompt rows has taken over 2 s.
  options.step_timeout_seconds = 10;
  std::promise<absl::Status> broken;
  std::atomic<int> broken_calls = 0;
  options.on_broken = [&](const absl::Status& reason) {
    if (broken_calls++ == 0) broken.set_value(reason);
  };
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto [model, engine] =
      CountingEngine(counting, /*max_batch_tokens=*/2048, /*max_running=*/4, options);
  ASSERT_NE(engine, nullptr);
  RunConcurrently(*engine, {RandomTokens(12, 11), RandomTokens(16, 12)}, {4, 4});
  EXPECT_EQ(broken_calls, 0) << "steps within the timeout stalled the engine";
  EXPECT_FALSE(engine->stats().broken);

  std::atomic<bool> held = false;
  counting.before_sample = [&] {
    if (!held.exchange(true)) released.wait();
  };
  auto done = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> outcome = done->get_future();
  ASSERT_TRUE(engine->Submit(Greedy(RandomTokens(20, 13), 8, done)).ok());
  std::future<absl::Status> reason = broken.get_future();
  ASSERT_EQ(reason.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "a hung step did not stall the engine";
  const absl::Status why = reason.get();
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable) << why;
  EXPECT_NE(why.message().find("past the step timeout of 10 s"), std::string::npos) << why;
  const EngineStats stats = engine->stats();
  EXPECT_TRUE(stats.broken);
  EXPECT_GE(stats.step_in_progress_seconds, 10.0);
  EXPECT_EQ(outcome.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the hung step's request finished while the step hangs";
  auto refused = std::make_shared<std::promise<Outcome>>();
  const absl::StatusOr<uint64_t> late = engine->Submit(Greedy(RandomTokens(20, 14), 8, refused));
  EXPECT_EQ(late.status(), why);

  release.set_value();
  const Outcome out = outcome.get();
  EXPECT_EQ(out.status, why);
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_EQ(broken_calls, 1);
  // The request's last event goes out inside the step; the step ends just after.
  for (int i = 0; i < 1000 && engine->stats().step_in_progress_seconds > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine->stats().step_in_progress_seconds, 0.0);
  WaitForFreeBlocks(*engine);
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

// Teacher forcing with capture: the forced tokens come out as given, with the -log p a plain
// one-sequence decode of prompt + forced tokens gives them, and the first event carries the
// distribution after the prompt. Batched with a greedy request, which is unchanged.
TEST_F(EngineTest, ForcedTokensAreScoredAsASingleSequenceDecodeScoresThem) {
  const std::vector<int32_t> prompt = RandomTokens(37, 5);
  const std::vector<int32_t> forced = RandomTokens(6, 6);
  std::vector<double> want_nll;
  std::vector<float> after_prompt;
  {
    SequenceRunner runner(*model_->llama, static_cast<int32_t>(prompt.size() + forced.size()));
    std::vector<float> logits;
    ASSERT_TRUE(runner.Append(prompt, 512, false, logits).ok());
    after_prompt = logits;
    for (int32_t t : forced) {
      want_nll.push_back(-LogSoftmaxAt(logits, t));
      const int32_t one[] = {t};
      ASSERT_TRUE(runner.Append(one, 1, false, logits).ok());
    }
  }
  const std::vector<int32_t> other = RandomTokens(50, 8);
  const std::vector<int32_t> other_want = Reference(other, 8);

  EngineOptions options;
  options.scheduler.max_batch_tokens = 32;  // chunked, batched with the other request
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok());
  EngineRequest r;
  r.prompt = prompt;
  r.max_new_tokens = static_cast<int32_t>(forced.size());
  r.scoring.capture = true;
  r.scoring.forced = forced;
  auto events = std::make_shared<std::vector<TokenEvent>>();
  auto done = std::make_shared<std::promise<void>>();
  r.on_event = [events, done](const TokenEvent& e) {
    events->push_back(e);
    if (e.finished) done->set_value();
  };
  ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
  auto other_done = std::make_shared<std::promise<Outcome>>();
  auto other_out = other_done->get_future();
  ASSERT_TRUE((*engine)->Submit(Greedy(other, 8, other_done)).ok());
  done->get_future().wait();
  EXPECT_EQ(other_out.get().tokens, other_want);

  std::vector<int32_t> tokens;
  double previous = 0;
  for (const TokenEvent& e : *events) {
    ASSERT_TRUE(e.status.ok()) << e.status;
    for (int32_t t : e.tokens) {
      const size_t i = tokens.size();
      tokens.push_back(t);
      ASSERT_LT(i, want_nll.size());
      EXPECT_NEAR(e.emitted_nll - previous, want_nll[i], 2e-3 * (1 + want_nll[i])) << i;
    }
    previous = e.emitted_nll;
  }
  EXPECT_EQ(tokens, forced);
  EXPECT_EQ(events->back().finish_reason, FinishReason::kLength);
  const std::vector<float>& first = events->front().first_logprobs;
  ASSERT_EQ(first.size(), static_cast<size_t>(model_->config.vocab_size));
  double mass = 0;
  for (float lp : first) mass += std::exp(static_cast<double>(lp));
  EXPECT_NEAR(mass, 1.0, 1e-4);
  EXPECT_EQ(Argmax(first), Argmax(after_prompt));
  EXPECT_NEAR(-first[forced[0]], want_nll[0], 2e-3 * (1 + want_nll[0]));
  for (size_t i = 1; i < events->size(); ++i) EXPECT_TRUE((*events)[i].first_logprobs.empty());
}

// A background request holds the only running slot; a request that arrives is served at
// once, as alone, and the background one ends with Unavailable.
TEST_F(EngineTest, BackgroundRequestIsDroppedForAnotherRequest) {
  const std::vector<int32_t> prompt = RandomTokens(20, 31);
  const std::vector<int32_t> want = Reference(prompt, 6);
  EngineOptions options;
  options.scheduler.max_running_requests = 1;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok());
  EngineRequest background;
  background.prompt = RandomTokens(30, 32);
  background.scoring.forced = RandomTokens(400, 33);
  background.scoring.background = true;
  background.max_new_tokens = 400;
  auto started = std::make_shared<std::promise<void>>();
  auto ended = std::make_shared<std::promise<absl::Status>>();
  auto seen = std::make_shared<int>(0);
  background.on_event = [started, ended, seen](const TokenEvent& e) {
    if ((*seen)++ == 0) started->set_value();
    if (e.finished) ended->set_value(e.status);
  };
  ASSERT_TRUE((*engine)->Submit(std::move(background)).ok());
  started->get_future().wait();
  auto done = std::make_shared<std::promise<Outcome>>();
  auto out = done->get_future();
  ASSERT_TRUE((*engine)->Submit(Greedy(prompt, 6, done)).ok());
  const absl::Status dropped = ended->get_future().get();
  EXPECT_EQ(dropped.code(), absl::StatusCode::kUnavailable) << dropped;
  EXPECT_EQ(out.get().tokens, want);
  WaitForFreeBlocks(**engine);

  // Forced tokens must be max_new_tokens of them, in the vocabulary, and prefill exactly.
  EngineRequest bad;
  bad.prompt = prompt;
  bad.max_new_tokens = 3;
  bad.scoring.forced = {1, 2};
  EXPECT_EQ((*engine)->Submit(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.scoring.forced = {1, 2, model_->config.vocab_size};
  EXPECT_EQ((*engine)->Submit(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ridgeserve
