// The prefix cache over a real BlockAllocator: hits along the hash chain, LRU eviction order,
// reference counts, the MTP m - 1 rule. Expected block ids and counts are worked out by hand
// from the allocator's documented order (a fresh pool hands out 0, 1, 2...).
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace xds::engine {
namespace {

constexpr int64_t kBs = 4;

std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::span<const int32_t> block_of(const std::vector<int32_t>& t, int64_t i) {
  return std::span<const int32_t>(t).subspan(static_cast<size_t>(i * kBs), kBs);
}

// Allocates one block per full block of `tokens` and caches them all; returns the table.
std::vector<int32_t> prefill_and_cache(BlockAllocator& alloc, PrefixCache& cache,
                                       const std::vector<int32_t>& tokens) {
  std::vector<int32_t> table;
  uint64_t h = PrefixCache::kRootHash;
  for (int64_t i = 0; i < static_cast<int64_t>(tokens.size()) / kBs; ++i) {
    table.push_back(alloc.allocate().value());
    const uint64_t next = PrefixCache::block_hash(h, block_of(tokens, i));
    EXPECT_TRUE(cache.insert(alloc, table.back(), h, next, block_of(tokens, i)));
    h = next;
  }
  return table;
}

TEST(PrefixCacheHash, ChainNamesTheWholePrefix) {
  const auto a = iota_tokens(8);
  auto b = a;
  const uint64_t ha0 = PrefixCache::block_hash(PrefixCache::kRootHash, block_of(a, 0));
  const uint64_t ha1 = PrefixCache::block_hash(ha0, block_of(a, 1));
  EXPECT_EQ(ha0, PrefixCache::block_hash(PrefixCache::kRootHash, block_of(b, 0)));
  b[1] = 999;  // block 0 differs -> block 1's hash differs although its tokens are equal
  const uint64_t hb0 = PrefixCache::block_hash(PrefixCache::kRootHash, block_of(b, 0));
  EXPECT_NE(ha0, hb0);
  EXPECT_NE(ha1, PrefixCache::block_hash(hb0, block_of(b, 1)));
  // Order matters, and so does the parent.
  const std::vector<int32_t> swapped = {a[1], a[0], a[2], a[3]};
  EXPECT_NE(ha0, PrefixCache::block_hash(PrefixCache::kRootHash, swapped));
  EXPECT_NE(ha1, PrefixCache::block_hash(PrefixCache::kRootHash, block_of(a, 1)));
}

TEST(PrefixCache, LongestChainIsAttachedWithReferences) {
  BlockAllocator alloc(8);
  PrefixCache cache({.num_blocks = 8, .block_size = kBs});
  const auto prompt = iota_tokens(12);
  const auto table = prefill_and_cache(alloc, cache, prompt);
  EXPECT_EQ(table, (std::vector<int32_t>{0, 1, 2}));
  for (int32_t b : table) EXPECT_EQ(alloc.refcount(b), 2);  // the sequence + the cache
  EXPECT_EQ(cache.cached_count(), 3);
  EXPECT_EQ(cache.evictable_count(), 0);

  // The same prompt plus two tokens: 3 full blocks, all cached.
  auto q = prompt;
  q.push_back(7);
  q.push_back(8);
  std::vector<int32_t> t2;
  PrefixCache::Match m = cache.attach(alloc, q, -1, t2);
  EXPECT_EQ(m.blocks, 3);
  EXPECT_EQ(m.evictable, 0);
  EXPECT_EQ(t2, table);
  for (int32_t b : table) EXPECT_EQ(alloc.refcount(b), 3);
  EXPECT_EQ(cache.hits(), 3);
  EXPECT_EQ(cache.queries(), 3);

  // Diverging inside block 1: one hit; max_blocks caps the walk and the query count.
  auto d = prompt;
  d[5] = -1;
  std::vector<int32_t> t3;
  EXPECT_EQ(cache.attach(alloc, d, -1, t3).blocks, 1);
  EXPECT_EQ(t3, (std::vector<int32_t>{0}));
  EXPECT_EQ(cache.match(alloc, prompt, 2).blocks, 2);
  std::vector<int32_t> t4;
  EXPECT_EQ(cache.attach(alloc, prompt, 2, t4).blocks, 2);
  EXPECT_EQ(cache.hits(), 3 + 1 + 2);
  EXPECT_EQ(cache.queries(), 3 + 3 + 2);
  // The same tokens under another parent are not a hit.
  std::vector<int32_t> shifted = {0, 0, 0, 0};
  shifted.insert(shifted.end(), prompt.begin(), prompt.end());
  EXPECT_EQ(cache.match(alloc, shifted, -1).blocks, 0);
  cache.check_invariants(alloc);
}

TEST(PrefixCache, ReleasedBlocksAreEvictedLeastRecentlyUsedFirst) {
  BlockAllocator alloc(6);
  PrefixCache cache({.num_blocks = 6, .block_size = kBs});
  const auto a = iota_tokens(8, 0);    // blocks 0, 1
  const auto b = iota_tokens(8, 500);  // blocks 2, 3
  const auto ta = prefill_and_cache(alloc, cache, a);
  const auto tb = prefill_and_cache(alloc, cache, b);
  // Sequence b finishes first (last block first), then a.
  for (auto it = tb.rbegin(); it != tb.rend(); ++it) cache.release(alloc, *it);
  for (auto it = ta.rbegin(); it != ta.rend(); ++it) cache.release(alloc, *it);
  EXPECT_EQ(cache.evictable_count(), 4);
  EXPECT_EQ(alloc.free_count(), 2);
  for (int32_t blk : {0, 1, 2, 3}) EXPECT_EQ(alloc.refcount(blk), 1);
  // A hit on a's first block takes it out of the LRU and makes it recent again on release.
  std::vector<int32_t> t;
  EXPECT_EQ(cache.attach(alloc, std::vector<int32_t>(a.begin(), a.begin() + 4), -1, t).blocks, 1);
  EXPECT_EQ(alloc.refcount(0), 2);
  EXPECT_EQ(cache.evictable_count(), 3);
  cache.release(alloc, 0);
  cache.check_invariants(alloc);
  // Released in the order 3, 2, 1, 0, then 0 again: eviction takes 3, 2, 1, 0.
  for (int32_t want : {3, 2, 1, 0}) {
    const int32_t free_before = alloc.free_count();
    ASSERT_TRUE(cache.evict_one(alloc));
    EXPECT_EQ(alloc.refcount(want), 0) << "expected block " << want << " evicted";
    EXPECT_EQ(alloc.free_count(), free_before + 1);
    EXPECT_FALSE(cache.cached(want));
    cache.check_invariants(alloc);
  }
  EXPECT_FALSE(cache.evict_one(alloc));
  EXPECT_EQ(alloc.free_count(), 6);
  EXPECT_EQ(cache.match(alloc, a, -1).blocks, 0);
  alloc.check_invariants();
}

// The gateway's view of a cache (P096): every insert and every eviction, by chain hash, only
// while recording; a duplicate insert is no event.
TEST(PrefixCache, EventsNameEveryCachedAndEvictedChainHash) {
  BlockAllocator alloc(4);
  PrefixCache cache({.num_blocks = 4, .block_size = kBs});
  const auto a = iota_tokens(8, 0);
  const uint64_t h0 = PrefixCache::block_hash(PrefixCache::kRootHash, block_of(a, 0));
  const uint64_t h1 = PrefixCache::block_hash(h0, block_of(a, 1));
  prefill_and_cache(alloc, cache, iota_tokens(4, 900));  // before recording: no event
  cache.record_events(true);
  const auto t = prefill_and_cache(alloc, cache, a);
  const int32_t extra = alloc.allocate().value();
  EXPECT_FALSE(cache.insert(alloc, extra, PrefixCache::kRootHash, h0, block_of(a, 0)));
  PrefixCache::Events ev;
  cache.take_events(ev);
  EXPECT_EQ(ev.added, (std::vector<uint64_t>{h0, h1}));
  EXPECT_TRUE(ev.removed.empty());
  cache.take_events(ev);
  EXPECT_TRUE(ev.added.empty());
  // a released last block first: evicted 1 (h1), then 0 (h0); the first block (900..903)
  // is still held.
  cache.release(alloc, t[1]);
  cache.release(alloc, t[0]);
  ASSERT_TRUE(cache.evict_one(alloc));
  ASSERT_TRUE(cache.evict_one(alloc));
  cache.take_events(ev);
  EXPECT_TRUE(ev.added.empty());
  EXPECT_EQ(ev.removed, (std::vector<uint64_t>{h1, h0}));
  cache.record_events(false);
  cache.release(alloc, 0);
  ASSERT_TRUE(cache.evict_one(alloc));
  cache.take_events(ev);
  EXPECT_TRUE(ev.removed.empty());
}

TEST(PrefixCache, BlocksInUseAreNeverEvicted) {
  BlockAllocator alloc(4);
  PrefixCache cache({.num_blocks = 4, .block_size = kBs});
  const auto table = prefill_and_cache(alloc, cache, iota_tokens(8));
  EXPECT_FALSE(cache.evict_one(alloc));
  cache.release(alloc, table[1]);
  ASSERT_TRUE(cache.evict_one(alloc));
  EXPECT_EQ(alloc.refcount(table[1]), 0);
  EXPECT_EQ(alloc.refcount(table[0]), 2);
  EXPECT_FALSE(cache.evict_one(alloc));
}

TEST(PrefixCache, DuplicateContentIsNotCachedTwice) {
  BlockAllocator alloc(4);
  PrefixCache cache({.num_blocks = 4, .block_size = kBs});
  const auto t = iota_tokens(4);
  const uint64_t h = PrefixCache::block_hash(PrefixCache::kRootHash, t);
  const int32_t b0 = alloc.allocate().value(), b1 = alloc.allocate().value();
  EXPECT_TRUE(cache.insert(alloc, b0, PrefixCache::kRootHash, h, t));
  EXPECT_FALSE(cache.insert(alloc, b1, PrefixCache::kRootHash, h, t));      // same content
  EXPECT_FALSE(cache.insert(alloc, b0, PrefixCache::kRootHash, h + 1, t));  // b0 is cached
  EXPECT_EQ(alloc.refcount(b0), 2);
  EXPECT_EQ(alloc.refcount(b1), 1);
  EXPECT_EQ(cache.cached_count(), 1);
  cache.release(alloc, b1);  // not cached: straight back to the free list
  EXPECT_EQ(alloc.refcount(b1), 0);
  EXPECT_EQ(cache.evictable_count(), 0);
  cache.check_invariants(alloc);
}

TEST(PrefixCache, WithMtpAHitOfMBlocksReusesMMinusOne) {
  BlockAllocator alloc(8);
  PrefixCache cache({.num_blocks = 8, .block_size = kBs, .mtp_drop_last_hit = true});
  const auto prompt = iota_tokens(12);
  const auto table = prefill_and_cache(alloc, cache, prompt);
  std::vector<int32_t> t;
  const PrefixCache::Match m = cache.attach(alloc, prompt, -1, t);
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(t, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(m.last_hash, PrefixCache::block_hash(
                             PrefixCache::block_hash(PrefixCache::kRootHash, block_of(prompt, 0)),
                             block_of(prompt, 1)));
  EXPECT_EQ(alloc.refcount(2), 2);  // not attached
  EXPECT_EQ(cache.match(alloc, std::vector<int32_t>(prompt.begin(), prompt.begin() + 4), -1).blocks,
            0);
}

TEST(PrefixCache, WithMtpACappedHitCountsTheBlockAfterTheCap) {
  // Three cached blocks: capped at 2 (or 1), the block after the cap matches, so nothing is
  // dropped, and attaching the count a lookup gave attaches exactly that many (the scheduler
  // looks up, the DP group attaches what it was told).
  BlockAllocator alloc(8);
  PrefixCache cache({.num_blocks = 8, .block_size = kBs, .mtp_drop_last_hit = true});
  const auto prompt = iota_tokens(12);
  prefill_and_cache(alloc, cache, prompt);
  EXPECT_EQ(cache.match(alloc, prompt, 2).blocks, 2);
  EXPECT_EQ(cache.match(alloc, prompt, 1).blocks, 1);
  EXPECT_EQ(cache.match(alloc, prompt, 0).blocks, 0);
  const PrefixCache::Match looked = cache.match(alloc, prompt, 2);
  std::vector<int32_t> t;
  EXPECT_EQ(cache.attach(alloc, prompt, looked.blocks, t).blocks, looked.blocks);
  EXPECT_EQ(t, (std::vector<int32_t>{0, 1}));
  // Only two of the prompt's blocks given: the second has no cached successor in `tokens`.
  EXPECT_EQ(cache.match(alloc, std::vector<int32_t>(prompt.begin(), prompt.begin() + 8), 2).blocks,
            1);
}

TEST(PrefixCache, ManyEntriesSurviveDeletionsInTheTable) {
  // Fill and drain the open-addressing table in an interleaved order (backward-shift deletes).
  const int32_t n = 64;
  BlockAllocator alloc(n);
  PrefixCache cache({.num_blocks = n, .block_size = kBs});
  std::vector<int32_t> blocks;
  for (int32_t i = 0; i < n; ++i) {
    const auto t = iota_tokens(4, i * 10);
    blocks.push_back(alloc.allocate().value());
    ASSERT_TRUE(cache.insert(alloc, blocks.back(), PrefixCache::kRootHash,
                             PrefixCache::block_hash(PrefixCache::kRootHash, t), t));
  }
  for (int32_t i = 0; i < n; i += 2) cache.release(alloc, blocks[i]);
  for (int32_t i = 0; i < n / 2; ++i) ASSERT_TRUE(cache.evict_one(alloc));
  cache.check_invariants(alloc);
  for (int32_t i = 0; i < n; ++i) {
    EXPECT_EQ(cache.match(alloc, iota_tokens(4, i * 10), -1).blocks, i % 2) << i;
  }
}

}  // namespace
}  // namespace xds::engine
