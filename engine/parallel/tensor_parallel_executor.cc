#include "engine/parallel/tensor_parallel_executor.h"

#include <cassert>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {

TensorParallelExecutor::TensorParallelExecutor(std::vector<LlamaModel*> ranks,
                                               std::vector<PagedKvCache*> caches)
    : ranks_(std::move(ranks)), caches_(std::move(caches)), status_(ranks_.size()) {
  assert(!ranks_.empty() && ranks_.size() == caches_.size());
  if (const char* fault = std::getenv("RIDGESERVE_TEST_TP_FAULT"); fault != nullptr) {
    const std::vector<std::string> parts = absl::StrSplit(fault, ':');
    int32_t rank = 0;
    int64_t step = 0;
    if ((parts.size() == 2 || (parts.size() == 3 && parts[2] == "unrecoverable")) &&
        absl::SimpleAtoi(parts[0], &rank) && absl::SimpleAtoi(parts[1], &step)) {
      fault_rank_ = rank;
      fault_step_ = step;
      fault_unrecoverable_ = parts.size() == 3;
      spdlog::warn("RIDGESERVE_TEST_TP_FAULT: rank {} will fail its step {}{}", rank, step,
                   fault_unrecoverable_ ? ", and the group will not be reset" : "");
    }
  }
  for (int32_t r = 0; r < static_cast<int32_t>(ranks_.size()); ++r) {
    threads_.emplace_back([this, r] { RunRank(r); });
  }
}

TensorParallelExecutor::~TensorParallelExecutor() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TensorParallelExecutor::RunRank(int32_t rank) {
  uint64_t seen = 0;
  while (true) {
    const std::function<absl::Status(int32_t)>* work;
    {
      std::unique_lock lock(mu_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      work = work_;
    }
    absl::Status status = (*work)(rank);
    // A failing rank releases the others from the collectives it will not join (a group
    // already aborted keeps its first reason).
    if (!status.ok()) {
      ranks_[rank]->communicator()->Abort(absl::StrCat("rank ", rank, ": ", status.message()));
    }
    std::lock_guard lock(mu_);
    status_[rank] = std::move(status);
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

absl::Status TensorParallelExecutor::Run(const ForwardBatch& batch, ForwardProfile* profile) {
  if (!broken_.ok()) return broken_;
  // A step the model refuses (every rank would, before any collective) fails here alone.
  RS_RETURN_IF_ERROR(ranks_[0]->CheckStep(batch, *caches_[0]));
  const int64_t step = ++steps_;
  return OnEveryRank([&](int32_t rank) {
    if (rank == fault_rank_ && step == fault_step_) {
      return absl::InternalError(absl::StrCat("injected fault at step ", step));
    }
    return ranks_[rank]->Run(batch, *caches_[rank], nullptr, rank == 0 ? profile : nullptr);
  });
}

absl::Status TensorParallelExecutor::OnEveryRank(
    const std::function<absl::Status(int32_t rank)>& work) {
  if (!broken_.ok()) return broken_;
  {
    std::unique_lock lock(mu_);
    work_ = &work;
    pending_ = static_cast<int32_t>(ranks_.size());
    ++generation_;
    start_cv_.notify_all();
    done_cv_.wait(lock, [&] { return pending_ == 0; });
  }
  // The first rank that failed on its own (others fail with the abort it caused).
  int32_t failed = -1;
  for (int32_t r = 0; r < static_cast<int32_t>(status_.size()); ++r) {
    if (status_[r].ok()) continue;
    if (failed < 0 || (status_[failed].code() == absl::StatusCode::kAborted &&
                       status_[r].code() != absl::StatusCode::kAborted)) {
      failed = r;
    }
  }
  if (failed < 0) return absl::OkStatus();
  const absl::Status error = absl::InternalError(
      absl::StrCat("tensor-parallel rank ", failed, " failed: ", status_[failed].message()));
  spdlog::error("{}", std::string(error.message()));
  if (absl::Status reset = fault_unrecoverable_
                               ? absl::UnimplementedError("RIDGESERVE_TEST_TP_FAULT: not reset")
                               : ranks_[0]->communicator()->Reset();
      !reset.ok()) {
    broken_ =
        absl::UnavailableError(absl::StrCat("tensor-parallel group stopped: ", error.message(),
                                            "; it cannot be reset (", reset.message(), ")"));
    spdlog::error("{}", std::string(broken_.message()));
    // No step runs again, and the decode graphs hold the aborted group's collectives: NCCL's
    // abort does not finish while a graph that captured them exists (ncclCommAbort waits for
    // their destruction), so they go now (the rank threads wait; a graph still in flight is
    // freed when it ends).
    for (LlamaModel* rank : ranks_) rank->SetDecodeGraphBuckets({});
  }
  return error;
}

}  // namespace ridgeserve
