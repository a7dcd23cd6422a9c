// The cooperative prefill scheduler's words and assignment (engine/cooperative_prefill.h):
// every expectation is worked out by hand from the cost rule.
#include "engine/cooperative_prefill.h"

#include <gtest/gtest.h>

#include <vector>

namespace xds::engine {
namespace {

PoolGroupState group(int64_t free_blocks, int64_t queued, std::vector<uint16_t> hits = {}) {
  PoolGroupState s;
  s.highest = 9;
  s.free_blocks = free_blocks;
  s.queued_tokens = queued;
  for (size_t i = 0; i < hits.size(); ++i) s.hits[i] = hits[i];
  return s;
}

TEST(CooperativePrefill, WordsRoundTripEveryField) {
  PoolGroupState s = group(123456, 7890123, {});
  s.highest = 0x0123456789ABCDEFull;
  for (int i = 0; i < kPoolWindow; ++i) s.hits[static_cast<size_t>(i)] = static_cast<uint16_t>(1000 * i + 7);
  const xccl::MailWords w = pack_pool_state(s);
  EXPECT_EQ(w[0], s.highest);
  EXPECT_EQ(w[1], 123456ull | (7890123ull << 32));
  EXPECT_EQ(w[2] & 0xFFFF, 7u);                    // request 0
  EXPECT_EQ((w[5] >> 48) & 0xFFFF, 15007u);        // request 15: word 5, bits 48-63
  const PoolGroupState back = unpack_pool_state(w);
  EXPECT_EQ(back.highest, s.highest);
  EXPECT_EQ(back.free_blocks, s.free_blocks);
  EXPECT_EQ(back.queued_tokens, s.queued_tokens);
  EXPECT_EQ(back.hits, s.hits);
}

TEST(CooperativePrefill, CheapestGroupCountsQueueAndCacheHits) {
  constexpr int64_t kBs = 16;
  // Request 0: 100 tokens, 8 blocks. Group 0 queue 50 -> cost 150; group 1 queue 80 with 4
  // cached blocks (64 tokens) -> 80 + 100 - 64 = 116: group 1.
  // Request 1: 40 tokens, 3 blocks. Group 0: 50 + 40 = 90; group 1 now 80 + 36 = 116 + 40 =
  // 156: group 0.
  // Request 2: 200 tokens, 13 blocks. Group 0: free 20 - 3 = 17 >= 13, cost 90 + 200 = 290;
  // group 1: free 10 - (8 - 4) = 6 < 13: skipped. Group 0.
  const std::vector<PoolRequest> pending = {{1, 100, 8}, {2, 40, 3}, {3, 200, 13}};
  const std::vector<PoolGroupState> groups = {group(20, 50), group(10, 80, {4})};
  EXPECT_EQ(assign_pooled(pending, groups, kBs), (std::vector<int>{1, 0, 0}));
}

TEST(CooperativePrefill, EqualCostsGoToTheLowerRankAndTheFirstMisfitStops) {
  constexpr int64_t kBs = 16;
  const std::vector<PoolGroupState> groups = {group(4, 0), group(4, 0)};
  // Request 0 (2 blocks) -> rank 0 (tie); request 1 (3 blocks): rank 0 has 2 left, rank 1 has
  // 4 -> rank 1; request 2 (4 blocks): nobody has 4 -> stops; request 3 (1 block) would fit
  // but waits behind it.
  const std::vector<PoolRequest> pending = {{1, 20, 2}, {2, 40, 3}, {3, 60, 4}, {4, 5, 1}};
  EXPECT_EQ(assign_pooled(pending, groups, kBs), (std::vector<int>{0, 1, -1, -1}));
}

}  // namespace
}  // namespace xds::engine
