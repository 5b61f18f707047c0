#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/parallel/tensor_parallel_executor.h"
#include "engine/ridgefill/ridgefill_maps.h"
#include "engine/ridgefill_plan.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
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
  // blocks, and every rank uses the same ones.
  Impl(Model& m, const EngineOptions& o, std::vector<std::unique_ptr<PagedKvCache>> kv)
      : model(m), options(o), caches(std::move(kv)), cache(caches.front().get()) {
    const int32_t block_size = options.scheduler.block_size;
    const int32_t num_blocks = cache->shape().num_blocks;
    scheduler = std::make_unique<Scheduler>(options.scheduler, cache->pool());
    if (caches.size() > 1) {
      std::vector<PagedKvCache*> rank_caches;
      for (const std::unique_ptr<PagedKvCache>& c : caches) rank_caches.push_back(c.get());
      executor = std::make_unique<TensorParallelExecutor>(model.rank_models(), rank_caches);
    }
    published.kv_blocks_total = num_blocks;
    published.kv_blocks_free = num_blocks;
    published.kv_block_size = block_size;
  }

  void Run();
  // Moves queued submissions and aborts into the scheduler; false when stopping.
  bool TakeInput();
  void Step();
  void Emit(uint64_t id, Live& live, TokenEvent& event);
  void FinishWith(uint64_t id, FinishReason reason, absl::Status status);
  void Publish();

  Model& model;
  const EngineOptions options;
  std::vector<std::unique_ptr<PagedKvCache>> caches;
  PagedKvCache* cache;                               // rank 0's
  std::unique_ptr<TensorParallelExecutor> executor;  // TP > 1
  std::unique_ptr<Scheduler> scheduler;

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

  // Engine thread only.
  std::unordered_map<uint64_t, Live> live;
  std::vector<float> logits;
  int64_t steps = 0;
  std::thread thread;
};

