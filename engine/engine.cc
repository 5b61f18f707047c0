#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/draft/spec_kv.h"
#include "engine/draft/spec_pc.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/parallel/tensor_parallel_executor.h"
#include "engine/ridgefill/ridgefill_maps.h"
#include "engine/ridgefill/ridgefill_plan.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Prefix-cache namespace of SpecPC's compressed prompts: their blocks are never shared with
// exact requests (renumbered or original positions alike).
uint64_t SpecPcCacheSalt(bool original_positions) {
  return 0x5350'4350'0000'0000ull | (original_positions ? 2 : 1);
}

}  // namespace

struct Engine::Impl {
  // A request as the engine thread tracks it, beside the scheduler's SchedRequest.
  struct Live {
    Live(EventCallback callback, Sampler s)
        : on_event(std::move(callback)), sampler(std::move(s)) {}
    EventCallback on_event;
    Sampler sampler;
    int32_t max_new_tokens = 0;
    int32_t prompt_tokens = 0;
    int32_t completion_tokens = 0;
    int32_t cached_prompt_tokens = 0;
    Clock::time_point arrival;
    std::optional<Clock::time_point> first_scheduled;
    std::optional<Clock::time_point> first_token;
    // RidgeFill (split_layer < 0: exact).
    int32_t split_layer = -1;
    int32_t filled_prompt_tokens = 0;  // planned, less the rows the leverage test promoted
    std::vector<uint8_t> promoted;     // per prompt position (recomputes promote them again)
    double estimated_saved_seconds = 0;
    std::shared_ptr<const RidgeFillMaps> maps;  // what the filled rows use, to the end
    // SpecPC: the draft phase's scorer (null once the kept tokens are chosen, and for other
    // requests), the kept prompt positions (original-positions mode: their RoPE positions),
    // the draft's and the target prefill's measured shares of the steps they ran in.
    std::unique_ptr<SpecPcScorer> spec;
    int32_t kept_prompt_tokens = 0;
    int32_t kept_kv_tokens = 0;
    std::vector<int32_t> kept;
    double draft_seconds = 0;
    double target_prefill_seconds = 0;
    int32_t target_prefill_rows = 0;
    int32_t priority = 0;
    // SpecKV: the prompt, the draft's lookahead answer, the tokens emitted so far (replayed after
    // a preemption), the target's captured queries [layer][row - (P - window)][q_dim] of the
    // prefill over prompt + lookahead, the first token (from the last prompt row) until the
    // prefill completes, and whether the K/V are compacted (then `kept` has budget entries).
    SpecKvParams spec_kv;  // budget 0: not SpecKV
    std::vector<int32_t> prompt_ids;
    std::vector<int32_t> lookahead;
    std::vector<int32_t> generated;
    std::vector<float> kv_queries;
    int32_t kv_first_token = -1;
    float kv_first_logprob = 0;
    bool compacted = false;
    // ScoringRequest: capture first_logprobs / emitted_nll, teacher-forced tokens.
    bool capture = false;
    std::vector<int32_t> forced;
    double emitted_nll = 0;
    // Online calibration: the next prompt position whose rows may be taken.
    int32_t calibration_next = 0;
    bool kv_prefilling() const { return spec_kv.budget > 0 && !compacted && !lookahead.empty(); }
    // Every prompt row runs every layer on exact K/V over the whole prompt.
    bool exact_prefill() const {
      return split_layer < 0 && spec_kv.budget == 0 && spec == nullptr &&
             kept_prompt_tokens == prompt_tokens;
    }
  };

  struct Incoming {
    uint64_t id;
    EngineRequest request;
    std::vector<uint8_t> filled_rows;  // RidgeFill plan; empty for exact requests
    std::shared_ptr<const RidgeFillMaps> maps;
    Clock::time_point arrival;
  };

  // RunOnEngineThread's work, run between steps.
  struct Task {
    std::function<void()> fn;
    std::shared_ptr<std::promise<void>> done;
  };
  void RunTasks();

  // caches[r] holds rank r's KV heads (one cache at TP = 1); the scheduler hands out rank 0's
  // blocks, and every rank uses the same ones. `tp` runs the ranks over them (TP > 1).
  Impl(Model& m, const EngineOptions& o, std::vector<std::unique_ptr<PagedKvCache>> kv,
       std::unique_ptr<TensorParallelExecutor> tp, std::unique_ptr<PagedKvCache> draft_kv)
      : model(m),
        options(o),
        caches(std::move(kv)),
        cache(caches.front().get()),
        executor(std::move(tp)),
        draft_cache(std::move(draft_kv)) {
    const int32_t block_size = options.scheduler.block_size;
    const int32_t num_blocks = cache->shape().num_blocks;
    scheduler = std::make_unique<Scheduler>(options.scheduler, cache->pool());
    if (draft_cache != nullptr) {
      // Every SpecPC request passes through the draft first; its queue is bounded by the
      // target's at Submit. No prefix caching: the scored rows must run to be captured.
      SchedulerConfig draft_config = options.scheduler;
      draft_config.max_queued_requests = std::numeric_limits<int32_t>::max();
      draft_config.enable_prefix_caching = false;
      draft_scheduler = std::make_unique<Scheduler>(draft_config, draft_cache->pool());
      const DraftModel& d = *options.draft;
      const SpecPcParams params = DefaultSpecPcParams(model.config, d.num_layers, 0, 1);
      for (int32_t l = params.first_layer; l < params.num_layers; ++l)
        draft_scored_layers.push_back(l);
    }
    published.kv_blocks_total = num_blocks;
    published.kv_blocks_free = num_blocks;
    published.kv_block_size = block_size;
  }

  void Run();
  // Moves queued submissions and aborts into the scheduler; false when stopping.
  bool TakeInput();
  bool HasWork() const {
    return scheduler->HasWork() || (draft_scheduler != nullptr && draft_scheduler->HasWork());
  }
  void Step();
  // The target's forward, sampling and events for one step's plan.
  void RunTarget(const StepPlan& plan);
  // EngineOptions::calibration_rows: the rows of this step's batch to take (indices into the
  // captured rows), advancing each request's calibration_next. Empty when off.
  std::vector<int32_t> CalibrationRowsOf(const StepPlan& plan, const ForwardBatch& batch,
                                         std::span<const int32_t> chunk_row);
  // The draft's forward for SpecPC requests still drafting; those whose lookahead is complete
  // get their kept tokens and move to the target's scheduler.
  void RunDraft(const StepPlan& plan);
  // Scores and selects a drafted request's kept tokens and queues it for the target.
  void FinishDrafting(SchedRequest& drafted, Live& l);
  // SpecKV: queues a drafted request's prompt + lookahead for the target.
  void FinishKvDrafting(SchedRequest& drafted, Live& l);
  // SpecKV: after the target's prefill of prompt + lookahead, selects and compacts the kept
  // entries of every layer and KV head, and rewrites the request to decode after them.
  void CompactKv(SchedRequest& r, Live& l);
  void Emit(uint64_t id, Live& live, TokenEvent& event);
  void FinishWith(uint64_t id, FinishReason reason, absl::Status status);
  void Publish();
  // EngineOptions::step_timeout_seconds: the watchdog thread's loop, until the engine stops or
  // is broken.
  void Watch();
  // The engine can run no more steps, for `reason`: the first reason is kept and reported
  // (EngineOptions::on_broken), later ones are dropped. Any thread.
  void Break(const absl::Status& reason);
  // OK, or why the engine is broken.
  absl::Status Broken();
  // What the requests of a step that failed with `status` get: why the engine is broken, where it
  // is (UNAVAILABLE: a client may retry elsewhere), else INTERNAL.
  absl::Status StepFailure(const absl::Status& status);

