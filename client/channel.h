// The channel ridgeserve's clients (ridgeserve-cli, ridgeserve-loadtest) open to a server:
// plaintext, or TLS verifying the server against a CA file or the system's roots, with a client
// certificate for servers that require one (mutual TLS); and a bearer token sent with every
// call (`authorization: Bearer <token>`, what the server's --auth_token_file checks), on
// plaintext and TLS channels alike.
#ifndef RIDGESERVE_CLIENT_CHANNEL_H_
#define RIDGESERVE_CLIENT_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace ridgeserve {

// As the flags of the same names give them (channel_flags.h).
struct ChannelSecurity {
  bool tls = false;             // TLS with the system's CA certificates (unless tls_ca)
  std::string tls_ca;           // PEM CA certificates the server must chain to; implies TLS
  std::string tls_cert;         // PEM client certificate chain (mutual TLS); implies TLS
  std::string tls_key;          // its private key
  std::string auth_token;       // bearer token, or:
  std::string auth_token_file;  // a file whose first non-blank line is the token
};

// InvalidArgument naming the flag for a file that does not read, a certificate without its key
// (or the other way round), both a token and a token file, or a token file without a token.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& target,
                                                           const ChannelSecurity& security);

}  // namespace ridgeserve

#endif  // RIDGESERVE_CLIENT_CHANNEL_H_
