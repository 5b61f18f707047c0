// The ridgeserve.v1.Admin service: operator calls (the proto says what each does). Who may
// call it is the port's token check (server_credentials.h: the tokens of --admin_token_file
// for this service and no others); a server without --admin_token_file has no admin tokens, so
// the service itself answers PERMISSION_DENIED.
//
// Threading: methods are called by gRPC threads; a reload is answered on the maps manager's
// watcher thread when it is done.
#ifndef RIDGESERVE_SERVER_ADMIN_SERVICE_H_
#define RIDGESERVE_SERVER_ADMIN_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "ridgeserve/v1/ridgeserve.grpc.pb.h"
#include "server/ridgefill_maps_manager.h"

namespace ridgeserve {

// Raw bytes in and out, as the Inference service (raw_messages.h).
using RawAdminService = v1::Admin::WithRawCallbackMethod_ReloadRidgeFillMaps<v1::Admin::Service>;

class AdminService final : public RawAdminService {
 public:
  // `enabled`: the server was started with --admin_token_file. `ridgefill` must outlive the
  // service and every call on it.
  AdminService(bool enabled, RidgeFillMapsManager& ridgefill);

  grpc::ServerUnaryReactor* ReloadRidgeFillMaps(grpc::CallbackServerContext* context,
                                                const grpc::ByteBuffer* request,
                                                grpc::ByteBuffer* response) override;

 private:
  const bool enabled_;
  RidgeFillMapsManager& ridgefill_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_ADMIN_SERVICE_H_
