#include "engine/parallel/rank_group.h"

#include <omp.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "kernels/cpu/cpu_backend.h"

namespace ridgeserve {

std::vector<Backend*> RankGroup::backend_ptrs() const {
  std::vector<Backend*> out;
  for (const std::unique_ptr<Backend>& b : backends) out.push_back(b.get());
  return out;
}

std::vector<Communicator*> RankGroup::communicators() const {
  std::vector<Communicator*> out;
  if (size() > 1) {
    for (int r = 0; r < size(); ++r) out.push_back(&thread_comms->rank(r));
  }
  return out;
}

absl::StatusOr<RankGroup> CreateCpuRankGroup(int size, int threads, cpu::Activations activations) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel must be >= 1, got ", size));
  }
  const int total = threads > 0 ? threads : omp_get_num_procs();
  RankGroup group;
  for (int r = 0; r < size; ++r) {
    RS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                        CreateCpuBackendFromEnvironment(std::max(1, total / size), activations));
    group.backends.push_back(std::move(backend));
  }
  group.thread_comms = std::make_unique<ThreadCommunicatorGroup>(size);
  return group;
}

}  // namespace ridgeserve
