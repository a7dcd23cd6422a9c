// EPLB's map and slot logic in the engine (engine/eplb_maps.h) against hand-derived cases:
// physical ids of a plan's copies, the disabled map, the redundant slots a device must hold,
// the row spread as the dispatcher sees it (xccl plan_routes with spread keys) against
// eplb::spread_slot, and device loads from slot counts.
#include "engine/eplb_maps.h"

#include <gtest/gtest.h>

#include "eplb/planner.h"
#include "xccl/expert_map.h"

namespace xds::engine {
namespace {

// 8 experts over 2 devices, 2 redundant slots each: 4 + 2 = 6 slots per device.
const eplb::Shape kShape{8, 2, 2};

eplb::LayerPlan two_replicas() {
  // Expert 1 (device 0) copied to device 1, expert 6 (device 1) copied to device 0.
  eplb::LayerPlan p;
  p.replicas = {1, 6};
  p.placement = {{1, 1}, {6, 0}};
  return p;
}

TEST(EplbMaps, ReplicasOfAPlanAreHandDerivedPhysicalIds) {
  auto slots = eplb::plan_slots(kShape, two_replicas());
  ASSERT_TRUE(slots.ok()) << slots.status().to_string();
  auto reps = replicas_of_slots(kShape, *slots);
  ASSERT_TRUE(reps.ok()) << reps.status().to_string();
  // Device 0: slots 0-3 experts 0-3 (physical 0-3), slot 4 first replica (physical 4).
  // Device 1: slots 0-3 experts 4-7 (physical 6-9), slot 4 first replica (physical 10).
  const std::vector<std::vector<int32_t>> want = {{0}, {1, 10}, {2}, {3}, {6}, {7}, {8, 4}, {9}};
  EXPECT_EQ(*reps, want);
}

TEST(EplbMaps, PrimaryReplicasAreTheIdentityMapOfTheExchange) {
  const auto p = primary_replicas(kShape);
  const xccl::ExpertMap id = xccl::ExpertMap::identity(8, 2, 6, 1);
  EXPECT_EQ(p, id.replicas);
  EXPECT_EQ(p[5], std::vector<int32_t>({7}));  // expert 5: device 1 slot 1 = 6 + 1
}

TEST(EplbMaps, RedundantSlotExpertsPerDevice) {
  const std::vector<std::vector<int32_t>> reps = {{0}, {1, 10}, {2}, {3}, {6}, {7}, {8, 4}, {9}};
  auto d0 = redundant_slot_experts(kShape, 0, reps);
  auto d1 = redundant_slot_experts(kShape, 1, reps);
  ASSERT_TRUE(d0.ok() && d1.ok());
  EXPECT_EQ(*d0, std::vector<int32_t>({6, -1}));  // physical 4 = device 0 redundant slot 0
  EXPECT_EQ(*d1, std::vector<int32_t>({1, -1}));  // physical 10 = device 1 redundant slot 0
  // A primary slot that holds another expert, and an id beyond the 12 slots: errors.
  std::vector<std::vector<int32_t>> bad = reps;
  bad[0] = {1};
  EXPECT_FALSE(redundant_slot_experts(kShape, 0, bad).ok());
  bad = reps;
  bad[2].push_back(12);
  EXPECT_FALSE(redundant_slot_experts(kShape, 0, bad).ok());
}

TEST(EplbMaps, LayerMapsCoverOnlyTheMoeLayersUnderOneVersion) {
  const std::vector<int64_t> moe = {1, 3};
  std::vector<std::vector<std::vector<int32_t>>> reps = {primary_replicas(kShape),
                                                         primary_replicas(kShape)};
  reps[1][1].push_back(10);
  auto maps = layer_maps(kShape, 4, moe, reps, 7);
  ASSERT_TRUE(maps.ok()) << maps.status().to_string();
  ASSERT_EQ(maps->size(), 4u);
  EXPECT_TRUE((*maps)[0].replicas.empty());
  EXPECT_TRUE((*maps)[2].replicas.empty());
  EXPECT_EQ((*maps)[1].version, 7u);
  EXPECT_EQ((*maps)[3].version, 7u);
  EXPECT_EQ((*maps)[3].slots_per_device, 6);
  EXPECT_EQ((*maps)[3].replicas[1], std::vector<int32_t>({1, 10}));
  EXPECT_FALSE(layer_maps(kShape, 4, moe, {primary_replicas(kShape)}, 7).ok());  // 1 of 2
  EXPECT_FALSE(layer_maps(kShape, 3, moe, reps, 7).ok());  // layer 3 outside 3 layers
}

// The dispatcher's choice of copy (ExpertMap::physical with spread_key) is eplb::spread_slot's:
// copies[(row + rank) mod |copies|], for 2 and 3 copies, ranks 0-3, rows 0-40.
TEST(EplbMaps, SpreadKeyPicksTheCopyOfSpreadSlot) {
  xccl::ExpertMap m = xccl::ExpertMap::identity(8, 2, 6, 1);
  m.replicas[1] = {1, 10};
  m.replicas[6] = {8, 4, 11};
  auto slots = eplb::plan_slots(kShape, two_replicas());
  ASSERT_TRUE(slots.ok());
  std::vector<eplb::Slot> three = {{1, 2}, {0, 4}, {1, 5}};  // physical 8, 4, 11
  for (int rank = 0; rank < 4; ++rank)
    for (int64_t row = 0; row <= 40; ++row) {
      const uint32_t key = spread_key(row, rank);
      EXPECT_EQ(m.physical(1, key),
                eplb::spread_slot((*slots)[1], uint64_t(row), uint64_t(rank)).physical(kShape));
      EXPECT_EQ(m.physical(6, key),
                eplb::spread_slot(three, uint64_t(row), uint64_t(rank)).physical(kShape));
    }
  // By hand: row 5, rank 1 -> copy 6 mod 2 = 0 (physical 1); rank 2 -> copy 1 (10).
  EXPECT_EQ(m.physical(1, spread_key(5, 1)), 1);
  EXPECT_EQ(m.physical(1, spread_key(5, 2)), 10);
}

// plan_routes with spread keys: rows 0, 1, 2 of a step (rank 0) all pick expert 1; its
// copies are physical 1 (device 0 slot 1) and 10 (device 1 slot 4): rows 0 and 2 go to
// device 0, row 1 to device 1.
TEST(EplbMaps, RoutesFollowTheRowSpread) {
  xccl::ExpertMap m = xccl::ExpertMap::identity(8, 2, 6, 1);
  m.replicas[1] = {1, 10};
  const std::vector<int32_t> ids = {1, 1, 1};
  const std::vector<float> w = {1.f, 1.f, 1.f};
  const std::vector<uint32_t> keys = {spread_key(0, 0), spread_key(1, 0), spread_key(2, 0)};
  xccl::RoutePlan plan;
  ASSERT_TRUE(xccl::plan_routes_into(m, ids, w, 3, 1, plan, keys).ok());
  ASSERT_EQ(plan.per_device[0].size(), 2u);
  ASSERT_EQ(plan.per_device[1].size(), 1u);
  EXPECT_EQ(plan.per_device[0][0].token, 0u);
  EXPECT_EQ(plan.per_device[0][1].token, 2u);
  EXPECT_EQ(plan.per_device[0][0].local_expert[0], 1);
  EXPECT_EQ(plan.per_device[1][0].token, 1u);
  EXPECT_EQ(plan.per_device[1][0].local_expert[0], 4);
  // Too few keys: an error, not a read past the end.
  EXPECT_FALSE(xccl::plan_routes_into(m, ids, w, 3, 1, plan, std::span(keys).first(2)).ok());
}

// A decode batch of 6 sequences that all sit at position 100, on DP rank 1: the step's rows
// 0..5 all pick expert 6, whose copies are physical 8 (device 1 slot 2), 4 (device 0 slot 4)
// and 11 (device 1 slot 5). Row r meets copy (r + 1) mod 3: rows 2 and 5 -> 8, rows 0 and
// 3 -> 4, rows 1 and 4 -> 11, so every copy serves two rows (spreading by the position, all
// six would meet one copy).
TEST(EplbMaps, ADecodeBatchAtOnePositionSpreadsOverEveryCopy) {
  xccl::ExpertMap m = xccl::ExpertMap::identity(8, 2, 6, 1);
  m.replicas[6] = {8, 4, 11};
  constexpr int kRows = 6, kRank = 1;
  const std::vector<int32_t> ids(kRows, 6);
  const std::vector<float> w(kRows, 1.f);
  std::vector<uint32_t> keys;
  for (int row = 0; row < kRows; ++row) keys.push_back(spread_key(row, kRank));
  xccl::RoutePlan plan;
  ASSERT_TRUE(xccl::plan_routes_into(m, ids, w, kRows, 1, plan, keys).ok());
  // Device 0 (copy 4, local slot 4): rows 0 and 3.
  ASSERT_EQ(plan.per_device[0].size(), 2u);
  EXPECT_EQ(plan.per_device[0][0].token, 0u);
  EXPECT_EQ(plan.per_device[0][1].token, 3u);
  EXPECT_EQ(plan.per_device[0][0].local_expert[0], 4);
  EXPECT_EQ(plan.per_device[0][1].local_expert[0], 4);
  // Device 1: rows 1, 2, 4, 5 in row order; 1 and 4 on slot 5 (copy 11), 2 and 5 on slot 2.
  ASSERT_EQ(plan.per_device[1].size(), 4u);
  const std::vector<std::pair<uint32_t, int>> want = {{1, 5}, {2, 2}, {4, 5}, {5, 2}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(plan.per_device[1][i].token, want[i].first) << i;
    EXPECT_EQ(plan.per_device[1][i].local_expert[0], want[i].second) << i;
  }
}

TEST(EplbMaps, DeviceLoadFromSlotCounts) {
  // 2 devices x 3 slots: device 0 = 5 + 1 + 0 = 6, device 1 = 1 + 1 + 0 = 2; mean 4, max 6.
  const std::vector<double> counts = {5, 1, 0, 1, 1, 0};
  const DeviceLoad d = device_load(2, 3, counts);
  EXPECT_EQ(d.load, std::vector<double>({6, 2}));
  EXPECT_DOUBLE_EQ(d.max, 6);
  EXPECT_DOUBLE_EQ(d.mean, 4);
  EXPECT_DOUBLE_EQ(d.ratio(), 1.5);
  EXPECT_DOUBLE_EQ(device_load(2, 3, std::vector<double>(6, 0.0)).ratio(), 1.0);
}

}  // namespace
}  // namespace xds::engine

