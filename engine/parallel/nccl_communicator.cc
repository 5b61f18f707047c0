#include "engine/parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/reduce_ranks.h"

namespace ridgeserve {
namespace {

absl::Status NcclError(ncclResult_t result, const char* call, const char* file, int line) {
  return absl::InternalError(
      absl::StrCat(call, ": ", ncclGetErrorString(result), " at ", file, ":", line));
}

}  // namespace

#define NCCL_RETURN_IF_ERROR(call)                                                \
  do {                                                                            \
    const ncclResult_t rs_nccl_result_ = (call);                                  \
    if (rs_nccl_result_ != ncclSuccess) {                                         \
      return ::ridgeserve::NcclError(rs_nccl_result_, #call, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)

// Shared by the group's ranks. `comms` are enqueued on under a shared lock and taken by Abort
// under the exclusive one, after which no rank enqueues on them; nobody waits for the device
// while holding the lock (Abort must be able to end such a wait).
struct NcclCommunicatorGroup::State {
  std::vector<ncclComm_t> comms;
  std::shared_mutex mutex;
  std::atomic<bool> aborted{false};
  std::string reason;   // written once under the exclusive lock
  std::thread aborter;  // Abort's; joined by the group's destructor

  // ncclCommAbort runs on a thread of its own: it stops the kernels at once (its abort flag),
  // but then waits until every CUDA graph that captured the communicator's collectives is
  // destroyed (commDestroySync in recent NCCL sources), and those are the ranks' decode graphs,
  // which go when the failed step has returned on every rank (TensorParallelExecutor) or, after an
  // abort by the step watchdog, with the engine. Waiting here, the rank or watchdog thread that
  // aborts would never return.
  void Abort(std::string_view why) {
    std::unique_lock lock(mutex);
    if (aborted.load()) return;
    reason = std::string(why);
    aborted.store(true);
    std::vector<ncclComm_t> taken;
    for (ncclComm_t& comm : comms) {
      taken.push_back(comm);
      comm = nullptr;
    }
    aborter = std::thread([taken = std::move(taken)] {
      for (ncclComm_t comm : taken) {
        if (comm != nullptr) ncclCommAbort(comm);
      }
    });
  }
  absl::Status AbortedStatus() {
    std::shared_lock lock(mutex);
    return absl::AbortedError(absl::StrCat("tensor-parallel group aborted: ", reason));
  }
};

namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclCommunicatorGroup::State> state, int rank, int size,
                   Backend& backend)
      : state_(std::move(state)),
        rank_(rank),
        size_(size),
        backend_(backend),
        device_(CudaBackendDevice(backend)),
        stream_(static_cast<cudaStream_t>(CudaBackendStream(backend))) {}

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduceSum(float* data, size_t count) override {
    if (size_ == 1 || count == 0) return Check();
    if (absl::Status s = EnsureGather(sizeof(float) * count * size_); !s.ok()) return s;
    float* gathered = gather_.as<float>();
    if (absl::Status s = Enqueue([&](ncclComm_t comm) {
          return ncclAllGather(data, gathered, count, ncclFloat, comm, stream_);
        });
        !s.ok()) {
      return s;
    }
    cuda::LaunchSumRanksInOrder(gathered, size_, count, data, stream_);
    return absl::OkStatus();
  }

  absl::Status ReserveAllReduce(size_t count) override {
    return EnsureGather(sizeof(float) * std::max<size_t>(count, 1) * size_);
  }

  absl::Status AllGather(const float* in, size_t count, float* out) override {
    return Enqueue(
        [&](ncclComm_t comm) { return ncclAllGather(in, out, count, ncclFloat, comm, stream_); });
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " of ", size_));
    }
    return Enqueue([&](ncclComm_t comm) {
      return ncclBroadcast(data, data, bytes, ncclUint8, root, comm, stream_);
    });
  }

  absl::Status Barrier() override {
    if (absl::Status s = EnsureGather(sizeof(float) * size_); !s.ok()) return s;
    float* one = gather_.as<float>();
    if (absl::Status s = Enqueue([&](ncclComm_t comm) {
          return ncclAllReduce(one, one, 1, ncclFloat, ncclSum, comm, stream_);
        });
        !s.ok()) {
      return s;
    }
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const cudaError_t waited = cudaStreamSynchronize(stream_);
    if (state_->aborted.load()) return state_->AbortedStatus();
    CUDA_RETURN_IF_ERROR(waited);
    ncclResult_t async = ncclSuccess;
    {
      std::shared_lock lock(state_->mutex);
      if (state_->comms[rank_] != nullptr) ncclCommGetAsyncError(state_->comms[rank_], &async);
    }
    if (async != ncclSuccess) {
      const absl::Status s = NcclError(async, "ncclCommGetAsyncError", __FILE__, __LINE__);
      state_->Abort(std::string(s.message()));
      return state_->AbortedStatus();
    }
    return absl::OkStatus();
  }

  absl::Status Launch(const std::function<absl::Status()>& launch) override {
    return Guarded(launch);
  }

  void Abort(std::string_view reason) override { state_->Abort(reason); }

 private:
  absl::Status Check() {
    if (state_->aborted.load()) return state_->AbortedStatus();
    return absl::OkStatus();
  }

  // Runs `call(comm)` on this rank's communicator unless the group is aborted.
  template <typename Call>
  absl::Status Enqueue(Call call) {
    return Guarded([&]() -> absl::Status {
      NCCL_RETURN_IF_ERROR(call(state_->comms[rank_]));
      return absl::OkStatus();
    });
  }

  // Runs fn() on this rank's device unless the group is aborted, holding the group's lock so
  // that no Abort tears the communicators down meanwhile.
  template <typename Fn>
  absl::Status Guarded(const Fn& fn) {
    {
      std::shared_lock lock(state_->mutex);
      if (!state_->aborted.load()) {
        CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
        return fn();
      }
    }
    return state_->AbortedStatus();
  }

  // Grows the gather buffer (device memory of this rank's backend; ReserveAllReduce takes it at
  // the start, for the step budget's rows).
  absl::Status EnsureGather(size_t bytes) {
    if (gather_.bytes() >= bytes) return absl::OkStatus();
    gather_ = DeviceBuffer();
    absl::StatusOr<DeviceBuffer> grown = backend_.Alloc(bytes);
    if (!grown.ok()) return grown.status();
    gather_ = std::move(*grown);
    return absl::OkStatus();
  }

  std::shared_ptr<NcclCommunicatorGroup::State> state_;
  const int rank_;
  const int size_;
  Backend& backend_;
  const int device_;
  const cudaStream_t stream_;
  DeviceBuffer gather_;  // AllReduceSum's [size, count] gather; Barrier's word
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicatorGroup>> NcclCommunicatorGroup::Create(
    std::span<Backend* const> backends) {
  if (backends.empty()) return absl::InvalidArgumentError("NCCL group of no ranks");
  std::vector<int> devices;
  for (Backend* b : backends) devices.push_back(CudaBackendDevice(*b));
  auto state = std::make_shared<State>();
  state->comms.resize(devices.size());
  // Every algorithm's connections now (unless the operator set it otherwise): their buffers are
  // in use before the KV cache is sized, and no collective waits on the host for a peer's first
  // connection while holding the group's lock, where a failed peer's Abort could not reach it.
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  NCCL_RETURN_IF_ERROR(
      ncclCommInitAll(state->comms.data(), static_cast<int>(devices.size()), devices.data()));
  std::unique_ptr<NcclCommunicatorGroup> group(new NcclCommunicatorGroup());
  group->state_ = state;
  for (size_t r = 0; r < backends.size(); ++r) {
    group->ranks_.push_back(std::make_unique<NcclCommunicator>(
        state, static_cast<int>(r), static_cast<int>(backends.size()), *backends[r]));
  }
  return group;
}

NcclCommunicatorGroup::~NcclCommunicatorGroup() {
  ranks_.clear();
  // An abort's end: by now no graph holds the group's collectives (an engine drops its
  // recordings when it goes).
  if (state_->aborter.joinable()) state_->aborter.join();
  std::unique_lock lock(state_->mutex);
  for (ncclComm_t comm : state_->comms) {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
  state_->comms.clear();
}

}  // namespace ridgeserve
