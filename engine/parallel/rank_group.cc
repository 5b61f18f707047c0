#include "engine/parallel/rank_group.h"

#include <omp.h>

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/parallel/nccl_communicator.h"
#include "engine/parallel/thread_communicator.h"

namespace ridgeserve {

std::vector<Backend*> RankGroup::backend_ptrs() const {
  std::vector<Backend*> out;
  for (const std::unique_ptr<Backend>& b : backends) out.push_back(b.get());
  return out;
}

absl::StatusOr<RankGroup> CreateRankGroup(std::string_view name, int size, BackendOptions options) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel must be >= 1, got ", size));
  }
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_num_procs();
  options.num_threads = std::max(1, threads / size);
  RankGroup group;
  for (int r = 0; r < size; ++r) {
    options.device = r;
    RS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(name, options));
    group.backends.push_back(std::move(backend));
  }
  if (size == 1) return group;
  if (name == "cpu") {
    auto comms = std::make_shared<ThreadCommunicatorGroup>(size);
    for (int r = 0; r < size; ++r) group.comms.push_back(&comms->rank(r));
    group.comms_owner = comms;
    return group;
  }
  // Device memory: NCCL, from the backend's module (not linked into this binary).
  RS_ASSIGN_OR_RETURN(void* create, BackendModuleSymbol(name, kCudaModuleCreateNcclGroup));
  RS_ASSIGN_OR_RETURN(std::shared_ptr<NcclCommunicatorGroup> comms,
                      reinterpret_cast<CreateNcclGroupFn>(create)(group.backend_ptrs()));
  for (int r = 0; r < size; ++r) group.comms.push_back(&comms->rank(r));
  group.comms_owner = comms;
  return group;
}

}  // namespace ridgeserve
