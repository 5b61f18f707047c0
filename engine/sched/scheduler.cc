#include "engine/sched/scheduler.h"

#include <algorithm>
#include <cassert>
#include <set>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/kv/block_pool.h"

namespace ridgeserve {

int32_t StepPlan::num_tokens() const {
  int32_t n = 0;
  for (const ScheduledChunk& c : chunks) n += c.count;
  return n;
}

struct Scheduler::Impl {
  // Scheduler-private state of a live request.
  struct Entry {
    std::unique_ptr<SchedRequest> req;
    uint64_t seq = 0;  // arrival order; kept across preemptions
    // Chained hashes of the request's full blocks of tokens (block k covers tokens
    // [k * block_size, (k + 1) * block_size)), computed lazily; tokens never change once
    // appended, so neither do these.
    std::vector<uint64_t> block_hashes;
    // req->blocks[0, num_published) are in the prefix cache (published by this request or
    // taken from the cache).
    int32_t num_published = 0;
    bool admitted_once = false;
  };

  // (background, priority, arrival): lower runs first; the greatest is the first to be
  // preempted (or dropped, when background).
  static bool Before(const Entry* a, const Entry* b) {
    if (a->req->background != b->req->background) return b->req->background;
    if (a->req->priority != b->req->priority) return a->req->priority < b->req->priority;
    return a->seq < b->seq;
  }
  struct BeforeLess {
    bool operator()(const Entry* a, const Entry* b) const { return Before(a, b); }
  };

  Impl(const SchedulerConfig& c, BlockPool& p) : config(c), pool(p) {
    assert(config.block_size > 0 && config.max_batch_tokens > 0 &&
           config.max_background_step_tokens > 0);
  }

  int32_t BlocksFor(int32_t tokens) const {
    return (tokens + config.block_size - 1) / config.block_size;
  }

  uint64_t ParentHash(const Entry& e, int32_t k) const {
    return k == 0 ? RootBlockHash(e.req->cache_salt) : e.block_hashes[k - 1];
  }
  std::span<const int32_t> BlockTokens(const Entry& e, int32_t k) const {
    return std::span<const int32_t>(e.req->tokens)
        .subspan(static_cast<size_t>(k) * config.block_size, config.block_size);
  }
  // The seed of block k's hash: its parent's hash, mixed with which of its rows are filled
  // when the request fills any.
  uint64_t BlockSeed(const Entry& e, int32_t k) const {
    const uint64_t parent = ParentHash(e, k);
    const std::vector<uint8_t>& filled = e.req->filled_rows;
    const size_t begin = static_cast<size_t>(k) * config.block_size;
    if (begin >= filled.size()) return parent;
    const size_t end = std::min(filled.size(), begin + config.block_size);
    const std::vector<int32_t> rows(filled.begin() + begin, filled.begin() + end);
    return HashBlockTokens(parent, rows);
  }
  // Makes block_hashes cover the first `num_blocks` full blocks (all tokens must be known).
  void EnsureHashes(Entry& e, int32_t num_blocks) {
    for (int32_t k = static_cast<int32_t>(e.block_hashes.size()); k < num_blocks; ++k) {
      e.block_hashes.push_back(HashBlockTokens(BlockSeed(e, k), BlockTokens(e, k)));
    }
  }

  // Cached blocks holding the longest full-block prefix of the request's known tokens minus
  // the last one (which must be computed so that its logits exist).
  std::vector<int32_t> FindCachedPrefix(Entry& e) {
    std::vector<int32_t> hits;
    if (!config.enable_prefix_caching || !e.req->share_kv) return hits;
    const int32_t max_blocks = (static_cast<int32_t>(e.req->tokens.size()) - 1) / config.block_size;
    EnsureHashes(e, max_blocks);
    for (int32_t k = 0; k < max_blocks; ++k) {
      const int32_t b = pool.FindCached(e.block_hashes[k], ParentHash(e, k), BlockTokens(e, k));
      if (b < 0) break;
      hits.push_back(b);
    }
    return hits;
  }

  // Publishes the request's blocks that are now full of computed tokens.
  void PublishComputedBlocks(Entry& e) {
    if (!config.enable_prefix_caching || !e.req->share_kv) return;
    const int32_t full = e.req->num_computed_tokens / config.block_size;
    EnsureHashes(e, full);
    for (int32_t k = e.num_published; k < full; ++k) {
      // False when an identical block was published first by a request computing the same
      // prefix concurrently: this copy stays private and is freed with the request.
      pool.Publish(e.req->blocks[k], e.block_hashes[k], ParentHash(e, k), BlockTokens(e, k));
    }
    e.num_published = std::max(e.num_published, full);
  }

