// Runs the engine's forward steps on every rank of a sharded model (DESIGN.md, "Scale"): one
// worker thread per rank drives that rank's LlamaModel, backend and KV cache; the engine
// thread hands every rank the same plain-data step (the ForwardBatch, read-only) and waits.
// Rank 0 holds the logits (head()) and its profile comes back; the scheduler's block decisions (the
// block tables in the batch) hold for every rank's cache, which have the same blocks.
#ifndef RIDGESERVE_ENGINE_PARALLEL_TENSOR_PARALLEL_EXECUTOR_H_
#define RIDGESERVE_ENGINE_PARALLEL_TENSOR_PARALLEL_EXECUTOR_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/llama.h"

namespace ridgeserve {

class TensorParallelExecutor {
 public:
  // ranks[r] runs on caches[r]; both must outlive the executor. Starts the rank threads.
  //
  // Testing hook: with RIDGESERVE_TEST_TP_FAULT=R:S in the environment, rank R fails its S-th
  // step (counting from 1) without running it, as a rank whose forward errs would; with
  // R:S:unrecoverable the group is then not reset, as an NCCL group cannot be.
  TensorParallelExecutor(std::vector<LlamaModel*> ranks, std::vector<PagedKvCache*> caches);
  ~TensorParallelExecutor();  // joins the rank threads

  // LlamaModel::Run on every rank (OnEveryRank), after rank 0's CheckStep: a step the model
  // refuses fails alone, with the model's error, before any rank runs it.
  absl::Status Run(const ForwardBatch& batch, ForwardProfile* profile);
  // work(rank) on every rank's thread at once (work that joins the group's collectives, such as
  // recording decode graphs), returning when all have. When a rank fails, it aborts the group's
  // collectives so no rank waits for it, and this returns Internal naming the first rank that
  // failed on its own and its error; the group is then reset, or, where the communicator cannot
  // be reset, this and every later call return Unavailable saying so and naming that error.
  absl::Status OnEveryRank(const std::function<absl::Status(int32_t rank)>& work);
  // Rank 0's model, which holds a successful Run's logits (LlamaModel::SampleLogits,
  // CopyLogits; called between Runs, while the rank threads wait).
  LlamaModel& head() { return *ranks_[0]; }
  // Not OK once the group could not be reset after a failed step: every later Run fails.
  const absl::Status& broken() const { return broken_; }

 private:
  void RunRank(int32_t rank);

  std::vector<LlamaModel*> ranks_;
  std::vector<PagedKvCache*> caches_;
  int32_t fault_rank_ = -1;
  int64_t fault_step_ = -1;
  bool fault_unrecoverable_ = false;

  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  int64_t steps_ = 0;        // Runs (the fault hook's count; the caller's thread)
  uint64_t generation_ = 0;  // works handed out
  int32_t pending_ = 0;      // ranks still running the current work
  bool stopping_ = false;
  const std::function<absl::Status(int32_t)>* work_ = nullptr;
  std::vector<absl::Status> status_;  // per rank, of the current work
  absl::Status broken_;               // set when the group could not be reset
  std::vector<std::thread> threads_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_PARALLEL_TENSOR_PARALLEL_EXECUTOR_H_
