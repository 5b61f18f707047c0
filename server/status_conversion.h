// absl::Status → grpc::Status at the transport boundary (the codes are numerically equal).
#ifndef RIDGESERVE_SERVER_STATUS_CONVERSION_H_
#define RIDGESERVE_SERVER_STATUS_CONVERSION_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ridgeserve {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_STATUS_CONVERSION_H_
