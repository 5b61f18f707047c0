// NCCL Communicator for tensor-parallel ranks that are threads of one process, one CUDA
// backend (one GPU) per rank (DESIGN.md, "Scale"). Built only with CUDA.
//
// Stream order: a collective is enqueued on the rank's backend stream and returns once
// enqueued (NCCL's model), so every later op of that backend sees its result and the host
// sees it after the backend's Synchronize or CopyToHost. Barrier alone waits for the device.
// Buffers are device memory of the rank's backend.
//
// AllReduceSum keeps the interface's promise (sum in rank order, the same bits on every rank):
// it is an all-gather followed by an in-order sum on each device (kernels/cuda/reduce_ranks.h),
// not ncclAllReduce, whose ring or tree order depends on the topology. That moves (size - 1)
// x count floats into each GPU instead of a ring's 2 (size - 1) / size x count: the same at
// size 2, 3.5x more at 8; an ncclAllReduce mode can be added where bits may differ.
//
// Failure: Abort (any thread) marks the group aborted and returns; a thread of its own calls
// ncclCommAbort on every rank's communicator, which ends kernels stuck waiting for a dead peer
// at once and then waits until the CUDA graphs that captured the group's collectives are
// destroyed (TensorParallelExecutor drops the ranks' decode graphs when the group cannot be
// reset). From the abort on, every collective returns Aborted naming the reason. NCCL communicators
// do not recover: make a new group. Asynchronous NCCL errors found by Barrier abort the group the
// same way. Not reached by an abort: a rank blocked inside an NCCL call (under the group's lock)
// because the launch queue is full behind a kernel stuck on the failed peer. A peer that hangs on
// the device is aborted by the engine's step watchdog (--step_timeout_s).
#ifndef RIDGESERVE_ENGINE_PARALLEL_NCCL_COMMUNICATOR_H_
#define RIDGESERVE_ENGINE_PARALLEL_NCCL_COMMUNICATOR_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/parallel/communicator.h"
#include "kernels/backend.h"

namespace ridgeserve {

class NcclCommunicatorGroup {
 public:
  // Rank r runs on backends[r] (made by CreateCudaBackend, distinct devices). One
  // ncclCommInitAll for the group, connecting every algorithm (NCCL_RUNTIME_CONNECT=0 unless
  // set); Internal naming the NCCL error if it fails.
  static absl::StatusOr<std::unique_ptr<NcclCommunicatorGroup>> Create(
      std::span<Backend* const> backends);
  ~NcclCommunicatorGroup();

  int size() const { return static_cast<int>(ranks_.size()); }
  // Rank r's communicator, for rank r's thread.
  Communicator& rank(int r) { return *ranks_[r]; }

  struct State;

 private:
  NcclCommunicatorGroup() = default;
  std::shared_ptr<State> state_;
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

// The CUDA module's entry point for a group (kernels/backend_registry.h: the module is loaded
// with dlopen, so nothing links NCCL but the module itself).
inline constexpr char kCudaModuleCreateNcclGroup[] = "ridgeserve_cuda_create_nccl_group";
using CreateNcclGroupFn =
    absl::StatusOr<std::shared_ptr<NcclCommunicatorGroup>> (*)(std::span<Backend* const> backends);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_PARALLEL_NCCL_COMMUNICATOR_H_
