// EventLanes: a key's work runs in the order posted, keys on different lanes run at once, and
// destroying the lanes runs everything already posted.
#include "server/event_lanes.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace ridgeserve {
namespace {

TEST(EventLanesTest, EachKeysWorkRunsInTheOrderPostedFromSeveralThreads) {
  constexpr int kKeys = 8, kPerKey = 2000;
  std::vector<std::vector<int>> seen(kKeys);  // seen[key]: touched only on key's lane
  {
    EventLanes lanes(3);
    // Two posting threads, each owning half of the keys, interleave their posts.
    auto post = [&](int first_key) {
      for (int i = 0; i < kPerKey; ++i) {
        for (int key = first_key; key < kKeys; key += 2) {
          lanes.Post(key, [&seen, key, i] { seen[key].push_back(i); });
        }
      }
    };
    std::thread a(post, 0), b(post, 1);
    a.join();
    b.join();
  }  // the destructor runs what is still queued
  for (int key = 0; key < kKeys; ++key) {
    ASSERT_EQ(seen[key].size(), static_cast<size_t>(kPerKey)) << "key " << key;
    for (int i = 0; i < kPerKey; ++i) ASSERT_EQ(seen[key][i], i) << "key " << key;
  }
}

TEST(EventLanesTest, KeysOnDifferentLanesRunAtOnce) {
  EventLanes lanes(2);
  // Key 0's work waits for key 1's: with one thread for both it would never finish.
  std::promise<void> second_ran;
  std::future<void> second = second_ran.get_future();
  std::promise<bool> first_done;
  lanes.Post(0, [&] {
    first_done.set_value(second.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  });
  lanes.Post(1, [&] { second_ran.set_value(); });
  EXPECT_TRUE(first_done.get_future().get());
}

TEST(EventLanesTest, WorkPostedFromItsOwnLaneRunsAfterIt) {
  std::vector<int> order;
  {
    EventLanes lanes(1);
    lanes.Post(0, [&] {
      lanes.Post(0, [&] { order.push_back(2); });
      order.push_back(1);
    });
  }
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace ridgeserve