  Model& model;
  const EngineOptions options;
  std::vector<std::unique_ptr<PagedKvCache>> caches;
  PagedKvCache* cache;                               // rank 0's
  std::unique_ptr<TensorParallelExecutor> executor;  // TP > 1
  std::unique_ptr<Scheduler> scheduler;
  // SpecPC (options.draft set): the draft's cache and scheduler, and the draft layers whose
  // queries are scored (the same for every request).
  std::unique_ptr<PagedKvCache> draft_cache;
  std::unique_ptr<Scheduler> draft_scheduler;
  std::vector<int32_t> draft_scored_layers;

  // Shared with submitting threads, under `mu`.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Incoming> incoming;
  std::vector<uint64_t> aborts;
  std::vector<Task> tasks;
  bool stopping = false;
  bool exited = false;  // the engine thread ran its last task
  uint64_t next_id = 1;
  EngineStats published;
  std::optional<Clock::time_point> step_started;  // of the step now running
  absl::Status broken;                            // OK while steps can run
  std::condition_variable watchdog_cv;            // wakes the watchdog once `exited`

  // Engine thread only.
  std::unordered_map<uint64_t, Live> live;
  int64_t steps = 0;
  double step_seconds = 0.0;
  double forward_seconds = 0.0;
  int64_t step_rows = 0;
  std::thread thread;
  std::thread watchdog;  // options.step_timeout_seconds > 0
};

bool Engine::Impl::TakeInput() {
  std::deque<Incoming> fresh;
  std::vector<uint64_t> to_abort;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!HasWork()) {
      cv.wait(lock,
              [&] { return stopping || !incoming.empty() || !aborts.empty() || !tasks.empty(); });
    }
    if (stopping) return false;
    fresh.swap(incoming);
    to_abort.swap(aborts);
  }
  for (Incoming& in : fresh) {
    EngineRequest& r = in.request;
    auto sched = std::make_unique<SchedRequest>();
    sched->id = in.id;
    sched->priority = r.priority;
    sched->tokens = r.prompt;
    sched->num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
    sched->max_total_tokens = static_cast<int32_t>(r.prompt.size()) + r.max_new_tokens;
    sched->background = r.scoring.background;
    Live l{std::move(r.on_event), Sampler(r.sampling)};
    l.capture = r.scoring.capture;
    l.forced = std::move(r.scoring.forced);
    l.max_new_tokens = r.max_new_tokens;
    l.prompt_tokens = sched->num_prompt_tokens;
    l.kept_prompt_tokens = l.prompt_tokens;
    l.kept_kv_tokens = l.prompt_tokens;
    l.priority = r.priority;
    l.arrival = in.arrival;
    // SpecPC (Submit cleared budgets the prompt fits in): drafting first, the prompt plus the
    // lookahead in the draft's cache.
    const bool drafting = r.spec_pc.budget > 0 || r.spec_kv.budget > 0;
    if (r.spec_pc.budget > 0) {
      const SpecPcParams params = DefaultSpecPcParams(model.config, options.draft->num_layers,
                                                      r.spec_pc.budget, r.spec_pc.lookahead_tokens);
      l.spec = std::make_unique<SpecPcScorer>(options.draft->config(), params, l.prompt_tokens);
      sched->max_total_tokens = l.prompt_tokens + params.lookahead_tokens;
    } else if (r.spec_kv.budget > 0) {
      l.spec_kv.budget = r.spec_kv.budget;
      l.spec_kv.lookahead_tokens = std::min(r.spec_kv.lookahead_tokens, r.max_new_tokens);
      l.prompt_ids = r.prompt;
      sched->max_total_tokens = l.prompt_tokens + l.spec_kv.lookahead_tokens;
    }
    if (!in.filled_rows.empty()) {
      l.split_layer = r.ridgefill.split_layer;
      l.filled_prompt_tokens = static_cast<int32_t>(
          std::count(in.filled_rows.begin(), in.filled_rows.end(), uint8_t{1}));
      // The maps' id (a map file's checksum), never their address: blocks filled by maps
      // that were swapped out must not match a request on new maps at the same address.
      sched->cache_salt = RidgeFillCacheSalt(l.split_layer, in.maps->id());
      sched->filled_rows = std::move(in.filled_rows);
      l.maps = std::move(in.maps);
    }
    live.emplace(in.id, std::move(l));
    Scheduler& first = drafting ? *draft_scheduler : *scheduler;
    if (absl::Status s = first.Add(std::move(sched)); !s.ok()) {
      FinishWith(
          in.id, FinishReason::kNone,
          s.code() == absl::StatusCode::kInvalidArgument ? absl::OutOfRangeError(s.message()) : s);
    }
  }
  for (uint64_t id : to_abort) {
    if (live.count(id) != 0 &&
        (scheduler->Abort(id) || (draft_scheduler != nullptr && draft_scheduler->Abort(id)))) {
      FinishWith(id, FinishReason::kAborted, absl::OkStatus());
    }
  }
  return true;
}

void Engine::Impl::Emit(uint64_t id, Live& l, TokenEvent& event) {
  event.id = id;
  event.prompt_tokens = l.prompt_tokens;
  event.completion_tokens = l.completion_tokens;
  event.cached_prompt_tokens = l.cached_prompt_tokens;
  event.split_layer = l.split_layer;
  event.emitted_nll = l.emitted_nll;
  if (l.first_token) {
    event.timing.ttft_seconds = Seconds(l.arrival, *l.first_token);
    event.filled_prompt_tokens = l.filled_prompt_tokens;
    event.exact_prompt_tokens = l.prompt_tokens - l.filled_prompt_tokens;
    if (l.split_layer >= 0) {
      event.skipped_layer_tokens =
          int64_t{l.filled_prompt_tokens} * (model.config.num_layers - 1 - l.split_layer);
    }
    event.timing.estimated_ttft_saved_seconds = l.estimated_saved_seconds;
    event.kept_prompt_tokens = l.kept_prompt_tokens;
    event.kept_kv_tokens = l.kept_kv_tokens;
    event.timing.draft_seconds = l.draft_seconds;
  }
  if (event.finished) {
    const Clock::time_point now = Clock::now();
    if (l.first_scheduled) {
      event.timing.queue_seconds = Seconds(l.arrival, *l.first_scheduled);
      if (l.first_token) event.timing.prefill_seconds = Seconds(*l.first_scheduled, *l.first_token);
    }
    event.timing.e2e_seconds = Seconds(l.arrival, now);
  }
  l.on_event(event);
}

void Engine::Impl::FinishWith(uint64_t id, FinishReason reason, absl::Status status) {
  auto it = live.find(id);
  if (it == live.end()) return;
  TokenEvent event;
  event.finished = true;
  event.finish_reason = reason;
  event.status = std::move(status);
  Emit(id, it->second, event);
  live.erase(it);
}

