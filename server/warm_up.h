// One short greedy generation through the engine before the server reports SERVING, so the
// first client request does not pay for first-touch allocations and thread-pool start-up,
// and a model that cannot generate is caught at start.
#ifndef RIDGESERVE_SERVER_WARM_UP_H_
#define RIDGESERVE_SERVER_WARM_UP_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/model/model.h"

namespace ridgeserve {

// Blocks until the generation finished, failed, or `timeout` passed.
absl::Status WarmUp(Engine& engine, const Model& model, absl::Duration timeout);

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_WARM_UP_H_
