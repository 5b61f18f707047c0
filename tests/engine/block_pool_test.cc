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

std::vector<int32_t> Seq(int32_t first, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

TEST(BlockHashTest, DependsOnParentAndEveryToken) {
  const auto t = Seq(100, 16);
  const uint64_t root = RootBlockHash(0);
  EXPECT_EQ(HashBlockTokens(root, t), HashBlockTokens(root, Seq(100, 16)));
  EXPECT_NE(HashBlockTokens(root, t), HashBlockTokens(RootBlockHash(1), t));
  EXPECT_NE(HashBlockTokens(root, t), HashBlockTokens(HashBlockTokens(root, t), t));
  for (int i = 0; i < 16; ++i) {
    auto u = t;
    u[i] += 1;
    EXPECT_NE(HashBlockTokens(root, t), HashBlockTokens(root, u)) << i;
  }
}

TEST(BlockPoolCacheTest, PublishedBlockStaysFindableAfterRelease) {
  BlockPool pool(4);
  const uint64_t root = RootBlockHash(0);
  const auto t = Seq(1, 16);
  const uint64_t h = HashBlockTokens(root, t);
  auto a = pool.Allocate(1);
  ASSERT_TRUE(a.ok());
  const int32_t b = (*a)[0];
  EXPECT_EQ(pool.FindCached(h, root, t), -1);
  ASSERT_TRUE(pool.Publish(b, h, root, t));
  EXPECT_EQ(pool.FindCached(h, root, t), b);
  EXPECT_EQ(pool.num_cached(), 1);
  pool.Release(b);
  EXPECT_EQ(pool.num_free(), 4);  // evictable counts as free
  EXPECT_EQ(pool.num_evictable(), 1);
  ASSERT_EQ(pool.FindCached(h, root, t), b);
  pool.AcquireCached(b);  // revived by a hit
  EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_evictable(), 0);
  pool.AcquireCached(b);  // second owner
  EXPECT_EQ(pool.ref_count(b), 2);
  pool.Release(b);
  pool.Release(b);
  EXPECT_EQ(pool.num_evictable(), 1);
}

TEST(BlockPoolCacheTest, HashMatchAloneIsNotAHit) {
  BlockPool pool(2);
  const uint64_t root = RootBlockHash(0);
  auto a = pool.Allocate(1);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool.Publish((*a)[0], 42, root, Seq(1, 16)));
  EXPECT_EQ(pool.FindCached(42, root, Seq(1, 16)), (*a)[0]);
  EXPECT_EQ(pool.FindCached(42, root, Seq(2, 16)), -1);      // other tokens, same hash
  EXPECT_EQ(pool.FindCached(42, root + 1, Seq(1, 16)), -1);  // other prefix, same hash
}

TEST(BlockPoolCacheTest, DuplicatePublishKeepsFirst) {
  BlockPool pool(2);
  const uint64_t root = RootBlockHash(0);
  const auto t = Seq(1, 16);
  const uint64_t h = HashBlockTokens(root, t);
  auto a = pool.Allocate(2);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(pool.Publish((*a)[0], h, root, t));
  EXPECT_FALSE(pool.Publish((*a)[1], h, root, t));
  EXPECT_FALSE(pool.is_cached((*a)[1]));
  pool.Release((*a)[1]);
  pool.Release((*a)[0]);
  EXPECT_EQ(pool.num_evictable(), 1);
  EXPECT_EQ(pool.FindCached(h, root, t), (*a)[0]);
}

TEST(BlockPoolCacheTest, EvictsUncachedFirstThenLeastRecentlyReleased) {
  BlockPool pool(4);
  const uint64_t root = RootBlockHash(0);
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a.ok());
  std::vector<uint64_t> hashes;
  for (int i = 0; i < 3; ++i) {
    hashes.push_back(HashBlockTokens(root, Seq(i * 16, 16)));
    ASSERT_TRUE(pool.Publish((*a)[i], hashes[i], root, Seq(i * 16, 16)));
  }
  // Release order 1, 0, 2: block 1 is the least recently released.
  pool.Release((*a)[1]);
  pool.Release((*a)[0]);
  pool.Release((*a)[2]);
  // The never-published block goes first; the cache is untouched.
  auto b = pool.Allocate(1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool.num_evictable(), 3);
  // Then LRU: block 1, then block 0; block 2 survives.
  auto c = pool.Allocate(2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0], (*a)[1]);
  EXPECT_EQ((*c)[1], (*a)[0]);
  EXPECT_FALSE(pool.is_cached((*a)[1]));
  EXPECT_EQ(pool.FindCached(hashes[1], root, Seq(16, 16)), -1);
  EXPECT_EQ(pool.FindCached(hashes[0], root, Seq(0, 16)), -1);
  EXPECT_EQ(pool.FindCached(hashes[2], root, Seq(32, 16)), (*a)[2]);
  EXPECT_EQ(pool.num_cached(), 1);
  // A reused block can be published again under a new hash.
  const uint64_t h = HashBlockTokens(root, Seq(500, 16));
  EXPECT_TRUE(pool.Publish((*c)[0], h, root, Seq(500, 16)));
  EXPECT_EQ(pool.Allocate(2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_free(), 1);
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
