#include "server/inference_service.h"

#include <string>
#include <utility>

#include "engine/tokenizer/utf8.h"
#include "server/raw_messages.h"
#include "server/request_validation.h"
#include "server/ridgefill_maps_info.h"
#include "server/status_conversion.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {

InferenceService::InferenceService(const Model& model, Engine& engine, ServerOptions options,
                                   ServerMetrics& metrics, const RidgeFillMapsManager& ridgefill,
                                   RidgeFillShadow* shadow)
    : model_(model),
      engine_(engine),
      options_(std::move(options)),
      ridgefill_(ridgefill),
      events_(options_.event_threads),
      context_{model_, engine_, options_, registry_, metrics, ridgefill_, shadow, &events_} {}

namespace {

// A unary method that answers at once: parses the request, lets `answer` fill the response
// and finishes with its status.
template <typename Request, typename Response, typename Answer>
grpc::ServerUnaryReactor* AnswerNow(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer& bytes, grpc::ByteBuffer* out,
                                    Answer answer) {
  Request request;
  Response response;
  absl::Status status = ParseRequest(bytes, request);
  if (status.ok()) status = answer(request, response);
  if (status.ok()) *out = SerializeResponse(response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* InferenceService::Generate(grpc::CallbackServerContext* /*context*/,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return new GenerateUnaryReactor(context_, *request, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* InferenceService::GenerateStream(
    grpc::CallbackServerContext* /*context*/, const grpc::ByteBuffer* request) {
  return new GenerateStreamReactor(context_, *request);
}

grpc::ServerUnaryReactor* InferenceService::Abort(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return AnswerNow<v1::AbortRequest, v1::AbortResponse>(
      context, *request, response,
      [this](const auto& req, auto& resp) { return AnswerAbort(req, resp); });
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return AnswerNow<v1::TokenizeRequest, v1::TokenizeResponse>(
      context, *request, response,
      [this](const auto& req, auto& resp) { return AnswerTokenize(req, resp); });
}

grpc::ServerUnaryReactor* InferenceService::GetModelInfo(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return AnswerNow<v1::GetModelInfoRequest, v1::ModelInfo>(
      context, *request, response,
      [this](const auto& req, auto& resp) { return AnswerGetModelInfo(req, resp); });
}

absl::Status InferenceService::AnswerAbort(const v1::AbortRequest& request,
                                           v1::AbortResponse& /*response*/) {
  if (request.request_id().empty()) {
    return absl::InvalidArgumentError("request_id must not be empty");
  }
  absl::StatusOr<std::optional<uint64_t>> id = registry_.RequestAbort(request.request_id());
  if (id.ok()) {
    // Without an engine id yet, the call aborts itself as soon as it has one.
    if (id->has_value()) engine_.Abort(**id);
    spdlog::info("request {}: abort requested", request.request_id());
  }
  return id.status();
}

absl::Status InferenceService::AnswerTokenize(const v1::TokenizeRequest& request,
                                              v1::TokenizeResponse& response) const {
  absl::StatusOr<std::vector<int32_t>> ids = TokenizeRequestInput(request, *model_.tokenizer);
  if (!ids.ok()) return ids.status();
  for (int32_t id : *ids) {
    response.add_token_ids(id);
    // A token can hold part of a character; proto strings must be valid UTF-8.
    AppendUtf8Lossy(model_.tokenizer->TokenBytes(id), /*final=*/true, response.add_tokens());
  }
  return absl::OkStatus();
}

absl::Status InferenceService::AnswerGetModelInfo(const v1::GetModelInfoRequest& /*request*/,
                                                  v1::ModelInfo& response) const {
  const ModelConfig& c = model_.config;
  response.set_model_name(c.name);
  response.set_architecture(c.arch_name);
  response.set_num_layers(c.num_layers);
  response.set_hidden_size(c.hidden);
  response.set_num_heads(c.num_heads);
  response.set_num_kv_heads(c.num_kv_heads);
  response.set_vocab_size(c.vocab_size);
  response.set_context_length(c.context_length);
  response.set_backend(options_.backend);
  response.set_tensor_parallel(options_.tensor_parallel);
  const RidgeFillMapsSnapshot maps = ridgefill_.Snapshot();
  for (int32_t layer : maps.split_layers) response.add_ridgefill_split_layers(layer);
  *response.mutable_ridgefill_maps() = ToRidgeFillMapsInfo(maps);
  response.set_default_exact_tail_tokens(options_.default_exact_tail_tokens);

  const EngineStats s = engine_.stats();
  v1::ServerStats& stats = *response.mutable_stats();
  stats.set_num_requests_running(s.num_running);
  stats.set_num_requests_waiting(s.num_waiting);
  stats.set_kv_cache_blocks_total(s.kv_blocks_total);
  stats.set_kv_cache_blocks_free(s.kv_blocks_free);
  stats.set_kv_cache_block_size(s.kv_block_size);
  stats.set_num_preemptions(s.num_preemptions);
  stats.set_num_prefix_cache_hit_tokens(s.num_prefix_hit_tokens);
  return absl::OkStatus();
}

void InferenceService::StartDraining() { registry_.StartDraining(); }

bool InferenceService::WaitForIdle(absl::Time deadline) {
  return registry_.WaitUntilEmpty(deadline);
}

int InferenceService::AbortAll() {
  const std::vector<uint64_t> ids = registry_.AbortAll();
  for (uint64_t id : ids) engine_.Abort(id);
  return static_cast<int>(ids.size());
}

int InferenceService::num_in_flight() const { return registry_.size(); }

}  // namespace ridgeserve