void Engine::Impl::Step() {
  const Clock::time_point start = Clock::now();
  const StepPlan plan = scheduler->Schedule();
  const StepPlan draft_plan = draft_scheduler != nullptr ? draft_scheduler->Schedule() : StepPlan{};
  if (plan.chunks.empty() && draft_plan.chunks.empty()) {
    // Work exists but nothing fits this instant (e.g. waiting for blocks): let input arrive.
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::milliseconds(1));
    return;
  }
  for (const SchedRequest* r : plan.dropped) {
    FinishWith(r->id, FinishReason::kNone,
               absl::UnavailableError("background request dropped: other requests need the "
                                      "capacity"));
  }
  // A preempted SpecKV request whose K/V were compacted starts over from prompt + lookahead
  // (and replays what it emitted).
  for (SchedRequest* r : plan.preempted) {
    Live& l = live.at(r->id);
    if (!l.compacted) continue;
    std::vector<int32_t> tokens = l.prompt_ids;
    tokens.insert(tokens.end(), l.lookahead.begin(), l.lookahead.end());
    scheduler->Rewrite(r->id, std::move(tokens), 0);
    l.compacted = false;
    l.kept.clear();
  }
  if (!plan.chunks.empty()) RunTarget(plan);
  if (!draft_plan.chunks.empty()) RunDraft(draft_plan);
  ++steps;
  step_seconds += Seconds(start, Clock::now());
}

std::vector<int32_t> Engine::Impl::CalibrationRowsOf(const StepPlan& plan,
                                                     const ForwardBatch& batch,
                                                     std::span<const int32_t> chunk_row) {
  const EngineOptions::CalibrationRows& want = options.calibration_rows;
  std::vector<int32_t> rows;
  if (!want.take) return rows;
  // With filled rows in the batch the capture holds the exact rows only, in batch order.
  std::vector<int32_t> captured_index;
  if (!batch.fill_split.empty()) {
    captured_index.resize(batch.num_rows());
    int32_t next = 0;
    for (int32_t r = 0; r < batch.num_rows(); ++r) {
      captured_index[r] = batch.fill_split[r] < 0 ? next++ : -1;
    }
  }
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    Live& l = live.at(chunk.request->id);
    if (!l.exact_prefill()) continue;
    const int32_t end = std::min(chunk.start + chunk.count, l.prompt_tokens);
    for (int32_t p = std::max({chunk.start, l.calibration_next, want.first_position}); p < end;
         ++p) {
      if (p % want.stride != 0) continue;
      const int32_t row = chunk_row[i] + p - chunk.start;
      rows.push_back(captured_index.empty() ? row : captured_index[row]);
    }
    l.calibration_next = std::max(l.calibration_next, end);
  }
  return rows;
}

