#include "server/generate_call.h"

#include <utility>

#include "server/raw_messages.h"
#include "server/request_validation.h"
#include "server/status_conversion.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {

// --- GenerateCall ---------------------------------------------------------------------------

absl::Status GenerateCall::Start(const grpc::ByteBuffer& bytes, StepSink sink) {
  v1::GenerateRequest request;
  absl::Status status = ParseRequest(bytes, request);
  if (status.ok()) {
    status = Submit(request, std::move(sink));
  } else {
    spdlog::info("request refused: {}", status.ToString());
  }
  if (!status.ok()) context_.metrics.RecordError(status.code());
  return status;
}

absl::Status GenerateCall::Submit(const v1::GenerateRequest& request, StepSink sink) {
  // RIDGEFILL: validated against, and run on, the maps loaded now (swaps do not touch it).
  std::optional<ServerOptions> ridgefill_options;
  std::shared_ptr<const RidgeFillMaps> maps;
  if (request.prefill().mode() == v1::PrefillOptions::RIDGEFILL) {
    RidgeFillMapsSnapshot snapshot = context_.ridgefill.Snapshot();
    ridgefill_options.emplace(context_.options);
    ridgefill_options->ridgefill_split_layers = std::move(snapshot.split_layers);
    ridgefill_options->default_split_layer = snapshot.default_split_layer;
    ridgefill_options->ridgefill_unavailable = std::move(snapshot.unavailable);
    maps = std::move(snapshot.maps);
  }
  absl::StatusOr<ValidatedRequest> validated =
      ValidateGenerateRequest(request, *context_.model.tokenizer, context_.model.config,
                              ridgefill_options ? *ridgefill_options : context_.options);
  if (!validated.ok()) {
    spdlog::info("request {} refused: {}", request.request_id(), validated.status().ToString());
    return validated.status();
  }
  request_id_ = validated->request_id;
  if (absl::Status admitted = context_.registry.Admit(&request_id_); !admitted.ok()) {
    spdlog::info("request {} refused: {}", request_id_, admitted.ToString());
    return admitted;
  }
  admitted_ = true;
  sink_ = std::move(sink);
  output_.emplace(*context_.model.tokenizer, request_id_, std::move(validated->stop),
                  static_cast<int32_t>(validated->engine.prompt.size()));
  EngineRequest& engine_request = validated->engine;
  metrics_.emplace(context_.metrics, engine_request);
  engine_request.ridgefill.maps = std::move(maps);
  if (context_.shadow != nullptr && engine_request.ridgefill.split_layer >= 0 &&
      context_.shadow->Sample(engine_request)) {
    shadowed_.emplace();
    shadowed_->prompt = engine_request.prompt;
  }
  // The call's lane, from its address (spread over the lanes by a multiplicative hash).
  const uint64_t lane = (reinterpret_cast<uintptr_t>(this) >> 4) * 0x9E3779B97F4A7C15ull >> 32;
  engine_request.on_event = [this, lane](const TokenEvent& event) {
    context_.events->Post(lane, [this, event, handed_over = RequestMetrics::Clock::now()] {
      OnEvent(event, handed_over);
    });
  };
  absl::StatusOr<uint64_t> id = context_.engine.Submit(std::move(engine_request));
  if (!id.ok()) {
    spdlog::info("request {} refused by the engine: {}", request_id_, id.status().ToString());
    return id.status();
  }
  // Cancelled or aborted while being submitted: nobody could abort it yet, so do it now.
  if (context_.registry.SetEngineId(request_id_, *id)) context_.engine.Abort(*id);
  return absl::OkStatus();
}

void GenerateCall::CollectShadowed(const TokenEvent& event) {
  RidgeFillShadow::Sampled& s = *shadowed_;
  if (!event.first_logprobs.empty()) s.first_logprobs = event.first_logprobs;
  s.tokens.insert(s.tokens.end(), event.tokens.begin(), event.tokens.end());
  s.nll = event.emitted_nll;
  s.split_layer = event.split_layer;
  s.filled_prompt_tokens = event.filled_prompt_tokens;
  // Compared when it ran to its end with rows filled (not aborted, not failed).
  const bool complete =
      event.finish_reason == FinishReason::kStop || event.finish_reason == FinishReason::kLength;
  if (event.finished && event.status.ok() && complete && s.filled_prompt_tokens > 0) {
    context_.shadow->Shadow(std::move(s));
  }
}

void GenerateCall::Cancel() {
  if (admitted_) AbortEngineRequest();
}

void GenerateCall::Done() {
  if (admitted_) context_.registry.Remove(request_id_);
}

void GenerateCall::AbortEngineRequest() {
  absl::StatusOr<std::optional<uint64_t>> id = context_.registry.RequestAbort(request_id_);
  if (id.ok() && id->has_value()) context_.engine.Abort(**id);
}

