// The generation calls the server has admitted, by request_id: admission (unique ids,
// refused while draining), the request_id -> engine id map that Abort and cancellation use,
// and the in-flight count that a drain waits on.
//
// An entry lives from Admit until its call is done (Remove), which may be before the engine
// knows the request (validation → Admit → Engine::Submit → SetEngineId): an abort asked for
// in that window is remembered and handed back by SetEngineId.
//
// Threading: every method is thread-safe.
#ifndef RIDGESERVE_SERVER_REQUEST_REGISTRY_H_
#define RIDGESERVE_SERVER_REQUEST_REGISTRY_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ridgeserve {

class RequestRegistry {
 public:
  // Registers a call under `request_id`, or names one when it is empty (then *request_id is
  // set). UNAVAILABLE while draining, ALREADY_EXISTS when the id is live.
  absl::Status Admit(std::string* request_id);
  // The engine accepted the request. True when an abort was asked for before: the caller
  // aborts it in the engine now.
  bool SetEngineId(const std::string& request_id, uint64_t engine_id);
  // Asks for the request to end. NOT_FOUND for an unknown id; otherwise the engine id to abort
  // now, or nullopt when the engine does not know it yet (SetEngineId will say so).
  absl::StatusOr<std::optional<uint64_t>> RequestAbort(const std::string& request_id);
  // The call is done (reply sent or failed): its id is free again.
  void Remove(const std::string& request_id);

  // From now on Admit refuses with UNAVAILABLE.
  void StartDraining();
  bool draining() const;
  // Every live request's engine id, all marked as aborted.
  std::vector<uint64_t> AbortAll();
  // Blocks until no call is live or `deadline` passes; true when none is live.
  bool WaitUntilEmpty(absl::Time deadline);
  int size() const;

 private:
  struct Entry {
    std::optional<uint64_t> engine_id;
    bool abort_requested = false;
  };

  mutable std::mutex mu_;
  std::condition_variable empty_cv_;
  absl::flat_hash_map<std::string, Entry> entries_;
  bool draining_ = false;
  uint64_t next_name_ = 1;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_REQUEST_REGISTRY_H_
