// ridgeserve-cli: a command-line client for a running ridgeserve.
//   ridgeserve-cli generate [flags] [PROMPT...]   whole completion
//   ridgeserve-cli stream   [flags] [PROMPT...]   tokens as they arrive, then TTFT and rate
//   ridgeserve-cli info                           model and server state
//   ridgeserve-cli health                         SERVING / NOT_SERVING (exit code says which)
//   ridgeserve-cli tokenize [flags] [TEXT...]
//   ridgeserve-cli abort REQUEST_ID                ends a live request
//   ridgeserve-cli reload-maps                     rereads the server's RidgeFill maps (admin)
// The prompt is the words after the subcommand, else --prompt, else --file, else stdin.
// --tls, --tls_ca, --tls_cert/--tls_key and --auth_token(_file) reach a server that wants them.
// On error prints "CODE: message" of the gRPC status to stderr and exits with the code's
// number (INVALID_ARGUMENT = 3, UNAVAILABLE = 14, ...).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/channel.h"
#include "client/channel_flags.h"
#include "client/cli_parsing.h"
#include "client/commands.h"
#include "engine/common/status_macros.h"
#include "ridgeserve/v1/ridgeserve.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address HOST:PORT");
ABSL_FLAG(std::string, prompt, "", "prompt text (instead of positional words)");
ABSL_FLAG(std::string, file, "", "read the prompt from this file");
ABSL_FLAG(std::string, token_ids, "", "prompt as comma-separated token ids (generate, stream)");
ABSL_FLAG(bool, chat, false, "send the prompt as a user message through the chat template");
ABSL_FLAG(std::string, system, "", "with --chat: a system message before the user's");
ABSL_FLAG(bool, json, false, "print responses as JSON");
ABSL_FLAG(int64_t, deadline_ms, 0, "call deadline in milliseconds (0: none)");
ABSL_FLAG(std::string, request_id, "", "request id (for Abort; the server names it if empty)");
ABSL_FLAG(int32_t, priority, 0, "lower is scheduled first");
ABSL_FLAG(std::string, health_service, "", "health: service name to check ('' = server)");
ABSL_FLAG(bool, add_special_tokens, true, "tokenize: add BOS where the model wants one");
// Sampling: unset flags leave the field unset, so the server's documented default applies.
ABSL_FLAG(std::optional<float>, temperature, std::nullopt, "0 = greedy (default 1)");
ABSL_FLAG(std::optional<float>, top_p, std::nullopt, "nucleus mass in (0, 1] (default 1)");
ABSL_FLAG(std::optional<int32_t>, top_k, std::nullopt, "keep the k most likely (0 = off)");
ABSL_FLAG(std::optional<float>, min_p, std::nullopt, "drop tokens below min_p * max prob");
ABSL_FLAG(std::optional<float>, repetition_penalty, std::nullopt, "> 0 (1 = off)");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt, "sampling seed (default: random)");
ABSL_FLAG(std::optional<int32_t>, max_new_tokens, std::nullopt, "at most this many tokens");
ABSL_FLAG(std::vector<std::string>, stop, {},
          "stop string; repeat the flag or separate with commas (\\, for a comma, C escapes "
          "such as \\n allowed)");
ABSL_FLAG(std::string, stop_token_ids, "", "comma-separated token ids that end generation");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past end-of-generation tokens");
ABSL_FLAG(bool, logprobs, false, "return each token's log-probability (shown with --json)");
// Prefill.
ABSL_FLAG(std::string, mode, "exact", "prefill mode: exact, ridgefill, spec_pc or spec_kv");
ABSL_FLAG(std::optional<int32_t>, exact_tail_tokens, std::nullopt,
          "ridgefill: prompt tail that runs exactly (default: the server's)");
ABSL_FLAG(std::optional<int32_t>, split_layer, std::nullopt, "ridgefill: split layer");
ABSL_FLAG(std::optional<int32_t>, budget, std::nullopt, "spec_pc / spec_kv: tokens kept");

