// CountingGraphBackend: a test backend (below) for the engine tests of decode graphs.
#ifndef RIDGESERVE_TESTS_ENGINE_COUNTING_GRAPH_BACKEND_H_
#define RIDGESERVE_TESTS_ENGINE_COUNTING_GRAPH_BACKEND_H_

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "kernels/backend.h"
#include "tests/engine/forwarding_backend.h"

namespace ridgeserve::testing {

// A backend that forwards to another and counts Alloc calls. Its "graphs" replay by running
// the recorded ops again, reading the buffers as they are then, as a CUDA graph replays its
// launches: so the engine takes its decode-graph path (padded buckets, replays) on the CPU.
// before_sample, when set, runs at the start of every Sample call (a test holds a step there);
// with fail_record set, Record fails. The backend must outlive its graphs.
class CountingGraphBackend final : public ForwardingBackend {
 public:
  explicit CountingGraphBackend(Backend& inner) : ForwardingBackend(inner) {}

  absl::StatusOr<DeviceBuffer> Alloc(size_t bytes) override {
    ++allocs;
    return inner_.Alloc(bytes);
  }
  void Sample(float* logits, int32_t vocab, std::span<const SampleSpec> specs,
              std::span<const int32_t> penalty_ids, SampledToken* out) override {
    if (before_sample) before_sample();
    inner_.Sample(logits, vocab, specs, penalty_ids, out);
  }
  bool SupportsGraphs() const override { return true; }
  absl::StatusOr<std::unique_ptr<BackendGraph>> Record(
      const std::function<absl::Status()>& ops) override {
    class Replayed final : public BackendGraph {
     public:
      Replayed(std::function<absl::Status()> ops, std::atomic<int>& replays,
               std::atomic<int>& destroyed)
          : ops_(std::move(ops)), replays_(replays), destroyed_(destroyed) {}
      ~Replayed() override { ++destroyed_; }
      bool Replay() override {
        ++replays_;
        return ops_().ok();
      }

     private:
      std::function<absl::Status()> ops_;
      std::atomic<int>& replays_;
      std::atomic<int>& destroyed_;
    };
    if (fail_record) return absl::InternalError("recording refused by the test");
    ++records;
    return std::make_unique<Replayed>(ops, replays, destroyed);
  }

  std::atomic<int> allocs = 0, records = 0, replays = 0, destroyed = 0;  // destroyed: graphs
  std::function<void()> before_sample;
  std::atomic<bool> fail_record = false;
};

}  // namespace ridgeserve::testing

#endif  // RIDGESERVE_TESTS_ENGINE_COUNTING_GRAPH_BACKEND_H_
