#include "server/server_credentials.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cassert>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"
#include "ridgeserve/v1/ridgeserve.grpc.pb.h"
#include "server/file_contents.h"

namespace ridgeserve {
namespace {

// Core credentials (plaintext or TLS) as the C++ ServerCredentials a ServerBuilder takes.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* credentials)
      : credentials_(credentials) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(credentials_); }

  // C++ processors are for gRPC's own credentials; the token check is set on the core ones.
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    assert(false && "CoreServerCredentials take a core auth metadata processor");
  }

 private:
  int AddPortToServer(const std::string& address, grpc_server* server) override {
    return grpc_server_add_http2_port(server, address.c_str(), credentials_);
  }

  grpc_server_credentials* const credentials_;
};

absl::string_view View(const grpc_slice& slice) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)), GRPC_SLICE_LENGTH(slice)};
}

// The auth metadata processor: non-blocking, so it answers before returning (gRPC's C++
// wrapper does the same with non-blocking processors). The call's path arrives as ":path".
void ProcessAuthMetadata(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md,
                         size_t num_md, grpc_process_auth_metadata_done_cb done, void* user_data) {
  const CallTokens& tokens = *static_cast<const CallTokens*>(state);
  absl::string_view method;
  std::vector<absl::string_view> authorization;
  std::vector<grpc_metadata> consumed;  // the token goes no further than this check
  for (size_t i = 0; i < num_md; ++i) {
    const absl::string_view key = View(md[i].key);
    if (key == ":path") {
      method = View(md[i].value);
    } else if (key == "authorization") {
      authorization.push_back(View(md[i].value));
      consumed.push_back(md[i]);
    }
  }
  static const std::string kAdminPrefix = absl::StrCat("/", v1::Admin::service_full_name(), "/");
  const bool admin = absl::StartsWith(method, kAdminPrefix);
  const BearerTokenAuth* const auth = admin ? tokens.admin.get() : tokens.service.get();
  absl::Status status = auth == nullptr ? absl::OkStatus() : auth->Check(method, authorization);
  if (status.ok()) {
    done(user_data, consumed.data(), consumed.size(), nullptr, 0, GRPC_STATUS_OK, nullptr);
  } else {
    const std::string message =
        admin ? absl::StrCat(status.message(), " (", v1::Admin::service_full_name(),
                             " takes the tokens of --admin_token_file)")
              : std::string(status.message());
    done(user_data, nullptr, 0, nullptr, 0, static_cast<grpc_status_code>(status.code()),
         message.c_str());
  }
}

void DestroyAuthState(void* state) { delete static_cast<CallTokens*>(state); }

absl::Status FlagError(absl::string_view flag, const std::string& path, absl::string_view what) {
  // OpenSSL's queue is shared with gRPC's TLS handshakes: leave nothing in it.
  ERR_clear_error();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": ", what));
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* x509) const { X509_free(x509); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Certificate = std::unique_ptr<X509, X509Deleter>;

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileContents(path);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", bytes.status().message()));
  }
  return bytes;
}

// The file's contents with its first PEM certificate, parsed: OpenSSL finds here what gRPC
// would only find wrong at the first handshake.
absl::StatusOr<std::pair<std::string, Certificate>> ReadCertificates(absl::string_view flag,
                                                                     const std::string& path) {
  RS_ASSIGN_OR_RETURN(std::string pem, ReadFlagFile(flag, path));
  Certificate first(PEM_read_bio_X509(MemoryBio(pem).get(), nullptr, nullptr, nullptr));
  if (first == nullptr) return FlagError(flag, path, "no PEM certificate in it");
  return std::pair{std::move(pem), std::move(first)};
}

// The key file's contents, checked to be the private key of `certificate`.
absl::StatusOr<std::string> ReadKey(const std::string& path, X509* certificate) {
  RS_ASSIGN_OR_RETURN(std::string pem, ReadFlagFile("tls_key", path));
  // No passphrase callback: an encrypted key fails here instead of prompting on a terminal.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(MemoryBio(pem).get(), nullptr, no_passphrase, nullptr));
  if (key == nullptr) {
    return FlagError("tls_key", path,
                     "no PEM private key in it (encrypted keys are not supported)");
  }
  if (X509_check_private_key(certificate, key.get()) != 1) {
    return FlagError("tls_key", path, "not the private key of the --tls_cert certificate");
  }
  return pem;
}

absl::StatusOr<grpc_server_credentials*> CreateTlsCredentials(const TlsFiles& tls) {
  if (tls.tls_cert.empty() != tls.tls_key.empty()) {
    return absl::InvalidArgumentError(
        tls.tls_cert.empty() ? "--tls_key needs --tls_cert (the certificate of that key)"
                             : "--tls_cert needs --tls_key (the certificate's private key)");
  }
  if (tls.tls_cert.empty()) {
    if (!tls.tls_client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca needs --tls_cert and --tls_key (mutual TLS is TLS first)");
    }
    return grpc_insecure_server_credentials_create();
  }
  RS_ASSIGN_OR_RETURN(auto chain, ReadCertificates("tls_cert", tls.tls_cert));
  RS_ASSIGN_OR_RETURN(const std::string key, ReadKey(tls.tls_key, chain.second.get()));
  std::string client_ca;
  if (!tls.tls_client_ca.empty()) {
    RS_ASSIGN_OR_RETURN(auto ca, ReadCertificates("tls_client_ca", tls.tls_client_ca));
    client_ca = std::move(ca.first);
  }
  grpc_ssl_pem_key_cert_pair pair{key.c_str(), chain.first.c_str()};
  // gRPC copies the PEM strings.
  return grpc_ssl_server_credentials_create_ex(
      client_ca.empty() ? nullptr : client_ca.c_str(), &pair, 1,
      client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                        : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
      nullptr);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CreateServerCredentials(
    const TlsFiles& tls, CallTokens tokens) {
  RS_ASSIGN_OR_RETURN(grpc_server_credentials* const credentials, CreateTlsCredentials(tls));
  if (tokens.service != nullptr || tokens.admin != nullptr) {
    grpc_server_credentials_set_auth_metadata_processor(
        credentials, {ProcessAuthMetadata, DestroyAuthState, new CallTokens(std::move(tokens))});
  }
  return std::make_shared<CoreServerCredentials>(credentials);
}

}  // namespace ridgeserve
