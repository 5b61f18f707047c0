// Collectives among the ranks of one tensor-parallel group (DESIGN.md, "Scale"). Each rank
// is a thread of the server process driving its own backend; buffers are that backend's
// memory. Every rank calls the same collectives in the same order, and a call returns when
// every rank has joined it.
//
// Failure: a rank that fails mid-step calls Abort, so that no other rank waits for it
// forever; every pending and later collective on every rank then returns the abort's status
// (Aborted naming the reason) until the group is Reset or, where an implementation cannot
// recover (NCCL), for good.
//
// Threading: a rank's Communicator is used by that rank's thread only; Abort may be called
// from any thread.
#ifndef RIDGESERVE_ENGINE_PARALLEL_COMMUNICATOR_H_
#define RIDGESERVE_ENGINE_PARALLEL_COMMUNICATOR_H_

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ridgeserve {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // On every rank: data[i] = the sum over ranks of data[i], added in rank order
  // ((d_0 + d_1) + d_2) + ... , so every rank holds the same bits. data [count] floats.
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  // Takes now the memory AllReduceSum of up to `count` floats and Barrier need of their own
  // (NCCL: the gather buffer, size() x count floats of device memory), so that later calls
  // allocate nothing. Called on each rank while none of the group's collectives is in progress.
  virtual absl::Status ReserveAllReduce(size_t count) = 0;
  // On every rank: out[r * count + i] = rank r's in[i]. in [count], out [size() * count].
  virtual absl::Status AllGather(const float* in, size_t count, float* out) = 0;
  // On every rank: data takes root's `bytes` bytes.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  // Returns when every rank has called it.
  virtual absl::Status Barrier() = 0;
  // Runs `launch`, work that enqueues this rank's collectives without calling them (a recorded
  // graph's replay); its status is launch's. NCCL runs it only if the group is not aborted (else
  // Aborted), holding the group so that an abort cannot tear it down between the check and the
  // launch; here it just runs (collectives that check for themselves, as the thread group's).
  virtual absl::Status Launch(const std::function<absl::Status()>& launch) { return launch(); }
  // Fails every pending and later collective of the group with Aborted naming `reason`.
  virtual void Abort(std::string_view reason) = 0;
  // After an abort, once no rank is inside a collective, makes the whole group usable again
  // (called on one rank). Unimplemented where the group cannot recover.
  virtual absl::Status Reset() {
    return absl::UnimplementedError(
        absl::StrCat(std::string(name()), " communicators cannot be used again after an abort"));
  }
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_PARALLEL_COMMUNICATOR_H_
