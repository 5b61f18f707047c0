// Scheduler tests with no model. A fake engine runs every plan against a simulated KV cache:
// each slot records the (position, token) written there, and the "model" samples the next
// token from what it reads back through the request's block table, never from the request's
// own token list. So a wrong block table, a bad prefix-cache hit, a reused block that was
// still in use or a lost token after preemption changes the output, which is compared with
// the same request run alone (an independent reference: a plain loop, no scheduler).
#include "engine/sched/scheduler.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "engine/kv/block_pool.h"
#include "gtest/gtest.h"

namespace ridgeserve {
namespace {

constexpr int32_t kBlock = 16;
constexpr int32_t kVocab = 1000;

// The fake model's next token for a known sequence; 0 is its end-of-sequence token.
int32_t NextToken(const std::vector<int32_t>& seq) {
  uint64_t h = 1469598103934665603ULL;
  for (int32_t t : seq) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ULL;
  h ^= h >> 29;
  return static_cast<int32_t>(h % kVocab);
}

// What the request produces alone: greedy loop until length or end-of-sequence.
std::vector<int32_t> Reference(std::vector<int32_t> tokens, int32_t max_total, bool stop_on_eos) {
  while (static_cast<int32_t>(tokens.size()) < max_total) {
    const int32_t next = NextToken(tokens);
    tokens.push_back(next);
    if (stop_on_eos && next == 0) break;
  }
  return tokens;
}

std::vector<int32_t> Tokens(int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(1, kVocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = pick(rng);
  return t;
}

class Harness {
 public:
  Harness(SchedulerConfig config, int32_t num_blocks, bool stop_on_eos = false)
      : config_(config),
        pool_(num_blocks),
        sched_(config, pool_),
        kv_(static_cast<size_t>(num_blocks) * config.block_size),
        stop_on_eos_(stop_on_eos) {}

  Scheduler& sched() { return sched_; }
  BlockPool& pool() { return pool_; }
  const std::map<uint64_t, std::vector<int32_t>>& done() const { return done_; }

  const std::set<uint64_t>& dropped() const { return dropped_; }

  absl::Status Add(uint64_t id, std::vector<int32_t> prompt, int32_t max_new, int32_t priority = 0,
                   uint64_t salt = 0, std::vector<uint8_t> filled_rows = {},
                   bool background = false) {
    auto r = std::make_unique<SchedRequest>();
    r->id = id;
    r->priority = priority;
    r->background = background;
    r->num_prompt_tokens = static_cast<int32_t>(prompt.size());
    r->max_total_tokens = r->num_prompt_tokens + max_new;
    r->tokens = std::move(prompt);
    r->cache_salt = salt;
    r->filled_rows = std::move(filled_rows);
    SchedRequest* raw = r.get();
    absl::Status s = sched_.Add(std::move(r));
    if (s.ok()) live_[id] = raw;
    return s;
  }
  SchedRequest* request(uint64_t id) { return live_.at(id); }
  bool Abort(uint64_t id) {
    live_.erase(id);
    return sched_.Abort(id);
  }

  // One engine iteration: schedule, check the plan, run the fake model, update, finish.
  StepPlan Step() {
    StepPlan plan = sched_.Schedule();
    CheckPlan(plan);
    for (const SchedRequest* r : plan.dropped) {
      dropped_.insert(r->id);
      live_.erase(r->id);
    }
    std::vector<int32_t> sampled = Run(plan);
    sched_.Update(plan, sampled);
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      SchedRequest* r = plan.chunks[i].request;
      if (sampled[i] < 0) continue;
      if (static_cast<int32_t>(r->tokens.size()) >= r->max_total_tokens ||
          (stop_on_eos_ && sampled[i] == 0)) {
        done_[r->id] = r->tokens;
        live_.erase(r->id);
        sched_.Finish(r->id);
      }
    }
    CheckInvariants();
    ++steps_;
    return plan;
  }

  // Steps until nothing is left; fails if that takes more than max_steps.
  int32_t RunToCompletion(int32_t max_steps = 100000) {
    int32_t n = 0;
    while (sched_.HasWork()) {
      Step();
      if (::testing::Test::HasFatalFailure() || ++n > max_steps) {
        ADD_FAILURE() << "no completion after " << n << " steps";
        break;
      }
    }
    return n;
  }

  // The plan is executable: right start, blocks cover it, budget kept, one chunk per request.
  void CheckPlan(const StepPlan& plan) {
    ASSERT_LE(plan.num_tokens(), config_.max_batch_tokens);
    std::set<const SchedRequest*> seen;
    for (const ScheduledChunk& c : plan.chunks) {
      const SchedRequest& r = *c.request;
      ASSERT_TRUE(seen.insert(&r).second) << "request " << r.id << " scheduled twice";
      ASSERT_EQ(r.state, RequestState::kRunning);
      ASSERT_EQ(c.start, r.num_computed_tokens);
      ASSERT_GE(c.count, 1);
      ASSERT_LE(c.start + c.count, static_cast<int32_t>(r.tokens.size()));
      ASSERT_EQ(c.sample, c.start + c.count == static_cast<int32_t>(r.tokens.size()));
      ASSERT_GE(static_cast<int32_t>(r.blocks.size()) * config_.block_size, c.start + c.count);
    }
    for (const SchedRequest* r : plan.preempted) {
      ASSERT_EQ(r->state, RequestState::kWaiting);
      ASSERT_TRUE(r->blocks.empty());
      ASSERT_EQ(r->num_computed_tokens, 0);
      ASSERT_FALSE(seen.count(r)) << "preempted request left in the plan";
      ASSERT_FALSE(r->background) << "a background request is dropped, not preempted";
    }
    for (const SchedRequest* r : plan.dropped) {
      ASSERT_TRUE(r->background);
      ASSERT_EQ(r->state, RequestState::kFinished);
      ASSERT_TRUE(r->blocks.empty());
      ASSERT_FALSE(seen.count(r)) << "dropped request left in the plan";
    }
  }

  // Writes each chunk's K/V (here: position and token) to its slots, then samples from what
  // the block table reads back.
  std::vector<int32_t> Run(const StepPlan& plan) {
    std::vector<int32_t> sampled(plan.chunks.size(), -1);
    for (const ScheduledChunk& c : plan.chunks) {
      const SchedRequest& r = *c.request;
      for (int32_t p = c.start; p < c.start + c.count; ++p) {
        const int32_t block = r.blocks[p / config_.block_size];
        // Writing into a block someone else reads, or a published one, corrupts the cache.
        EXPECT_EQ(pool_.ref_count(block), 1) << "write to shared block " << block;
        EXPECT_FALSE(pool_.is_cached(block)) << "write to published block " << block;
        kv_[Slot(r, p)] = {p, r.tokens[p]};
      }
    }
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const ScheduledChunk& c = plan.chunks[i];
      if (!c.sample) continue;
      std::vector<int32_t> seen;
      for (int32_t p = 0; p < c.start + c.count; ++p) {
        const Cell& cell = kv_[Slot(*c.request, p)];
        EXPECT_EQ(cell.pos, p) << "request " << c.request->id;
        seen.push_back(cell.token);
      }
      sampled[i] = NextToken(seen);
    }
    return sampled;
  }

