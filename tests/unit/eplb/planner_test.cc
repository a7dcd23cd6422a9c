// The EPLB planner against cases worked out by hand from the rules in eplb/planner.h; the
// expert map (plan_slots), the row spread and the load prediction likewise.
#include "eplb/planner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace xds::eplb {
namespace {

LayerCounts make_counts(int layer, const std::vector<std::vector<double>>& rows) {
  LayerCounts c;
  c.layer = layer;
  c.n_slices = static_cast<int>(rows.size());
  for (const auto& r : rows) c.counts.insert(c.counts.end(), r.begin(), r.end());
  return c;
}

PlanParams make_params(int e, int n, int s, std::optional<int64_t> budget = std::nullopt) {
  PlanParams p;
  p.shape = {e, n, s};
  p.budget = budget;
  return p;
}

std::vector<std::pair<int, int>> pairs(const std::vector<Placement>& placement) {
  std::vector<std::pair<int, int>> out;
  for (const Placement& p : placement) out.emplace_back(p.expert, p.device);
  return out;
}

using Pairs = std::vector<std::pair<int, int>>;

TEST(Planner, SingleHotExpertTakesEveryDevice) {
  // E = 4, N = 4 (one primary per device), S = 1, R = N·S = 4; one slice [12, 3, 2, 1].
  // tail_before = 12.
  // Round 1: argmax 0 -> {0}; trial col 0 = 12/2 = 6 -> max(6,3,2,1) = 6. Pick 0, copies 2.
  // Round 2: argmax 0 (6) -> {0}; 12/3 = 4 -> max(4,3,2,1) = 4. Pick 0, copies 3.
  // Round 3: argmax 0 (4) -> {0}; 12/4 = 3 -> max(3,3,2,1) = 3. Pick 0, copies 4.
  // Round 4: sim [3,3,2,1]: argmax is 0 (tie with 1, lowest e); copies[0] = 4 = N, so it
  //   is removed and expert 1 is NOT considered: no candidates, stop. tail_after = 3.
  // Placement: total [12,3,2,1], copies [4,1,1,1], share [3,3,2,1]; loads d0..d3 = 3,3,2,1.
  //   Replica 1 of e0: eligible d1 (3), d2 (2), d3 (1) -> d3, load 4.
  //   Replica 2: d1 (3), d2 (2) -> d2, load 5. Replica 3: d1 -> load 6.
  auto plan = plan_layer(make_params(4, 4, 1), make_counts(7, {{12, 3, 2, 1}}));
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->layer, 7);
  EXPECT_EQ(plan->replicas, (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(plan->tail_before, 12.0);
  EXPECT_EQ(plan->tail_after, 3.0);
  EXPECT_EQ(pairs(plan->placement), (Pairs{{0, 3}, {0, 2}, {0, 1}}));
  EXPECT_TRUE(plan->dropped.empty());

  // Predicted loads, all four copies of e0 placed (share 12/4 = 3):
  // d0 = 3, d1 = 3 + 3 = 6, d2 = 2 + 3 = 5, d3 = 1 + 3 = 4; max 6, mean 18 / 4 = 4.5.
  auto load = predict_load({4, 4, 1}, make_counts(7, {{12, 3, 2, 1}}), *plan);
  ASSERT_TRUE(load.ok()) << load.status().to_string();
  EXPECT_EQ(load->device_load, (std::vector<double>{3, 6, 5, 4}));
  EXPECT_EQ(load->max, 6.0);
  EXPECT_EQ(load->mean, 4.5);
}

TEST(Planner, TwoSlicesWithDifferentHotExperts) {
  // E = 4, N = 2 (d0: e0 e1, d1: e2 e3), S = 1, R = 2.
  // slices [10, 1, 1, 2] and [1, 2, 9, 1]; tail_before = 10 + 9 = 19.
  // Round 1: argmax 0 and 2 -> {0, 2}.
  //   tail(0): col 0 -> 5, .5: max(5,1,1,2) + max(.5,2,9,1) = 5 + 9 = 14.
  //   tail(2): col 2 -> .5, 4.5: max(10,1,.5,2) + max(1,2,4.5,1) = 10 + 4.5 = 14.5.
  //   Pick 0 (14); sim = [5,1,1,2], [.5,2,9,1].
  // Round 2: argmax 0 and 2; copies[0] = 2 = N -> {2}.
  //   tail(2) = max(5,1,.5,2) + max(.5,2,4.5,1) = 5 + 4.5 = 9.5. Pick 2. tail_after 9.5.
  // Placement: total [11,3,10,3], copies [2,1,2,1], share [5.5,3,5,3]; d0 = 8.5, d1 = 8.
  //   By total: e0 (11) then e2 (10). e0: d0 holds it -> d1 (13.5, full).
  //   e2: d1 holds it and is full -> d0.
  const LayerCounts counts = make_counts(1, {{10, 1, 1, 2}, {1, 2, 9, 1}});
  auto plan = plan_layer(make_params(4, 2, 1), counts);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->replicas, (std::vector<int>{0, 2}));
  EXPECT_EQ(plan->tail_before, 19.0);
  EXPECT_EQ(plan->tail_after, 9.5);
  EXPECT_EQ(pairs(plan->placement), (Pairs{{0, 1}, {2, 0}}));
  EXPECT_TRUE(plan->dropped.empty());

  // With a budget of 1 only round 1 runs: tail_after 14, e0 -> d1.
  auto one = plan_layer(make_params(4, 2, 1, 1), counts);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->replicas, (std::vector<int>{0}));
  EXPECT_EQ(one->tail_after, 14.0);
  EXPECT_EQ(pairs(one->placement), (Pairs{{0, 1}}));

