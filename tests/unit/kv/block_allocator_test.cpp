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
