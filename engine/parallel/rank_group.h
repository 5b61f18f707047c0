// What a tensor-parallel group runs on: one backend and one communicator per rank, made from
// the backend's name through the registry. On the CPU the ranks share the machine's cores
// (each backend gets its share of the threads) and meet in a ThreadCommunicatorGroup; on CUDA
// rank r drives device r and the ranks meet through NCCL.
#ifndef RIDGESERVE_ENGINE_PARALLEL_RANK_GROUP_H_
#define RIDGESERVE_ENGINE_PARALLEL_RANK_GROUP_H_

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/parallel/communicator.h"
#include "kernels/backend.h"
#include "kernels/backend_registry.h"

namespace ridgeserve {

struct RankGroup {
  std::vector<std::unique_ptr<Backend>> backends;  // [rank]
  std::vector<Communicator*> comms;                // [rank]; empty at size 1
  std::shared_ptr<void> comms_owner;               // the group the communicators belong to

  int size() const { return static_cast<int>(backends.size()); }
  std::vector<Backend*> backend_ptrs() const;
};

// `size` backends called `name` (CreateBackend; CUDA rank r on device r, so more ranks than
// devices fail there naming the device). options.num_threads is the CPU threads of the whole
// group (<= 0: all cores; each rank gets at least one). Errors are CreateBackend's, NCCL's, or
// InvalidArgument for size < 1.
absl::StatusOr<RankGroup> CreateRankGroup(std::string_view name, int size, BackendOptions options);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_PARALLEL_RANK_GROUP_H_