void Engine::Impl::RunTarget(const StepPlan& plan) {
  const Clock::time_point start = Clock::now();
  const int32_t block_size = cache->shape().block_size;
  ForwardBatch batch;
  ForwardCapture capture;
  std::vector<std::pair<Live*, int32_t>> captured;  // SpecKV: each captured row's request, position
  // RidgeFill: filled rows per chunk (their split is the request's).
  std::vector<int32_t> filled_in_chunk(plan.chunks.size(), 0);
  std::vector<int32_t> chunk_row(plan.chunks.size(), 0);  // the chunk's first batch row
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    SchedRequest& r = *chunk.request;
    Live& l = live.at(r.id);
    if (!l.first_scheduled) l.first_scheduled = start;
    chunk_row[i] = batch.num_rows();
    const bool kv_prefill = l.kv_prefilling();
    batch.AddSequence(r.blocks, block_size, std::span(r.tokens).subspan(chunk.start, chunk.count),
                      chunk.start, chunk.sample && !kv_prefill);
    if (kv_prefill) {
      // SpecKV: the first token's logits from the last prompt row; the window's and the
      // lookahead's queries at every layer.
      const int32_t last = l.prompt_tokens - 1;
      if (chunk.start <= last && last < chunk.start + chunk.count) {
        batch.logit_rows.push_back(chunk_row[i] + last - chunk.start);
      }
      for (int32_t p = std::max(chunk.start, l.prompt_tokens - l.spec_kv.window);
           p < chunk.start + chunk.count; ++p) {
        capture.query_rows.push_back(chunk_row[i] + p - chunk.start);
        captured.emplace_back(&l, p);
      }
    }
    const int32_t fill_end =
        std::min(chunk.start + chunk.count, static_cast<int32_t>(r.filled_rows.size()));
    const int32_t filled =
        static_cast<int32_t>(std::count(r.filled_rows.begin() + std::min(chunk.start, fill_end),
                                        r.filled_rows.begin() + fill_end, uint8_t{1}));
    if (filled == 0) continue;
    filled_in_chunk[i] = filled;
    batch.fill_split.resize(batch.num_rows() - chunk.count, -1);
    batch.row_fill.resize(batch.num_rows() - chunk.count, nullptr);
    for (int32_t p = chunk.start; p < chunk.start + chunk.count; ++p) {
      const bool fill = p < fill_end && r.filled_rows[p] != 0;
      batch.fill_split.push_back(fill ? l.split_layer : -1);
      batch.row_fill.push_back(fill ? l.maps.get() : nullptr);
    }
  }
  if (!batch.fill_split.empty()) {
    batch.fill_split.resize(batch.num_rows(), -1);
    batch.row_fill.resize(batch.num_rows(), nullptr);
  }
  // SpecPC with original positions: kept token i runs at cache place i with RoPE position
  // kept[i]; generated tokens continue after the whole prompt.
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    const Live& l = live.at(chunk.request->id);
    if (l.kept.empty()) continue;
    if (batch.rope_positions.empty()) batch.rope_positions = batch.positions;
    const int32_t kept = static_cast<int32_t>(l.kept.size());
    for (int32_t p = chunk.start; p < chunk.start + chunk.count; ++p) {
      batch.rope_positions[chunk_row[i] + p - chunk.start] =
          p < kept ? l.kept[p] : l.prompt_tokens + (p - kept);
    }
  }
  ForwardProfile profile;
  ForwardProfile* wanted = batch.fill_split.empty() ? nullptr : &profile;
  const int32_t num_layers = model.config.num_layers;
  if (!captured.empty()) {
    for (int32_t layer = 0; layer < num_layers; ++layer) capture.query_layers.push_back(layer);
  }
  const std::vector<int32_t> calibration = CalibrationRowsOf(plan, batch, chunk_row);
  if (!calibration.empty()) capture.depths = options.calibration_rows.depths;
  const bool capturing = !captured.empty() || !calibration.empty();
  const Clock::time_point forward_start = Clock::now();
  absl::Status status = Broken();
  if (status.ok()) {
    status = executor != nullptr
                 ? executor->Run(batch, wanted)
                 : model.llama->Run(batch, *cache, capturing ? &capture : nullptr, wanted);
  }
  forward_seconds += Seconds(forward_start, Clock::now());
  step_rows += batch.num_rows();
  if (executor != nullptr && !executor->broken().ok()) Break(executor->broken());
  if (status.ok() && !calibration.empty()) {
    options.calibration_rows.take(capture.states, calibration);
  }
  const size_t q_dim = static_cast<size_t>(model.config.num_heads) * model.config.head_dim;
  for (size_t j = 0; status.ok() && j < captured.size(); ++j) {
    Live& l = *captured[j].first;
    const size_t rows = l.spec_kv.window + l.lookahead.size();
    l.kv_queries.resize(rows * num_layers * q_dim);
    const size_t row = captured[j].second - (l.prompt_tokens - l.spec_kv.window);
    for (int32_t layer = 0; layer < num_layers; ++layer) {
      std::copy_n(capture.queries[layer].begin() + j * q_dim, q_dim,
                  l.kv_queries.begin() + (layer * rows + row) * q_dim);
    }
  }
  // SpecPC: the target prefill's share of this step, per kept row, prices the dropped rows.
  const double row_seconds = Seconds(start, Clock::now()) / batch.num_rows();
  for (const ScheduledChunk& chunk : plan.chunks) {
    Live& l = live.at(chunk.request->id);
    if (l.kept_prompt_tokens == l.prompt_tokens || chunk.start >= l.kept_prompt_tokens) continue;
    const int32_t rows = std::min(chunk.count, l.kept_prompt_tokens - chunk.start);
    l.target_prefill_seconds += rows * row_seconds;
    l.target_prefill_rows += rows;
  }
  for (int32_t row : profile.promoted_rows) {
    const size_t i =
        std::upper_bound(chunk_row.begin(), chunk_row.end(), row) - chunk_row.begin() - 1;
    --filled_in_chunk[i];
    Live& l = live.at(plan.chunks[i].request->id);
    const int32_t pos = plan.chunks[i].start + (row - chunk_row[i]);
    if (l.promoted.empty()) l.promoted.resize(l.prompt_tokens, 0);
    if (l.promoted[pos] == 0) {
      l.promoted[pos] = 1;
      --l.filled_prompt_tokens;
    }
  }
  std::vector<int32_t> sampled(plan.chunks.size(), -1);
  std::vector<float> logprobs(plan.chunks.size(), 0.0f);
  // ScoringRequest::capture: each sampled token's -log p, and the first token's distribution.
  std::vector<double> nll(plan.chunks.size(), 0.0);
  std::vector<std::vector<float>> first_logprobs(plan.chunks.size());
  const int32_t vocab = model.config.vocab_size;
  // The rows to sample, found in chunk order. Most are drawn on the backend (Backend::Sample:
  // only tokens come back); rows that need their whole distribution on the host (a scoring
  // capture, or a forced token's log-probability) are copied here and drawn by the same
  // definition. Each row has its own request's sampler, so a token does not depend on where
  // it was drawn or on the other rows.
  struct Draw {
    size_t chunk;
    Live* live;
    int32_t logit_row;
    std::vector<int32_t> context;  // SpecKV: prompt + emitted tokens (its tokens are not)
    bool kv_first = false;         // SpecKV's first token, sampled once during its prefill
    SampledToken result;
  };
  std::vector<Draw> draws;
  draws.reserve(plan.chunks.size());
  std::vector<size_t> emits_kv_first;  // chunks whose sampled token is SpecKV's first token
  int32_t logit_row = 0;
  for (size_t i = 0; status.ok() && i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    Live& l = live.at(chunk.request->id);
    if (l.kv_prefilling()) {
      // The first token, sampled once (a recompute after preemption reuses it), emitted when
      // the prefill of prompt + lookahead completes; a replay emits nothing new here.
      const int32_t last = l.prompt_tokens - 1;
      if (chunk.start <= last && last < chunk.start + chunk.count) {
        if (l.kv_first_token < 0) draws.push_back({i, &l, logit_row, {}, true, {}});
        ++logit_row;
      }
      if (chunk.sample && l.generated.empty()) emits_kv_first.push_back(i);
      continue;
    }
    if (!chunk.sample) continue;
    std::vector<int32_t> context;
    if (l.spec_kv.budget > 0) {
      context = l.prompt_ids;
      context.insert(context.end(), l.generated.begin(), l.generated.end());
    }
    draws.push_back({i, &l, logit_row++, std::move(context), false, {}});
  }
  const auto context_of = [&](const Draw& d) -> const std::vector<int32_t>& {
    return d.kv_first                   ? d.live->prompt_ids
           : d.live->spec_kv.budget > 0 ? d.context
                                        : plan.chunks[d.chunk].request->tokens;
  };
  std::vector<SampleSpec> specs;
  std::vector<Draw*> on_backend;
  std::vector<int32_t> penalty_ids;
  std::vector<Draw*> on_host;
  std::vector<int32_t> host_rows;
  for (Draw& d : draws) {
    const Live& l = *d.live;
    const bool forced = !d.kv_first && !l.forced.empty();
    if (forced && !l.capture && !l.sampler.params().logprobs) {
      d.result.token = l.forced[l.completion_tokens];  // nothing to read from the logits
      continue;
    }
    if (forced || (!d.kv_first && l.capture)) {
      on_host.push_back(&d);
      host_rows.push_back(d.logit_row);
      continue;
    }
    SampleSpec spec = d.live->sampler.Next(d.logit_row);
    if (spec.repetition_penalty != 1.0f) {
      const std::vector<int32_t>& context = context_of(d);
      spec.penalty_begin = static_cast<int32_t>(penalty_ids.size());
      penalty_ids.insert(penalty_ids.end(), context.begin(), context.end());
      spec.penalty_end = static_cast<int32_t>(penalty_ids.size());
    }
    specs.push_back(spec);
    on_backend.push_back(&d);
  }
  LlamaModel& head = executor != nullptr ? executor->head() : *model.llama;
  std::vector<SampledToken> results(specs.size());
  std::vector<float> host_logits(host_rows.size() * static_cast<size_t>(vocab));
  if (status.ok()) {
    const Clock::time_point sample_start = Clock::now();
    status = head.SampleLogits(specs, penalty_ids, results.data());
    if (status.ok()) status = head.CopyLogits(host_rows, host_logits.data());
    forward_seconds += Seconds(sample_start, Clock::now());
  }
  // The profile's time marks, read after sampling. Reading waits for the step's work where
  // sampling did not (a prefill chunk samples nothing): forward time, not the engine thread's.
  const Clock::time_point read_start = Clock::now();
  if (status.ok()) profile.ReadTimes();
  for (size_t i = 0; status.ok() && i < plan.chunks.size(); ++i) {
    if (filled_in_chunk[i] == 0) continue;
    Live& l = live.at(plan.chunks[i].request->id);
    l.estimated_saved_seconds +=
        filled_in_chunk[i] * profile.SavedSecondsPerRow(l.split_layer, model.config.num_layers);
  }
  forward_seconds += Seconds(read_start, Clock::now());
  for (size_t j = 0; status.ok() && j < on_backend.size(); ++j) on_backend[j]->result = results[j];
  for (size_t j = 0; status.ok() && j < on_host.size(); ++j) {
    Draw& d = *on_host[j];
    Live& l = *d.live;
    const std::span<float> row(host_logits.data() + j * vocab, vocab);
    if (l.forced.empty()) {
      d.result = l.sampler.Sample(row, context_of(d));
    } else {
      d.result.token = l.forced[l.completion_tokens];
      if (l.sampler.params().logprobs) d.result.logprob = LogSoftmaxAt(row, d.result.token);
    }
    if (l.capture) {
      nll[d.chunk] = -LogSoftmaxAt(row, d.result.token);
      if (!l.first_token) first_logprobs[d.chunk] = LogSoftmax(row);
    }
  }
  for (const Draw& d : draws) {
    if (d.kv_first) {
      d.live->kv_first_token = d.result.token;
      d.live->kv_first_logprob = d.result.logprob;
    } else {
      sampled[d.chunk] = d.result.token;
      logprobs[d.chunk] = d.result.logprob;
    }
  }
  for (size_t i : emits_kv_first) {
    const Live& l = live.at(plan.chunks[i].request->id);
    sampled[i] = l.kv_first_token;
    logprobs[i] = l.kv_first_logprob;
  }
  // Every request of the step ends with the step's failure (its blocks freed).
  const auto fail_step = [&](const absl::Status& status) {
    spdlog::error("forward failed: {}", status.ToString());
    const absl::Status failed = StepFailure(status);
    for (const ScheduledChunk& chunk : plan.chunks) {
      const uint64_t id = chunk.request->id;
      scheduler->Abort(id);
      FinishWith(id, FinishReason::kNone, failed);
    }
  };
  if (!status.ok()) {
    fail_step(status);
    return;
  }
  scheduler->Update(plan, sampled);
  for (const ScheduledChunk& chunk : plan.chunks) {
    Live& l = live.at(chunk.request->id);
    if (chunk.sample && l.kv_prefilling()) CompactKv(*chunk.request, l);
  }
  // A broken engine's step fails whatever it computed (the step past the timeout among them),
  // checked after SpecKV's compaction, which runs on the backend too.
  if (absl::Status b = Broken(); !b.ok()) {
    fail_step(b);
    return;
  }
  const Clock::time_point now = Clock::now();
  const std::vector<int32_t>& eog = model.tokenizer->end_of_generation_ids();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (sampled[i] < 0) continue;
    const SchedRequest& r = *plan.chunks[i].request;
    const uint64_t id = r.id;
    Live& l = live.at(id);
    if (!l.first_token) {
      l.first_token = now;
      l.cached_prompt_tokens = r.num_cached_prompt_tokens;
      if (l.target_prefill_rows > 0) {
        l.estimated_saved_seconds = (l.prompt_tokens - l.kept_prompt_tokens) *
                                        l.target_prefill_seconds / l.target_prefill_rows -
                                    l.draft_seconds;
      }
    }
    TokenEvent event;
    event.first_logprobs = std::move(first_logprobs[i]);
    const int32_t token = sampled[i];
    if (l.forced.empty() && l.sampler.IsStop(token, eog)) {
      event.finished = true;
      event.finish_reason = FinishReason::kStop;
    } else {
      ++l.completion_tokens;
      l.emitted_nll += nll[i];
      if (l.spec_kv.budget > 0) l.generated.push_back(token);
      event.tokens.push_back(token);
      if (l.sampler.params().logprobs) event.logprobs.push_back(logprobs[i]);
      if (l.completion_tokens >= l.max_new_tokens ||
          static_cast<int32_t>(r.tokens.size()) >= model.config.context_length) {
        event.finished = true;
        event.finish_reason = FinishReason::kLength;
      }
    }
    Emit(id, l, event);
    if (event.finished) {
      scheduler->Finish(id);
      live.erase(id);
    }
  }
}

