// The serving engine: one thread that runs scheduler → forward → sampler → events in a loop,
// fed by a thread-safe input queue. Requests arrive as token ids (the server tokenizes);
// results leave as TokenEvents through each request's callback. Never includes gRPC.
//
// Threading: Submit, Abort and stats are thread-safe. Callbacks run on the engine thread
// and must not block (hand the event to the caller's own queue/reactor and return).
#ifndef RIDGESERVE_ENGINE_ENGINE_H_
#define RIDGESERVE_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/draft/draft_model.h"
#include "engine/model/model.h"
#include "engine/ridgefill/ridgefill_maps.h"
#include "engine/sampling/sampler.h"
#include "engine/sched/scheduler.h"

namespace ridgeserve {

struct EngineOptions {
  SchedulerConfig scheduler;
  int32_t kv_cache_tokens = 65536;  // KV cache capacity (rounded up to whole blocks)
  // Decode steps replay recorded graphs on a backend that has them, at any tensor-parallel size
  // (LlamaModel::SetDecodeGraphBuckets; --enforce_eager turns this off).
  bool decode_graphs = true;
  // A step (scheduling, the forward passes, sampling, handing out tokens, and RunOnEngineThread's
  // tasks before it, such as a RidgeFill map upload) that runs longer than this many seconds
  // stalls the engine (0: no limit): a watchdog thread aborts a
  // tensor-parallel group's collectives, so that ranks waiting for a hung peer return, and
  // reports the engine broken (on_broken). The stalled step's requests fail UNAVAILABLE when it
  // returns, if it ever does. CheckStepTimeout says which values Create takes.
  double step_timeout_seconds = 0;
  // Called once, on the engine thread or the watchdog's, when the engine can run no more steps:
  // a tensor-parallel group that could not be reset after a failed step (NCCL), or a step past
  // step_timeout_seconds; the reason (Unavailable) given. The requests of the step that broke
  // it and of every later step fail with the reason, and Submit refuses new ones with it; the
  // server reports itself NOT_SERVING so that it is restarted. Must not block.
  std::function<void(const absl::Status& reason)> on_broken;
  // RidgeFill (maps per request, RidgeFillRequest::maps):
  int32_t ridgefill_sink_tokens = 4;        // first prompt rows that always run exactly
  int32_t ridgefill_min_prompt_tokens = 0;  // shorter prompts run exactly
  // SpecPC (null: no draft, SpecPC requests are refused). Not owned; must outlive the engine
  // and use the target's backend; not at tensor parallel > 1 (Create refuses).
  const DraftModel* draft = nullptr;
  int32_t draft_kv_cache_tokens = 32768;  // the draft's own KV cache (whole blocks)
  // SpecPC: the kept tokens keep their original RoPE positions (and decoding continues at the
  // prompt's length) instead of being renumbered 0..budget-1 as the reference does.
  bool spec_pc_original_positions = false;
  // Online RidgeFill calibration (take empty: off; not with tensor parallel > 1, Create
  // refuses): after each target forward, the residual stream at `depths` (ForwardCapture) of
  // the prompt rows of exact requests (no RidgeFill, SpecPC or SpecKV: their later layers see
  // approximate K/V or a compressed prompt) at positions p >= first_position with
  // p % stride == 0, each position once per request (a recompute after preemption does not
  // repeat it). take(states, rows) runs on the engine thread and must not block: states[i] is
  // [n, hidden] at depths[i], rows the indices into those n of the rows taken.
  struct CalibrationRows {
    std::vector<int32_t> depths;
    int32_t first_position = 0;
    int32_t stride = 1;
    std::function<void(std::span<const std::vector<float>> states, std::span<const int32_t> rows)>
        take;
  } calibration_rows;
};

// OK for EngineOptions::step_timeout_seconds 0 (no limit) or in [0.001, 1e6] seconds (a
// shorter one would break the engine at its first step, a typo rather than a limit; the upper
// bound, 11.6 days, keeps out infinity and NaN, whose deadlines overflow), else
// InvalidArgument saying so (the server names its flag before it).
absl::Status CheckStepTimeout(double seconds);

enum class FinishReason { kNone, kStop, kLength, kStopSequence, kAborted };

// Seconds, measured on the engine's steady clock.
struct RequestTiming {
  double queue_seconds = 0;    // arrival → first scheduled
  double ttft_seconds = 0;     // arrival → first token sampled
  double prefill_seconds = 0;  // first scheduled → first token sampled
  double e2e_seconds = 0;      // arrival → finished
  // SpecPC / SpecKV: the draft's share of the steps it ran in (prefill and lookahead) and the
  // selection's time. 0 for other requests.
  double draft_seconds = 0;
  // RidgeFill: the work its filled rows skipped, priced at the per-row cost of the exact
  // layers measured in the same forward passes, minus the measured cost of filling them.
  // SpecPC: the dropped prompt rows priced at the per-row cost of the target's prefill steps
  // that ran the kept ones, minus draft_seconds. 0 for exact requests. Known from the first
  // token on.
  double estimated_ttft_saved_seconds = 0;
};

struct TokenEvent {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // produced since the previous event (usually one)
  std::vector<float> logprobs;  // per token, when requested
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status status;  // not OK: the request failed and is finished
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prefix-cache hits
  // RidgeFill (from the first token on): prompt rows filled approximately, and the rest of
  // the prompt, which ran every layer. Exact requests: filled 0, exact = prompt_tokens.
  int32_t filled_prompt_tokens = 0;
  int32_t exact_prompt_tokens = 0;
  int32_t split_layer = -1;          // RidgeFill split used; -1 for exact requests
  int64_t skipped_layer_tokens = 0;  // sum over filled rows of the layers they skipped
  // SpecPC (from the first token on): prompt tokens the target prefilled; prompt_tokens for
  // other requests.
  int32_t kept_prompt_tokens = 0;
  // SpecKV (from the first token on): prompt KV entries kept per layer and KV head after the
  // prefill (the budget); prompt_tokens for other requests.
  int32_t kept_kv_tokens = 0;
  // ScoringRequest::capture: the event of the first token has log_softmax of the unmodified
  // logits that produced it (vocab_size entries); every event has the sum over the tokens
  // emitted so far of -log p under the unmodified logits.
  std::vector<float> first_logprobs;
  double emitted_nll = 0;
  RequestTiming timing;  // ttft set from the first token on; the rest when finished
};

using EventCallback = std::function<void(const TokenEvent&)>;

// Which prompt rows RidgeFill fills (DESIGN.md, "RidgeFill — our definition"). Every prompt
// row is filled except: the last exact_tail_tokens (and always the last prompt token, whose
// logits start decoding), the first EngineOptions::ridgefill_sink_tokens, special tokens
// (the tokenizer's added/control tokens, e.g. chat-template markers) and exact_spans.
struct RidgeFillRequest {
  int32_t split_layer = -1;  // < 0: exact prefill (the rest is ignored)
  int32_t exact_tail_tokens = 0;
  std::vector<std::pair<int32_t, int32_t>> exact_spans;  // [begin, end) prompt positions
  // The maps the request is filled with, held until it finishes (so a server may swap maps
  // while it runs: chunks, recomputes after preemption and its prefix-cache key all use
  // these). Required with a split layer (FailedPrecondition without). Their last reference may
  // be dropped on any thread.
  std::shared_ptr<const RidgeFillMaps> maps;
};

// SpecPC (DESIGN.md, "SpecPC and SpecKV"): the draft prefills the prompt and decodes
// lookahead_tokens greedily; its attention picks `budget` prompt tokens, which the target
// prefills alone (engine/draft/spec_pc.h). budget 0: off; budget >= the prompt: exact.
struct SpecPcRequest {
  int32_t budget = 0;
  int32_t lookahead_tokens = 1;
};

// SpecKV (DESIGN.md, "SpecPC and SpecKV"; engine/draft/spec_kv.h): the draft decodes a
// lookahead answer of min(max_new_tokens, lookahead_tokens) tokens; the target prefills prompt +
// lookahead, keeps `budget` prompt entries per layer and KV head by its attention, drops the
// rest and the lookahead's, and decodes over the kept ones. budget 0: off; >= the prompt: exact.
struct SpecKvRequest {
  int32_t budget = 0;
  int32_t lookahead_tokens = 64;
};

// Quality measurement (the server's RidgeFill shadow sampling): what a request's tokens cost
// under the model, and a request that runs only on idle capacity.
struct ScoringRequest {
  // TokenEvent::first_logprobs and emitted_nll.
  bool capture = false;
  // Teacher forcing: step i emits forced[i] instead of a sampled token (stop tokens do not
  // end it; max_new_tokens must be forced.size()). Empty: sampling as usual.
  std::vector<int32_t> forced;
  // Runs only on the budget and KV blocks other requests leave, and is dropped (its final
  // event has an Unavailable status) when another request waits or needs its blocks
  // (SchedRequest::background).
  bool background = false;
};

struct EngineRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_new_tokens = 256;
  int32_t priority = 0;  // lower runs first
  RidgeFillRequest ridgefill;
  SpecPcRequest spec_pc;  // not with ridgefill
  SpecKvRequest spec_kv;  // not with ridgefill or spec_pc
  ScoringRequest scoring;
  EventCallback on_event;
};

