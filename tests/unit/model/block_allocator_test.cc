#include "model/block_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace xds {
namespace {

// Hand-derived: a fresh pool hands out 0, 1, 2, ...; freed blocks come back last-freed first.
TEST(BlockAllocator, AllocatesInOrderAndReusesTheLastFreedFirst) {
  BlockAllocator a(4);
  EXPECT_EQ(a.num_blocks(), 4);
  EXPECT_EQ(a.free_count(), 4);
  EXPECT_EQ(a.allocate().value(), 0);
  EXPECT_EQ(a.allocate().value(), 1);
  EXPECT_EQ(a.allocate().value(), 2);
  EXPECT_EQ(a.free_count(), 1);
  EXPECT_EQ(a.used_count(), 3);
  EXPECT_EQ(a.unref(1), 0);
  EXPECT_EQ(a.unref(0), 0);
  EXPECT_EQ(a.free_count(), 3);
  EXPECT_EQ(a.allocate().value(), 0);  // freed last
  EXPECT_EQ(a.allocate().value(), 1);
  EXPECT_EQ(a.allocate().value(), 3);  // never used before
  EXPECT_EQ(a.free_count(), 0);
  a.check_invariants();
}

// Hand-derived: a retired block is never handed out again, free or held when retired.
TEST(BlockAllocator, ARetiredBlockIsNeverHandedOutAgain) {
  BlockAllocator a(4);
  EXPECT_EQ(a.allocate().value(), 0);
  EXPECT_EQ(a.allocate().value(), 1);
  a.retire(3);  // free: off the free list at once
  a.retire(0);  // held: stays with its holder
  a.retire(0);  // twice is once
  EXPECT_EQ(a.retired_count(), 2);
  EXPECT_EQ(a.free_count(), 1);  // block 2
  EXPECT_EQ(a.refcount(0), 1);
  a.check_invariants();
  EXPECT_EQ(a.unref(0), 0);  // its last holder lets go: it does not come back
  EXPECT_EQ(a.free_count(), 1);
  a.check_invariants();
  EXPECT_EQ(a.allocate().value(), 2);
  EXPECT_FALSE(a.allocate().ok());  // 0 and 3 retired, 1 held
  EXPECT_EQ(a.unref(1), 0);
  EXPECT_EQ(a.allocate().value(), 1);
  a.check_invariants();
}

TEST(BlockAllocator, ExhaustionIsAnErrorThatNamesThePool) {
  BlockAllocator a(2);
  ASSERT_TRUE(a.allocate().ok());
  ASSERT_TRUE(a.allocate().ok());
  const Result<int32_t> none = a.allocate();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("all 2 blocks"), std::string::npos)
      << none.status().message();
  BlockAllocator empty(0);
  EXPECT_EQ(empty.allocate().status().code(), StatusCode::kResourceExhausted);
}

TEST(BlockAllocator, AllocatingSeveralIsAllOrNothing) {
  BlockAllocator a(5);
  std::vector<int32_t> table = {42};  // appended to, never cleared
  ASSERT_TRUE(a.allocate(3, table).ok());
  EXPECT_EQ(table, (std::vector<int32_t>{42, 0, 1, 2}));
  const Status s = a.allocate(3, table);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("3 needed, 2 of 5 free"), std::string::npos) << s.message();
  EXPECT_EQ(table.size(), 4u);  // unchanged
  EXPECT_EQ(a.free_count(), 2);
  ASSERT_TRUE(a.allocate(0, table).ok());
  ASSERT_TRUE(a.allocate(2, table).ok());
  EXPECT_EQ(table, (std::vector<int32_t>{42, 0, 1, 2, 3, 4}));
  a.check_invariants();
}

// A fork shares its parent's blocks: both tables hold them, the blocks return to the pool only
// when the last holder lets go, and neither holder may write a shared block.
TEST(BlockAllocator, ForkSharesBlocksUntilTheLastHolderFrees) {
  BlockAllocator a(4);
  std::vector<int32_t> parent;
  ASSERT_TRUE(a.allocate(2, parent).ok());  // {0, 1}
  EXPECT_TRUE(a.writable(0));
  const std::vector<int32_t> child = parent;
  a.ref(child);
  EXPECT_EQ(a.refcount(0), 2);
  EXPECT_EQ(a.refcount(1), 2);
  EXPECT_FALSE(a.writable(0));
  EXPECT_FALSE(a.writable(1));
  EXPECT_EQ(a.free_count(), 2);
  a.unref(parent);
  EXPECT_EQ(a.refcount(0), 1);
  EXPECT_TRUE(a.writable(1));  // the child alone holds it now
  EXPECT_EQ(a.free_count(), 2);
  a.unref(child);
  EXPECT_EQ(a.free_count(), 4);
  EXPECT_EQ(a.refcount(0), 0);
  a.check_invariants();
}