  // Grows the block table to cover positions [0, num_tokens); the caller checked num_free.
  void AllocateFor(SchedRequest& r, int32_t num_tokens) {
    const int32_t need = BlocksFor(num_tokens) - static_cast<int32_t>(r.blocks.size());
    if (need <= 0) return;
    auto fresh = pool.Allocate(need);
    assert(fresh.ok());
    r.blocks.insert(r.blocks.end(), fresh->begin(), fresh->end());
  }

  // Tail first, so a request's last blocks are evicted before its (more shareable) prefix.
  void FreeBlocks(SchedRequest& r) {
    for (auto it = r.blocks.rbegin(); it != r.blocks.rend(); ++it) pool.Release(*it);
    r.blocks.clear();
  }

  void InsertRunning(Entry* e) {
    running.insert(std::upper_bound(running.begin(), running.end(), e, BeforeLess()), e);
  }
  void EraseRunning(Entry* e) { running.erase(std::find(running.begin(), running.end(), e)); }

  void AddChunk(StepPlan& plan, SchedRequest& r, int32_t count) {
    const int32_t start = r.num_computed_tokens;
    plan.chunks.push_back(
        ScheduledChunk{&r, start, count, start + count == static_cast<int32_t>(r.tokens.size())});
  }

  // A request leaving the plan loses its chunk (the plan has not run, so nothing is lost but
  // the budget, which is refunded).
  void Unplan(SchedRequest& r, StepPlan& plan, int32_t& budget) {
    auto chunk = std::find_if(plan.chunks.begin(), plan.chunks.end(),
                              [&](const ScheduledChunk& c) { return c.request == &r; });
    if (chunk != plan.chunks.end()) {
      budget += chunk->count;
      plan.chunks.erase(chunk);
    }
  }

  // Preemption by recompute; a background request is dropped instead.
  void Preempt(Entry* e, StepPlan& plan, int32_t& budget) {
    SchedRequest& r = *e->req;
    Unplan(r, plan, budget);
    if (r.background) {
      plan.dropped.push_back(&r);
      Remove(r.id);
      return;
    }
    FreeBlocks(r);  // its published blocks stay in the cache: a quick resume may reuse them
    r.num_computed_tokens = 0;
    r.state = RequestState::kWaiting;
    ++r.num_preemptions;
    ++num_preemptions;
    e->num_published = 0;
    EraseRunning(e);
    waiting.insert(e);  // by (priority, arrival): ahead of later arrivals of its priority
    plan.preempted.push_back(&r);
  }

  // Schedules the next chunk of a running request, preempting worse requests (by priority,
  // then arrival) when blocks run out. Returns false when `e` itself was preempted.
  bool ScheduleRunning(Entry* e, StepPlan& plan, int32_t& budget) {
    SchedRequest& r = *e->req;
    const int32_t remaining = static_cast<int32_t>(r.tokens.size()) - r.num_computed_tokens;
    for (;;) {
      int32_t count = std::min(remaining, budget);
      const int32_t need =
          BlocksFor(r.num_computed_tokens + count) - static_cast<int32_t>(r.blocks.size());
      if (need > pool.num_free()) {
        Entry* victim = running.back();
        if (victim != e) {
          Preempt(victim, plan, budget);
          continue;
        }
        // `e` is the worst running request: rather than preempting itself, it runs as many
        // tokens as the free blocks hold (a prefill chunk shrinks; a decode cannot).
        const int32_t fit =
            (static_cast<int32_t>(r.blocks.size()) + pool.num_free()) * config.block_size -
            r.num_computed_tokens;
        if (fit <= 0) {
          Preempt(e, plan, budget);
          return false;
        }
        count = std::min(count, fit);
      }
      AllocateFor(r, r.num_computed_tokens + count);
      AddChunk(plan, r, count);
      budget -= count;
      return true;
    }
  }

  // Admits the best waiting request with its first chunk; false (nothing changed) when the
  // KV cache cannot hold that chunk now.
  bool Admit(Entry* e, StepPlan& plan, int32_t& budget) {
    SchedRequest& r = *e->req;
    std::vector<int32_t> hits = FindCachedPrefix(*e);
    const int32_t cached = static_cast<int32_t>(hits.size()) * config.block_size;
    const int32_t count = std::min(static_cast<int32_t>(r.tokens.size()) - cached, budget);
    const int32_t need = BlocksFor(cached + count) - static_cast<int32_t>(hits.size());
    // Hits nobody holds are counted in num_free but stop being free once taken.
    const int32_t unowned_hits = static_cast<int32_t>(
        std::count_if(hits.begin(), hits.end(), [&](int32_t b) { return pool.ref_count(b) == 0; }));
    if (need > pool.num_free() - unowned_hits) return false;

    for (int32_t b : hits) pool.AcquireCached(b);
    r.blocks = std::move(hits);
    r.num_computed_tokens = cached;
    e->num_published = static_cast<int32_t>(r.blocks.size());
    AllocateFor(r, cached + count);
    if (!e->admitted_once) {
      e->admitted_once = true;
      r.num_cached_prompt_tokens = std::min(cached, r.num_prompt_tokens);
      num_prefix_hit_tokens += r.num_cached_prompt_tokens;
    }
    r.state = RequestState::kRunning;
    waiting.erase(e);
    InsertRunning(e);
    AddChunk(plan, r, count);
    budget -= count;
    return true;
  }

