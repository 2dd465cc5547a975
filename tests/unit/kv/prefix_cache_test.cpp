// The prefix cache's block pool: reference counts, publishing, lookups that check the tokens,
// kept blocks evicted least recently used only when blocks run out.
#include <gtest/gtest.h>

#include <vector>

#include "helios/prefix_cache.h"

namespace helios {
namespace {

constexpr int32_t kBs = 4;
const std::vector<TokenId> kA = {1, 2, 3, 4}, kB = {5, 6, 7, 8};

TEST(PrefixCachePool, ReleasedPublishedBlocksAreKeptAndFoundByKey) {
  CachingBlockPool pool(3, kBs, true);
  const int32_t b = *pool.allocate();
  const uint64_t key = prefix_block_key(0, kA.data(), kBs);
  pool.publish(b, key, kA.data());
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 3);  // kept, but free to evict
  EXPECT_EQ(pool.n_used(), 0);
  auto hit = pool.lookup(key, kA.data());
  ASSERT_TRUE(hit);
  EXPECT_EQ(*hit, b);
  EXPECT_EQ(pool.n_used(), 1);
  // Shared: a second holder, and the block stays held until both let go.
  ASSERT_TRUE(pool.lookup(key, kA.data()));
  pool.release(b);
  EXPECT_EQ(pool.n_used(), 1);
  pool.release(b);
  EXPECT_EQ(pool.n_used(), 0);
  EXPECT_EQ(pool.stats().cached_blocks, 1);
}

TEST(PrefixCachePool, KeysChainThePrefixAndLookupsCheckTheTokens) {
  const uint64_t a = prefix_block_key(0, kA.data(), kBs);
  EXPECT_NE(prefix_block_key(a, kB.data(), kBs), prefix_block_key(0, kB.data(), kBs));
  EXPECT_NE(prefix_block_key(0, kA.data(), kBs), prefix_block_key(0, kB.data(), kBs));
  CachingBlockPool pool(2, kBs, true);
  const int32_t b = *pool.allocate();
  pool.publish(b, a, kA.data());
  EXPECT_FALSE(pool.lookup(a, kB.data()));  // the same key with other tokens: no hit
  EXPECT_FALSE(pool.lookup(a + 1, kA.data()));
}

TEST(PrefixCachePool, FreeBlocksGoFirstThenTheLeastRecentlyUsedKeptOne) {
  CachingBlockPool pool(3, kBs, true);
  std::vector<int32_t> held;
  for (int i = 0; i < 3; ++i) held.push_back(*pool.allocate());
  const std::vector<TokenId> t[3] = {{1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}};
  std::vector<uint64_t> keys;
  for (int i = 0; i < 2; ++i) {
    keys.push_back(prefix_block_key(0, t[i].data(), kBs));
    pool.publish(held[i], keys[i], t[i].data());
  }
  pool.release(held[0]);  // kept, older
  pool.release(held[1]);  // kept, newer
  pool.release(held[2]);  // unpublished: free
  EXPECT_EQ(*pool.allocate(), held[2]);
  // Touch the older one: now block 1 is the least recently used.
  pool.release(*pool.lookup(keys[0], t[0].data()));
  EXPECT_EQ(*pool.allocate(), held[1]);
  EXPECT_EQ(pool.stats().evictions, 1);
  EXPECT_FALSE(pool.lookup(keys[1], t[1].data()));  // evicted
  EXPECT_TRUE(pool.lookup(keys[0], t[0].data()));
  EXPECT_FALSE(pool.allocate());  // everything held
}

TEST(PrefixCachePool, OffPublishesNothing) {
  CachingBlockPool pool(2, kBs, false);
  const int32_t b = *pool.allocate();
  const uint64_t key = prefix_block_key(0, kA.data(), kBs);
  pool.publish(b, key, kA.data());
  pool.release(b);
  EXPECT_FALSE(pool.lookup(key, kA.data()));
  EXPECT_EQ(pool.stats().cached_blocks, 0);
  EXPECT_FALSE(pool.stats().enabled);
}

TEST(PrefixCachePool, ResetEmptiesTheCacheAndGrowAddsFreeBlocks) {
  CachingBlockPool pool(1, kBs, true);
  const int32_t b = *pool.allocate();
  const uint64_t key = prefix_block_key(0, kA.data(), kBs);
  pool.publish(b, key, kA.data());
  pool.release(b);
  pool.grow(3);
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_TRUE(pool.lookup(key, kA.data()));
  pool.reset(2);
  EXPECT_EQ(pool.n_blocks(), 2);
  EXPECT_FALSE(pool.lookup(key, kA.data()));
}

}  // namespace
}  // namespace helios
