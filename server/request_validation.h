// Turns a GenerateRequest / TokenizeRequest from the wire into what the engine takes: checks
// every field against the documented limits (INVALID_ARGUMENT naming the field, e.g.
// "sampling.top_p must be in (0, 1], got 1.5"), tokenizes the input, and checks the prompt
// against the model's context and --max_prompt_tokens (OUT_OF_RANGE). Prefill modes the server
// cannot run are FAILED_PRECONDITION. Pure functions: no engine, no gRPC; safe from any thread.
#ifndef RIDGESERVE_SERVER_REQUEST_VALIDATION_H_
#define RIDGESERVE_SERVER_REQUEST_VALIDATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/model/config.h"
#include "engine/tokenizer/tokenizer.h"
#include "ridgeserve/v1/ridgeserve.pb.h"
#include "server/server_options.h"

namespace ridgeserve {

inline constexpr int32_t kDefaultMaxNewTokens = 256;
inline constexpr int32_t kMaxNewTokensLimit = 1 << 20;  // 1048576
inline constexpr int kMaxRequestIdBytes = 256;

struct ValidatedRequest {
  std::string request_id;  // as sent; empty when the client left it to the server
  // Prompt ids, sampling, max_new_tokens, priority and logprobs; on_event is left empty for
  // the caller to set.
  EngineRequest engine;
  std::vector<std::string> stop;  // stop strings, each 1..options.max_stop_string_bytes bytes
};

// The prompt of a GenerateRequest:
// - text: encoded with BOS where the model wants one, special-token strings parsed (as
//   Hugging Face tokenizers do by default, so a hand-written chat prompt works);
// - token_ids: taken as they are (each must be in the vocabulary);
// - chat: the model's chat template with the generation prompt appended.
// When sampling.max_new_tokens is unset it defaults to min(256, what the context has left).
absl::StatusOr<ValidatedRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                         const Tokenizer& tokenizer,
                                                         const ModelConfig& config,
                                                         const ServerOptions& options);

// Token ids for a TokenizeRequest: text (BOS only with add_special_tokens) or chat (the
// template with the generation prompt, as Generate would see it).
absl::StatusOr<std::vector<int32_t>> TokenizeRequestInput(const v1::TokenizeRequest& request,
                                                          const Tokenizer& tokenizer);

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_REQUEST_VALIDATION_H_
