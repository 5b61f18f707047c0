#include "server/request_validation.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/common/status_macros.h"
#include "engine/draft/spec_kv.h"
#include "engine/draft/spec_pc.h"

namespace ridgeserve {
namespace {

// The ids the model can both embed and the tokenizer can print.
int32_t UsableVocab(const Tokenizer& tokenizer, const ModelConfig& config) {
  return std::min(tokenizer.vocab_size(), config.vocab_size);
}

absl::Status CheckTokenIds(const google::protobuf::RepeatedField<int32_t>& ids,
                           const std::string& field, int32_t vocab) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "] = ", ids[i], " is not a token id (vocabulary [0, ", vocab, "))"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const v1::SamplingParams& s, int32_t vocab,
                              const ServerOptions& options, SamplingParams& out,
                              std::vector<std::string>& stop) {
  if (s.has_temperature()) {
    const float t = s.temperature();
    if (!std::isfinite(t) || t < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sampling.temperature must be finite and >= 0, got %g", t));
    }
    out.temperature = t;
  }
  if (s.has_top_p()) {
    const float p = s.top_p();
    if (!(p > 0 && p <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sampling.top_p must be in (0, 1], got %g", p));
    }
    out.top_p = p;
  }
  if (s.has_top_k()) {
    if (s.top_k() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.top_k must be >= 0 (0 = off), got ", s.top_k()));
    }
    out.top_k = s.top_k();
  }
  if (s.has_min_p()) {
    const float m = s.min_p();
    if (!(m >= 0 && m <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sampling.min_p must be in [0, 1], got %g", m));
    }
    out.min_p = m;
  }
  if (s.has_repetition_penalty()) {
    const float r = s.repetition_penalty();
    if (!std::isfinite(r) || !(r > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sampling.repetition_penalty must be finite and > 0, got %g", r));
    }
    out.repetition_penalty = r;
  }
  if (s.has_seed()) {
    out.seed = s.seed();
    out.has_seed = true;
  }
  if (s.has_max_new_tokens() &&
      (s.max_new_tokens() < 1 || s.max_new_tokens() > kMaxNewTokensLimit)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_new_tokens must be in [1, ",
                                                   kMaxNewTokensLimit, "], got ",
                                                   s.max_new_tokens()));
  }
  if (s.stop_size() > options.max_stop_strings) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.stop has ", s.stop_size(),
                                                   " strings; at most ", options.max_stop_strings,
                                                   " (--max_stop_strings)"));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    const size_t n = s.stop(i).size();
    if (n < 1 || n > static_cast<size_t>(options.max_stop_string_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop[", i, "] must be 1..",
                                                     options.max_stop_string_bytes,
                                                     " bytes (--max_stop_string_bytes), got ", n));
    }
    stop.push_back(s.stop(i));
  }
  RS_RETURN_IF_ERROR(CheckTokenIds(s.stop_token_ids(), "sampling.stop_token_ids", vocab));
  out.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  out.ignore_eos = s.has_ignore_eos() && s.ignore_eos();
  // The sampler's own check, in case it knows a limit this layer does not.
  if (absl::Status status = ValidateSamplingParams(out); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.", status.message()));
  }
  return absl::OkStatus();
}

// `field`'s budget (>= min_budget) and lookahead_tokens ([1, max_lookahead]), when set.
absl::Status ValidateBudget(const v1::BudgetOptions& b, const std::string& field,
                            int32_t min_budget, int32_t max_lookahead) {
  if (b.has_budget() && b.budget() < min_budget) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".budget must be >= ", min_budget, ", got ", b.budget()));
  }
  if (b.has_lookahead_tokens() &&
      (b.lookahead_tokens() < 1 || b.lookahead_tokens() > max_lookahead)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".lookahead_tokens must be in [1, ",
                                                   max_lookahead, "], got ", b.lookahead_tokens()));
  }
  return absl::OkStatus();
}

