// In-process Communicator for ranks that are threads of one process on host-memory backends
// (the CPU backend): the sharded model runs and is tested without GPUs. Reductions add in
// fixed rank order, once, into a shared buffer every rank copies, so every rank holds the
// same bits and the result does not depend on thread timing.
#ifndef RIDGESERVE_ENGINE_PARALLEL_THREAD_COMMUNICATOR_H_
#define RIDGESERVE_ENGINE_PARALLEL_THREAD_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "engine/parallel/communicator.h"

namespace ridgeserve {

class ThreadCommunicatorGroup {
 public:
  explicit ThreadCommunicatorGroup(int size);
  ~ThreadCommunicatorGroup();

  int size() const { return static_cast<int>(ranks_.size()); }
  // Rank r's communicator, for rank r's thread. Reset on any rank clears an abort.
  Communicator& rank(int r) { return *ranks_[r]; }

  struct State;

 private:
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_PARALLEL_THREAD_COMMUNICATOR_H_