  // Ref counts equal the number of live owners; shared blocks are published and hold the
  // same prefix for every owner; free accounting adds up; queues match the requests' states.
  void CheckInvariants() {
    std::vector<int32_t> owners(pool_.num_blocks(), 0);
    std::map<int32_t, std::pair<const SchedRequest*, int32_t>>
        first_owner;  // block -> (req, index)
    int32_t running = 0, waiting = 0;
    for (const auto& [id, r] : live_) {
      if (r->state == RequestState::kWaiting) {
        ++waiting;
        ASSERT_TRUE(r->blocks.empty());
        ASSERT_EQ(r->num_computed_tokens, 0);
        continue;
      }
      ASSERT_EQ(r->state, RequestState::kRunning);
      ++running;
      ASSERT_GE(static_cast<int32_t>(r->blocks.size()) * config_.block_size,
                r->num_computed_tokens);
      ASSERT_LE(r->num_computed_tokens, static_cast<int32_t>(r->tokens.size()));
      std::set<int32_t> mine(r->blocks.begin(), r->blocks.end());
      ASSERT_EQ(mine.size(), r->blocks.size()) << "block twice in one table";
      for (size_t k = 0; k < r->blocks.size(); ++k) {
        const int32_t b = r->blocks[k];
        ++owners[b];
        auto [it, inserted] = first_owner.try_emplace(b, r, static_cast<int32_t>(k));
        if (!inserted) {
          // Shared: must be a published, full block at the same index of the same prefix.
          ASSERT_TRUE(pool_.is_cached(b)) << "block " << b << " owned twice but not cached";
          const auto [other, index] = it->second;
          ASSERT_EQ(index, static_cast<int32_t>(k));
          const int32_t end = (index + 1) * config_.block_size;
          ASSERT_LE(end, r->num_computed_tokens);
          ASSERT_LE(end, other->num_computed_tokens);
          ASSERT_TRUE(
              std::equal(r->tokens.begin(), r->tokens.begin() + end, other->tokens.begin()));
        }
      }
    }
    int32_t unowned = 0;
    for (int32_t b = 0; b < pool_.num_blocks(); ++b) {
      ASSERT_EQ(pool_.ref_count(b), owners[b]) << "block " << b;
      if (owners[b] == 0) ++unowned;
    }
    ASSERT_EQ(pool_.num_free(), unowned);
    const SchedulerStats st = sched_.stats();
    ASSERT_EQ(st.num_running, running);
    ASSERT_EQ(st.num_waiting, waiting);
    ASSERT_EQ(st.num_free_blocks, unowned);
    ASSERT_LE(st.num_running, config_.max_running_requests);
  }

