// The credentials of ridgeserve's gRPC port: plaintext or TLS (--tls_cert, --tls_key), mutual
// TLS when --tls_client_ca is given (client certificates required and verified against it),
// and on either a bearer-token check of every call (bearer_token_auth.h): the tokens of
// --admin_token_file for ridgeserve.v1.Admin, those of --auth_token_file for every other
// service. Neither kind of token opens the other's services.
//
// The token check is gRPC's own auth metadata processor, which runs before a call reaches any
// service (health and reflection included) and fails it with its status. gRPC 1.51's C++
// InsecureServerCredentials refuse a processor (they assert), so the credentials are made with
// the core API, where plaintext ones take one like TLS ones do.
#ifndef RIDGESERVE_SERVER_SERVER_CREDENTIALS_H_
#define RIDGESERVE_SERVER_SERVER_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "server/bearer_token_auth.h"

namespace ridgeserve {

// PEM file paths, as the flags of the same names give them; all empty: plaintext.
struct TlsFiles {
  std::string tls_cert;       // certificate chain, the server's first
  std::string tls_key;        // its private key (not encrypted)
  std::string tls_client_ca;  // CA certificates client certificates must chain to
};

// The token checks of the port's calls, kept as long as the credentials are.
struct CallTokens {
  // Every service but ridgeserve.v1.Admin (--auth_token_file); null: no check.
  std::shared_ptr<const BearerTokenAuth> service;
  // ridgeserve.v1.Admin (--admin_token_file); null: its calls go through unchecked to the
  // service, which refuses them all.
  std::shared_ptr<const BearerTokenAuth> admin;
};

// InvalidArgument naming the flag and the file for a certificate without a key (or the other
// way round), a client CA without a server certificate, a file that does not read or holds
// no PEM certificate or key, a key that is not the certificate's.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CreateServerCredentials(
    const TlsFiles& tls, CallTokens tokens);

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_SERVER_CREDENTIALS_H_
