#include "engine/kv/block_pool.h"

#include <algorithm>

#include "engine/kv/paged_kv_cache.h"
#include "gtest/gtest.h"

namespace ridgeserve {
namespace {

TEST(BlockPoolTest, AllocatesDistinctBlocksAndReturnsThem) {
  BlockPool pool(8);
  auto a = pool.Allocate(5);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool.num_free(), 3);
  std::vector<int32_t> sorted = *a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
  for (int32_t b : *a) pool.Release(b);
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(BlockPoolTest, ExhaustionFailsWithoutTakingAnything) {
  BlockPool pool(4);
  ASSERT_TRUE(pool.Allocate(3).ok());
  auto more = pool.Allocate(2);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_free(), 1);
}

TEST(BlockPoolTest, SharedBlockFreedAtLastRelease) {
  BlockPool pool(2);
  auto a = pool.Allocate(1);
  ASSERT_TRUE(a.ok());
  const int32_t b = (*a)[0];
  pool.AddRef(b);
  EXPECT_EQ(pool.ref_count(b), 2);
  pool.Release(b);
  EXPECT_EQ(pool.num_free(), 1);
  pool.Release(b);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockTableTest, ReservesWholeBlocksAndMapsSlots) {
  BlockPool pool(10);
  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool, 17, 16).ok());
  ASSERT_EQ(table.blocks().size(), 2u);
  EXPECT_EQ(table.Slot(0, 16), table.blocks()[0] * 16);
  EXPECT_EQ(table.Slot(16, 16), table.blocks()[1] * 16);
  EXPECT_EQ(table.Slot(5, 16), table.blocks()[0] * 16 + 5);
  ASSERT_TRUE(table.Reserve(pool, 32, 16).ok());  // already covered
  EXPECT_EQ(table.blocks().size(), 2u);
  EXPECT_EQ(table.Reserve(pool, 16 * 20, 16).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table.blocks().size(), 2u);
  table.Release(pool);
  EXPECT_EQ(pool.num_free(), 10);
}

}  // namespace
}  // namespace ridgeserve
