#include "server/admin_service.h"

#include "server/raw_messages.h"
#include "server/ridgefill_maps_info.h"
#include "server/status_conversion.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {

AdminService::AdminService(bool enabled, RidgeFillMapsManager& ridgefill)
    : enabled_(enabled), ridgefill_(ridgefill) {}

grpc::ServerUnaryReactor* AdminService::ReloadRidgeFillMaps(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::ReloadRidgeFillMapsRequest parsed;
  absl::Status status = ParseRequest(*request, parsed);
  if (status.ok() && !enabled_) {
    status = absl::PermissionDeniedError(
        "ridgeserve.v1.Admin is off: start the server with --admin_token_file to allow it");
  }
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  spdlog::info("admin: RidgeFill maps reload asked for by {}", context->peer());
  // Answered when the watcher thread has loaded or refused the file; the call (and
  // `response`) live until Finish.
  ridgefill_.RequestReload(
      [reactor, response](const absl::Status& outcome, const RidgeFillMapsSnapshot& after) {
        if (outcome.ok()) *response = SerializeResponse(ToRidgeFillMapsInfo(after));
        reactor->Finish(ToGrpcStatus(outcome));
      });
  return reactor;
}

}  // namespace ridgeserve
