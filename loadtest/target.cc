#include "loadtest/target.h"

#include <arpa/inet.h>

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ridgeserve::loadtest {
namespace {

bool IsLoopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

}  // namespace

absl::Status CheckTarget(const std::string& target, bool allow_remote) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--target: \"", target, "\" is not HOST:PORT"));
  }
  std::string host = target.substr(0, colon);
  uint32_t port = 0;
  if (!absl::SimpleAtoi(absl::string_view(target).substr(colon + 1), &port) || port == 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--target: \"", target, "\" has no valid port"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--target: put an IPv6 address in brackets, e.g. [::1]:50051; got \"", target, "\""));
  }
  if (!allow_remote && !IsLoopback(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--target: \"", host,
        "\" is not a loopback address; pass --allow_remote to load a server elsewhere"));
  }
  return absl::OkStatus();
}

}  // namespace ridgeserve::loadtest