 private:
  struct Cell {
    int32_t pos = -1;
    int32_t token = -1;
  };
  size_t Slot(const SchedRequest& r, int32_t p) const {
    return static_cast<size_t>(r.blocks[p / config_.block_size]) * config_.block_size +
           p % config_.block_size;
  }

  SchedulerConfig config_;
  BlockPool pool_;
  Scheduler sched_;
  std::vector<Cell> kv_;
  bool stop_on_eos_;
  std::map<uint64_t, SchedRequest*> live_;
  std::map<uint64_t, std::vector<int32_t>> done_;
  std::set<uint64_t> dropped_;
  int64_t steps_ = 0;
};

SchedulerConfig Config(int32_t max_batch_tokens, int32_t max_running = 64, int32_t max_queued = 256,
                       bool prefix_caching = true) {
  SchedulerConfig c;
  c.max_batch_tokens = max_batch_tokens;
  c.max_running_requests = max_running;
  c.max_queued_requests = max_queued;
  c.block_size = kBlock;
  c.enable_prefix_caching = prefix_caching;
  return c;
}

int32_t CountOf(const StepPlan& plan, uint64_t id) {
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.request->id == id) return c.count;
  }
  return 0;
}

TEST(SchedulerTest, BudgetRespectedAndOutputsMatchAlone) {
  Harness h(Config(64), 256);
  std::map<uint64_t, std::vector<int32_t>> want;
  for (uint64_t id = 0; id < 10; ++id) {
    auto prompt = Tokens(50, id);
    want[id] = Reference(prompt, 50 + 12, false);
    ASSERT_TRUE(h.Add(id, prompt, 12).ok());
  }
  StepPlan first = h.Step();
  EXPECT_EQ(first.num_tokens(), 64);  // 50 + a 14-token chunk of the next prompt
  EXPECT_EQ(CountOf(first, 0), 50);
  EXPECT_EQ(CountOf(first, 1), 14);
  h.RunToCompletion();
  EXPECT_EQ(h.done(), want);
  EXPECT_EQ(h.pool().num_free(), 256);
}

TEST(SchedulerTest, DecodesScheduledBeforePrefill) {
  // Budget 8 and 8 decoding requests: a new long prompt waits while the decodes run.
  Harness h(Config(8), 256);
  for (uint64_t id = 0; id < 8; ++id) ASSERT_TRUE(h.Add(id, Tokens(1, id), 20).ok());
  h.Step();  // eight 1-token prompts
  ASSERT_TRUE(h.Add(100, Tokens(40, 100), 4).ok());
  for (int s = 0; s < 5; ++s) {
    StepPlan plan = h.Step();
    ASSERT_EQ(plan.chunks.size(), 8u);
    for (const ScheduledChunk& c : plan.chunks) EXPECT_EQ(c.count, 1);
    EXPECT_EQ(CountOf(plan, 100), 0);
  }
  // With budget to spare, decodes still come first in the plan.
  Harness g(Config(32), 256);
  ASSERT_TRUE(g.Add(1, Tokens(5, 1), 10).ok());
  g.Step();
  ASSERT_TRUE(g.Add(2, Tokens(100, 2), 10).ok());
  StepPlan plan = g.Step();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].request->id, 1u);
  EXPECT_EQ(plan.chunks[0].count, 1);
  EXPECT_EQ(plan.chunks[1].request->id, 2u);
  EXPECT_EQ(plan.chunks[1].count, 31);
  EXPECT_FALSE(plan.chunks[1].sample);
}

TEST(SchedulerTest, LongPromptChunkedWhileDecodesContinue) {
  Harness h(Config(64), 512);
  for (uint64_t id = 0; id < 3; ++id) ASSERT_TRUE(h.Add(id, Tokens(8, id), 200).ok());
  h.Step();
  const auto long_prompt = Tokens(1000, 99);
  ASSERT_TRUE(h.Add(99, long_prompt, 5).ok());
  int32_t prefill_steps = 0;
  for (;;) {
    StepPlan plan = h.Step();
    ASSERT_GE(plan.chunks.size(), 4u);
    for (uint64_t id = 0; id < 3; ++id) EXPECT_EQ(CountOf(plan, id), 1) << "decode " << id;
    ++prefill_steps;
    const ScheduledChunk& last = plan.chunks.back();
    ASSERT_EQ(last.request->id, 99u);
    EXPECT_LE(last.count, 61);
    if (last.sample) break;
  }
  EXPECT_EQ(prefill_steps, (1000 + 60) / 61);
  h.RunToCompletion();
  EXPECT_EQ(h.done().at(99), Reference(long_prompt, 1005, false));
}

TEST(SchedulerTest, MaxRunningRespected) {
  Harness h(Config(256, /*max_running=*/2), 256);
  for (uint64_t id = 0; id < 5; ++id) ASSERT_TRUE(h.Add(id, Tokens(10, id), 6).ok());
  h.Step();
  EXPECT_EQ(h.sched().stats().num_running, 2);
  EXPECT_EQ(h.sched().stats().num_waiting, 3);
  h.RunToCompletion();  // CheckInvariants asserts num_running <= 2 each step
  EXPECT_EQ(h.done().size(), 5u);
}