  // A budget of 0: nothing selected, tail unchanged.
  auto none = plan_layer(make_params(4, 2, 1, 0), counts);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->replicas.empty());
  EXPECT_EQ(none->tail_after, 19.0);
}

TEST(Planner, ArgmaxTieAndAReplicaWithNoEligibleDevice) {
  // E = 4, N = 2, S = 1, R = 2; one slice [5, 5, 1, 1]; tail_before 5.
  // Round 1: argmax tie 0/1 -> 0; {0}: tail(0) = max(2.5,5,1,1) = 5. Pick 0.
  // Round 2: sim [2.5,5,1,1]: argmax 1 -> {1}: tail(1) = max(2.5,2.5,1,1) = 2.5. Pick 1.
  // Placement: total [5,5,1,1], copies [2,2,1,1], share [2.5,2.5,1,1]; d0 = 5, d1 = 2.
  //   By total, ties by id: e0 then e1. e0: d0 holds it -> d1 (full after).
  //   e1: d0 holds it, d1 is full -> dropped.
  const LayerCounts counts = make_counts(0, {{5, 5, 1, 1}});
  auto plan = plan_layer(make_params(4, 2, 1), counts);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->replicas, (std::vector<int>{0, 1}));
  EXPECT_EQ(plan->tail_before, 5.0);
  EXPECT_EQ(plan->tail_after, 2.5);
  EXPECT_EQ(pairs(plan->placement), (Pairs{{0, 1}}));
  EXPECT_EQ(plan->dropped, (std::vector<int>{1}));

  // The prediction counts only placed copies: e0 has 2 (share 2.5), e1 one (share 5).
  // d0 = 2.5 + 5 = 7.5, d1 = 1 + 1 + 2.5 = 4.5.
  auto load = predict_load({4, 2, 1}, counts, *plan);
  ASSERT_TRUE(load.ok()) << load.status().to_string();
  EXPECT_EQ(load->device_load, (std::vector<double>{7.5, 4.5}));
  EXPECT_EQ(load->max, 7.5);
  EXPECT_EQ(load->mean, 6.0);
}

TEST(Planner, EqualTailsGoToTheLowestId) {
  // E = 4, N = 2, S = 2, R = 1; slices [6,0,0,0] and [0,0,6,0]; tail_before 12.
  // Candidates {0, 2}: tail(0) = 3 + 6 = 9, tail(2) = 6 + 3 = 9: tie -> 0.
  // Placement: share [3,0,6,0]; d0 = 3, d1 = 6; e0's only eligible device is d1.
  auto plan = plan_layer(make_params(4, 2, 2, 1), make_counts(0, {{6, 0, 0, 0}, {0, 0, 6, 0}}));
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->replicas, (std::vector<int>{0}));
  EXPECT_EQ(plan->tail_after, 9.0);
  EXPECT_EQ(pairs(plan->placement), (Pairs{{0, 1}}));
}

TEST(Planner, EqualDeviceLoadsGoToTheLowestDevice) {
  // E = 6, N = 3 (d0: e0 e1, d1: e2 e3, d2: e4 e5), S = 1, R = 1; one slice
  // [9,1,1,1,1,1]. Pick 0 (tail 4.5). share [4.5,1,1,1,1,1]: d0 = 5.5, d1 = 2, d2 = 2.
  // e0 -> d1 (tie with d2, lowest id).
  auto plan = plan_layer(make_params(6, 3, 1, 1), make_counts(0, {{9, 1, 1, 1, 1, 1}}));
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->replicas, (std::vector<int>{0}));
  EXPECT_EQ(plan->tail_after, 4.5);
  EXPECT_EQ(pairs(plan->placement), (Pairs{{0, 1}}));
}