void Engine::Impl::RunDraft(const StepPlan& plan) {
  const Clock::time_point start = Clock::now();
  const DraftModel& draft = *options.draft;
  const int32_t block_size = draft_cache->shape().block_size;
  ForwardBatch batch;
  batch.num_layers = draft.num_layers;
  ForwardCapture capture;
  capture.query_layers = draft_scored_layers;
  std::vector<std::pair<Live*, int32_t>> captured;  // each captured row's request and position
  for (const ScheduledChunk& chunk : plan.chunks) {
    SchedRequest& r = *chunk.request;
    Live& l = live.at(r.id);
    if (!l.first_scheduled) l.first_scheduled = start;
    const int32_t row0 = batch.num_rows();
    batch.AddSequence(r.blocks, block_size, std::span(r.tokens).subspan(chunk.start, chunk.count),
                      chunk.start, chunk.sample);
    for (int32_t p = chunk.start; p < chunk.start + chunk.count; ++p) {
      if (l.spec == nullptr || !l.spec->Wants(p)) continue;
      capture.query_rows.push_back(row0 + p - chunk.start);
      captured.emplace_back(&l, p);
    }
  }
  const Clock::time_point forward_start = Clock::now();
  absl::Status status = Broken();
  if (status.ok()) status = draft.llama->Run(batch, *draft_cache, &capture, nullptr);
  // The draft's tokens are greedy, drawn on the backend: one spec per sampled row.
  std::vector<SampleSpec> greedy;
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (!chunk.sample) continue;
    greedy.push_back({.row = static_cast<int32_t>(greedy.size()), .temperature = 0.0f});
  }
  std::vector<SampledToken> drafted(greedy.size());
  if (status.ok()) status = draft.llama->SampleLogits(greedy, {}, drafted.data());
  forward_seconds += Seconds(forward_start, Clock::now());
  if (status.ok()) status = Broken();  // the step past the timeout among them
  if (!status.ok()) {
    spdlog::error("draft forward failed: {}", status.ToString());
    const absl::Status failed = StepFailure(status);
    for (const ScheduledChunk& chunk : plan.chunks) {
      draft_scheduler->Abort(chunk.request->id);
      FinishWith(chunk.request->id, FinishReason::kNone, failed);
    }
    return;
  }
  const size_t q_dim = static_cast<size_t>(draft.config().num_heads) * draft.config().head_dim;
  for (size_t j = 0; j < captured.size(); ++j) {
    for (size_t li = 0; li < capture.queries.size(); ++li) {
      captured[j].first->spec->SetQuery(
          captured[j].second, static_cast<int32_t>(li),
          std::span<const float>(capture.queries[li]).subspan(j * q_dim, q_dim));
    }
  }
  std::vector<int32_t> sampled(plan.chunks.size(), -1);
  size_t drawn = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (plan.chunks[i].sample) sampled[i] = drafted[drawn++].token;
  }
  draft_scheduler->Update(plan, sampled);
  const double seconds = Seconds(start, Clock::now());
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    SchedRequest& r = *plan.chunks[i].request;
    Live& l = live.at(r.id);
    l.draft_seconds += seconds * plan.chunks[i].count / batch.num_rows();
    // SpecKV's answer also ends at an end-of-generation token (included).
    const std::vector<int32_t>& eog = model.tokenizer->end_of_generation_ids();
    const bool stopped = l.spec_kv.budget > 0 && sampled[i] >= 0 &&
                         std::find(eog.begin(), eog.end(), sampled[i]) != eog.end();
    if (static_cast<int32_t>(r.tokens.size()) < r.max_total_tokens && !stopped) continue;
    const uint64_t id = r.id;
    if (l.spec_kv.budget > 0) {
      FinishKvDrafting(r, l);
    } else {
      FinishDrafting(r, l);
    }
    draft_scheduler->Finish(id);
  }
}

