// Which servers the load generator may hit: loopback unless the user says otherwise.
#ifndef RIDGESERVE_LOADTEST_TARGET_H_
#define RIDGESERVE_LOADTEST_TARGET_H_

#include <string>

#include "absl/status/status.h"

namespace ridgeserve::loadtest {

// `target` must be HOST:PORT (IPv6 hosts in brackets). Without `allow_remote`, HOST must be
// loopback: `localhost`, 127.0.0.0/8 or ::1 (no name is resolved). InvalidArgument otherwise.
absl::Status CheckTarget(const std::string& target, bool allow_remote);

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_TARGET_H_