absl::Status ValidatePrefill(const v1::PrefillOptions& p, const ServerOptions& options) {
  const v1::RidgeFillOptions& r = p.ridgefill();
  if (r.has_exact_tail_tokens() && r.exact_tail_tokens() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill.ridgefill.exact_tail_tokens must be >= 0, got ", r.exact_tail_tokens()));
  }
  if (r.has_split_layer() && r.split_layer() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill.ridgefill.split_layer must be >= 0, got ", r.split_layer()));
  }
  for (int i = 0; i < r.exact_spans_size(); ++i) {
    const v1::Span& span = r.exact_spans(i);
    if (span.begin() < 0 || span.end() < span.begin()) {
      return absl::InvalidArgumentError(absl::StrCat("prefill.ridgefill.exact_spans[", i,
                                                     "] must have 0 <= begin <= end, got [",
                                                     span.begin(), ", ", span.end(), ")"));
    }
  }
  RS_RETURN_IF_ERROR(
      ValidateBudget(p.spec_pc(), "prefill.spec_pc", kSpecPcMinBudget, kSpecPcMaxLookahead));
  // SpecKV's lookahead answer is capped by the same limit as SpecPC's (the engine's).
  RS_RETURN_IF_ERROR(
      ValidateBudget(p.spec_kv(), "prefill.spec_kv", kSpecKvMinBudget, kSpecPcMaxLookahead));

  switch (p.mode()) {
    case v1::PrefillOptions::EXACT:
      return absl::OkStatus();
    case v1::PrefillOptions::RIDGEFILL: {
      if (options.ridgefill_split_layers.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("prefill.mode RIDGEFILL: ",
                         options.ridgefill_unavailable.empty()
                             ? "no RidgeFill maps loaded (start the server with --ridgefill_maps)"
                             : options.ridgefill_unavailable));
      }
      const auto& splits = options.ridgefill_split_layers;
      if (r.has_split_layer() &&
          std::find(splits.begin(), splits.end(), r.split_layer()) == splits.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("prefill.ridgefill.split_layer ", r.split_layer(),
                         ": no RidgeFill maps for it (loaded: ", absl::StrJoin(splits, ", "), ")"));
      }
      return absl::OkStatus();
    }
    case v1::PrefillOptions::SPEC_PC:
    case v1::PrefillOptions::SPEC_KV:
      if (!options.has_draft_model) {
        return absl::FailedPreconditionError(
            absl::StrCat("prefill.mode ", v1::PrefillOptions::Mode_Name(p.mode()),
                         ": no draft model loaded (start the server with --draft_model)"));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("prefill.mode: unknown value ", static_cast<int>(p.mode())));
  }
}

absl::StatusOr<std::vector<ChatMessage>> ChatMessages(const v1::ChatInput& chat) {
  if (chat.messages().empty()) {
    return absl::InvalidArgumentError("chat.messages must not be empty");
  }
  std::vector<ChatMessage> messages;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("chat.messages[", i, "].role must be one of system, user, assistant, got \"",
                       m.role(), "\""));
    }
    messages.push_back(ChatMessage{m.role(), m.content()});
  }
  return messages;
}

std::vector<int32_t> EncodeChat(const std::vector<ChatMessage>& messages,
                                const Tokenizer& tokenizer) {
  const std::string prompt = tokenizer.ApplyChatTemplate(messages, /*add_generation_prompt=*/true);
  // The template already holds BOS where the model wants one, as text.
  return tokenizer.Encode(prompt, /*add_bos=*/false, /*parse_special=*/true);
}

absl::StatusOr<std::vector<int32_t>> PromptIds(const v1::GenerateRequest& request,
                                               const Tokenizer& tokenizer, int32_t vocab) {
  switch (request.input_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return absl::InvalidArgumentError("text must not be empty");
      std::vector<int32_t> ids =
          tokenizer.Encode(request.text(), /*add_bos=*/true, /*parse_special=*/true);
      if (ids.empty()) return absl::InvalidArgumentError("text encodes to no tokens");
      return ids;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return absl::InvalidArgumentError("token_ids.ids must not be empty");
      RS_RETURN_IF_ERROR(CheckTokenIds(ids, "token_ids.ids", vocab));
      return std::vector<int32_t>(ids.begin(), ids.end());
    }
    case v1::GenerateRequest::kChat: {
      RS_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, ChatMessages(request.chat()));
      return EncodeChat(messages, tokenizer);
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("input must be set (text, token_ids or chat)");
}

}  // namespace

