// The reactors of Generate (unary) and GenerateStream (server streaming): one per call, each
// owning its call's state and deleting itself in OnDone. Both share GenerateCall, which
// validates and tokenizes the request, admits it under its request_id, submits it to the
// engine, turns engine events into responses (OutputBuilder) and aborts the engine request
// when the call is cancelled (client cancel, deadline, disconnect), Abort is called, or a stop
// string matched.
//
// Lifetime: the engine callback points at the reactor. That is safe because a reactor calls
// Finish (or StartWriteAndFinish) only after it has handled the engine's final event for its
// request (or when the request never reached the engine), and touches nothing after it; gRPC
// calls OnDone only after that.
#ifndef RIDGESERVE_SERVER_GENERATE_CALL_H_
#define RIDGESERVE_SERVER_GENERATE_CALL_H_

#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "grpcpp/grpcpp.h"
#include "ridgeserve/v1/ridgeserve.grpc.pb.h"
#include "server/event_lanes.h"
#include "server/metrics.h"
#include "server/output_builder.h"
#include "server/request_registry.h"
#include "server/ridgefill_maps_manager.h"
#include "server/ridgefill_shadow.h"
#include "server/server_options.h"

namespace ridgeserve {

// What generation calls need from the server. Everything outlives every call.
struct ServingContext {
  const Model& model;
  Engine& engine;
  const ServerOptions& options;
  RequestRegistry& registry;
  ServerMetrics& metrics;
  // The RidgeFill maps of the moment: a RIDGEFILL request takes a snapshot and keeps its
  // maps to the end.
  const RidgeFillMapsManager& ridgefill;
  // --ridgefill_shadow_fraction's sampler; null when off.
  RidgeFillShadow* shadow = nullptr;
  // Where each call handles its engine events (one lane per call, so in order).
  EventLanes* events = nullptr;
};

// One generation request's path from the wire (raw bytes, raw_messages.h) to the engine and
// back, shared by both reactors. Threading: Start, Cancel and Done from gRPC threads; the engine
// thread only copies each event to the call's lane (ServingContext::events), where OnEvent and
// the sink run.
class GenerateCall {
 public:
  using StepSink = std::function<void(OutputBuilder::Step)>;

  explicit GenerateCall(const ServingContext& context) : context_(context) {}

  // Parses, validates, admits and submits. The sink then gets one step per engine event, the last
  // with finished set; it may run before Start returns. Not OK: the request was refused (and
  // counted as an error) and the sink is never called.
  absl::Status Start(const grpc::ByteBuffer& request, StepSink sink);
  // The client is gone: end the engine request (its final event still comes).
  void Cancel();
  // The call is over (OnDone): its request_id is free again.
  void Done();

 private:
  absl::Status Submit(const v1::GenerateRequest& request, StepSink sink);
  void OnEvent(const TokenEvent& event, RequestMetrics::Clock::time_point handed_over);
  // Gathers a shadow-sampled request's side and hands it to the shadow when it ends.
  void CollectShadowed(const TokenEvent& event);
  void AbortEngineRequest();

  const ServingContext context_;
  std::string request_id_;
  bool admitted_ = false;
  std::optional<OutputBuilder> output_;    // the call's lane only, once submitted
  std::optional<RequestMetrics> metrics_;  // the call's lane only, once submitted
  // Shadow-sampled RIDGEFILL requests: their side of the comparison (the call's lane only).
  std::optional<RidgeFillShadow::Sampled> shadowed_;
  StepSink sink_;
};

class GenerateUnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  GenerateUnaryReactor(const ServingContext& context, const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response);
  void OnCancel() override;
  void OnDone() override;

 private:
  void OnStep(OutputBuilder::Step step);  // the call's lane

  GenerateCall call_;
  v1::GenerateResponse response_;  // the call's lane
  grpc::ByteBuffer* out_;          // owned by gRPC; ours to fill until Finish
};

class GenerateStreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateStreamReactor(const ServingContext& context, const grpc::ByteBuffer& request);
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void OnStep(OutputBuilder::Step step);  // the call's lane
  // Under mu_: starts the next write or, when everything is written and the engine is done,
  // claims the Finish; the engine's last message goes with the Finish (one batch, so a deadline
  // cannot fall between the final message and the status). The caller acts on the result after
  // unlocking.
  enum class Next { kNothing, kWrite, kWriteAndFinish, kFinish };
  Next PickNextLocked();
  void Act(Next next);

  GenerateCall call_;
  std::mutex mu_;
  std::deque<v1::GenerateResponse> queue_;  // not yet written
  grpc::ByteBuffer in_flight_;  // the message being written; owned by whoever set writing_
  bool writing_ = false;
  bool broken_ = false;  // a write failed: the client is gone, drop the rest
  bool engine_done_ = false;
  bool finish_claimed_ = false;
  grpc::Status final_status_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_GENERATE_CALL_H_