void Engine::Impl::FinishDrafting(SchedRequest& drafted, Live& l) {
  const Clock::time_point start = Clock::now();
  const std::vector<float> scores =
      l.spec->Scores(*draft_cache, options.draft->llama->backend(), drafted.blocks);
  const SpecPcParams& params = l.spec->params();
  std::vector<int32_t> kept =
      SelectSpecPcTokens(scores, params.budget, params.kernel, params.window);
  auto sched = std::make_unique<SchedRequest>();
  sched->id = drafted.id;
  sched->priority = l.priority;
  for (int32_t p : kept) sched->tokens.push_back(drafted.tokens[p]);
  sched->num_prompt_tokens = static_cast<int32_t>(kept.size());
  sched->max_total_tokens = sched->num_prompt_tokens + l.max_new_tokens;
  sched->cache_salt = SpecPcCacheSalt(options.spec_pc_original_positions);
  l.kept_prompt_tokens = sched->num_prompt_tokens;
  if (options.spec_pc_original_positions) l.kept = std::move(kept);
  l.spec.reset();
  l.draft_seconds += Seconds(start, Clock::now());
  if (absl::Status s = scheduler->Add(std::move(sched)); !s.ok()) {
    FinishWith(drafted.id, FinishReason::kNone, s);
  }
}

void Engine::Impl::FinishKvDrafting(SchedRequest& drafted, Live& l) {
  l.lookahead.assign(drafted.tokens.begin() + l.prompt_tokens, drafted.tokens.end());
  auto sched = std::make_unique<SchedRequest>();
  sched->id = drafted.id;
  sched->priority = l.priority;
  sched->tokens = l.prompt_ids;
  sched->tokens.insert(sched->tokens.end(), l.lookahead.begin(), l.lookahead.end());
  sched->num_prompt_tokens = static_cast<int32_t>(sched->tokens.size());
  // Prompt + lookahead + the first token, then at most budget + max_new_tokens.
  sched->max_total_tokens =
      std::max(sched->num_prompt_tokens + 1, l.spec_kv.budget + l.max_new_tokens);
  sched->share_kv = false;
  if (absl::Status s = scheduler->Add(std::move(sched)); !s.ok()) {
    FinishWith(drafted.id, FinishReason::kNone, s);
  }
}

void Engine::Impl::CompactKv(SchedRequest& r, Live& l) {
  const Clock::time_point start = Clock::now();
  const ModelConfig& c = model.config;
  const int32_t P = l.prompt_tokens, W = l.spec_kv.window;
  const int32_t T = P + static_cast<int32_t>(l.lookahead.size());
  const int32_t rows = T - (P - W);
  const size_t q_dim = static_cast<size_t>(c.num_heads) * c.head_dim;
  std::vector<int32_t> positions(rows);
  std::iota(positions.begin(), positions.end(), P - W);
  std::vector<int32_t> tokens;
  Backend& backend = model.llama->backend();
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    const std::span<const float> queries =
        std::span(l.kv_queries).subspan(static_cast<size_t>(layer) * rows * q_dim, rows * q_dim);
    const KvLayerView kv = cache->layer(layer);
    const std::vector<std::vector<int32_t>> kept =
        SelectSpecKvLayer(backend, kv, r.blocks, c, queries, positions, P, l.spec_kv);
    CompactKvLayer(backend, kv, r.blocks, kept);
    // The scheduler's tokens for the kept places (they never run again): layer 0's first head.
    if (layer == 0) {
      for (int32_t p : kept.front()) tokens.push_back(l.prompt_ids[p]);
    }
  }
  // Decoding continues after the kept entries: the first token (appended by Update), or after a
  // preemption everything emitted so far, recomputed at RoPE positions P, P + 1, ...
  if (l.generated.empty()) {
    tokens.push_back(r.tokens.back());
  } else {
    tokens.insert(tokens.end(), l.generated.begin(), l.generated.end());
  }
  scheduler->Rewrite(r.id, std::move(tokens), l.spec_kv.budget);
  l.compacted = true;
  l.kept.assign(l.spec_kv.budget, 0);
  l.kept_kv_tokens = l.spec_kv.budget;
  l.kv_queries = {};
  l.draft_seconds += Seconds(start, Clock::now());
}

void Engine::Impl::Publish() {
  const SchedulerStats s = scheduler->stats();
  // SpecPC requests still drafting count as waiting for the target.
  const SchedulerStats d = draft_scheduler != nullptr ? draft_scheduler->stats() : SchedulerStats{};
  std::lock_guard<std::mutex> lock(mu);
  published.num_running = s.num_running;
  published.num_waiting = s.num_waiting + d.num_running + d.num_waiting;  // + `incoming`
  published.kv_blocks_free = s.num_free_blocks;
  published.num_preemptions = s.num_preemptions + d.num_preemptions;
  published.num_prefix_hit_tokens = s.num_prefix_hit_tokens;
  published.num_steps = steps;
  published.step_seconds = step_seconds;
  published.forward_seconds = forward_seconds;
  published.step_rows = step_rows;
}

void Engine::Impl::Watch() {
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.step_timeout_seconds));
  std::unique_lock<std::mutex> lock(mu);
  // Until the engine thread's last step is over, stopping or not: a step that hangs at shutdown
  // is aborted too.
  while (!exited && broken.ok()) {
    if (!step_started) {
      // A step that starts meanwhile is looked at on waking (at least 0.1 s on: a short timeout
      // does not wake an idle engine's watchdog a thousand times a second).
      watchdog_cv.wait_for(lock,
                           std::max<Clock::duration>(timeout, std::chrono::milliseconds(100)));
      continue;
    }
    if (const Clock::time_point deadline = *step_started + timeout; Clock::now() < deadline) {
      watchdog_cv.wait_until(lock, deadline);  // the step may have ended, and another begun
      continue;
    }
    const double seconds = Seconds(*step_started, Clock::now());
    lock.unlock();
    const absl::Status reason = absl::UnavailableError(
        absl::StrFormat("an engine step has run for %.1f s, past the step timeout of %g s: the "
                        "engine is stalled",
                        seconds, options.step_timeout_seconds));
    Break(reason);  // first, so that the step's requests get this reason, not the abort's
    // Ranks waiting in a collective for a hung peer return; the step ends when every rank has.
    if (executor != nullptr) model.llama->communicator()->Abort(std::string(reason.message()));
    return;
  }
}

void Engine::Impl::Break(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!broken.ok()) return;
    broken = reason;
  }
  if (options.on_broken) options.on_broken(reason);
}

absl::Status Engine::Impl::Broken() {
  std::lock_guard<std::mutex> lock(mu);
  return broken;
}

absl::Status Engine::Impl::StepFailure(const absl::Status& status) {
  absl::Status b = Broken();
  return b.ok() ? absl::InternalError(status.message()) : b;
}

void Engine::Impl::RunTasks() {
  std::vector<Task> run;
  {
    std::lock_guard<std::mutex> lock(mu);
    run.swap(tasks);
  }
  for (Task& t : run) {
    t.fn();
    t.done->set_value();
  }
}

