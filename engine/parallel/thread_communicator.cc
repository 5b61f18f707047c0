#include "engine/parallel/thread_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace ridgeserve {

// Every collective is two or three barrier phases over pointers the ranks publish: ranks
// post their buffer, meet, read each other's buffers (the reduction splits the elements over
// the ranks, each summing its share in rank order into `scratch`), meet, copy out, meet.
struct ThreadCommunicatorGroup::State {
  explicit State(int n) : size(n), posted(n) {}

  // Waits until all `size` ranks have arrived at this phase. false when aborted.
  bool Arrive() {
    std::unique_lock lock(mu);
    if (aborted) return false;
    const uint64_t phase = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    cv.wait(lock, [&] { return aborted || generation != phase; });
    return !aborted;
  }

  absl::Status AbortedStatus() {
    std::lock_guard lock(mu);
    return absl::AbortedError(absl::StrCat("tensor-parallel group aborted: ", reason));
  }

  // Which collective each rank called, with its size: ranks that disagree would read each
  // other's buffers as something else, so they abort instead.
  struct Call {
    int kind = 0;
    size_t count = 0;
    int root = 0;
    bool operator==(const Call&) const = default;
  };
  // After the first phase (every rank posted its call), on every rank before it reads
  // another's buffer: false, and the group aborted, unless every rank made rank 0's call.
  bool SameCall() {
    for (int r = 1; r < size; ++r) {
      if (calls[r] == calls[0]) continue;
      std::lock_guard lock(mu);
      if (!aborted) {
        aborted = true;
        reason =
            absl::StrCat("rank ", r, " called collective ", calls[r].kind, " of ", calls[r].count,
                         " where rank 0 called ", calls[0].kind, " of ", calls[0].count);
        cv.notify_all();
      }
      return false;
    }
    return true;
  }

  const int size;
  std::vector<Call> calls = std::vector<Call>(size);
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string reason;
  std::vector<const void*> posted;  // per rank, the buffer of the collective in progress
  std::vector<float> scratch;       // reduction result
};

namespace {

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadCommunicatorGroup::State& state, int rank)
      : state_(state), rank_(rank) {}

  std::string_view name() const override { return "thread"; }
  int rank() const override { return rank_; }
  int size() const override { return state_.size; }

  absl::Status AllReduceSum(float* data, size_t count) override {
    State& s = state_;
    s.posted[rank_] = data;
    s.calls[rank_] = {1, count, 0};
    if (rank_ == 0) s.scratch.resize(std::max(s.scratch.size(), count));
    if (!s.Arrive() || !s.SameCall()) return s.AbortedStatus();
    // This rank's share of the elements, each summed over the ranks in order.
    const size_t begin = count * rank_ / s.size, end = count * (rank_ + 1) / s.size;
    for (size_t i = begin; i < end; ++i) {
      float sum = static_cast<const float*>(s.posted[0])[i];
      for (int r = 1; r < s.size; ++r) sum += static_cast<const float*>(s.posted[r])[i];
      s.scratch[i] = sum;
    }
    if (!s.Arrive()) return s.AbortedStatus();
    std::memcpy(data, s.scratch.data(), sizeof(float) * count);
    // Nobody may post the next collective's buffers or resize scratch before all have copied.
    if (!s.Arrive()) return s.AbortedStatus();
    return absl::OkStatus();
  }

  absl::Status ReserveAllReduce(size_t count) override {
    if (rank_ == 0) state_.scratch.resize(std::max(state_.scratch.size(), count));
    return absl::OkStatus();
  }

  absl::Status AllGather(const float* in, size_t count, float* out) override {
    State& s = state_;
    s.posted[rank_] = in;
    s.calls[rank_] = {2, count, 0};
    if (!s.Arrive() || !s.SameCall()) return s.AbortedStatus();
    for (int r = 0; r < s.size; ++r) {
      std::memcpy(out + r * count, s.posted[r], sizeof(float) * count);
    }
    if (!s.Arrive()) return s.AbortedStatus();
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    State& s = state_;
    if (root < 0 || root >= s.size) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " of ", s.size));
    }
    s.posted[rank_] = data;
    s.calls[rank_] = {3, bytes, root};
    if (!s.Arrive() || !s.SameCall()) return s.AbortedStatus();
    if (rank_ != root) std::memcpy(data, s.posted[root], bytes);
    if (!s.Arrive()) return s.AbortedStatus();
    return absl::OkStatus();
  }

  absl::Status Barrier() override {
    State& s = state_;
    s.calls[rank_] = {4, 0, 0};
    // The second phase keeps the next collective's call from overwriting this one's while
    // another rank still compares them.
    if (!s.Arrive() || !s.SameCall() || !s.Arrive()) return s.AbortedStatus();
    return absl::OkStatus();
  }

  absl::Status Reset() override {
    State& s = state_;
    std::lock_guard lock(s.mu);
    s.aborted = false;
    s.reason.clear();
    s.arrived = 0;
    return absl::OkStatus();
  }

  void Abort(std::string_view reason) override {
    State& s = state_;
    std::lock_guard lock(s.mu);
    if (s.aborted) return;
    s.aborted = true;
    s.reason = std::string(reason);
    s.cv.notify_all();
  }

 private:
  using State = ThreadCommunicatorGroup::State;
  State& state_;
  const int rank_;
};

}  // namespace

ThreadCommunicatorGroup::ThreadCommunicatorGroup(int size) : state_(std::make_unique<State>(size)) {
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<ThreadCommunicator>(*state_, r));
}

ThreadCommunicatorGroup::~ThreadCommunicatorGroup() = default;

}  // namespace ridgeserve
