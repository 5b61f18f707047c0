#include "client/commands.h"

#include <chrono>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "ridgeserve/v1/ridgeserve.grpc.pb.h"

namespace ridgeserve {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

void SetDeadline(const CallOptions& options, grpc::ClientContext& context) {
  if (options.deadline_ms > 0) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(options.deadline_ms));
  }
}

// One line of JSON with the proto's own field names and every field, zeros included.
void PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Only fails on invalid UTF-8 or bad Any types, neither of which the API has.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::fwrite(json.data(), 1, json.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void PrintSummary(const v1::GenerateResponse& r) {
  std::fprintf(stderr,
               "[%s] finish_reason %s | %d prompt + %d completion tokens | server ttft %.3f s, "
               "e2e %.3f s\n",
               r.request_id().c_str(), v1::FinishReason_Name(r.finish_reason()).c_str(),
               r.usage().prompt_tokens(), r.usage().completion_tokens(), r.timing().ttft_seconds(),
               r.timing().e2e_seconds());
  if (r.usage().filled_prompt_tokens() > 0) {
    std::fprintf(stderr,
                 "RidgeFill: %d prompt tokens filled, %d exact | estimated ttft saved %.3f s\n",
                 r.usage().filled_prompt_tokens(), r.usage().exact_prompt_tokens(),
                 r.timing().estimated_ttft_saved_seconds());
  }
}

}  // namespace

absl::Status RunGenerate(const std::shared_ptr<grpc::Channel>& channel,
                         const v1::GenerateRequest& request, const CallOptions& options) {
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(options, context);
  v1::GenerateResponse response;
  if (grpc::Status s = stub->Generate(&context, request, &response); !s.ok()) return FromGrpc(s);
  if (options.json) {
    PrintJson(response);
  } else {
    std::fwrite(response.text().data(), 1, response.text().size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    PrintSummary(response);
  }
  return absl::OkStatus();
}

absl::Status RunStream(const std::shared_ptr<grpc::Channel>& channel,
                       const v1::GenerateRequest& request, const CallOptions& options) {
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(options, context);
  const Clock::time_point start = Clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->GenerateStream(&context, request);
  v1::GenerateResponse message;
  v1::GenerateResponse last;
  std::optional<double> ttft;
  double last_token_at = 0;
  int64_t tokens = 0;
  while (reader->Read(&message)) {
    if (message.token_ids_size() > 0) {
      const double now = SecondsSince(start);
      if (!ttft) ttft = now;
      last_token_at = now;
      tokens += message.token_ids_size();
    }
    if (options.json) {
      PrintJson(message);
    } else if (!message.text().empty()) {
      std::fwrite(message.text().data(), 1, message.text().size(), stdout);
      std::fflush(stdout);
    }
    if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last = message;
  }
  const double total = SecondsSince(start);
  if (!options.json) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  if (grpc::Status s = reader->Finish(); !s.ok()) return FromGrpc(s);
  // Decode rate over the tokens after the first, whose wait is the TTFT.
  const double decode_rate =
      tokens > 1 && last_token_at > *ttft ? (tokens - 1) / (last_token_at - *ttft) : 0.0;
  std::fprintf(stderr, "ttft %.3f s | %lld tokens in %.3f s | %.1f tokens/s after the first\n",
               ttft.value_or(0.0), static_cast<long long>(tokens), total, decode_rate);
  PrintSummary(last);
  return absl::OkStatus();
}

absl::Status RunInfo(const std::shared_ptr<grpc::Channel>& channel, const CallOptions& options) {
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(options, context);
  v1::ModelInfo info;
  if (grpc::Status s = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info); !s.ok()) {
    return FromGrpc(s);
  }
  if (options.json) {
    PrintJson(info);
  } else {
    std::fputs(info.DebugString().c_str(), stdout);
  }
  return absl::OkStatus();
}

absl::Status RunReloadMaps(const std::shared_ptr<grpc::Channel>& channel,
                           const CallOptions& options) {
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(options, context);
  v1::RidgeFillMapsInfo info;
  if (grpc::Status s = stub->ReloadRidgeFillMaps(&context, v1::ReloadRidgeFillMapsRequest(), &info);
      !s.ok()) {
    return FromGrpc(s);
  }
  if (options.json) {
    PrintJson(info);
  } else {
    std::fputs(info.DebugString().c_str(), stdout);
  }
  return absl::OkStatus();
}

absl::Status RunHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                       const CallOptions& options) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(options, context);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  if (grpc::Status s = stub->Check(&context, request, &response); !s.ok()) return FromGrpc(s);
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  if (options.json) {
    PrintJson(response);
  } else {
    std::printf("%s\n", name.c_str());
  }
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat("health: ", name));
  }
  return absl::OkStatus();
}

absl::Status RunAbort(const std::shared_ptr<grpc::Channel>& channel, const std::string& request_id,
                      const CallOptions& options) {
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(options, context);
  v1::AbortRequest request;
  request.set_request_id(request_id);
  v1::AbortResponse response;
  return FromGrpc(stub->Abort(&context, request, &response));
}

absl::Status RunTokenize(const std::shared_ptr<grpc::Channel>& channel,
                         const v1::TokenizeRequest& request, const CallOptions& options) {
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(options, context);
  v1::TokenizeResponse response;
  if (grpc::Status s = stub->Tokenize(&context, request, &response); !s.ok()) return FromGrpc(s);
  if (options.json) {
    PrintJson(response);
  } else {
    std::printf("%s\n", absl::StrJoin(response.token_ids(), ",").c_str());
    std::fprintf(stderr, "%d tokens\n", response.token_ids_size());
  }
  return absl::OkStatus();
}

}  // namespace ridgeserve
