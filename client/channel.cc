#include "client/channel.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/status_macros.h"
#include "grpcpp/support/client_interceptor.h"

namespace ridgeserve {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;

absl::StatusOr<std::string> ReadFlagFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  if (in) bytes << in.rdbuf();
  if (!in || bytes.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": cannot read it, or it is empty"));
  }
  return bytes.str();
}

absl::StatusOr<std::string> Token(const ChannelSecurity& security) {
  if (security.auth_token_file.empty()) return security.auth_token;
  if (!security.auth_token.empty()) {
    return absl::InvalidArgumentError("give --auth_token or --auth_token_file, not both");
  }
  RS_ASSIGN_OR_RETURN(const std::string text,
                      ReadFlagFile("auth_token_file", security.auth_token_file));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::string_view token = absl::StripAsciiWhitespace(line); !token.empty()) {
      return std::string(token);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--auth_token_file ", security.auth_token_file, ": no token in it"));
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(
    const ChannelSecurity& security) {
  if (security.tls_cert.empty() != security.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together (the client certificate and its private key)");
  }
  if (!security.tls && security.tls_ca.empty() && security.tls_cert.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;  // empty roots: the system's
  if (!security.tls_ca.empty()) {
    RS_ASSIGN_OR_RETURN(options.pem_root_certs, ReadFlagFile("tls_ca", security.tls_ca));
  }
  if (!security.tls_cert.empty()) {
    RS_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadFlagFile("tls_cert", security.tls_cert));
    RS_ASSIGN_OR_RETURN(options.pem_private_key, ReadFlagFile("tls_key", security.tls_key));
  }
  return grpc::SslCredentials(options);
}

// Adds the token to every call's metadata. Call credentials would do it only on TLS channels
// (gRPC refuses them on plaintext ones), and the server checks tokens on both.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string& value) : value_(value) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", value_);
    }
    methods->Proceed();
  }

 private:
  const std::string value_;
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(const std::string& token)
      : value_(absl::StrCat("Bearer ", token)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(value_);
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& target,
                                                           const ChannelSecurity& security) {
  RS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, Credentials(security));
  RS_ASSIGN_OR_RETURN(const std::string token, Token(security));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(interceptors));
}

}  // namespace ridgeserve