bool Engine::Impl::TakeInput() {
  std::deque<Incoming> fresh;
  std::vector<uint64_t> to_abort;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!scheduler->HasWork()) {
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
    Live l{std::move(r.on_event), Sampler(r.sampling)};
    l.max_new_tokens = r.max_new_tokens;
    l.prompt_tokens = sched->num_prompt_tokens;
    l.arrival = in.arrival;
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
    if (absl::Status s = scheduler->Add(std::move(sched)); !s.ok()) {
      FinishWith(
          in.id, FinishReason::kNone,
          s.code() == absl::StatusCode::kInvalidArgument ? absl::OutOfRangeError(s.message()) : s);
    }
  }
  for (uint64_t id : to_abort) {
    if (live.count(id) != 0 && scheduler->Abort(id)) {
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
  if (l.first_token) {
    event.timing.ttft_seconds = Seconds(l.arrival, *l.first_token);
    event.filled_prompt_tokens = l.filled_prompt_tokens;
    event.exact_prompt_tokens = l.prompt_tokens - l.filled_prompt_tokens;
    if (l.split_layer >= 0) {
      event.skipped_layer_tokens =
          int64_t{l.filled_prompt_tokens} * (model.config.num_layers - 1 - l.split_layer);
    }
    event.timing.estimated_ttft_saved_seconds = l.estimated_saved_seconds;
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
  StepPlan plan = scheduler->Schedule();
  if (plan.chunks.empty()) {
    // Work exists but nothing fits this instant (e.g. waiting for blocks): let input arrive.
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::milliseconds(1));
    return;
  }
  const Clock::time_point start = Clock::now();
  const int32_t block_size = cache->shape().block_size;
  ForwardBatch batch;
  // RidgeFill: filled rows per chunk (their split is the request's).
  std::vector<int32_t> filled_in_chunk(plan.chunks.size(), 0);
  std::vector<int32_t> chunk_row(plan.chunks.size(), 0);  // the chunk's first batch row
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    SchedRequest& r = *chunk.request;
    Live& l = live.at(r.id);
    if (!l.first_scheduled) l.first_scheduled = start;
    chunk_row[i] = batch.num_rows();
    batch.AddSequence(r.blocks, block_size, std::span(r.tokens).subspan(chunk.start, chunk.count),
                      chunk.start, chunk.sample);
    const int32_t fill_end =
        std::min(chunk.start + chunk.count, static_cast<int32_t>(r.filled_rows.size()));
    const int32_t filled =
        static_cast<int32_t>(std::count(r.filled_rows.begin() + std::min(chunk.start, fill_end),
                                        r.filled_rows.begin() + fill_end, uint8_t{1}));
    if (filled == 0) continue;
    filled_in_chunk[i] = filled;
    batch.fill_split.resize(batch.num_rows() - chunk.count, -1);
    batch.fill_maps.resize(batch.num_rows() - chunk.count, nullptr);
    for (int32_t p = chunk.start; p < chunk.start + chunk.count; ++p) {
      const bool fill = p < fill_end && r.filled_rows[p] != 0;
      batch.fill_split.push_back(fill ? l.split_layer : -1);
      batch.fill_maps.push_back(fill ? l.maps.get() : nullptr);
    }
  }
  if (!batch.fill_split.empty()) {
    batch.fill_split.resize(batch.num_rows(), -1);
    batch.fill_maps.resize(batch.num_rows(), nullptr);
  }
  ForwardProfile profile;
  ForwardProfile* wanted = batch.fill_split.empty() ? nullptr : &profile;
  absl::Status status = executor != nullptr
                            ? executor->Forward(batch, logits, wanted)
                            : model.llama->Forward(batch, *cache, logits, nullptr, wanted);
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
  for (size_t i = 0; status.ok() && i < plan.chunks.size(); ++i) {
    if (filled_in_chunk[i] == 0) continue;
    Live& l = live.at(plan.chunks[i].request->id);
    l.estimated_saved_seconds +=
        filled_in_chunk[i] * profile.SavedSecondsPerRow(l.split_layer, model.config.num_layers);
  }
  std::vector<int32_t> sampled(plan.chunks.size(), -1);
  std::vector<float> logprobs(plan.chunks.size(), 0.0f);
  const int32_t vocab = model.config.vocab_size;
  size_t logit_row = 0;
  for (size_t i = 0; status.ok() && i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    if (!chunk.sample) continue;
    Live& l = live.at(chunk.request->id);
    const SampleResult result = l.sampler.Sample(
        std::span<float>(logits).subspan(logit_row * vocab, vocab), chunk.request->tokens);
    ++logit_row;
    sampled[i] = result.token;
    logprobs[i] = result.logprob;
  }
  if (!status.ok()) {
    spdlog::error("forward failed: {}", status.ToString());
    for (const ScheduledChunk& chunk : plan.chunks) {
      const uint64_t id = chunk.request->id;
      scheduler->Abort(id);
      FinishWith(id, FinishReason::kNone, absl::InternalError(status.message()));
    }
    return;
  }
  scheduler->Update(plan, sampled);
  ++steps;
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
    }
    TokenEvent event;
    const int32_t token = sampled[i];
    if (l.sampler.IsStop(token, eog)) {
      event.finished = true;
      event.finish_reason = FinishReason::kStop;
    } else {
      ++l.completion_tokens;
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

void Engine::Impl::Publish() {
  const SchedulerStats s = scheduler->stats();
  std::lock_guard<std::mutex> lock(mu);
  published.num_running = s.num_running;
  published.num_waiting = s.num_waiting;  // stats() adds what is still in `incoming`
  published.kv_blocks_free = s.num_free_blocks;
  published.num_preemptions = s.num_preemptions;
  published.num_prefix_hit_tokens = s.num_prefix_hit_tokens;
  published.num_steps = steps;
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
    RunTasks();
    if (scheduler->HasWork()) Step();
    Publish();
  }
  // Stopping: everything still live ends as aborted.
  std::vector<uint64_t> ids;
  for (const auto& [id, l] : live) ids.push_back(id);
  for (uint64_t id : ids) {
    scheduler->Abort(id);
    FinishWith(id, FinishReason::kAborted, absl::OkStatus());
  }
  Publish();
  // Tasks queued until now still run; later ones are refused.
  RunTasks();
  {
    std::lock_guard<std::mutex> lock(mu);
    exited = true;
  }
  RunTasks();
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
  auto impl = std::make_unique<Impl>(model, options, std::move(caches));
  Impl* raw = impl.get();
  raw->thread = std::thread([raw] { raw->Run(); });
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
  std::vector<uint8_t> filled_rows;
  if (request.ridgefill.split_layer >= 0) {
    if (request.ridgefill.maps == nullptr && impl_->model.llama->ridgefill_maps() != nullptr) {
      // The model's maps, not owned: they outlive the engine's requests (SetRidgeFillMaps).
      request.ridgefill.maps = std::shared_ptr<const RidgeFillMaps>(
          std::shared_ptr<void>(), impl_->model.llama->ridgefill_maps());
    }
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
  return stats;
}

}  // namespace ridgeserve