struct EngineStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_free = 0;
  int32_t kv_block_size = 0;
  int64_t num_preemptions = 0;
  int64_t num_prefix_hit_tokens = 0;
  // Steps that ran the model, since the start; of their wall time, forward_seconds on the
  // backend (the model's forward passes, target and draft, and Backend::Sample), the rest on
  // the engine thread around them (scheduling, building the batch, handing tokens to their
  // requests).
  int64_t num_steps = 0;
  double step_seconds = 0.0;
  double forward_seconds = 0.0;
  int64_t step_rows = 0;  // rows of the target model's forward passes (prompt and decode)
  // How long the step now running has run (0 between steps), as of the call: it grows while a
  // step hangs, when nothing else changes.
  double step_in_progress_seconds = 0.0;
  bool broken = false;  // the engine can run no more steps (EngineOptions::on_broken)
};

class Engine {
 public:
  // `model` must outlive the engine. Starts the engine thread.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(Model& model, const EngineOptions& options);
  // Aborts everything still running and joins the thread.
  ~Engine();

  // Queues a request and returns its id. ResourceExhausted when the waiting queue is full,
  // OutOfRange when prompt + max_new_tokens exceeds the context or the KV cache, and
  // InvalidArgument for an empty prompt, a token outside the vocabulary or a bad RidgeFill
  // parameter (negative tail, span outside the prompt) or a bad SpecPC budget (below
  // kSpecPcMinBudget) or lookahead (outside [1, kSpecPcMaxLookahead]), a bad SpecKV budget
  // (below kSpecKvMinBudget) or lookahead, or two prefill modes combined, FailedPrecondition for
  // a RidgeFill split layer the model has no maps for and for SpecPC / SpecKV without a draft
  // (EngineOptions::draft), OutOfRange when prompt + lookahead exceeds the draft's context or
  // KV cache, InvalidArgument for forced tokens outside the vocabulary or not max_new_tokens
  // of them, or forced / background with another prefill mode; Unavailable once the engine is
  // broken (EngineOptions::on_broken).
  absl::StatusOr<uint64_t> Submit(EngineRequest request);
  // Ends a request within one step; its final event has finish_reason kAborted. Unknown or
  // finished ids are ignored.
  void Abort(uint64_t id);
  EngineStats stats() const;
  // Runs `task` on the engine thread between two steps and returns when it has run: backend
  // work from another thread (a Backend is driven by one thread), e.g. uploading RidgeFill
  // maps while the engine serves. On the engine thread itself (a callback) it runs at once.
  // Unavailable (and `task` not run) once the engine thread has ended.
  absl::Status RunOnEngineThread(std::function<void()> task);

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  // Submit's SpecPC / SpecKV checks; clears the budget when the whole prompt fits in it
  // (exact).
  absl::Status CheckDraftRequest(EngineRequest& request) const;
  // Submit's ScoringRequest checks.
  absl::Status CheckScoring(const EngineRequest& request) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_ENGINE_H_
