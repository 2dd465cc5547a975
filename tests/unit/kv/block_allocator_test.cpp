#include <gtest/gtest.h>

#include <set>

#include "helios/kv_cache.h"

namespace helios {
namespace {

TEST(BlockAllocator, AllocatesEveryBlockOnceThenRunsOut) {
  BlockAllocator a(4);
  std::set<int32_t> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = a.allocate();
    ASSERT_TRUE(id.has_value());
    EXPECT_TRUE(ids.insert(*id).second) << "block " << *id << " handed out twice";
    EXPECT_GE(*id, 0);
    EXPECT_LT(*id, 4);
  }
  EXPECT_EQ(a.n_free(), 0);
  EXPECT_FALSE(a.allocate().has_value());
  EXPECT_FALSE(a.can_allocate(1));
}

TEST(BlockAllocator, FreedBlockIsReusedFirst) {
  BlockAllocator a(3);
  const int32_t first = *a.allocate();
  (void)*a.allocate();
  a.release(first);
  EXPECT_EQ(*a.allocate(), first);
}

TEST(BlockAllocator, GrowAddsFreeBlocksAfterThoseFreeNow) {
  BlockAllocator a(3);
  EXPECT_EQ(*a.allocate(), 0);
  EXPECT_EQ(*a.allocate(), 1);
  a.release(0);
  a.grow(5);
  EXPECT_EQ(a.n_blocks(), 5);
  EXPECT_EQ(a.n_free(), 4);
  EXPECT_EQ(a.n_used(), 1) << "block 1 is still held";
  // The blocks free before come first (0 freed last, reused first), then the new ones, low ids first.
  for (int32_t want : {0, 2, 3, 4}) EXPECT_EQ(*a.allocate(), want);
  EXPECT_FALSE(a.allocate().has_value());
  a.release(4);
  a.release(1);
  EXPECT_EQ(a.n_free(), 2);
}

TEST(BlockAllocator, GrownAllocatorHandsOutWhatANewOneWould) {
  BlockAllocator grown(2), fresh(6);
  grown.grow(6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(*grown.allocate(), *fresh.allocate());
  grown.grow(4);  // not larger: nothing changes
  EXPECT_EQ(grown.n_blocks(), 6);
  EXPECT_EQ(grown.n_free(), 0);
}

TEST(BlockTable, ReserveGrowsByWholeBlocksAndMapsSlots) {
  BlockAllocator a(8);
  BlockTable t;
  ASSERT_TRUE(reserve_tokens(a, t, 17, 16));
  EXPECT_EQ(t.block_ids.size(), 2u);
  EXPECT_EQ(t.capacity_tokens(16), 32);
  ASSERT_TRUE(reserve_tokens(a, t, 32, 16));
  EXPECT_EQ(t.block_ids.size(), 2u) << "32 tokens still fit in two blocks";
  EXPECT_EQ(t.slot(0, 16), t.block_ids[0] * 16);
  EXPECT_EQ(t.slot(17, 16), t.block_ids[1] * 16 + 1);
}

TEST(BlockTable, FailedReserveChangesNothing) {
  BlockAllocator a(3);
  BlockTable t;
  ASSERT_TRUE(reserve_tokens(a, t, 16, 16));
  EXPECT_FALSE(reserve_tokens(a, t, 16 * 4, 16));
  EXPECT_EQ(t.block_ids.size(), 1u);
  EXPECT_EQ(a.n_free(), 2);
  release_table(a, t);
  EXPECT_TRUE(t.block_ids.empty());
  EXPECT_EQ(a.n_free(), 3);
}

TEST(BlockTable, BlocksForTokens) {
  EXPECT_EQ(blocks_for_tokens(0, 16), 0);
  EXPECT_EQ(blocks_for_tokens(1, 16), 1);
  EXPECT_EQ(blocks_for_tokens(16, 16), 1);
  EXPECT_EQ(blocks_for_tokens(17, 16), 2);
}

}  // namespace
}  // namespace helios
