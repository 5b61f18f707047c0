#include "server/raw_messages.h"

#include "absl/strings/str_format.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace ridgeserve {

absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message& message) {
  grpc::ByteBuffer view(bytes);  // shares the slices; the reader needs a non-const buffer
  grpc::ProtoBufferReader reader(&view);
  if (reader.status().ok() && message.ParseFromZeroCopyStream(&reader)) {
    return absl::OkStatus();
  }
  // protobuf's parser says no more than false (and proto3 has no required fields to name).
  return absl::InvalidArgumentError(absl::StrFormat(
      "the request is not a valid %s: its %d bytes do not parse as one%s", message.GetTypeName(),
      bytes.Length(), reader.status().ok() ? "" : " (" + reader.status().error_message() + ")"));
}

grpc::ByteBuffer SerializeResponse(const google::protobuf::Message& message) {
  grpc::ByteBuffer bytes;
  bool own_buffer;
  // Fails only for a message over 2 GiB, which no response comes near.
  grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, &bytes, &own_buffer)
      .IgnoreError();
  return bytes;
}

}  // namespace ridgeserve
