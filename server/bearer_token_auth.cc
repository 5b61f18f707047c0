#include "server/bearer_token_auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/status_macros.h"
#include "server/file_contents.h"

namespace ridgeserve {
namespace {

constexpr absl::string_view kScheme = "bearer ";  // RFC 6750; the scheme is case-insensitive

std::array<uint8_t, 32> Sha256(absl::string_view bytes) {
  std::array<uint8_t, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest.data());
  return digest;
}

// The tokens of a token file, digested.
absl::StatusOr<std::vector<std::array<uint8_t, 32>>> ReadTokens(const std::string& path) {
  RS_ASSIGN_OR_RETURN(const std::string text, ReadFileContents(path));
  std::vector<std::array<uint8_t, 32>> digests;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const absl::string_view token = absl::StripAsciiWhitespace(line);
    if (token.empty()) continue;
    for (const char c : token) {
      if (c <= ' ' || c > '~') {
        return absl::InvalidArgumentError(
            absl::StrCat(path, " line ", line_number,
                         ": a token must be printable ASCII without spaces (one token a line)"));
      }
    }
    digests.push_back(Sha256(token));
  }
  if (digests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no token in it (one token a line)"));
  }
  return digests;
}

}  // namespace

BearerTokenAuth::BearerTokenAuth(std::string token_file, std::vector<std::string> exempt_services)
    : token_file_(std::move(token_file)), exempt_prefixes_([&] {
        std::vector<std::string> prefixes;
        for (const std::string& service : exempt_services) {
          prefixes.push_back(absl::StrCat("/", service, "/"));
        }
        return prefixes;
      }()) {}

absl::StatusOr<std::unique_ptr<BearerTokenAuth>> BearerTokenAuth::Create(
    std::string token_file, std::vector<std::string> exempt_services) {
  std::unique_ptr<BearerTokenAuth> auth(
      new BearerTokenAuth(std::move(token_file), std::move(exempt_services)));
  RS_RETURN_IF_ERROR(auth->Reload());
  return auth;
}

absl::Status BearerTokenAuth::Reload() {
  RS_ASSIGN_OR_RETURN(std::vector<Digest> digests, ReadTokens(token_file_));
  std::lock_guard<std::mutex> lock(mu_);
  digests_ = std::move(digests);
  return absl::OkStatus();
}

size_t BearerTokenAuth::num_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return digests_.size();
}

bool BearerTokenAuth::Accepts(absl::string_view token) const {
  const Digest digest = Sha256(token);
  std::lock_guard<std::mutex> lock(mu_);
  // Every digest is compared, so the time does not tell which one (if any) matched.
  int matches = 0;
  for (const Digest& known : digests_) {
    matches |= CRYPTO_memcmp(known.data(), digest.data(), digest.size()) == 0;
  }
  return matches != 0;
}

absl::Status BearerTokenAuth::Check(absl::string_view method,
                                    const std::vector<absl::string_view>& authorization) const {
  for (const std::string& prefix : exempt_prefixes_) {
    if (absl::StartsWith(method, prefix)) return absl::OkStatus();
  }
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing bearer token: send the metadata \"authorization: Bearer <token>\"");
  }
  for (absl::string_view value : authorization) {
    if (value.size() <= kScheme.size() ||
        !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
      return absl::UnauthenticatedError(
          "the authorization metadata must be \"Bearer <token>\" (another scheme was sent)");
    }
    if (Accepts(absl::StripAsciiWhitespace(value.substr(kScheme.size())))) {
      return absl::OkStatus();
    }
  }
  return absl::UnauthenticatedError("invalid bearer token");
}

}  // namespace ridgeserve