TEST(SchedulerTest, QueueFullIsResourceExhausted) {
  Harness h(Config(256, 64, /*max_queued=*/3), 256);
  for (uint64_t id = 0; id < 3; ++id) ASSERT_TRUE(h.Add(id, Tokens(10, id), 4).ok());
  EXPECT_EQ(h.Add(3, Tokens(10, 3), 4).code(), absl::StatusCode::kResourceExhausted);
  h.Step();  // admits all three, the queue empties
  EXPECT_TRUE(h.Add(3, Tokens(10, 3), 4).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.done().size(), 4u);
}

TEST(SchedulerTest, AddRejectsWhatCanNeverRun) {
  Harness h(Config(64), 4);  // 64 tokens of KV
  EXPECT_EQ(h.Add(1, Tokens(60, 1), 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Add(2, {}, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(h.Add(3, Tokens(60, 3), 4).ok());  // exactly the capacity
  EXPECT_EQ(h.Add(3, Tokens(10, 3), 4).code(), absl::StatusCode::kAlreadyExists);
  h.RunToCompletion();
  EXPECT_EQ(h.done().at(3), Reference(Tokens(60, 3), 64, false));
}

TEST(SchedulerTest, PriorityThenArrivalOrder) {
  Harness h(Config(256, /*max_running=*/1), 256);
  const std::vector<std::pair<uint64_t, int32_t>> adds = {{1, 5}, {2, 1}, {3, 3}, {4, 1}, {5, 0}};
  for (auto [id, prio] : adds) ASSERT_TRUE(h.Add(id, Tokens(5, id), 3, prio).ok());
  std::vector<uint64_t> order;
  while (h.sched().HasWork()) {
    StepPlan plan = h.Step();
    for (const ScheduledChunk& c : plan.chunks) {
      if (c.start == 0) order.push_back(c.request->id);
    }
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{5, 2, 4, 3, 1}));
}

// Two requests that fit alone but not together: the later one is preempted, keeps its
// prompt and generated tokens, recomputes them from position 0 and ends identical.
TEST(SchedulerTest, PreemptionRecomputesAndOutputIsUnchanged) {
  Harness h(Config(256, 64, 256, /*prefix_caching=*/false), 6);  // 96 tokens of KV
  const auto a = Tokens(30, 1), b = Tokens(30, 2);
  ASSERT_TRUE(h.Add(1, a, 40).ok());
  ASSERT_TRUE(h.Add(2, b, 40).ok());
  SchedRequest* rb = h.request(2);
  std::vector<int32_t> tokens_at_preemption;
  bool resumed_from_zero = false;
  while (h.sched().HasWork()) {
    StepPlan plan = h.Step();
    for (const SchedRequest* p : plan.preempted) {
      ASSERT_EQ(p, rb);  // the later arrival is the victim, never the earlier one
      tokens_at_preemption = p->tokens;
    }
    for (const ScheduledChunk& c : plan.chunks) {
      if (c.request == rb && !tokens_at_preemption.empty() && c.start == 0 &&
          rb->num_preemptions > 0) {
        // Resumes with prompt + generated tokens intact, recomputing all of them.
        ASSERT_GT(rb->tokens.size(), b.size());
        EXPECT_TRUE(std::equal(tokens_at_preemption.begin(), tokens_at_preemption.end(),
                               rb->tokens.begin()));
        EXPECT_EQ(c.count, static_cast<int32_t>(tokens_at_preemption.size()));
        resumed_from_zero = true;
      }
    }
  }
  EXPECT_GE(h.sched().stats().num_preemptions, 1);
  EXPECT_GT(tokens_at_preemption.size(), b.size());
  EXPECT_TRUE(resumed_from_zero);
  EXPECT_EQ(h.done().at(1), Reference(a, 70, false));
  EXPECT_EQ(h.done().at(2), Reference(b, 70, false));
  EXPECT_EQ(h.pool().num_free(), 6);
}

// Lower priority is preempted first even when it arrived earlier (here it decodes while the
// better request's prompt is chunked, so it is a victim already scheduled in the step).
TEST(SchedulerTest, PreemptsLowestPriorityFirst) {
  Harness h(Config(16, 64, 256, false), 6);
  ASSERT_TRUE(h.Add(1, Tokens(30, 1), 40, /*priority=*/2).ok());
  h.Step();
  h.Step();
  ASSERT_TRUE(h.Add(2, Tokens(60, 2), 10, /*priority=*/0).ok());
  int64_t preempted_1 = 0;
  while (h.sched().HasWork()) {
    StepPlan plan = h.Step();
    for (const SchedRequest* p : plan.preempted) {
      ASSERT_EQ(p->id, 1u);
      ++preempted_1;
    }
  }
  EXPECT_GE(preempted_1, 1);
  EXPECT_EQ(h.done().at(1), Reference(Tokens(30, 1), 70, false));
  EXPECT_EQ(h.done().at(2), Reference(Tokens(60, 2), 70, false));
}

// The worst running request, short of blocks for its whole chunk, runs what fits instead of
// preempting itself; only when nothing fits is it preempted.
TEST(SchedulerTest, WorstRequestShrinksItsChunkBeforePreemptingItself) {
  Harness h(Config(32, 64, 256, false), 6);  // 96 tokens
  ASSERT_TRUE(h.Add(1, Tokens(20, 1), 60).ok());
  ASSERT_TRUE(h.Add(2, Tokens(70, 2), 5).ok());
  StepPlan p1 = h.Step();  // A: 20 tokens (2 blocks); B: 12 (1 block)
  EXPECT_EQ(CountOf(p1, 2), 12);
  StepPlan p2 = h.Step();  // A decodes; B: 31 more (2 more blocks), 1 block free
  EXPECT_EQ(CountOf(p2, 2), 31);
  StepPlan p3 = h.Step();  // B wants 27 tokens (2 blocks); the one free block holds 21
  EXPECT_EQ(CountOf(p3, 1), 1);
  EXPECT_EQ(CountOf(p3, 2), 21);
  EXPECT_TRUE(p3.preempted.empty());
  h.RunToCompletion();
  EXPECT_GE(h.sched().stats().num_preemptions, 1);  // A's growth later evicts B
  EXPECT_EQ(h.done().at(1), Reference(Tokens(20, 1), 80, false));
  EXPECT_EQ(h.done().at(2), Reference(Tokens(70, 2), 75, false));
}

// A background request, added first, runs only on the budget the other request leaves, and
// both end as they would alone.
TEST(SchedulerTest, BackgroundRunsOnWhatOthersLeave) {
  Harness h(Config(32), 64);
  ASSERT_TRUE(h.Add(1, Tokens(40, 1), 4, /*priority=*/0, 0, {}, /*background=*/true).ok());
  ASSERT_TRUE(h.Add(2, Tokens(40, 2), 4, /*priority=*/5).ok());
  StepPlan p1 = h.Step();
  EXPECT_EQ(CountOf(p1, 2), 32);
  EXPECT_EQ(CountOf(p1, 1), 0);
  StepPlan p2 = h.Step();
  EXPECT_EQ(CountOf(p2, 2), 8);
  EXPECT_EQ(CountOf(p2, 1), 24);
  StepPlan p3 = h.Step();  // the other request decodes first
  EXPECT_EQ(CountOf(p3, 2), 1);
  EXPECT_EQ(CountOf(p3, 1), 16);
  h.RunToCompletion();
  EXPECT_TRUE(h.dropped().empty());
  EXPECT_EQ(h.done().at(1), Reference(Tokens(40, 1), 44, false));
  EXPECT_EQ(h.done().at(2), Reference(Tokens(40, 2), 44, false));
}

// On an idle engine a background prefill still goes in chunks of max_background_step_tokens,
// so a request that arrives waits for at most one short step; that request's own prefill
// takes the whole budget, and the background request keeps its cap on what is left.
TEST(SchedulerTest, BackgroundStepsHoldAtMostTheirCap) {
  SchedulerConfig c = Config(256);
  c.max_background_step_tokens = 48;
  Harness h(c, 64);
  ASSERT_TRUE(h.Add(1, Tokens(120, 1), 2, 0, 0, {}, /*background=*/true).ok());
  EXPECT_EQ(CountOf(h.Step(), 1), 48);
  EXPECT_EQ(CountOf(h.Step(), 1), 48);
  ASSERT_TRUE(h.Add(2, Tokens(200, 2), 2).ok());
  StepPlan p = h.Step();
  EXPECT_EQ(CountOf(p, 2), 200);
  EXPECT_EQ(CountOf(p, 1), 24);  // the rest of its prompt: under the cap and what is left
  h.RunToCompletion();
  EXPECT_TRUE(h.dropped().empty());
  EXPECT_EQ(h.done().at(1), Reference(Tokens(120, 1), 122, false));
  EXPECT_EQ(h.done().at(2), Reference(Tokens(200, 2), 202, false));
}

// A request waiting for a running slot drops the background request holding it, and is
// admitted in the same step.
TEST(SchedulerTest, BackgroundDroppedWhenAnotherWaitsForASlot) {
  Harness h(Config(256, /*max_running=*/1), 64);
  ASSERT_TRUE(h.Add(1, Tokens(20, 1), 30, 0, 0, {}, /*background=*/true).ok());
  h.Step();
  h.Step();
  ASSERT_TRUE(h.Add(2, Tokens(20, 2), 5).ok());
  StepPlan p = h.Step();
  ASSERT_EQ(p.dropped.size(), 1u);
  EXPECT_EQ(p.dropped[0]->id, 1u);
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_EQ(CountOf(p, 2), 20);
  h.RunToCompletion();
  EXPECT_EQ(h.dropped(), (std::set<uint64_t>{1}));
  EXPECT_EQ(h.done().count(1), 0u);
  EXPECT_EQ(h.done().at(2), Reference(Tokens(20, 2), 25, false));
  EXPECT_EQ(h.pool().num_free(), 64);
}

// Short of blocks, the other request takes the background request's: dropped, not preempted
// (never requeued, never recomputed).
TEST(SchedulerTest, BackgroundDroppedNotPreemptedWhenBlocksRunOut) {
  Harness h(Config(256, 64, 256, /*prefix_caching=*/false), 6);  // 96 tokens of KV
  ASSERT_TRUE(h.Add(1, Tokens(50, 1), 40, 0, 0, {}, /*background=*/true).ok());
  h.Step();
  ASSERT_TRUE(h.Add(2, Tokens(60, 2), 10).ok());
  StepPlan p = h.Step();
  EXPECT_EQ(p.dropped.size(), 1u);
  EXPECT_EQ(CountOf(p, 2), 60);
  h.RunToCompletion();
  EXPECT_EQ(h.dropped(), (std::set<uint64_t>{1}));
  EXPECT_EQ(h.sched().stats().num_preemptions, 0);
  EXPECT_EQ(h.done().at(2), Reference(Tokens(60, 2), 70, false));
  EXPECT_EQ(h.pool().num_free(), 6);
}

TEST(SchedulerTest, PrefixCacheHitSharesFullBlocks) {
  Harness h(Config(256), 64);
  const auto prefix = Tokens(64, 7);
  ASSERT_TRUE(h.Add(1, prefix, 20).ok());
  h.Step();  // computes all 64 prompt tokens: 4 full blocks published
  SchedRequest* r1 = h.request(1);
  // Same 64-token prompt: never the block of the last prompt token, so 3 blocks = 48.
  ASSERT_TRUE(h.Add(2, prefix, 20).ok());
  auto longer = prefix;
  longer.insert(longer.end(), {5, 6, 7, 8, 9});
  ASSERT_TRUE(h.Add(3, longer, 20).ok());
  StepPlan plan = h.Step();
  SchedRequest* r2 = h.request(2);
  SchedRequest* r3 = h.request(3);
  EXPECT_EQ(r2->num_cached_prompt_tokens, 48);
  EXPECT_EQ(r3->num_cached_prompt_tokens, 64);
  EXPECT_EQ(CountOf(plan, 2), 16);
  EXPECT_EQ(CountOf(plan, 3), 5);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(r2->blocks[k], r1->blocks[k]);
    EXPECT_EQ(h.pool().ref_count(r1->blocks[k]), 3);
  }
  EXPECT_EQ(r3->blocks[3], r1->blocks[3]);
  EXPECT_NE(r2->blocks[3], r1->blocks[3]);  // recomputed into a private block
  EXPECT_EQ(h.sched().stats().num_prefix_hit_tokens, 48 + 64);
  h.RunToCompletion();
  EXPECT_EQ(h.done().at(2), Reference(prefix, 84, false));
  EXPECT_EQ(h.done().at(3), Reference(longer, 89, false));
  // Everything is free again; the published blocks stay as reclaimable cache.
  EXPECT_EQ(h.sched().stats().num_free_blocks, 64);
  EXPECT_GT(h.sched().stats().num_cached_free_blocks, 0);
  // A later request still hits the cached prefix after all owners finished.
  ASSERT_TRUE(h.Add(4, prefix, 1).ok());
  h.Step();
  EXPECT_EQ(h.sched().stats().num_prefix_hit_tokens, 48 + 64 + 48);
}

// SpecKV's path: a request that does not share KV neither publishes nor takes cached blocks;
// Rewrite keeps the blocks of its first places, frees the rest, and decoding continues from the
// rewritten tokens (the fake model reads its context back from the kept places).
TEST(SchedulerTest, RewriteKeepsTheFirstPlacesOfAPrivateRequest) {
  Harness h(Config(256), 64);
  const auto prompt = Tokens(70, 9);
  ASSERT_TRUE(h.Add(1, prompt, 30).ok());
  h.request(1)->share_kv = false;
  h.Step();  // the prompt and the first token
  SchedRequest* r = h.request(1);
  ASSERT_EQ(r->blocks.size(), 5u);
  EXPECT_EQ(h.sched().stats().num_cached_free_blocks, 0);
  // Keep places 0..31 (two blocks); continue from a new token after them.
  std::vector<int32_t> tokens(prompt.begin(), prompt.begin() + 32);
  tokens.push_back(r->tokens.back());
  h.sched().Rewrite(1, tokens, 32);
  EXPECT_EQ(r->blocks.size(), 2u);
  EXPECT_EQ(r->num_computed_tokens, 32);
  EXPECT_EQ(h.sched().stats().num_free_blocks, 62);
  // The same prompt again finds nothing cached.
  ASSERT_TRUE(h.Add(2, prompt, 4).ok());
  h.Step();
  EXPECT_EQ(h.request(2)->num_cached_prompt_tokens, 0);
  h.RunToCompletion();
  EXPECT_EQ(h.done().at(1), Reference(tokens, 70 + 30, false));  // max_total_tokens unchanged
}

TEST(SchedulerTest, DifferentSaltNeverShares) {
  Harness h(Config(256), 64);
  const auto prefix = Tokens(64, 7);
  ASSERT_TRUE(h.Add(1, prefix, 4, 0, /*salt=*/0).ok());
  h.Step();
  ASSERT_TRUE(h.Add(2, prefix, 4, 0, /*salt=*/1).ok());
  h.Step();
  EXPECT_EQ(h.request(2)->num_cached_prompt_tokens, 0);
}

// RidgeFill: a block is shared only by requests that filled the same rows of it (and of
// every block before it); blocks past the filled rows still differ through their parents.
TEST(SchedulerTest, FilledRowsArePartOfTheBlockKey) {
  Harness h(Config(256), 64);
  const auto prompt = Tokens(64, 7);
  std::vector<uint8_t> fill_a(64, 0), fill_b(64, 0);
  std::fill(fill_a.begin() + 4, fill_a.begin() + 40, 1);
  std::fill(fill_b.begin() + 4, fill_b.begin() + 24, 1);  // differs from block 1 on
  ASSERT_TRUE(h.Add(1, prompt, 4, 0, /*salt=*/9, fill_a).ok());
  h.Step();
  ASSERT_TRUE(h.Add(2, prompt, 4, 0, /*salt=*/9, fill_b).ok());
  ASSERT_TRUE(h.Add(3, prompt, 4, 0, /*salt=*/9, fill_a).ok());
  ASSERT_TRUE(h.Add(4, prompt, 4, 0, /*salt=*/9).ok());
  h.Step();
  EXPECT_EQ(h.request(2)->num_cached_prompt_tokens, 16);  // block 0 rows match
  EXPECT_EQ(h.request(3)->num_cached_prompt_tokens, 48);  // same rows: all but the last block
  EXPECT_EQ(h.request(4)->num_cached_prompt_tokens, 0);   // block 0 already differs
}

TEST(SchedulerTest, CachedBlocksEvictedWhenMemoryIsNeeded) {
  Harness h(Config(256), 8);  // 128 tokens
  const auto a = Tokens(64, 1);
  ASSERT_TRUE(h.Add(1, a, 1).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.sched().stats().num_cached_free_blocks, 4);
  EXPECT_EQ(h.sched().stats().num_free_blocks, 8);
  // Needs all 8 blocks: the cached ones are evicted (and forgotten).
  ASSERT_TRUE(h.Add(2, Tokens(120, 2), 8).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.done().at(2), Reference(Tokens(120, 2), 128, false));
  ASSERT_TRUE(h.Add(3, a, 1).ok());
  h.Step();
  EXPECT_EQ(h.sched().stats().num_prefix_hit_tokens, 0);
}

TEST(SchedulerTest, PreemptedRequestResumesFromItsCachedBlocks) {
  Harness h(Config(256), 6);
  ASSERT_TRUE(h.Add(1, Tokens(30, 1), 40).ok());
  ASSERT_TRUE(h.Add(2, Tokens(30, 2), 40).ok());
  h.RunToCompletion();
  EXPECT_GE(h.sched().stats().num_preemptions, 1);
  EXPECT_EQ(h.done().at(1), Reference(Tokens(30, 1), 70, false));
  EXPECT_EQ(h.done().at(2), Reference(Tokens(30, 2), 70, false));
  EXPECT_EQ(h.sched().stats().num_prefix_hit_tokens, 0);  // resumes are not prompt hits
}

TEST(SchedulerTest, AbortWaitingAndRunningFreesEverything) {
  Harness h(Config(32, /*max_running=*/2), 32);
  for (uint64_t id = 0; id < 4; ++id) ASSERT_TRUE(h.Add(id, Tokens(40, id), 10).ok());
  h.Step();
  h.Step();
  EXPECT_EQ(h.request(0)->state, RequestState::kRunning);
  EXPECT_EQ(h.request(3)->state, RequestState::kWaiting);
  EXPECT_TRUE(h.Abort(3));  // waiting
  EXPECT_TRUE(h.Abort(0));  // running
  EXPECT_FALSE(h.sched().Abort(0));
  EXPECT_FALSE(h.sched().Abort(12345));
  h.CheckInvariants();
  EXPECT_EQ(h.sched().stats().num_waiting, 1);
  EXPECT_EQ(h.sched().stats().num_running, 1);
  EXPECT_TRUE(h.Abort(1));
  EXPECT_TRUE(h.Abort(2));
  EXPECT_FALSE(h.sched().HasWork());
  EXPECT_EQ(h.sched().stats().num_free_blocks, 32);
  h.CheckInvariants();
}

TEST(SchedulerTest, AbortBetweenScheduleAndUpdateIsSkipped) {
  BlockPool pool(16);
  Scheduler s(Config(64), pool);
  for (uint64_t id = 1; id <= 2; ++id) {
    auto r = std::make_unique<SchedRequest>();
    r->id = id;
    r->tokens = Tokens(20, id);
    r->num_prompt_tokens = 20;
    r->max_total_tokens = 30;
    ASSERT_TRUE(s.Add(std::move(r)).ok());
  }
  StepPlan plan = s.Schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  SchedRequest* aborted = plan.chunks[0].request;
  EXPECT_TRUE(s.Abort(aborted->id));
  EXPECT_EQ(aborted->state, RequestState::kFinished);  // still readable until next Schedule
  s.Update(plan, {7, 8});
  EXPECT_EQ(aborted->tokens.size(), 20u);
  EXPECT_EQ(plan.chunks[1].request->tokens.back(), 8);
  EXPECT_EQ(s.stats().num_running, 1);
}

// Many requests with random lengths, shared prefixes, priorities, random aborts and a tiny
// KV cache; every plan and every state is checked, and every request that was not aborted
// ends exactly as it would alone.
struct SimCounts {
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t aborts = 0;
};

void RandomSimulation(uint32_t seed, bool prefix_caching, SimCounts& counts) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int32_t num_blocks = uniform(8, 24);
  SchedulerConfig config =
      Config(uniform(1, 4) * 16 + uniform(0, 7), uniform(1, 12), uniform(4, 40), prefix_caching);
  Harness h(config, num_blocks, /*stop_on_eos=*/true);
  const int32_t capacity = num_blocks * kBlock;
  const std::vector<std::vector<int32_t>> prefixes = {Tokens(48, seed), Tokens(20, seed + 1)};
  std::map<uint64_t, std::vector<int32_t>> want;
  std::set<uint64_t> aborted;
  uint64_t next_id = 0;
  int64_t preemptions_seen = 0;
  for (int step = 0; step < 3000 && (next_id < 120 || h.sched().HasWork()); ++step) {
    for (int n = uniform(0, 2); n > 0 && next_id < 120; --n) {
      const int32_t max_new = uniform(1, 40);
      int32_t len = uniform(1, std::max(1, std::min(100, capacity - max_new)));
      std::vector<int32_t> prompt;
      if (uniform(0, 2) == 0) {
        const auto& p = prefixes[uniform(0, 1)];
        prompt.assign(p.begin(), p.begin() + std::min<size_t>(len, p.size()));
      }
      const auto tail = Tokens(std::max(0, len - static_cast<int32_t>(prompt.size())), rng());
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const uint64_t id = next_id++;
      absl::Status s = h.Add(id, prompt, max_new, uniform(0, 2));
      if (s.ok()) {
        want[id] = Reference(prompt, len + max_new, true);
      } else {
        ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      }
    }
    if (!want.empty() && uniform(0, 9) == 0) {
      auto it = want.begin();
      std::advance(it, uniform(0, static_cast<int>(want.size()) - 1));
      if (!h.done().count(it->first) && !aborted.count(it->first)) {
        ASSERT_TRUE(h.Abort(it->first));
        aborted.insert(it->first);
      }
    }
    StepPlan plan = h.Step();
    if (::testing::Test::HasFatalFailure()) return;
    preemptions_seen += static_cast<int64_t>(plan.preempted.size());
    if (h.sched().HasWork()) {
      ASSERT_FALSE(plan.chunks.empty()) << "stalled at step " << step;
    }
  }
  ASSERT_FALSE(h.sched().HasWork()) << "did not finish";
  for (const auto& [id, tokens] : want) {
    if (aborted.count(id)) continue;
    ASSERT_TRUE(h.done().count(id)) << "request " << id << " lost";
    EXPECT_EQ(h.done().at(id), tokens) << "request " << id;
  }
  EXPECT_EQ(h.sched().stats().num_preemptions, preemptions_seen);
  EXPECT_EQ(h.pool().num_free(), num_blocks);
  counts.preemptions += preemptions_seen;
  counts.prefix_hit_tokens += h.sched().stats().num_prefix_hit_tokens;
  counts.aborts += static_cast<int64_t>(aborted.size());
}

TEST(SchedulerTest, RandomSimulationWithPrefixCache) {
  SimCounts counts;
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    SCOPED_TRACE(seed);
    RandomSimulation(seed, true, counts);
    if (HasFatalFailure()) return;
  }
  // The simulation exercised what it is meant to.
  EXPECT_GT(counts.preemptions, 0);
  EXPECT_GT(counts.prefix_hit_tokens, 0);
  EXPECT_GT(counts.aborts, 0);
}

TEST(SchedulerTest, RandomSimulationWithoutPrefixCache) {
  SimCounts counts;
  for (uint32_t seed = 101; seed <= 115; ++seed) {
    SCOPED_TRACE(seed);
    RandomSimulation(seed, false, counts);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(counts.preemptions, 0);
  EXPECT_EQ(counts.prefix_hit_tokens, 0);
}

}  // namespace
}  // namespace ridgeserve