// E = 4, N = 2, S = 2; slices [0,2,6,0], [3,2,0,0], [3,2,0,0]; tail_before 6 + 3 + 3 = 12.
// Round 1: argmax 2, 0, 0 -> {0, 2}.
//   tail(0): col 0 -> 0, 1.5, 1.5: 6 + 2 + 2 = 10. tail(2): col 2 -> 3, 0, 0: 3 + 3 + 3 = 9.
//   Pick 2 (copies 2 = N).
// Round 2: argmax 2, 0, 0; 2 is full -> {0}: col 0 -> 0, 1.5, 1.5: 3 + 2 + 2 = 7. Pick 0.
// Round 3: sim [0,2,3,0], [1.5,2,0,0], [1.5,2,0,0]: argmax 2, 1, 1 -> {1}:
//   col 1 -> 1, 1, 1: 3 + 1.5 + 1.5 = 6. Pick 1.
// Round 4: sim [0,1,3,0], [1.5,1,0,0], [1.5,1,0,0]: argmax 2, 0, 0, both full: stop.
// replicas [2, 0, 1], tail_after 6.
// Placement: total [6,6,6,0], copies [2,2,2,1], share [3,3,3,0]; d0 = 6, d1 = 3.
//   Order by total, ties by id: e0, e1, e2 (not the selection order 2, 0, 1).
//   e0 -> d1 (d0 holds it): d1 = 6. e1 -> d1 (d0 holds it, d1 has a slot left): d1 = 9, full.
//   e2 -> d0 (d1 holds it and is full): d0 = 9.
const std::vector<std::vector<double>> kOrderCase = {{0, 2, 6, 0}, {3, 2, 0, 0}, {3, 2, 0, 0}};

TEST(Planner, PlacementOrderIsByTotalNotBySelection) {
  auto plan = plan_layer(make_params(4, 2, 2), make_counts(5, kOrderCase));
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->replicas, (std::vector<int>{2, 0, 1}));
  EXPECT_EQ(plan->tail_before, 12.0);
  EXPECT_EQ(plan->tail_after, 6.0);
  EXPECT_EQ(pairs(plan->placement), (Pairs{{0, 1}, {1, 1}, {2, 0}}));
  EXPECT_TRUE(plan->dropped.empty());
}

void expect_error(const Result<LayerPlan>& r, const std::string& fragment) {
  ASSERT_FALSE(r.ok()) << "expected an error with: " << fragment;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
}

TEST(Planner, BadInputNamesTheField) {
  const LayerCounts ok = make_counts(2, {{1, 2, 3, 4}});
  expect_error(plan_layer(make_params(4, 3, 1), ok), "n_experts 4 is not divisible by devices 3");
  expect_error(plan_layer(make_params(4, 2, 1, 3), ok),
               "budget 3 exceeds devices × redundant_slots = 2 × 1 = 2");
  expect_error(plan_layer(make_params(4, 2, 1, -1), ok), "budget must be >= 0, got -1");
  expect_error(plan_layer(make_params(4, 2, -1), ok), "redundant_slots must be >= 0, got -1");
  expect_error(plan_layer(make_params(0, 1, 1), ok), "n_experts must be >= 1, got 0");
  expect_error(plan_layer(make_params(4, 0, 1), ok), "devices must be >= 1, got 0");

  LayerCounts ragged = ok;
  ragged.counts.pop_back();
  expect_error(plan_layer(make_params(4, 2, 1), ragged),
               "layer 2: counts holds 3 values, expected 1 slices × 4 experts = 4");
  expect_error(plan_layer(make_params(4, 2, 1), make_counts(2, {{1, 2, 3, 4}, {0, -1, 0, 0}})),
               "layer 2: counts[1][1] is -1, expected a finite number >= 0");
  expect_error(plan_layer(make_params(4, 2, 1),
                          make_counts(2, {{1, std::numeric_limits<double>::quiet_NaN(), 3, 4}})),
               "counts[0][1] is nan");
  expect_error(plan_layer(make_params(4, 2, 1), make_counts(2, {})),
               "layer 2: counts has no time slices");

  const std::vector<LayerCounts> twice = {ok, ok};
  auto both = plan_layers(make_params(4, 2, 1), twice);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("layer 2 appears more than once"), std::string::npos);
}