void Engine::Impl::Run() {
  while (TakeInput()) {
    // The watchdog times the tasks (a map upload) with the step.
    {
      std::lock_guard<std::mutex> lock(mu);
      step_started = Clock::now();
    }
    RunTasks();
    if (HasWork()) Step();
    {
      std::lock_guard<std::mutex> lock(mu);
      step_started.reset();
    }
    Publish();
  }
  // Stopping: everything still live ends as aborted.
  std::vector<uint64_t> ids;
  for (const auto& [id, l] : live) ids.push_back(id);
  for (uint64_t id : ids) {
    scheduler->Abort(id);
    if (draft_scheduler != nullptr) draft_scheduler->Abort(id);
    FinishWith(id, FinishReason::kAborted, absl::OkStatus());
  }
  Publish();
  // Tasks queued until now still run; later ones are refused.
  RunTasks();
  {
    std::lock_guard<std::mutex> lock(mu);
    exited = true;
  }
  watchdog_cv.notify_all();
  RunTasks();
}

absl::Status CheckStepTimeout(double seconds) {
  constexpr double kMin = 1e-3, kMax = 1e6;
  if (seconds == 0 || (seconds >= kMin && seconds <= kMax)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("must be 0 (no limit) or in [%g, %g], got %g", kMin, kMax, seconds));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(Model& model, const EngineOptions& options) {
  if (options.kv_cache_tokens < options.scheduler.block_size) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache_tokens must be at least one block (",
                                                   options.scheduler.block_size, "), got ",
                                                   options.kv_cache_tokens));
  }
  if (options.scheduler.max_batch_tokens < 1) {
    return absl::InvalidArgumentError("max_batch_tokens must be positive");
  }
  if (absl::Status s = CheckStepTimeout(options.step_timeout_seconds); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("step_timeout_seconds ", s.message()));
  }
  if (options.scheduler.max_background_step_tokens < 1) {
    return absl::InvalidArgumentError("max_background_step_tokens must be positive");
  }
  if (const EngineOptions::CalibrationRows& rows = options.calibration_rows; rows.take) {
    if (model.tensor_parallel() > 1) {
      return absl::InvalidArgumentError(
          "online calibration (calibration_rows) is not supported at tensor parallel > 1");
    }
    if (rows.stride < 1 || rows.first_position < 0 ||
        std::any_of(rows.depths.begin(), rows.depths.end(),
                    [&](int32_t d) { return d < 0 || d > model.config.num_layers; })) {
      return absl::InvalidArgumentError(
          "calibration_rows: need stride >= 1, first_position >= 0, depths in [0, num_layers]");
    }
  }
  const ModelConfig& c = model.config;
  const int32_t block_size = options.scheduler.block_size;
  const int32_t num_blocks = static_cast<int32_t>(
      std::min<int64_t>((int64_t{options.kv_cache_tokens} + block_size - 1) / block_size,
                        std::numeric_limits<int32_t>::max()));
  std::vector<std::unique_ptr<PagedKvCache>> caches;
  for (LlamaModel* rank : model.rank_models()) {
    RS_ASSIGN_OR_RETURN(
        PagedKvCache cache,
        PagedKvCache::Create(rank->backend(),
                             KvCacheShape{c.num_layers, rank->shard().num_kv_heads, c.head_dim,
                                          block_size, num_blocks, rank->kv_cache_dtype()}));
    caches.push_back(std::make_unique<PagedKvCache>(std::move(cache)));
  }
  // A step's scratch for the step budget, now: a step within it allocates no workspace. Each
  // sequence's block table as long as the context (prefix caching shares blocks, so the tables
  // of a step can name more blocks than the cache has).
  const int32_t max_rows = options.scheduler.max_batch_tokens;
  const int32_t max_seqs = options.scheduler.max_running_requests;
  const int64_t blocks_per_seq = (int64_t{c.context_length} + block_size - 1) / block_size;
  for (LlamaModel* rank : model.rank_models()) {
    RS_RETURN_IF_ERROR(rank->ReserveWorkspace(max_rows, max_seqs, max_seqs * blocks_per_seq));
  }
  std::unique_ptr<PagedKvCache> draft_cache;
  if (const DraftModel* draft = options.draft; draft != nullptr) {
    if (model.tensor_parallel() > 1) {
      return absl::InvalidArgumentError(
          "a SpecPC draft model with tensor parallel > 1 is not supported");
    }
    if (&draft->llama->backend() != &model.llama->backend()) {
      return absl::InvalidArgumentError("the draft model must be on the target's backend");
    }
    if (options.draft_kv_cache_tokens < block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft_kv_cache_tokens must be at least one block (", block_size, "), got ",
                       options.draft_kv_cache_tokens));
    }
    const ModelConfig& d = draft->config();
    RS_ASSIGN_OR_RETURN(
        PagedKvCache dc,
        PagedKvCache::Create(
            model.llama->backend(),
            KvCacheShape{draft->num_layers, d.num_kv_heads, d.head_dim, block_size,
                         (options.draft_kv_cache_tokens + block_size - 1) / block_size,
                         model.llama->kv_cache_dtype()}));
    draft_cache = std::make_unique<PagedKvCache>(std::move(dc));
    // A draft with its own weights steps in its own workspace (self:K in the target's); the
    // draft's scheduler has the target's budget, its sequences the draft's context.
    if (draft->llama != model.llama) {
      const int64_t draft_blocks_per_seq =
          (int64_t{d.context_length} + block_size - 1) / block_size;
      RS_RETURN_IF_ERROR(
          draft->llama->ReserveWorkspace(max_rows, max_seqs, max_seqs * draft_blocks_per_seq));
    }
  }
  std::unique_ptr<TensorParallelExecutor> executor;
  if (caches.size() > 1) {
    std::vector<PagedKvCache*> rank_caches;
    for (const std::unique_ptr<PagedKvCache>& c : caches) rank_caches.push_back(c.get());
    executor = std::make_unique<TensorParallelExecutor>(model.rank_models(), rank_caches);
  }
  // Every decode bucket recorded now, after the last reservation (growing a scratch later would
  // make the recordings stale), so that no request's step waits for one. A decode step has at
  // most max_seqs rows and the budget's; padded to its bucket it stays within both, and so
  // within the reservation. At TP > 1 every rank records at once (the recordings hold the
  // ranks' collectives), failing as a step does.
  if (options.decode_graphs && model.llama->backend().SupportsGraphs()) {
    const std::vector<LlamaModel*> ranks = model.rank_models();
    for (LlamaModel* rank : ranks) {
      rank->SetDecodeGraphBuckets(LlamaModel::DecodeGraphBuckets(std::min(max_seqs, max_rows)));
    }
    const absl::Status recorded = executor != nullptr
                                      ? executor->OnEveryRank([&](int32_t r) {
                                          return ranks[r]->RecordDecodeGraphs(*caches[r]);
                                        })
                                      : model.llama->RecordDecodeGraphs(*caches.front());
    if (!recorded.ok()) {
      for (LlamaModel* rank : ranks) rank->SetDecodeGraphBuckets({});  // they write to `caches`
      return recorded;
    }
  }
  auto impl = std::make_unique<Impl>(model, options, std::move(caches), std::move(executor),
                                     std::move(draft_cache));
  Impl* raw = impl.get();
  raw->thread = std::thread([raw] { raw->Run(); });
  if (options.step_timeout_seconds > 0) raw->watchdog = std::thread([raw] { raw->Watch(); });
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
  // The model outlives this engine; its recordings would write to this engine's caches.
  for (LlamaModel* rank : impl_->model.rank_models()) rank->SetDecodeGraphBuckets({});
}

