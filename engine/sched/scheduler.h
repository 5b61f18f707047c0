// Iteration-level scheduler: pure CPU logic that decides, for one engine step, which requests
// decode, which prefill chunks run, and who is preempted. It owns the requests' KV block
// tables (through the BlockPool) and the prefix cache, but never touches the model: the
// engine runs the plan and reports back with Update(). Unit-tested with no model at all.
//
// Policy (vLLM v1 style):
// - Token budget per step (max_batch_tokens): running requests first (decodes cost 1 token,
//   a request still prefilling gets a chunk of what is left of the budget), then waiting
//   requests in (priority, arrival) order while budget, max_running_requests and KV blocks
//   allow. Long prompts are chunked, so decodes are never starved.
// - Decodes are planned before prefill chunks, so a long prompt never delays a running
//   stream. New requests are admitted only in a step with no preemption, strictly in order
//   (the head of the queue waits for KV blocks rather than being overtaken).
// - When a running request needs a block and none is free, the lowest-priority (then latest
//   arrived) running request is preempted by recompute: its blocks are freed, it goes back to
//   the front of its priority in the waiting queue, and later recomputes prompt + generated
//   tokens (so greedy output is unchanged). A victim already planned in this step loses its
//   chunk (nothing ran yet; the budget is refunded). When the request short of blocks is
//   itself the worst, it first shrinks its prefill chunk to what the free blocks hold, and is
//   preempted only when not a single token fits. The best request therefore always
//   progresses (its max_total_tokens fits the cache), so everything admitted finishes.
// - Background requests (SchedRequest::background: quality sampling the server runs on idle
//   capacity) come after every other request in every order, run only on the budget and
//   blocks the others leave, and are dropped, never preempted: when another request is still
//   waiting at the end of a plan, or needs a background request's blocks, every background
//   request is removed (StepPlan::dropped) and its blocks freed. Another request is thus
//   never delayed by more than the step in which a background one was planned, and that
//   step holds at most max_background_step_tokens background rows.
// - Prefix caching: full blocks are identified by a hash of (parent hash, block tokens); a
//   new or resumed request reuses cached blocks of its longest cached full-block prefix
//   (never the block holding its last prompt token, so at least one token is computed and
//   logits exist). Freed blocks with a hash stay reusable until their memory is needed.
//
// Engine loop: Add/Abort (from the input queue) -> Schedule() -> run the plan -> Update() ->
// Finish() the requests that stopped. Request pointers handed out (in plans, or kept by the
// engine from before Add) stay valid until the first Schedule() after the request is
// finished or aborted, so the engine may read a request right after Finish()/Abort().
//
// Threading: engine thread only.
#ifndef RIDGESERVE_ENGINE_SCHED_SCHEDULER_H_
#define RIDGESERVE_ENGINE_SCHED_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace ridgeserve {

class BlockPool;

struct SchedulerConfig {
  int32_t max_batch_tokens = 2048;  // rows per forward step
  // Of those, at most this many for background requests: a request arriving while one runs
  // waits for that step, so the step stays short (its prefill goes in chunks this size).
  int32_t max_background_step_tokens = 256;
  int32_t max_running_requests = 64;
  int32_t max_queued_requests = 256;  // waiting requests beyond this: ResourceExhausted
  int32_t block_size = 16;
  bool enable_prefix_caching = true;
};

enum class RequestState { kWaiting, kRunning, kFinished };