void GenerateCall::OnEvent(const TokenEvent& event, RequestMetrics::Clock::time_point handed_over) {
  if (shadowed_) CollectShadowed(event);
  OutputBuilder::Step step = output_->OnEvent(event);
  metrics_->OnEvent(event, step.delta.finish_reason(), handed_over);
  if (step.abort_engine) AbortEngineRequest();
  if (step.finished) {
    const v1::Usage& usage = step.delta.usage();
    if (step.status.ok()) {
      spdlog::info(
          "request {} finished ({}): {} prompt tokens, {} completion tokens, ttft {:.3f} s, "
          "e2e {:.3f} s",
          request_id_, v1::FinishReason_Name(step.delta.finish_reason()), usage.prompt_tokens(),
          usage.completion_tokens(), event.timing.ttft_seconds, event.timing.e2e_seconds);
    } else {
      spdlog::warn("request {} failed: {}", request_id_, step.status.ToString());
    }
  }
  // May end the call: nothing of `this` is touched afterwards.
  sink_(std::move(step));
}

// --- GenerateUnaryReactor -------------------------------------------------------------------

GenerateUnaryReactor::GenerateUnaryReactor(const ServingContext& context,
                                           const grpc::ByteBuffer& request,
                                           grpc::ByteBuffer* response)
    : call_(context), out_(response) {
  absl::Status status =
      call_.Start(request, [this](OutputBuilder::Step step) { OnStep(std::move(step)); });
  if (!status.ok()) Finish(ToGrpcStatus(status));
}

void GenerateUnaryReactor::OnStep(OutputBuilder::Step step) {
  MergeDelta(step.delta, response_);
  if (!step.finished) return;
  if (step.status.ok()) *out_ = SerializeResponse(response_);
  Finish(ToGrpcStatus(step.status));
}

void GenerateUnaryReactor::OnCancel() { call_.Cancel(); }

void GenerateUnaryReactor::OnDone() {
  call_.Done();
  delete this;
}

// --- GenerateStreamReactor ------------------------------------------------------------------

GenerateStreamReactor::GenerateStreamReactor(const ServingContext& context,
                                             const grpc::ByteBuffer& request)
    : call_(context) {
  absl::Status status =
      call_.Start(request, [this](OutputBuilder::Step step) { OnStep(std::move(step)); });
  if (!status.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finish_claimed_ = true;
    }
    Finish(ToGrpcStatus(status));
  }
}

GenerateStreamReactor::Next GenerateStreamReactor::PickNextLocked() {
  if (writing_ || finish_claimed_) return Next::kNothing;
  if (!queue_.empty() && !broken_) {
    in_flight_ = SerializeResponse(queue_.front());
    queue_.pop_front();
    if (queue_.empty() && engine_done_) {
      finish_claimed_ = true;
      return Next::kWriteAndFinish;
    }
    writing_ = true;
    return Next::kWrite;
  }
  if (engine_done_) {
    finish_claimed_ = true;
    return Next::kFinish;
  }
  return Next::kNothing;
}

void GenerateStreamReactor::Act(Next next) {
  switch (next) {
    case Next::kWrite:
      StartWrite(&in_flight_);
      break;
    case Next::kWriteAndFinish:
      // No OnWriteDone follows: the call is complete at OnDone.
      StartWriteAndFinish(&in_flight_, grpc::WriteOptions(), final_status_);
      break;
    case Next::kFinish:
      // final_status_ is not written again once the Finish is claimed.
      Finish(final_status_);
      break;
    case Next::kNothing:
      break;
  }
}

void GenerateStreamReactor::OnStep(OutputBuilder::Step step) {
  Next next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const v1::GenerateResponse& d = step.delta;
    // A failed request ends with its status alone; a delta with nothing new is not sent (text
    // held back for a stop string comes with a later delta).
    const bool failed = step.finished && !step.status.ok();
    if (!failed && (step.finished || !d.text().empty() || d.token_ids_size() > 0)) {
      queue_.push_back(std::move(step.delta));
    }
    if (step.finished) {
      engine_done_ = true;
      final_status_ = ToGrpcStatus(step.status);
    }
    next = PickNextLocked();
  }
  Act(next);
}

void GenerateStreamReactor::OnWriteDone(bool ok) {
  Next next;
  bool abort = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok && !broken_) {
      broken_ = true;
      queue_.clear();
      abort = !engine_done_;
    }
    next = PickNextLocked();
  }
  if (abort) call_.Cancel();
  Act(next);
}

void GenerateStreamReactor::OnCancel() { call_.Cancel(); }

void GenerateStreamReactor::OnDone() {
  call_.Done();
  delete this;
}

}  // namespace ridgeserve