absl::StatusOr<uint64_t> Engine::Submit(EngineRequest request) {
  const ModelConfig& c = impl_->model.config;
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  if (request.max_new_tokens < 1) {
    return absl::InvalidArgumentError("max_new_tokens must be at least 1");
  }
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_new_tokens;
  if (total > c.context_length) {
    return absl::OutOfRangeError(absl::StrCat(
        "prompt (", request.prompt.size(), " tokens) + max_new_tokens (", request.max_new_tokens,
        ") exceeds the context of ", c.context_length, " tokens"));
  }
  const int64_t capacity =
      int64_t{impl_->published.kv_blocks_total} * impl_->published.kv_block_size;
  if (total > capacity) {
    return absl::OutOfRangeError(absl::StrCat("prompt + max_new_tokens (", total,
                                              " tokens) exceeds the KV cache of ", capacity,
                                              " tokens"));
  }
  if (request.spec_pc.budget != 0 || request.spec_kv.budget != 0) {
    RS_RETURN_IF_ERROR(CheckDraftRequest(request));
  }
  RS_RETURN_IF_ERROR(CheckScoring(request));
  std::vector<uint8_t> filled_rows;
  if (request.ridgefill.split_layer >= 0) {
    const RidgeFillMaps* maps = request.ridgefill.maps.get();
    if (maps == nullptr || maps->FindSplit(request.ridgefill.split_layer) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("no RidgeFill maps loaded for split layer ", request.ridgefill.split_layer));
    }
    const Tokenizer& tokenizer = *impl_->model.tokenizer;
    RidgeFillPlanOptions plan;
    plan.exact_tail_tokens = request.ridgefill.exact_tail_tokens;
    plan.sink_tokens = impl_->options.ridgefill_sink_tokens;
    plan.min_prompt_tokens = impl_->options.ridgefill_min_prompt_tokens;
    plan.exact_spans = request.ridgefill.exact_spans;
    RS_ASSIGN_OR_RETURN(filled_rows, PlanRidgeFillRows(request.prompt, plan, [&](int32_t t) {
                          return tokenizer.IsSpecial(t);
                        }));
    // Nothing filled: the request is exact, and shares the exact prefix cache.
    if (std::count(filled_rows.begin(), filled_rows.end(), uint8_t{1}) == 0) filled_rows.clear();
  }
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) return absl::UnavailableError("engine is stopping");
    if (!impl_->broken.ok()) return impl_->broken;
    const int32_t waiting =
        impl_->published.num_waiting + static_cast<int32_t>(impl_->incoming.size());
    if (waiting >= impl_->options.scheduler.max_queued_requests) {
      return absl::ResourceExhaustedError(
          absl::StrCat("request queue is full (", waiting, " waiting)"));
    }
    id = impl_->next_id++;
    std::shared_ptr<const RidgeFillMaps> maps;
    if (!filled_rows.empty()) maps = request.ridgefill.maps;
    request.ridgefill.maps.reset();
    impl_->incoming.push_back(Impl::Incoming{id, std::move(request), std::move(filled_rows),
                                             std::move(maps), Clock::now()});
  }
  impl_->cv.notify_one();
  return id;
}

absl::Status Engine::CheckScoring(const EngineRequest& request) const {
  const ScoringRequest& scoring = request.scoring;
  const bool draft = request.spec_pc.budget != 0 || request.spec_kv.budget != 0;
  if (scoring.capture && draft) {
    return absl::InvalidArgumentError("scoring.capture is for exact and RidgeFill requests");
  }
  if ((!scoring.forced.empty() || scoring.background) &&
      (draft || request.ridgefill.split_layer >= 0)) {
    return absl::InvalidArgumentError("forced tokens and background requests prefill exactly");
  }
  if (scoring.forced.empty()) return absl::OkStatus();
  if (static_cast<int32_t>(scoring.forced.size()) != request.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("scoring.forced has ", scoring.forced.size(),
                                                   " tokens; max_new_tokens must equal it, got ",
                                                   request.max_new_tokens));
  }
  for (int32_t t : scoring.forced) {
    if (t < 0 || t >= impl_->model.config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("forced token id ", t,
                                                     " is outside the vocabulary [0, ",
                                                     impl_->model.config.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::CheckDraftRequest(EngineRequest& request) const {
  const bool pc = request.spec_pc.budget != 0;
  if ((pc && request.spec_kv.budget != 0) || request.ridgefill.split_layer >= 0) {
    return absl::InvalidArgumentError(
        "only one of RidgeFill, SpecPC and SpecKV can be asked for in one request");
  }
  const std::string field = pc ? "spec_pc" : "spec_kv";
  int32_t& budget = pc ? request.spec_pc.budget : request.spec_kv.budget;
  const int32_t min_budget = pc ? kSpecPcMinBudget : kSpecKvMinBudget;
  if (budget < min_budget) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".budget must be >= ", min_budget, " (the prompt's last ",
                     pc ? kSpecPcWindow : kSpecKvWindow, " tokens are always kept), got ", budget));
  }
  const int32_t asked = pc ? request.spec_pc.lookahead_tokens : request.spec_kv.lookahead_tokens;
  if (asked < 1 || asked > kSpecPcMaxLookahead) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".lookahead_tokens must be in [1, ",
                                                   kSpecPcMaxLookahead, "], got ", asked));
  }
  const Impl& impl = *impl_;
  if (impl.options.draft == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(pc ? "SpecPC" : "SpecKV", " needs a draft model (--draft_model)"));
  }
  const int32_t prompt = static_cast<int32_t>(request.prompt.size());
  if (budget >= prompt) {
    budget = 0;  // the whole prompt is kept: exact
    return absl::OkStatus();
  }
  const int32_t lookahead = pc ? asked : std::min(asked, request.max_new_tokens);
  const int64_t draft_tokens = int64_t{prompt} + lookahead;
  const int32_t draft_context = impl.options.draft->config().context_length;
  const KvCacheShape& shape = impl.draft_cache->shape();
  const int64_t draft_capacity = int64_t{shape.num_blocks} * shape.block_size;
  if (draft_tokens > std::min<int64_t>(draft_context, draft_capacity)) {
    return absl::OutOfRangeError(absl::StrCat("prompt (", prompt, " tokens) + ", field,
                                              ".lookahead_tokens (", lookahead,
                                              ") exceeds the draft's context (", draft_context,
                                              ") or its KV cache (", draft_capacity, " tokens)"));
  }
  return absl::OkStatus();
}

void Engine::Abort(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->aborts.push_back(id);
  }
  impl_->cv.notify_one();
}

absl::Status Engine::RunOnEngineThread(std::function<void()> task) {
  if (std::this_thread::get_id() == impl_->thread.get_id()) {
    task();
    return absl::OkStatus();
  }
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->exited) return absl::UnavailableError("engine has stopped");
    impl_->tasks.push_back(Impl::Task{std::move(task), std::move(done)});
  }
  impl_->cv.notify_one();
  finished.wait();
  return absl::OkStatus();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  EngineStats stats = impl_->published;
  stats.num_waiting += static_cast<int32_t>(impl_->incoming.size());
  if (impl_->step_started)
    stats.step_in_progress_seconds = Seconds(*impl_->step_started, Clock::now());
  stats.broken = !impl_->broken.ok();
  return stats;
}

}  // namespace ridgeserve