// The scheduler's view of one request. Created by the engine, owned by the scheduler after
// Add(); destroyed at the first Schedule() after it is finished or aborted. The engine may
// read it, but only the scheduler writes it (priority must not change after Add()).
struct SchedRequest {
  uint64_t id = 0;
  int32_t priority = 0;         // lower runs first (vLLM semantics)
  std::vector<int32_t> tokens;  // prompt, then generated tokens as they are appended
  int32_t num_prompt_tokens = 0;
  int32_t max_total_tokens = 0;  // prompt + max_new_tokens (KV needed at most)
  // Prefix-cache namespace: requests with different salts never share KV blocks. Set it for
  // anything that writes different K/V for the same tokens (approximate prefill modes).
  uint64_t cache_salt = 0;
  // Approximate prefill: per prompt position, 1 when the row's K/V are approximate (RidgeFill
  // filled rows). Hashed into each block's prefix-cache key, so blocks are shared only between
  // requests that filled the same rows. Empty: every row exact.
  std::vector<uint8_t> filled_rows;
  // False: the request's blocks are never taken from nor published to the prefix cache (SpecKV
  // rewrites its K/V in place, Rewrite()).
  bool share_kv = true;
  // Runs on what other requests leave; dropped under load (see the policy above).
  bool background = false;
  // Tokens whose K/V are in the cache (computed or taken from the prefix cache).
  int32_t num_computed_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;  // of the prompt, taken from the prefix cache
  std::vector<int32_t> blocks;           // KV block table, in position order
  RequestState state = RequestState::kWaiting;
  int32_t num_preemptions = 0;
};

// One request's part of a step: run tokens[start, start + count) at positions start.. .
// `sample` is set when this chunk reaches the end of the known tokens, so the step's logits
// for its last row produce the next token.
struct ScheduledChunk {
  SchedRequest* request = nullptr;
  int32_t start = 0;
  int32_t count = 0;
  bool sample = false;
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;    // decodes first, then prefill chunks
  std::vector<SchedRequest*> preempted;  // preempted during this Schedule()
  // Background requests removed during this Schedule() (state kFinished): the engine ends
  // them. Valid until the next Schedule(), as finished requests are.
  std::vector<SchedRequest*> dropped;
  int32_t num_tokens() const;
};

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_free_blocks = 0;         // includes num_cached_free_blocks (reclaimable)
  int32_t num_cached_free_blocks = 0;  // free blocks still holding a reusable prefix
  int32_t num_total_blocks = 0;
  int64_t num_preemptions = 0;        // since start
  int64_t num_prefix_hit_tokens = 0;  // since start: sum of num_cached_prompt_tokens
};

class Scheduler {
 public:
  // `pool` (config.block_size tokens per block) must outlive the scheduler.
  Scheduler(const SchedulerConfig& config, BlockPool& pool);
  // Frees the blocks of every request still live.
  ~Scheduler();

  // Queues a request (state kWaiting). ResourceExhausted when max_queued_requests are waiting;
  // InvalidArgument when it could never fit in the KV cache (max_total_tokens > capacity), has
  // no tokens, or max_total_tokens < tokens.size(); AlreadyExists for a live id.
  absl::Status Add(std::unique_ptr<SchedRequest> request);
  // Removes a request wherever it is and frees its blocks (state kFinished); false when
  // unknown or already finished. Allowed between Schedule() and Update(): Update() then skips
  // the request's chunk.
  bool Abort(uint64_t id);

  // Plans one step; allocates the blocks every chunk writes. Empty only when nothing is
  // queued or running (or every running request awaits a Finish()).
  StepPlan Schedule();
  // After the step ran: every chunk's tokens are now computed; `sampled[i]` (or -1) is the
  // token sampled for chunks[i] when chunk.sample. Appends sampled tokens to the requests and
  // publishes newly completed full blocks to the prefix cache. sampled.size() ==
  // plan.chunks.size(). A request that got -1 for a sampling chunk has nothing left to
  // compute: the engine must Finish() it.
  void Update(const StepPlan& plan, const std::vector<int32_t>& sampled);
  // Marks a request finished (stop token, length, stop sequence) and frees its blocks; its
  // full blocks stay in the prefix cache. Unknown ids are ignored. The engine must finish a
  // request at the latest when tokens.size() reaches max_total_tokens.
  void Finish(uint64_t id);
  // Replaces a live request's tokens (SpecKV: after compacting its K/V to the first
  // num_computed_tokens places, or after a preemption to start over). A running request keeps
  // the blocks of its first num_computed_tokens places and frees the rest; a waiting one must
  // have num_computed_tokens 0. The request must not share KV (share_kv false) and its tokens
  // must fit max_total_tokens. Unknown ids are ignored.
  void Rewrite(uint64_t id, std::vector<int32_t> tokens, int32_t num_computed_tokens);

  SchedulerStats stats() const;
  bool HasWork() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_SCHED_SCHEDULER_H_
