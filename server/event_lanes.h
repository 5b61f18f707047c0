// Runs the work the engine thread hands over on threads of its own, so the engine thread goes
// back to its next step at once: each generation call's events (detokenizing, stop strings,
// protobufs, metrics, the gRPC write) run here, not inside the engine's step.
//
// Work posted under one key runs in the order it was posted, on one lane (thread); work under
// different keys may run at once on different lanes.
#ifndef RIDGESERVE_SERVER_EVENT_LANES_H_
#define RIDGESERVE_SERVER_EVENT_LANES_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ridgeserve {

class EventLanes {
 public:
  // `num_lanes` >= 1 threads.
  explicit EventLanes(int num_lanes);
  // Runs everything already posted, then joins the threads.
  ~EventLanes();
  EventLanes(const EventLanes&) = delete;
  EventLanes& operator=(const EventLanes&) = delete;

  // Thread-safe. Wakes the lane only when it had nothing to do, so a step's worth of events
  // costs its lane one wake-up.
  void Post(uint64_t key, std::function<void()> work);

 private:
  struct Lane {
    std::mutex mu;
    std::condition_variable ready;
    std::deque<std::function<void()>> queue;  // under mu
    bool stopping = false;                    // under mu
    std::thread thread;
  };
  static void Run(Lane& lane);

  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_EVENT_LANES_H_
