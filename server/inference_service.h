// The ridgeserve.v1.Inference service on gRPC's callback API. Generate and GenerateStream get
// one reactor per call (generate_call.h); Abort, Tokenize and GetModelInfo answer at once.
// Also the drain hooks main() uses at shutdown.
//
// Threading: methods are called by gRPC threads; the drain hooks from main's thread.
#ifndef RIDGESERVE_SERVER_INFERENCE_SERVICE_H_
#define RIDGESERVE_SERVER_INFERENCE_SERVICE_H_

#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "grpcpp/grpcpp.h"
#include "ridgeserve/v1/ridgeserve.grpc.pb.h"
#include "server/generate_call.h"
#include "server/metrics.h"
#include "server/request_registry.h"
#include "server/ridgefill_maps_manager.h"
#include "server/server_options.h"

namespace ridgeserve {

// Every method takes and gives raw bytes (raw_messages.h), so that a request that does not
// parse gets INVALID_ARGUMENT naming its message type instead of gRPC's UNIMPLEMENTED.
using RawInferenceService = v1::Inference::WithRawCallbackMethod_Generate<
    v1::Inference::WithRawCallbackMethod_GenerateStream<
        v1::Inference::WithRawCallbackMethod_Abort<v1::Inference::WithRawCallbackMethod_Tokenize<
            v1::Inference::WithRawCallbackMethod_GetModelInfo<v1::Inference::Service>>>>>;

class InferenceService final : public RawInferenceService {
 public:
  // `model`, `engine`, `metrics`, `ridgefill` and `shadow` (null: no shadow sampling) must
  // outlive the service and every call on it.
  InferenceService(const Model& model, Engine& engine, ServerOptions options,
                   ServerMetrics& metrics, const RidgeFillMapsManager& ridgefill,
                   RidgeFillShadow* shadow);

  // Each request is a serialized v1::<Method>Request, each response a serialized
  // v1::GenerateResponse, v1::AbortResponse, v1::TokenizeResponse or v1::ModelInfo.
  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

  // Shutdown, in this order: StartDraining (new generation calls get UNAVAILABLE), then
  // WaitForIdle until the in-flight calls are done or the timeout passes, then AbortAll (their
  // streams end with finish_reason ABORTED) and WaitForIdle again for them to be sent.
  void StartDraining();
  // True when no generation call is in flight any more.
  bool WaitForIdle(absl::Time deadline);
  // Returns how many requests were aborted in the engine.
  int AbortAll();
  int num_in_flight() const;

 private:
  // The answers of the methods that answer at once, on parsed messages.
  absl::Status AnswerAbort(const v1::AbortRequest& request, v1::AbortResponse& response);
  absl::Status AnswerTokenize(const v1::TokenizeRequest& request,
                              v1::TokenizeResponse& response) const;
  absl::Status AnswerGetModelInfo(const v1::GetModelInfoRequest& request,
                                  v1::ModelInfo& response) const;

  const Model& model_;
  Engine& engine_;
  const ServerOptions options_;
  const RidgeFillMapsManager& ridgefill_;
  RequestRegistry registry_;
  // Declared after the members the calls use, so it is destroyed (after running what is left)
  // while they still exist.
  EventLanes events_;
  const ServingContext context_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_INFERENCE_SERVICE_H_