  // Plans the running requests of one kind (background or not).
  void PlanRunning(bool background, StepPlan& plan, int32_t& budget) {
    auto remaining = [](const Entry* e) {
      return static_cast<int32_t>(e->req->tokens.size()) - e->req->num_computed_tokens;
    };
    // Decodes first, so a long prefill never delays running streams. `running` is sorted
    // best first, so victims (taken from the back) are never before index i.
    for (size_t i = 0; i < running.size() && budget > 0; ++i) {
      if (running[i]->req->background == background && remaining(running[i]) == 1) {
        ScheduleRunning(running[i], plan, budget);
      }
    }
    // Then chunks of prompts (or of recomputation after a preemption) already running.
    for (size_t i = 0; i < running.size() && budget > 0; ++i) {
      if (running[i]->req->background == background && remaining(running[i]) > 1) {
        ScheduleRunning(running[i], plan, budget);
      }
    }
  }

  // Admits waiting requests of one kind, strictly in (priority, arrival) order: the head of
  // the queue waits for blocks rather than being overtaken. Not after a preemption in this
  // step: blocks are short, and re-admitting the victim at once would only thrash.
  void AdmitWaiting(bool background, StepPlan& plan, int32_t& budget) {
    if (!plan.preempted.empty()) return;
    while (budget > 0 && !waiting.empty() && (*waiting.begin())->req->background == background &&
           static_cast<int32_t>(running.size()) < config.max_running_requests) {
      if (!Admit(*waiting.begin(), plan, budget)) break;
    }
  }

  bool OtherRequestWaits() const {
    return !waiting.empty() && !(*waiting.begin())->req->background;
  }

  StepPlan Schedule() {
    graveyard.clear();
    StepPlan plan;
    int32_t budget = config.max_batch_tokens;
    PlanRunning(/*background=*/false, plan, budget);
    AdmitWaiting(/*background=*/false, plan, budget);
    if (OtherRequestWaits()) {
      // It waits for budget, blocks or a running slot: drop the background requests, which
      // may hold what it needs, and try again. Background requests get nothing this step.
      std::vector<Entry*> background;
      for (Entry* e : running) {
        if (e->req->background) background.push_back(e);
      }
      for (Entry* e : waiting) {
        if (e->req->background) background.push_back(e);
      }
      for (Entry* e : background) Preempt(e, plan, budget);
      AdmitWaiting(/*background=*/false, plan, budget);
    } else {
      // What is left goes to the background requests, up to their own cap.
      int32_t background_budget = std::min(budget, config.max_background_step_tokens);
      PlanRunning(/*background=*/true, plan, background_budget);
      AdmitWaiting(/*background=*/true, plan, background_budget);
    }
    return plan;
  }

  void Update(const StepPlan& plan, const std::vector<int32_t>& sampled) {
    assert(sampled.size() == plan.chunks.size());
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const ScheduledChunk& c = plan.chunks[i];
      SchedRequest& r = *c.request;
      if (r.state != RequestState::kRunning) continue;  // aborted or finished meanwhile
      assert(r.num_computed_tokens == c.start);
      r.num_computed_tokens += c.count;
      if (c.sample && sampled[i] >= 0) r.tokens.push_back(sampled[i]);
      auto it = entries.find(r.id);
      assert(it != entries.end() && it->second->req.get() == &r);
      PublishComputedBlocks(*it->second);
    }
  }

  bool Remove(uint64_t id) {
    auto it = entries.find(id);
    if (it == entries.end()) return false;
    Entry* e = it->second.get();
    SchedRequest& r = *e->req;
    if (r.state == RequestState::kWaiting) {
      waiting.erase(e);
    } else {
      EraseRunning(e);
    }
    FreeBlocks(r);
    r.state = RequestState::kFinished;
    graveyard.push_back(std::move(it->second));
    entries.erase(it);
    return true;
  }

