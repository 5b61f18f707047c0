// RequestRegistry: unique ids, generated names, aborts asked before the engine knows the
// request, draining, and waiting for the last call, including from several threads.
#include "server/request_registry.h"

#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ridgeserve {
namespace {

using ::testing::UnorderedElementsAre;

TEST(RequestRegistryTest, IdsAreUniqueAmongLiveRequests) {
  RequestRegistry registry;
  std::string a = "job";
  ASSERT_TRUE(registry.Admit(&a).ok());
  std::string again = "job";
  EXPECT_EQ(registry.Admit(&again).code(), absl::StatusCode::kAlreadyExists);
  registry.Remove("job");
  EXPECT_TRUE(registry.Admit(&again).ok());  // free again once the call is done
}

TEST(RequestRegistryTest, EmptyIdsGetDistinctNames) {
  RequestRegistry registry;
  std::set<std::string> names;
  for (int i = 0; i < 100; ++i) {
    std::string id;
    ASSERT_TRUE(registry.Admit(&id).ok());
    EXPECT_FALSE(id.empty());
    names.insert(id);
  }
  EXPECT_EQ(names.size(), 100u);
  EXPECT_EQ(registry.size(), 100);
}

TEST(RequestRegistryTest, AbortBeforeAndAfterTheEngineId) {
  RequestRegistry registry;
  EXPECT_EQ(registry.RequestAbort("nope").status().code(), absl::StatusCode::kNotFound);

  std::string early = "early";
  ASSERT_TRUE(registry.Admit(&early).ok());
  absl::StatusOr<std::optional<uint64_t>> r = registry.RequestAbort("early");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());                   // the engine does not know it yet...
  EXPECT_TRUE(registry.SetEngineId("early", 7));  // ...so the submitter aborts it

  std::string late = "late";
  ASSERT_TRUE(registry.Admit(&late).ok());
  EXPECT_FALSE(registry.SetEngineId("late", 8));
  r = registry.RequestAbort("late");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->value_or(0), 8u);
}

TEST(RequestRegistryTest, DrainingRefusesAndAbortAllReturnsKnownIds) {
  RequestRegistry registry;
  std::string a = "a", b = "b", c = "c";
  ASSERT_TRUE(registry.Admit(&a).ok());
  ASSERT_TRUE(registry.Admit(&b).ok());
  ASSERT_TRUE(registry.Admit(&c).ok());
  registry.SetEngineId("a", 1);
  registry.SetEngineId("b", 2);
  registry.StartDraining();
  EXPECT_TRUE(registry.draining());
  std::string d = "d";
  EXPECT_EQ(registry.Admit(&d).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(registry.AbortAll(), UnorderedElementsAre(1u, 2u));
  EXPECT_TRUE(registry.SetEngineId("c", 3));  // marked too: aborted once submitted
}

TEST(RequestRegistryTest, WaitUntilEmpty) {
  RequestRegistry registry;
  EXPECT_TRUE(registry.WaitUntilEmpty(absl::Now()));
  std::vector<std::string> ids(8);
  for (std::string& id : ids) ASSERT_TRUE(registry.Admit(&id).ok());
  EXPECT_FALSE(registry.WaitUntilEmpty(absl::Now() + absl::Milliseconds(20)));
  std::vector<std::thread> threads;
  for (const std::string& id : ids) {
    threads.emplace_back([&registry, id] {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      registry.Remove(id);
    });
  }
  EXPECT_TRUE(registry.WaitUntilEmpty(absl::Now() + absl::Seconds(30)));
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(registry.size(), 0);
}

}  // namespace
}  // namespace ridgeserve