absl::StatusOr<ValidatedRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                         const Tokenizer& tokenizer,
                                                         const ModelConfig& config,
                                                         const ServerOptions& options) {
  ValidatedRequest out;
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id must be at most ",
                                                   kMaxRequestIdBytes, " bytes, got ",
                                                   request.request_id().size()));
  }
  out.request_id = request.request_id();
  const int32_t vocab = UsableVocab(tokenizer, config);
  RS_RETURN_IF_ERROR(
      ValidateSampling(request.sampling(), vocab, options, out.engine.sampling, out.stop));
  RS_RETURN_IF_ERROR(ValidatePrefill(request.prefill(), options));
  RS_ASSIGN_OR_RETURN(out.engine.prompt, PromptIds(request, tokenizer, vocab));

  const int64_t prompt_len = static_cast<int64_t>(out.engine.prompt.size());
  if (options.max_prompt_tokens > 0 && prompt_len > options.max_prompt_tokens) {
    return absl::OutOfRangeError(
        absl::StrCat("prompt (", prompt_len, " tokens) exceeds this server's limit of ",
                     options.max_prompt_tokens, " tokens a request (--max_prompt_tokens)"));
  }
  const int64_t context = config.context_length;
  if (request.sampling().has_max_new_tokens()) {
    const int32_t max_new = request.sampling().max_new_tokens();
    if (prompt_len + max_new > context) {
      return absl::OutOfRangeError(
          absl::StrCat("prompt (", prompt_len, " tokens) + sampling.max_new_tokens (", max_new,
                       ") exceeds the model context of ", context, " tokens"));
    }
    out.engine.max_new_tokens = max_new;
  } else {
    if (prompt_len >= context) {
      return absl::OutOfRangeError(absl::StrCat("prompt (", prompt_len,
                                                " tokens) leaves no room in the model context of ",
                                                context, " tokens"));
    }
    out.engine.max_new_tokens =
        static_cast<int32_t>(std::min<int64_t>(kDefaultMaxNewTokens, context - prompt_len));
  }
  out.engine.priority = request.priority();
  out.engine.sampling.logprobs = request.sampling().has_logprobs() && request.sampling().logprobs();
  if (request.prefill().mode() == v1::PrefillOptions::RIDGEFILL) {
    const v1::RidgeFillOptions& r = request.prefill().ridgefill();
    RidgeFillRequest& fill = out.engine.ridgefill;
    fill.split_layer = r.has_split_layer() ? r.split_layer() : options.default_split_layer;
    fill.exact_tail_tokens =
        r.has_exact_tail_tokens() ? r.exact_tail_tokens() : options.default_exact_tail_tokens;
    for (int i = 0; i < r.exact_spans_size(); ++i) {
      const v1::Span& span = r.exact_spans(i);
      if (span.end() > prompt_len) {
        return absl::InvalidArgumentError(
            absl::StrCat("prefill.ridgefill.exact_spans[", i, "].end (", span.end(),
                         ") is past the end of the prompt (", prompt_len, " tokens)"));
      }
      fill.exact_spans.emplace_back(span.begin(), span.end());
    }
  }
  if (request.prefill().mode() == v1::PrefillOptions::SPEC_PC) {
    const v1::BudgetOptions& b = request.prefill().spec_pc();
    out.engine.spec_pc.budget = b.has_budget() ? b.budget() : options.spec_pc_budget;
    out.engine.spec_pc.lookahead_tokens =
        b.has_lookahead_tokens() ? b.lookahead_tokens() : options.spec_pc_lookahead_tokens;
  }
  if (request.prefill().mode() == v1::PrefillOptions::SPEC_KV) {
    const v1::BudgetOptions& b = request.prefill().spec_kv();
    out.engine.spec_kv.budget = b.has_budget() ? b.budget() : options.spec_kv_budget;
    out.engine.spec_kv.lookahead_tokens =
        b.has_lookahead_tokens() ? b.lookahead_tokens() : options.spec_kv_lookahead_tokens;
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> TokenizeRequestInput(const v1::TokenizeRequest& request,
                                                          const Tokenizer& tokenizer) {
  switch (request.input_case()) {
    case v1::TokenizeRequest::kText:
      return tokenizer.Encode(request.text(), request.add_special_tokens(),
                              /*parse_special=*/true);
    case v1::TokenizeRequest::kChat: {
      RS_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, ChatMessages(request.chat()));
      return EncodeChat(messages, tokenizer);
    }
    case v1::TokenizeRequest::INPUT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("input must be set (text or chat)");
}

}  // namespace ridgeserve