  SchedulerConfig config;
  BlockPool& pool;
  uint64_t next_seq = 0;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Entry>> entries;  // live requests by id
  std::set<Entry*, BeforeLess> waiting;
  std::vector<Entry*> running;  // sorted best first
  // Finished/aborted requests, kept until the next Schedule() so pointers stay valid.
  std::vector<std::unique_ptr<Entry>> graveyard;
  int64_t num_preemptions = 0;
  int64_t num_prefix_hit_tokens = 0;
};

Scheduler::Scheduler(const SchedulerConfig& config, BlockPool& pool)
    : impl_(std::make_unique<Impl>(config, pool)) {}

Scheduler::~Scheduler() {
  // Return every block so the pool can outlive the scheduler consistently.
  std::vector<uint64_t> ids;
  for (const auto& [id, e] : impl_->entries) ids.push_back(id);
  for (uint64_t id : ids) impl_->Remove(id);
}

absl::Status Scheduler::Add(std::unique_ptr<SchedRequest> request) {
  Impl& s = *impl_;
  SchedRequest& r = *request;
  const int32_t n = static_cast<int32_t>(r.tokens.size());
  if (n == 0) return absl::InvalidArgumentError("request has no tokens");
  if (r.num_prompt_tokens <= 0 || r.num_prompt_tokens > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_prompt_tokens ", r.num_prompt_tokens, " outside [1, ", n, "]"));
  }
  if (r.max_total_tokens < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_total_tokens ", r.max_total_tokens, " < ", n, " tokens"));
  }
  const int64_t capacity = static_cast<int64_t>(s.pool.num_blocks()) * s.config.block_size;
  if (r.max_total_tokens > capacity) {
    return absl::InvalidArgumentError(absl::StrCat("request needs ", r.max_total_tokens,
                                                   " tokens of KV cache; capacity is ", capacity));
  }
  if (s.entries.contains(r.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id ", r.id, " is already queued"));
  }
  if (static_cast<int32_t>(s.waiting.size()) >= s.config.max_queued_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("waiting queue full (", s.config.max_queued_requests, " requests)"));
  }
  r.state = RequestState::kWaiting;
  r.num_computed_tokens = 0;
  r.num_cached_prompt_tokens = 0;
  r.blocks.clear();
  auto e = std::make_unique<Impl::Entry>();
  e->req = std::move(request);
  e->seq = s.next_seq++;
  Impl::Entry* raw = e.get();
  s.entries.emplace(raw->req->id, std::move(e));
  s.waiting.insert(raw);
  return absl::OkStatus();
}

bool Scheduler::Abort(uint64_t id) { return impl_->Remove(id); }

StepPlan Scheduler::Schedule() { return impl_->Schedule(); }

void Scheduler::Update(const StepPlan& plan, const std::vector<int32_t>& sampled) {
  impl_->Update(plan, sampled);
}

void Scheduler::Finish(uint64_t id) { impl_->Remove(id); }

void Scheduler::Rewrite(uint64_t id, std::vector<int32_t> tokens, int32_t num_computed_tokens) {
  auto it = impl_->entries.find(id);
  if (it == impl_->entries.end()) return;
  SchedRequest& r = *it->second->req;
  assert(!r.share_kv && static_cast<int32_t>(tokens.size()) <= r.max_total_tokens);
  assert(num_computed_tokens <= static_cast<int32_t>(tokens.size()));
  assert(r.state == RequestState::kRunning || num_computed_tokens == 0);
  const int32_t keep = impl_->BlocksFor(num_computed_tokens);
  while (static_cast<int32_t>(r.blocks.size()) > keep) {
    impl_->pool.Release(r.blocks.back());
    r.blocks.pop_back();
  }
  r.tokens = std::move(tokens);
  r.num_computed_tokens = num_computed_tokens;
  r.num_prompt_tokens = std::min(r.num_prompt_tokens, static_cast<int32_t>(r.tokens.size()));
  it->second->block_hashes.clear();
}

SchedulerStats Scheduler::stats() const {
  const Impl& s = *impl_;
  SchedulerStats st;
  st.num_running = static_cast<int32_t>(s.running.size());
  st.num_waiting = static_cast<int32_t>(s.waiting.size());
  st.num_free_blocks = s.pool.num_free();
  st.num_cached_free_blocks = s.pool.num_evictable();
  st.num_total_blocks = s.pool.num_blocks();
  st.num_preemptions = s.num_preemptions;
  st.num_prefix_hit_tokens = s.num_prefix_hit_tokens;
  return st;
}

bool Scheduler::HasWork() const { return !impl_->running.empty() || !impl_->waiting.empty(); }

}  // namespace ridgeserve