namespace ridgeserve {
namespace {

absl::Status BuildSampling(const std::vector<std::string>& stop_flags, v1::SamplingParams& s) {
  if (auto v = absl::GetFlag(FLAGS_temperature)) s.set_temperature(*v);
  if (auto v = absl::GetFlag(FLAGS_top_p)) s.set_top_p(*v);
  if (auto v = absl::GetFlag(FLAGS_top_k)) s.set_top_k(*v);
  if (auto v = absl::GetFlag(FLAGS_min_p)) s.set_min_p(*v);
  if (auto v = absl::GetFlag(FLAGS_repetition_penalty)) s.set_repetition_penalty(*v);
  if (auto v = absl::GetFlag(FLAGS_seed)) s.set_seed(*v);
  if (auto v = absl::GetFlag(FLAGS_max_new_tokens)) s.set_max_new_tokens(*v);
  for (const std::string& flag : stop_flags) {
    RS_ASSIGN_OR_RETURN(std::vector<std::string> stops, ParseStopList(flag));
    for (std::string& stop : stops) s.add_stop(std::move(stop));
  }
  RS_ASSIGN_OR_RETURN(std::vector<int32_t> stop_ids,
                      ParseIdList("stop_token_ids", absl::GetFlag(FLAGS_stop_token_ids)));
  for (int32_t id : stop_ids) s.add_stop_token_ids(id);
  if (absl::GetFlag(FLAGS_ignore_eos)) s.set_ignore_eos(true);
  if (absl::GetFlag(FLAGS_logprobs)) s.set_logprobs(true);
  return absl::OkStatus();
}

absl::Status BuildPrefill(v1::PrefillOptions& p) {
  RS_ASSIGN_OR_RETURN(v1::PrefillOptions::Mode mode, ParsePrefillMode(absl::GetFlag(FLAGS_mode)));
  p.set_mode(mode);
  if (auto v = absl::GetFlag(FLAGS_exact_tail_tokens))
    p.mutable_ridgefill()->set_exact_tail_tokens(*v);
  if (auto v = absl::GetFlag(FLAGS_split_layer)) p.mutable_ridgefill()->set_split_layer(*v);
  if (auto v = absl::GetFlag(FLAGS_budget)) {
    if (mode == v1::PrefillOptions::SPEC_KV) {
      p.mutable_spec_kv()->set_budget(*v);
    } else {
      p.mutable_spec_pc()->set_budget(*v);
    }
  }
  return absl::OkStatus();
}

void SetChat(const std::string& prompt, v1::ChatInput& chat) {
  if (!absl::GetFlag(FLAGS_system).empty()) {
    v1::ChatMessage& system = *chat.add_messages();
    system.set_role("system");
    system.set_content(absl::GetFlag(FLAGS_system));
  }
  v1::ChatMessage& user = *chat.add_messages();
  user.set_role("user");
  user.set_content(prompt);
}

absl::StatusOr<v1::GenerateRequest> BuildGenerateRequest(
    const std::vector<std::string>& positional, const std::vector<std::string>& stop_flags) {
  v1::GenerateRequest request;
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  request.set_priority(absl::GetFlag(FLAGS_priority));
  if (!absl::GetFlag(FLAGS_token_ids).empty()) {
    RS_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        ParseIdList("token_ids", absl::GetFlag(FLAGS_token_ids)));
    request.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  } else {
    RS_ASSIGN_OR_RETURN(std::string prompt, ReadPrompt(positional, absl::GetFlag(FLAGS_prompt),
                                                       absl::GetFlag(FLAGS_file)));
    if (absl::GetFlag(FLAGS_chat)) {
      SetChat(prompt, *request.mutable_chat());
    } else {
      request.set_text(prompt);
    }
  }
  RS_RETURN_IF_ERROR(BuildSampling(stop_flags, *request.mutable_sampling()));
  RS_RETURN_IF_ERROR(BuildPrefill(*request.mutable_prefill()));
  return request;
}

absl::StatusOr<v1::TokenizeRequest> BuildTokenizeRequest(
    const std::vector<std::string>& positional) {
  v1::TokenizeRequest request;
  RS_ASSIGN_OR_RETURN(std::string prompt, ReadPrompt(positional, absl::GetFlag(FLAGS_prompt),
                                                     absl::GetFlag(FLAGS_file)));
  if (absl::GetFlag(FLAGS_chat)) {
    SetChat(prompt, *request.mutable_chat());
  } else {
    request.set_text(prompt);
  }
  request.set_add_special_tokens(absl::GetFlag(FLAGS_add_special_tokens));
  return request;
}

absl::Status Run(const std::string& command, const std::vector<std::string>& positional,
                 const std::vector<std::string>& stop_flags) {
  CallOptions options;
  options.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
  options.json = absl::GetFlag(FLAGS_json);
  RS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                      OpenChannel(absl::GetFlag(FLAGS_target), ChannelSecurityFromFlags()));
  if (command == "generate" || command == "stream") {
    RS_ASSIGN_OR_RETURN(v1::GenerateRequest request, BuildGenerateRequest(positional, stop_flags));
    return command == "generate" ? RunGenerate(channel, request, options)
                                 : RunStream(channel, request, options);
  }
  if (command == "tokenize") {
    RS_ASSIGN_OR_RETURN(v1::TokenizeRequest request, BuildTokenizeRequest(positional));
    return RunTokenize(channel, request, options);
  }
  if (command == "abort") {
    if (positional.size() != 1) {
      return absl::InvalidArgumentError("abort takes one argument: the request_id");
    }
    return RunAbort(channel, positional[0], options);
  }
  if (!positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(command, " takes no arguments, got \"", positional[0], "\""));
  }
  if (command == "info") return RunInfo(channel, options);
  if (command == "health") return RunHealth(channel, absl::GetFlag(FLAGS_health_service), options);
  if (command == "reload-maps") return RunReloadMaps(channel, options);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown command \"", command,
                   "\" (generate, stream, info, health, tokenize, abort, reload-maps)"));
}

}  // namespace
}  // namespace ridgeserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "client for a ridgeserve server.\n"
      "  ridgeserve-cli generate|stream [flags] [PROMPT...]   (prompt: words, --prompt, --file "
      "or stdin)\n"
      "  ridgeserve-cli info | health | tokenize [TEXT...] | abort REQUEST_ID | reload-maps");
  // absl keeps only the last --stop; every occurrence counts here.
  const std::vector<std::string> stop_flags = ridgeserve::CollectRepeatedFlag(argc, argv, "stop");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr,
                 "INVALID_ARGUMENT: missing command (generate, stream, info, health, "
                 "tokenize, abort, reload-maps); see --help\n");
    return static_cast<int>(absl::StatusCode::kInvalidArgument);
  }
  const std::string command = args[1];
  const std::vector<std::string> positional(args.begin() + 2, args.end());
  absl::Status status = ridgeserve::Run(command, positional, stop_flags);
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
                 std::string(status.message()).c_str());
    return static_cast<int>(status.code());
  }
  return 0;
}
