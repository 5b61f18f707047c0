#include "client/channel_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(bool, tls, false,
          "connect with TLS, verifying the server against the system's CA certificates "
          "(--tls_ca and --tls_cert imply TLS)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificates the server's certificate must chain to");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate chain, for a server that requires one (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, auth_token_file, "",
          "file whose first line is the bearer token sent with every call");
ABSL_FLAG(std::string, auth_token, "",
          "bearer token sent with every call (other users can see it in ps: prefer "
          "--auth_token_file)");

namespace ridgeserve {

ChannelSecurity ChannelSecurityFromFlags() {
  return {absl::GetFlag(FLAGS_tls),        absl::GetFlag(FLAGS_tls_ca),
          absl::GetFlag(FLAGS_tls_cert),   absl::GetFlag(FLAGS_tls_key),
          absl::GetFlag(FLAGS_auth_token), absl::GetFlag(FLAGS_auth_token_file)};
}

}  // namespace ridgeserve
