#include "server/output_builder.h"

#include <utility>

namespace ridgeserve {

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::STOP;
    case FinishReason::kLength:
      return v1::LENGTH;
    case FinishReason::kStopSequence:
      return v1::STOP_SEQUENCE;
    case FinishReason::kAborted:
      return v1::ABORTED;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

OutputBuilder::OutputBuilder(const Tokenizer& tokenizer, std::string request_id,
                             std::vector<std::string> stop, int32_t prompt_tokens)
    : request_id_(std::move(request_id)),
      decoder_(tokenizer, /*skip_special=*/true),
      stops_(std::move(stop)),
      prompt_tokens_(prompt_tokens) {}

OutputBuilder::Step OutputBuilder::OnEvent(const TokenEvent& event) {
  Step step;
  v1::GenerateResponse& delta = step.delta;
  delta.set_request_id(request_id_);
  std::string text;
  // Token by token, so that tokens after the one completing a stop string are dropped even
  // when an event carries several.
  for (size_t i = 0; i < event.tokens.size() && !stops_.matched(); ++i) {
    const int32_t token = event.tokens[i];
    delta.add_token_ids(token);
    if (i < event.logprobs.size()) delta.add_logprobs(event.logprobs[i]);
    ++completion_tokens_;
    text += stops_.Push(decoder_.Push(token));
    if (stops_.matched() && !event.finished) step.abort_engine = true;
  }
  if (!event.finished) {
    delta.set_text(std::move(text));
    return step;
  }

  step.finished = true;
  step.status = event.status;
  if (!stops_.matched()) {
    // Bytes of an unfinished character (as U+FFFD), then the held-back text, which can still
    // complete a stop string.
    text += stops_.Push(decoder_.Flush());
    text += stops_.Flush();
  }
  delta.set_text(std::move(text));
  delta.set_finish_reason(stops_.matched() ? v1::STOP_SEQUENCE : ToProto(event.finish_reason));

  v1::Usage& usage = *delta.mutable_usage();
  const int32_t prompt_tokens = event.prompt_tokens > 0 ? event.prompt_tokens : prompt_tokens_;
  usage.set_prompt_tokens(prompt_tokens);
  usage.set_completion_tokens(completion_tokens_);
  usage.set_cached_prompt_tokens(event.cached_prompt_tokens);
  usage.set_filled_prompt_tokens(event.filled_prompt_tokens);
  // SpecPC's dropped tokens ran no layer; every other request prefills its whole prompt (also
  // when it ended before the engine said so).
  const int32_t kept = event.kept_prompt_tokens > 0 ? event.kept_prompt_tokens : prompt_tokens;
  usage.set_kept_prompt_tokens(kept);
  usage.set_exact_prompt_tokens(kept - event.filled_prompt_tokens);
  // SpecKV keeps `budget` KV entries per layer and KV head; every other request all of them.
  usage.set_kept_kv_tokens(event.kept_kv_tokens > 0 ? event.kept_kv_tokens : prompt_tokens);

  v1::Timing& timing = *delta.mutable_timing();
  timing.set_queue_seconds(event.timing.queue_seconds);
  timing.set_ttft_seconds(event.timing.ttft_seconds);
  timing.set_prefill_seconds(event.timing.prefill_seconds);
  timing.set_e2e_seconds(event.timing.e2e_seconds);
  timing.set_estimated_ttft_saved_seconds(event.timing.estimated_ttft_saved_seconds);
  timing.set_draft_seconds(event.timing.draft_seconds);
  return step;
}

void MergeDelta(const v1::GenerateResponse& delta, v1::GenerateResponse& total) {
  total.set_request_id(delta.request_id());
  total.mutable_text()->append(delta.text());
  total.mutable_token_ids()->Add(delta.token_ids().begin(), delta.token_ids().end());
  total.mutable_logprobs()->Add(delta.logprobs().begin(), delta.logprobs().end());
  if (delta.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    total.set_finish_reason(delta.finish_reason());
  }
  if (delta.has_usage()) *total.mutable_usage() = delta.usage();
  if (delta.has_timing()) *total.mutable_timing() = delta.timing();
}

}  // namespace ridgeserve
