// What a tensor-parallel group runs on: one backend and one communicator per rank. On the
// CPU, ranks share the machine's cores (each backend gets its share of the threads) and meet
// in a ThreadCommunicatorGroup.
#ifndef RIDGESERVE_ENGINE_PARALLEL_RANK_GROUP_H_
#define RIDGESERVE_ENGINE_PARALLEL_RANK_GROUP_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/parallel/thread_communicator.h"
#include "kernels/backend.h"
#include "kernels/cpu/linear.h"

namespace ridgeserve {

struct RankGroup {
  std::vector<std::unique_ptr<Backend>> backends;  // [rank]
  std::unique_ptr<ThreadCommunicatorGroup> thread_comms;

  int size() const { return static_cast<int>(backends.size()); }
  std::vector<Backend*> backend_ptrs() const;
  // Empty at size 1 (no collectives).
  std::vector<Communicator*> communicators() const;
};

// `size` CPU backends with `threads` threads between them (0: all cores; each rank at least
// one), on the kernel path CPUID picks (RIDGESERVE_CPU_ISA overrides).
absl::StatusOr<RankGroup> CreateCpuRankGroup(int size, int threads, cpu::Activations activations);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_PARALLEL_RANK_GROUP_H_