// Copy on write: the holder of a shared block gets a fresh block plus the block to copy from;
// the other holder keeps the original. A writable block is returned as is.
TEST(BlockAllocator, EnsureWritableCopiesOnlySharedBlocks) {
  BlockAllocator a(3);
  const int32_t b = a.allocate().value();  // 0
  const BlockAllocator::Writable own = a.ensure_writable(b).value();
  EXPECT_EQ(own.block, 0);
  EXPECT_EQ(own.copy_from, -1);
  EXPECT_EQ(a.refcount(0), 1);

  a.ref(b);  // a fork
  const BlockAllocator::Writable cow = a.ensure_writable(b).value();
  EXPECT_EQ(cow.block, 1);
  EXPECT_EQ(cow.copy_from, 0);
  EXPECT_EQ(a.refcount(0), 1);  // the fork's reference
  EXPECT_EQ(a.refcount(1), 1);
  EXPECT_TRUE(a.writable(0));
  EXPECT_TRUE(a.writable(1));

  // No free block: an error, and nothing changed.
  a.ref(0);
  ASSERT_TRUE(a.allocate().ok());  // 2: the pool is full
  const Result<BlockAllocator::Writable> none = a.ensure_writable(0);
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.refcount(0), 2);
  a.check_invariants();
}

// The prefix cache's use: the cache holds one reference of a cached block (refcount 1 with no
// sequence using it); a sequence hitting the cache refs it; eviction is the cache's unref.
TEST(BlockAllocator, CachedButUnreferencedBlocksStayHeldUntilEvicted) {
  BlockAllocator a(2);
  const int32_t block = a.allocate().value();  // a sequence computes the block
  a.ref(block);                                // the cache keeps it: 2
  EXPECT_EQ(a.unref(block), 1);                // the sequence finishes: held by the cache alone
  EXPECT_EQ(a.free_count(), 1);
  a.ref(block);  // a later sequence hits the cache
  EXPECT_FALSE(a.writable(block));
  EXPECT_EQ(a.unref(block), 1);  // it finishes
  EXPECT_EQ(a.unref(block), 0);  // evicted
  EXPECT_EQ(a.free_count(), 2);
  a.check_invariants();
}

// Random operations against a plain model (a map from held block to its holders' count),
// with the invariants checked after every step.
TEST(BlockAllocator, RandomOperationsAgreeWithAPlainModel) {
  constexpr int32_t kBlocks = 16;
  BlockAllocator a(kBlocks);
  std::map<int32_t, int32_t> held;  // block -> refcount
  std::mt19937 rng(7);
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      const Result<int32_t> r = a.allocate();
      if (static_cast<int32_t>(held.size()) == kBlocks) {
        EXPECT_FALSE(r.ok());
      } else {
        ASSERT_TRUE(r.ok());
        ASSERT_EQ(held.count(*r), 0u) << "block " << *r << " handed out twice";
        held[*r] = 1;
      }
    } else if (!held.empty()) {
      auto it = held.begin();
      std::advance(it, static_cast<long>(rng() % held.size()));
      if (op == 1) {
        a.ref(it->first);
        ++it->second;
      } else {
        const int32_t left = a.unref(it->first);
        EXPECT_EQ(left, it->second - 1);
        if (--it->second == 0) held.erase(it);
      }
    }
    a.check_invariants();
    ASSERT_EQ(a.free_count() + static_cast<int32_t>(held.size()), kBlocks);
    for (const auto& [b, count] : held) {
      ASSERT_EQ(a.refcount(b), count);
      ASSERT_EQ(a.writable(b), count == 1);
    }
  }
}

TEST(BlockAllocatorDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockAllocator a(2);
  const int32_t b = a.allocate().value();
  EXPECT_EQ(a.unref(b), 0);
  EXPECT_DEATH(a.unref(b), "block 0 is free");  // double free
  EXPECT_DEATH(a.ref(b), "block 0 is free");    // attaching a free block
  EXPECT_DEATH(a.unref(5), "out of range");     // not an id of this pool
  EXPECT_DEATH((void)a.refcount(-1), "out of range");
}

}  // namespace
}  // namespace xds
