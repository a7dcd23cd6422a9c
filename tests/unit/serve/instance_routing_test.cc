// The gateway's instance choice (serve/instance_routing.h): each case is worked out by hand
// from the three rules, and the prompt hashes are checked against the prefix cache's own
// chain (a second computation: the cache's insert and match).
#include "serve/instance_routing.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/prefix_cache.h"
#include "model/block_allocator.h"

namespace xds::serve {
namespace {

InstanceCandidate cand(int32_t index, double load, int64_t hits = 0, int32_t long_inflight = 0,
                       int32_t short_inflight = 0) {
  return {index, load, hits, long_inflight, short_inflight};
}

TEST(InstanceRouting, LeastLoadedWithoutHitsAndLowerIndexOnTies) {
  const InstanceRoutingPolicy p;
  EXPECT_EQ(route_to_instance({}, 10, p), -1);
  const std::vector<InstanceCandidate> c = {cand(0, 3), cand(1, 1), cand(2, 1)};
  EXPECT_EQ(route_to_instance(c, 10, p), 1);
}

TEST(InstanceRouting, TheLongestCachedPrefixWinsWithinTheBalanceThreshold) {
  InstanceRoutingPolicy p;
  p.balance_threshold = 2.0;
  // Least loaded is 0 (load 1): 1 (load 3, 4 blocks) is within 1 + 2; 2 (load 2, 4 blocks)
  // ties on hits and is less loaded.
  std::vector<InstanceCandidate> c = {cand(0, 1), cand(1, 3, 4), cand(2, 2, 4)};
  EXPECT_EQ(route_to_instance(c, 100, p), 2);
  // More hits beat less load within the threshold.
  c = {cand(0, 1), cand(1, 3, 5), cand(2, 2, 4)};
  EXPECT_EQ(route_to_instance(c, 100, p), 1);
  // Past the threshold the hit does not count: 3.5 > 1 + 2.
  c = {cand(0, 1), cand(1, 3.5, 9)};
  EXPECT_EQ(route_to_instance(c, 100, p), 0);
}

TEST(InstanceRouting, ShortAndLongPromptsKeepApartWhileTheyCan) {
  InstanceRoutingPolicy p;
  p.long_prompt_tokens = 1000;
  // A short prompt avoids 0 (prefilling a long one) even though 0 is idle and cached it.
  std::vector<InstanceCandidate> c = {cand(0, 0, 3, /*long=*/1), cand(1, 2)};
  EXPECT_EQ(route_to_instance(c, 100, p), 1);
  // A long prompt avoids 1 (prefilling short ones) and goes to 0.
  c = {cand(0, 2, 0, 1, 0), cand(1, 0, 0, 0, 2)};
  EXPECT_EQ(route_to_instance(c, 5000, p), 0);
  // When every candidate holds the other kind, the rules run over all of them.
  c = {cand(0, 2, 0, 1), cand(1, 1, 0, 1)};
  EXPECT_EQ(route_to_instance(c, 100, p), 1);
}

TEST(InstanceRouting, PromptHashesAreThePrefixCacheChain) {
  constexpr int64_t kBs = 4;
  std::vector<int32_t> prompt(11);
  std::iota(prompt.begin(), prompt.end(), 7);
  const std::vector<uint64_t> chain = prompt_block_hashes(prompt, kBs);
  ASSERT_EQ(chain.size(), 2u);  // 11 tokens: two full blocks
  // The cache's own chain: insert the two blocks under their hashes, match finds both.
  BlockAllocator alloc(4);
  engine::PrefixCache cache({.num_blocks = 4, .block_size = kBs});
  uint64_t parent = engine::PrefixCache::kRootHash;
  for (size_t i = 0; i < 2; ++i) {
    const int32_t b = alloc.allocate().value();
    ASSERT_TRUE(cache.insert(alloc, b, parent, chain[i],
                             std::span<const int32_t>(prompt).subspan(i * kBs, kBs)));
    parent = chain[i];
  }
  EXPECT_EQ(cache.match(alloc, prompt, -1).blocks, 2);
  EXPECT_EQ(cache.match(alloc, prompt, -1).last_hash, chain[1]);

  std::unordered_map<uint64_t, int32_t> cached = {{chain[0], 1}};
  EXPECT_EQ(leading_hits(chain, cached), 1);
  cached[chain[1]] = 2;
  EXPECT_EQ(leading_hits(chain, cached), 2);
  cached[chain[0]] = 0;  // evicted everywhere: the chain breaks at its first block
  EXPECT_EQ(leading_hits(chain, cached), 0);
}

}  // namespace
}  // namespace xds::serve