namespace xds::engine {
namespace {

// 6 experts over 3 devices (2 each), 2 redundant slots: 4 slots per device. Device d's slots
// 2-3 hold the experts of device d - 1 (mod 3).
TEST(EplbMaps, BackupReplicasCopyEachDevicesExpertsOnTheNext) {
  const eplb::Shape s{6, 3, 2};
  const std::vector<std::vector<int32_t>> want = {{0, 6}, {1, 7}, {4, 10}, {5, 11}, {8, 2},
                                                  {9, 3}};
  EXPECT_EQ(backup_replicas(s), want);
  // One redundant slot: only the first expert of each device has a copy.
  const std::vector<std::vector<int32_t>> one = {{0, 5}, {1}, {3, 8}, {4}, {6, 2}, {7}};
  EXPECT_EQ(backup_replicas(eplb::Shape{6, 3, 1}), one);
}

xccl::ExpertMap backup_map() {
  xccl::ExpertMap m;
  m.version = 4;
  m.n_devices = 3;
  m.slots_per_device = 4;
  m.replicas = backup_replicas(eplb::Shape{6, 3, 2});
  return m;
}

TEST(EplbMaps, AScaledDownMapDropsTheLostDeviceAndRenumbersTheOthers) {
  const std::vector<int> before = {0, 1, 2}, after = {0, 2};
  auto m = scaled_down_map(backup_map(), before, after);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->n_devices, 2);
  EXPECT_EQ(m->slots_per_device, 4);
  EXPECT_EQ(m->version, 4u);
  // Device 2 becomes device 1 (its slot s: physical 4 + s); device 1's copies are gone.
  const std::vector<std::vector<int32_t>> want = {{0}, {1}, {6}, {7}, {4, 2}, {5, 3}};
  EXPECT_EQ(m->replicas, want);
  EXPECT_TRUE(m->validate().ok());
  // Device 0 lost as well: experts 2 and 3 (device 1's) had their copies on device 2 only
  // until device 1 was lost ... here device 0 and 1 go, expert 0's copy on device 1 is gone.
  const Status none = scaled_down_map(backup_map(), before, std::vector<int>{2}).status();
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("expert 0 has no copy"), std::string::npos) << none.message();
}

TEST(EplbMaps, AScaledDownMapOfAScaledDownMapUsesTheSameIds) {
  // Groups {0, 2} left of {0, 1, 2}; then group 0 lost too: 2 serves alone, but experts 0
  // and 1 had no copy on 2.
  auto once = scaled_down_map(backup_map(), std::vector<int>{0, 1, 2}, std::vector<int>{0, 2});
  ASSERT_TRUE(once.ok());
  EXPECT_FALSE(scaled_down_map(*once, std::vector<int>{0, 2}, std::vector<int>{2}).ok());
  auto same = scaled_down_map(*once, std::vector<int>{0, 2}, std::vector<int>{0, 2});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->replicas, once->replicas);
  // Not a subset, or not ascending.
  EXPECT_FALSE(scaled_down_map(*once, std::vector<int>{0, 2}, std::vector<int>{1}).ok());
  EXPECT_FALSE(scaled_down_map(*once, std::vector<int>{0, 2}, std::vector<int>{2, 0}).ok());
  // A dense layer's empty map passes through.
  EXPECT_TRUE(scaled_down_map(xccl::ExpertMap{}, std::vector<int>{0, 2}, std::vector<int>{2}).ok());
}

}  // namespace
}  // namespace xds::engine