TEST(PlanSlots, HandDerivedExpertMap) {
  // The plan above. Slots per device: E/N + S = 4; d0 = [e0, e1 | e2, -],
  // d1 = [e2, e3 | e0, e1] (redundant slots filled in placement order).
  auto plan = plan_layer(make_params(4, 2, 2), make_counts(5, kOrderCase));
  ASSERT_TRUE(plan.ok());
  const Shape shape{4, 2, 2};
  auto slots = plan_slots(shape, *plan);
  ASSERT_TRUE(slots.ok()) << slots.status().to_string();
  const std::vector<std::vector<Slot>> expected = {
      {{0, 0}, {1, 2}}, {{0, 1}, {1, 3}}, {{1, 0}, {0, 2}}, {{1, 1}}};
  EXPECT_EQ(*slots, expected);
  // Physical ids d · 4 + slot: e0 -> 0, 6; e1 -> 1, 7; e2 -> 4, 2; e3 -> 5.
  EXPECT_EQ((*slots)[0][1].physical(shape), 6);
  EXPECT_EQ((*slots)[2][1].physical(shape), 2);
  EXPECT_EQ((*slots)[3][0].physical(shape), 5);
}

TEST(PlanSlots, NoReplicasIsTheIdentity) {
  // E = 6, N = 3, S = 2: expert e at device e / 2, slot e % 2, physical d · 4 + e % 2.
  LayerPlan empty;
  auto slots = plan_slots({6, 3, 2}, empty);
  ASSERT_TRUE(slots.ok());
  const int physical[6] = {0, 1, 4, 5, 8, 9};
  for (int e = 0; e < 6; ++e) {
    ASSERT_EQ((*slots)[e].size(), 1u);
    EXPECT_EQ((*slots)[e][0].physical({6, 3, 2}), physical[e]);
  }
}

TEST(PlanSlots, RejectsPlansThatBreakTheShape) {
  const Shape shape{4, 2, 1};
  LayerPlan p;
  p.layer = 3;
  p.replicas = {0};
  p.placement = {{0, 2}};
  auto bad_device = plan_slots(shape, p);
  ASSERT_FALSE(bad_device.ok());
  EXPECT_NE(bad_device.status().message().find("device 2, outside [0, 2)"), std::string::npos)
      << bad_device.status().message();

  p.placement = {{0, 0}};  // e0's primary is on d0
  auto twice = plan_slots(shape, p);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("expert 0 has two copies on device 0"),
            std::string::npos);

  p.replicas = {0, 1};
  p.placement = {{0, 1}, {1, 1}};  // S = 1
  auto full = plan_slots(shape, p);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.status().message().find("device 1 gets more than its 1 redundant slots"),
            std::string::npos);

  p.replicas = {0, 0};
  p.placement = {{0, 1}};
  auto missing = plan_slots(shape, p);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'replicas' lists expert 0 2 times"), std::string::npos)
      << missing.status().message();

  p.replicas = {4};
  p.placement = {};
  p.dropped = {4};
  EXPECT_FALSE(plan_slots(shape, p).ok());
}

TEST(Spread, RoundRobinFromTheRank) {
  const std::vector<Slot> copies = {{0, 0}, {1, 2}, {3, 5}};
  // (row + rank) mod 3.
  EXPECT_EQ(spread_slot(copies, 0, 0), (Slot{0, 0}));
  EXPECT_EQ(spread_slot(copies, 1, 0), (Slot{1, 2}));
  EXPECT_EQ(spread_slot(copies, 0, 2), (Slot{3, 5}));
  EXPECT_EQ(spread_slot(copies, 5, 1), (Slot{0, 0}));  // 6 mod 3 = 0
  EXPECT_EQ(spread_slot(copies, 4, 4), (Slot{3, 5}));  // 8 mod 3 = 2
  // 2^64 - 1 = 4^32 - 1 is 0 mod 3, so with rank 1 the exact sum is 1 mod 3 (no wrap to 0).
  EXPECT_EQ(spread_slot(copies, std::numeric_limits<uint64_t>::max(), 1), (Slot{1, 2}));
  // A single copy serves everything.
  const std::vector<Slot> one = {{2, 7}};
  EXPECT_EQ(spread_slot(one, 12345, 77), (Slot{2, 7}));
  // Any n consecutive rows of one rank meet every copy once; two ranks at the same row meet
  // different copies.
  for (uint64_t rank = 0; rank < 5; ++rank) {
    std::vector<int> hits(5, 0);
    for (uint64_t row = 100; row < 105; ++row) ++hits[spread_index(5, row, rank)];
    EXPECT_EQ(hits, (std::vector<int>{1, 1, 1, 1, 1}));
    EXPECT_NE(spread_index(5, 9, rank), spread_index(5, 9, rank + 1));
  }
}

}  // namespace
}  // namespace xds::eplb
