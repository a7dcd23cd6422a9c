// KV bookkeeping: reservations, prefix hits across sequences, eviction under pressure, fork
// with copy on write, rollback, and a randomised run of every operation that checks after
// each step that every reference is accounted for (free + used + cached == total).
#include "engine/kv_manager.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

namespace xds::engine {
namespace {

constexpr int64_t kBs = 4;

KvManager make(int32_t blocks, bool cache = true, bool mtp = false) {
  auto r = KvManager::create(
      {.num_blocks = blocks, .block_size = kBs, .prefix_cache = cache, .mtp_drop_last_hit = mtp});
  EXPECT_TRUE(r.ok());
  return std::move(r).value();
}

std::vector<int32_t> tokens(int32_t n, int32_t first = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence that prefilled `t` (reserve + commit).
int64_t prefilled(KvManager& kv, const std::vector<int32_t>& t) {
  const int64_t s = kv.add_sequence();
  EXPECT_TRUE(kv.reserve(s, static_cast<int64_t>(t.size())).ok());
  EXPECT_TRUE(kv.commit(s, t).ok());
  return s;
}

TEST(KvManager, ReserveAndUsage) {
  KvManager kv = make(10);
  const int64_t s = kv.add_sequence();
  kv.expect(s, 20);  // 5 blocks expected
  ASSERT_TRUE(kv.reserve(s, 10).ok());
  EXPECT_EQ(kv.table(s).size(), 3u);
  EXPECT_EQ(kv.capacity(s), 12);
  ASSERT_TRUE(kv.reserve(s, 12).ok());  // within capacity: nothing new
  EXPECT_EQ(kv.table(s).size(), 3u);
  KvUsage u = kv.usage();
  EXPECT_EQ(u.total, 10);
  EXPECT_EQ(u.used, 3);
  EXPECT_EQ(u.free, 7);
  EXPECT_EQ(u.cached, 0);
  EXPECT_EQ(u.reserved, 2);
  const Status st = kv.reserve(s, 100);  // 25 blocks: 22 more, 7 available
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("sequence 0 needs 22 more"), std::string::npos) << st.message();
  EXPECT_EQ(kv.table(s).size(), 3u);
  kv.free(s);
  u = kv.usage();
  EXPECT_EQ(u.free, 10);
  EXPECT_EQ(u.reserved, 0);
  kv.check_invariants();
  EXPECT_FALSE(KvManager::create({.num_blocks = 4, .block_size = 0}).ok());
}

TEST(KvManager, ASecondRequestHitsTheFirstOnesPrompt) {
  KvManager kv = make(10);
  const auto prompt = tokens(10);  // 2 full blocks + 2 tokens
  const int64_t a = prefilled(kv, prompt);
  const std::vector<int32_t> a_blocks(kv.table(a).begin(), kv.table(a).end());
  EXPECT_EQ(kv.prefix_cache().cached_count(), 2);
  kv.free(a);
  KvUsage u = kv.usage();
  EXPECT_EQ(u.cached, 2);  // the two full blocks stay, held by the cache only
  EXPECT_EQ(u.free, 8);
  EXPECT_EQ(u.used, 0);

  const int64_t b = kv.add_sequence();
  const PrefixCache::Match m = kv.match_prefix(prompt, (10 - 1) / kBs);
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(m.evictable, 2);
  EXPECT_EQ(kv.attach_prefix(b, prompt, (10 - 1) / kBs), 8);
  EXPECT_EQ(kv.length(b), 8);
  EXPECT_EQ(kv.table(b)[0], a_blocks[0]);
  EXPECT_EQ(kv.table(b)[1], a_blocks[1]);
  ASSERT_TRUE(kv.reserve(b, 10).ok());
  ASSERT_TRUE(kv.commit(b, prompt).ok());
  u = kv.usage();
  EXPECT_EQ(u.used, 3);
  EXPECT_EQ(u.cached, 0);
  EXPECT_EQ(kv.prefix_cache().hits(), 2);
  EXPECT_EQ(kv.prefix_cache().queries(), 2);
  kv.check_invariants();
}

TEST(KvManager, ARetiredBlockLeavesTheCacheAndIsNeverUsedAgain) {
  KvManager kv = make(6);
  const auto prompt = tokens(10);  // 2 full blocks (cached) + 2 tokens
  const int64_t a = prefilled(kv, prompt);
  const std::vector<int32_t> a_blocks(kv.table(a).begin(), kv.table(a).end());
  EXPECT_FALSE(kv.holds_retired(a));
  kv.retire(std::vector<int32_t>{a_blocks[0]});
  EXPECT_TRUE(kv.holds_retired(a));
  EXPECT_EQ(kv.prefix_cache().cached_count(), 1);  // block 1 stays cached
  EXPECT_EQ(kv.usage().retired, 1);
  kv.check_invariants();
  kv.free(a);
  // The prompt no longer hits: its chain starts with the retired block.
  EXPECT_EQ(kv.match_prefix(prompt, -1).blocks, 0);
  KvUsage u = kv.usage();
  EXPECT_EQ(u.free + u.cached + u.retired, 6);
  // Every block a pool of 6 can still give, none of them the retired one.
  const int64_t b = kv.add_sequence();
  ASSERT_TRUE(kv.reserve(b, 5 * kBs).ok());
  for (const int32_t blk : kv.table(b)) EXPECT_NE(blk, a_blocks[0]);
  EXPECT_FALSE(kv.reserve(b, 6 * kBs).ok());
  kv.check_invariants();
}

TEST(KvManager, PressureEvictsCachedBlocksOldestFirst) {
  KvManager kv = make(6);
  const int64_t a = prefilled(kv, tokens(8, 100));  // blocks 0, 1
  const int64_t b = prefilled(kv, tokens(8, 200));  // blocks 2, 3
  kv.free(a);
  kv.free(b);
  EXPECT_EQ(kv.usage().cached, 4);
  EXPECT_EQ(kv.available(), 6);
  // 3 blocks: 2 free + the least recently released cached block (a's, block 0 or 1: a's
  // blocks went back first, its last block first -> block 1).
  const int64_t c = kv.add_sequence();
  ASSERT_TRUE(kv.reserve(c, 12).ok());
  EXPECT_EQ(kv.prefix_cache().cached_count(), 3);
  EXPECT_FALSE(kv.prefix_cache().cached(1));
  EXPECT_TRUE(kv.prefix_cache().cached(0));
  // a's chain is broken after block 0: a hit of 1 block now.
  EXPECT_EQ(kv.match_prefix(tokens(8, 100), -1).blocks, 1);
  EXPECT_EQ(kv.match_prefix(tokens(8, 200), -1).blocks, 2);
  // Asking for more than free + evictable changes nothing.
  const int64_t d = kv.add_sequence();
  EXPECT_FALSE(kv.reserve(d, 16).ok());  // 4 > 3
  EXPECT_EQ(kv.prefix_cache().cached_count(), 3);
  ASSERT_TRUE(kv.reserve(d, 12).ok());  // evicts everything left
  EXPECT_EQ(kv.usage().cached, 0);
  EXPECT_EQ(kv.usage().free, 0);
  kv.check_invariants();
}

TEST(KvManager, ForkSharesFullBlocksAndCopiesThePartialOne) {
  KvManager kv = make(8);
  const auto prompt = tokens(10);
  const int64_t p = prefilled(kv, prompt);  // blocks 0, 1 full (cached), 2 partial
  std::vector<BlockCopy> copies;
  auto child = kv.fork(p, copies);
  ASSERT_TRUE(child.ok());
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, kv.table(p)[2]);
  const auto ct = kv.table(*child);
  ASSERT_EQ(ct.size(), 3u);
  EXPECT_EQ(ct[0], kv.table(p)[0]);
  EXPECT_EQ(ct[1], kv.table(p)[1]);
  EXPECT_EQ(ct[2], copies[0].dst);
  EXPECT_NE(ct[2], kv.table(p)[2]);
  EXPECT_EQ(kv.allocator().refcount(ct[0]), 3);  // parent, child, cache
  EXPECT_EQ(kv.allocator().refcount(ct[2]), 1);
  EXPECT_TRUE(kv.allocator().writable(ct[2]));
  EXPECT_TRUE(kv.allocator().writable(kv.table(p)[2]));
  EXPECT_EQ(kv.length(*child), 10);
  // Both decode on their own: the child's next full block is its own.
  ASSERT_TRUE(kv.reserve(*child, 12).ok());
  auto ctoks = prompt;
  ctoks.push_back(77);
  ctoks.push_back(78);
  ASSERT_TRUE(kv.commit(*child, ctoks).ok());
  EXPECT_TRUE(kv.prefix_cache().cached(ct[2]));
  kv.check_invariants();
  // At a block boundary nothing is copied.
  const int64_t q = prefilled(kv, tokens(8, 300));
  copies.clear();
  auto c2 = kv.fork(q, copies);
  ASSERT_TRUE(c2.ok());
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(kv.table(*c2).size(), 2u);
  kv.check_invariants();
  // No block for the copy: an error, and nothing changed.
  KvManager full = make(3);
  const int64_t r = prefilled(full, tokens(10));
  copies.clear();
  auto c3 = full.fork(r, copies);
  EXPECT_EQ(c3.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(copies.empty());
  full.check_invariants();
}

TEST(KvManager, TruncateGivesBackLookaheadBlocks) {
  KvManager kv = make(8);
  const int64_t s = kv.add_sequence();
  ASSERT_TRUE(kv.reserve(s, 20).ok());  // 5 blocks
  ASSERT_TRUE(kv.commit(s, tokens(9)).ok());
  ASSERT_TRUE(kv.truncate(s, 9).ok());
  EXPECT_EQ(kv.table(s).size(), 3u);
  EXPECT_EQ(kv.usage().free, 5);
  EXPECT_FALSE(kv.truncate(s, 5).ok());         // below the committed length
  EXPECT_FALSE(kv.commit(s, tokens(8)).ok());   // shrinking
  EXPECT_FALSE(kv.commit(s, tokens(13)).ok());  // past the capacity (12)
  kv.check_invariants();
}

TEST(KvManager, WithoutPrefixCacheNothingIsCached) {
  KvManager kv = make(6, /*cache=*/false);
  const int64_t a = prefilled(kv, tokens(8));
  kv.free(a);
  EXPECT_EQ(kv.usage().free, 6);
  const int64_t b = kv.add_sequence();
  EXPECT_EQ(kv.attach_prefix(b, tokens(8), -1), 0);
  EXPECT_EQ(kv.match_prefix(tokens(8), -1).blocks, 0);
  kv.check_invariants();
}

TEST(KvManager, WithMtpAHitReusesOneBlockFewer) {
  KvManager kv = make(8, true, /*mtp=*/true);
  kv.free(prefilled(kv, tokens(13)));  // 3 full blocks cached
  const int64_t b = kv.add_sequence();
  EXPECT_EQ(kv.attach_prefix(b, tokens(13), -1), 2 * kBs);
  ASSERT_TRUE(kv.reserve(b, 13).ok());
  ASSERT_TRUE(kv.commit(b, tokens(13)).ok());  // block 2 recomputed; its hash is cached already
  kv.check_invariants();
}

// Random operations on a few sequences whose prompts share prefixes; after each, every
// reference is accounted for. At the end, everything freed and evicted returns the pool.
TEST(KvManager, NoLeakAfterRandomOperations) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::mt19937 gen(seed);
    auto uni = [&](int64_t lo, int64_t hi) {
      return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
    };
    KvManager kv = make(static_cast<int32_t>(uni(4, 40)), uni(0, 4) != 0, uni(0, 1) == 1);
    std::map<int64_t, std::vector<int32_t>> toks;  // seq -> its tokens (committed + pending)
    const std::vector<std::vector<int32_t>> systems = {tokens(9, 1), tokens(13, 50), tokens(4, 90)};
    for (int step = 0; step < 400; ++step) {
      const int64_t op = uni(0, 6);
      if (op == 0 || toks.empty()) {  // a new request: system prompt + a tail, hits attached
        auto t = systems[static_cast<size_t>(uni(0, 2))];
        for (int64_t i = uni(0, 10); i > 0; --i) t.push_back(static_cast<int32_t>(uni(0, 3)));
        const int64_t s = kv.add_sequence();
        const int64_t hit = kv.attach_prefix(s, t, (static_cast<int64_t>(t.size()) - 1) / kBs);
        ASSERT_EQ(hit % kBs, 0);
        toks[s] = t;
        if (kv.reserve(s, static_cast<int64_t>(t.size())).ok()) {
          ASSERT_TRUE(kv.commit(s, t).ok());
        }
      } else {
        auto it = toks.begin();
        std::advance(it, uni(0, static_cast<int64_t>(toks.size()) - 1));
        const int64_t s = it->first;
        auto& t = it->second;
        if (op == 1) {
          kv.free(s);
          toks.erase(it);
        } else if (op == 2 || op == 3) {  // decode 1..3 tokens with lookahead, commit, roll back
          const int64_t len = kv.length(s);
          const int64_t k = uni(0, 2);
          if (kv.reserve(s, len + 1 + k).ok()) {
            t.resize(static_cast<size_t>(len));
            for (int64_t i = uni(1, 1 + k); i > 0; --i)
              t.push_back(static_cast<int32_t>(uni(0, 3)));
            ASSERT_TRUE(kv.commit(s, t).ok());
            ASSERT_TRUE(kv.truncate(s, static_cast<int64_t>(t.size())).ok());
          }
        } else if (op == 4) {
          std::vector<BlockCopy> copies;
          auto c = kv.fork(s, copies);
          if (c.ok()) {
            toks[*c] = std::vector<int32_t>(t.begin(), t.begin() + kv.length(s));
            for (const BlockCopy& bc : copies) {
              ASSERT_TRUE(kv.allocator().writable(bc.dst));
              ASSERT_NE(bc.src, bc.dst);
            }
          }
        } else if (op == 5) {  // a failed prefill frees and retries later: just free here
          if (kv.length(s) < static_cast<int64_t>(t.size())) {
            kv.free(s);
            toks.erase(it);
          }
        } else {
          kv.check_invariants();
        }
      }
      kv.check_invariants();
      const KvUsage u = kv.usage();
      ASSERT_EQ(u.free + u.used + u.cached, u.total);
      ASSERT_GE(u.free, 0);
      ASSERT_GE(u.used, 0);
    }
    for (const auto& [s, t] : toks) kv.free(s);
    kv.check_invariants();
    KvUsage u = kv.usage();
    EXPECT_EQ(u.used, 0) << "seed " << seed;
    EXPECT_EQ(u.free + u.cached, u.total);
    // Evicting everything returns the whole pool.
    const int64_t s = kv.add_sequence();
    ASSERT_TRUE(kv.reserve(s, u.total * kBs).ok());
    kv.free(s);
    EXPECT_EQ(kv.usage().free, u.total);
    kv.check_invariants();
  }
}

}  // namespace
}  // namespace xds::engine
