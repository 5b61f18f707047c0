// The subcommands of ridgeserve-cli, each one RPC against a running server. Results go to
// stdout (text, or JSON with `json`); summaries and timings to stderr. A failed RPC returns
// its status, which main() prints as "CODE: message" and turns into the exit code.
#ifndef RIDGESERVE_CLIENT_COMMANDS_H_
#define RIDGESERVE_CLIENT_COMMANDS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "ridgeserve/v1/ridgeserve.pb.h"

namespace ridgeserve {

struct CallOptions {
  int64_t deadline_ms = 0;  // 0: none
  bool json = false;        // print responses as JSON (field names as in the proto)
};

// Prints the whole text (or the response as JSON), then a one-line summary on stderr.
absl::Status RunGenerate(const std::shared_ptr<grpc::Channel>& channel,
                         const v1::GenerateRequest& request, const CallOptions& options);
// Prints deltas as they arrive (or one JSON object per message), then on stderr the time to
// first token and the decode rate as the client saw them.
absl::Status RunStream(const std::shared_ptr<grpc::Channel>& channel,
                       const v1::GenerateRequest& request, const CallOptions& options);
absl::Status RunInfo(const std::shared_ptr<grpc::Channel>& channel, const CallOptions& options);
// Admin.ReloadRidgeFillMaps: prints the maps' state after the reload (the token must be one of
// the server's --admin_token_file).
absl::Status RunReloadMaps(const std::shared_ptr<grpc::Channel>& channel,
                           const CallOptions& options);
// Prints the serving status; NOT_SERVING (or anything but SERVING) is an UNAVAILABLE error, so
// the exit code says whether the server is ready.
absl::Status RunHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                       const CallOptions& options);
// Ends a live request by its request_id (NOT_FOUND when there is none).
absl::Status RunAbort(const std::shared_ptr<grpc::Channel>& channel, const std::string& request_id,
                      const CallOptions& options);
// Prints the ids, comma-separated (JSON: ids and token texts).
absl::Status RunTokenize(const std::shared_ptr<grpc::Channel>& channel,
                         const v1::TokenizeRequest& request, const CallOptions& options);

}  // namespace ridgeserve

#endif  // RIDGESERVE_CLIENT_COMMANDS_H_
