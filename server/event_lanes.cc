#include "server/event_lanes.h"

#include <algorithm>
#include <utility>

namespace ridgeserve {

EventLanes::EventLanes(int num_lanes) {
  for (int i = 0; i < std::max(1, num_lanes); ++i) {
    lanes_.push_back(std::make_unique<Lane>());
    Lane& lane = *lanes_.back();
    lane.thread = std::thread([&lane] { Run(lane); });
  }
}

EventLanes::~EventLanes() {
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      lane->stopping = true;
    }
    lane->ready.notify_one();
  }
  for (const std::unique_ptr<Lane>& lane : lanes_) lane->thread.join();
}

void EventLanes::Post(uint64_t key, std::function<void()> work) {
  Lane& lane = *lanes_[key % lanes_.size()];
  bool was_idle;
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    was_idle = lane.queue.empty();
    lane.queue.push_back(std::move(work));
  }
  if (was_idle) lane.ready.notify_one();
}

void EventLanes::Run(Lane& lane) {
  std::deque<std::function<void()>> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(lane.mu);
      lane.ready.wait(lock, [&] { return lane.stopping || !lane.queue.empty(); });
      if (lane.queue.empty()) return;  // stopping, and everything posted has run
      batch.swap(lane.queue);
    }
    for (std::function<void()>& work : batch) work();
    batch.clear();
  }
}

}  // namespace ridgeserve
