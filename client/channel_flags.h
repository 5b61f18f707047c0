// The TLS and token flags of ridgeserve's clients (--tls, --tls_ca, --tls_cert, --tls_key,
// --auth_token, --auth_token_file), defined once for ridgeserve-cli and ridgeserve-loadtest.
#ifndef RIDGESERVE_CLIENT_CHANNEL_FLAGS_H_
#define RIDGESERVE_CLIENT_CHANNEL_FLAGS_H_

#include "client/channel.h"

namespace ridgeserve {

ChannelSecurity ChannelSecurityFromFlags();

}  // namespace ridgeserve

#endif  // RIDGESERVE_CLIENT_CHANNEL_FLAGS_H_
