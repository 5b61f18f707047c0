// The Inference service takes its requests and gives its responses as raw bytes (the
// generated WithRawCallbackMethod_* classes) and converts them here. gRPC's callback handlers
// (1.51, grpcpp/impl/codegen/server_callback_handlers.h) answer a request that does not parse
// with UNIMPLEMENTED and an empty message, which a client cannot tell from a missing method;
// ParseRequest makes it INVALID_ARGUMENT naming the message type.
#ifndef RIDGESERVE_SERVER_RAW_MESSAGES_H_
#define RIDGESERVE_SERVER_RAW_MESSAGES_H_

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace ridgeserve {

// OK, or INVALID_ARGUMENT: "the request is not a valid <type> (<n> bytes ...)".
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message& message);

grpc::ByteBuffer SerializeResponse(const google::protobuf::Message& message);

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_RAW_MESSAGES_H_
