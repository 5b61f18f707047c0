// Bearer-token authentication of gRPC calls (--auth_token_file): a client sends the metadata
// `authorization: Bearer <token>`, and the server accepts the tokens listed one a line in the
// token file. Only SHA-256 digests of the tokens are kept; a presented token's digest is
// compared with every one of them by CRYPTO_memcmp, so how long a check takes depends neither
// on which bytes match nor on the tokens' lengths. Calls to exempt services (health checks for
// Kubernetes probes, by default) need no token. server_credentials.h runs Check on every call.
//
// Threading: Check from any thread; Reload (SIGHUP) from any other.
#ifndef RIDGESERVE_SERVER_BEARER_TOKEN_AUTH_H_
#define RIDGESERVE_SERVER_BEARER_TOKEN_AUTH_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ridgeserve {

class BearerTokenAuth {
 public:
  // Reads `token_file`: one token a line, blank lines and surrounding whitespace ignored; a
  // token is printable ASCII without spaces. InvalidArgument naming the file (and the line)
  // when it cannot be read, holds no token or a malformed one. `exempt_services`: full service
  // names, e.g. "grpc.health.v1.Health", whose calls are let through without a token.
  static absl::StatusOr<std::unique_ptr<BearerTokenAuth>> Create(
      std::string token_file, std::vector<std::string> exempt_services);

  // Reads the file again. On an error the tokens in use stay and the error says why.
  absl::Status Reload();

  // OK, or Unauthenticated saying what is missing or wrong, for a call of `method` (its path,
  // "/package.Service/Method") carrying these `authorization` metadata values.
  absl::Status Check(absl::string_view method,
                     const std::vector<absl::string_view>& authorization) const;

  const std::string& token_file() const { return token_file_; }
  size_t num_tokens() const;

 private:
  using Digest = std::array<uint8_t, 32>;  // SHA-256

  BearerTokenAuth(std::string token_file, std::vector<std::string> exempt_services);
  bool Accepts(absl::string_view token) const;

  const std::string token_file_;
  const std::vector<std::string> exempt_prefixes_;  // "/<service>/"
  mutable std::mutex mu_;
  std::vector<Digest> digests_;  // under mu_
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_BEARER_TOKEN_AUTH_H_
