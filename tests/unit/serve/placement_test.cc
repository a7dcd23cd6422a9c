// P059's placement rule on hand-derived cases (the expected group is worked out in the
// comments from the rule's text, not from the code).
#include "serve/placement.h"

#include <gtest/gtest.h>

#include <cmath>

#include <vector>

namespace xds::serve {
namespace {

engine::GroupLoad load(int32_t group, int64_t used, int64_t reserved, int64_t total = 100) {
  engine::GroupLoad g;
  g.group = group;
  g.running = 1;
  g.waiting = 0;
  g.max_num_seqs = 8;
  g.kv_blocks_total = total;
  g.kv_blocks_used = used;
  g.kv_blocks_reserved = reserved;
  g.block_size = 16;
  return g;
}

PlacementDecision place(const std::vector<engine::GroupLoad>& loads, int64_t prompt,
                        int64_t max_tokens) {
  auto r = place_request(loads, {.prompt_tokens = prompt, .max_tokens = max_tokens});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : PlacementDecision{};
}

TEST(Placement, BlocksRoundUp) {
  EXPECT_EQ(placement_blocks({.prompt_tokens = 0, .max_tokens = 0}, 16), 0);
  EXPECT_EQ(placement_blocks({.prompt_tokens = 16, .max_tokens = 0}, 16), 1);
  EXPECT_EQ(placement_blocks({.prompt_tokens = 17, .max_tokens = 0}, 16), 2);
  EXPECT_EQ(placement_blocks({.prompt_tokens = 100, .max_tokens = 60}, 16), 10);
}

TEST(Placement, LowestUsageCountingReservedKv) {
  // need = ceil(160 / 16) = 10. After placing: g0 50+10+10 = 70, g1 20+30+10 = 60,
  // g2 45+0+10 = 55 -> g2. Without the reserved blocks g1 would look emptiest.
  const std::vector loads = {load(0, 50, 10), load(1, 20, 30), load(2, 45, 0)};
  const PlacementDecision d = place(loads, 100, 60);
  EXPECT_EQ(d.index, 2);
  EXPECT_EQ(d.group, 2);
}

TEST(Placement, SkipsGroupsAtTheirBatchLimit) {
  // g1 is emptiest (5 blocks) but running 6 + waiting 2 >= 8 -> skipped; g0 (40) beats g2 (41).
  std::vector loads = {load(0, 30, 0), load(1, 5, 0), load(2, 31, 0)};
  loads[1].running = 6;
  loads[1].waiting = 2;
  EXPECT_EQ(place(loads, 100, 60).group, 0);
  loads[1].waiting = 1;  // 7 < 8: eligible again
  EXPECT_EQ(place(loads, 100, 60).group, 1);
}

TEST(Placement, TiesGoToTheLowestGroupId) {
  // Both at 30 + 10 = 40 of 100; group 1 is listed second but has the lower id.
  const std::vector loads = {load(3, 20, 10), load(1, 10, 20)};
  const PlacementDecision d = place(loads, 100, 60);
  EXPECT_EQ(d.group, 1);
  EXPECT_EQ(d.index, 1);
}

TEST(Placement, UsageIsAFractionOfEachGroupsTotal) {
  // g0: (100 + 10) / 200 = 0.55; g1: (10 + 10) / 50 = 0.40 -> g1, though it has fewer free
  // blocks (30 against 90).
  EXPECT_EQ(place({load(0, 100, 0, 200), load(1, 10, 0, 50)}, 100, 60).group, 1);
  // g0: (40 + 10) / 100 = 0.5, g1: (90 + 10) / 200 = 0.5: an exact tie -> g0.
  EXPECT_EQ(place({load(1, 90, 0, 200), load(0, 40, 0, 100)}, 100, 60).group, 0);
}

TEST(Placement, WaitsWhenNothingFits) {
  // need 10: g0 has 95 + 0 + 10 = 105 > 100; g1 is at its batch limit; g2 has no KV at all.
  std::vector loads = {load(0, 95, 0), load(1, 0, 0), load(2, 0, 0, 0)};
  loads[1].running = 8;
  EXPECT_TRUE(place(loads, 100, 60).wait());
  EXPECT_TRUE(place({}, 1, 1).wait());
  // Exactly full fits: 90 + 0 + 10 = 100.
  loads[0].kv_blocks_used = 90;
  EXPECT_EQ(place(loads, 100, 60).group, 0);
}

TEST(Placement, AccountingSpreadsRequestsAndThenWaits) {
  // Two empty groups of 100 blocks; each request needs ceil(960 / 16) = 60 blocks.
  std::vector loads = {load(0, 0, 0), load(1, 0, 0)};
  const PlacementRequest req{.prompt_tokens = 900, .max_tokens = 60};
  std::vector<int32_t> groups;
  for (int i = 0; i < 3; ++i) {
    auto d = place_request(loads, req);
    ASSERT_TRUE(d.ok());
    groups.push_back(d->group);
    if (!d->wait()) account_placement(loads[static_cast<size_t>(d->index)], req);
  }
  EXPECT_EQ(groups, (std::vector<int32_t>{0, 1, -1}));
  EXPECT_EQ(loads[0].kv_blocks_reserved, 60);
  EXPECT_EQ(loads[0].waiting, 1);
}

TEST(Placement, ReserveRatioCountsAShareOfTheKvToCome) {
  // One group of 100 blocks, 40 used, 30 reserved; a request of 160 prompt + 480 output tokens.
  std::vector loads = {load(0, 40, 30)};
  const PlacementRequest req{.prompt_tokens = 160, .max_tokens = 480};
  // Ratio 1: 40 + 30 + ceil(640 / 16) = 110 > 100: wait.
  EXPECT_TRUE(place_request(loads, req)->wait());
  // Ratio 0.5: 40 + ceil(30 x 0.5) = 15 + ceil((160 + 240) / 16) = 25 -> 80 <= 100: placed.
  EXPECT_EQ(place_request(loads, req, {.reserve_ratio = 0.5})->group, 0);
  EXPECT_EQ(placement_blocks(req, 16, 0.5), 25);
  // Ratio 0.25: 120 output tokens -> ceil(280 / 16) = 18.
  EXPECT_EQ(placement_blocks(req, 16, 0.25), 18);
  // Outside (0, 1]: an error naming the ratio.
  for (double bad : {0.0, -0.5, 1.5, std::nan("")}) {
    auto r = place_request(loads, req, {.reserve_ratio = bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("reserve_ratio"), std::string::npos);
  }
}

TEST(Placement, BadInputIsAnError) {
  EXPECT_FALSE(place_request({}, {.prompt_tokens = -1, .max_tokens = 1}).ok());
  std::vector loads = {load(4, 0, 0)};
  loads[0].block_size = 0;
  auto r = place_request(loads, {.prompt_tokens = 1, .max_tokens = 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("group 4"), std::string::npos);
}

}  // namespace
}  // namespace xds::serve
