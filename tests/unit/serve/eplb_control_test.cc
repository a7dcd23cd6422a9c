// The shell's EPLB control (serve/eplb_control.h) against hand-derived cases: windows summed
// over groups into slices, the plan and its predicted loads for one hot expert, and the
// reconfiguration's commands (commit once every group prepared, abort on a failure, the map
// in force only after every group switched).
#include "serve/eplb_control.h"

#include <gtest/gtest.h>

namespace xds::serve {
namespace {

using engine::EplbCommand;
using engine::EplbOp;
using engine::EplbReport;
using engine::EplbState;
using engine::GroupLoad;

// 4 experts over 2 devices (2 each), 1 redundant slot: 3 slots per device; one MoE layer (5).
GroupLoad window(int group, int64_t seq, std::vector<int64_t> experts, std::vector<int64_t> slots,
                 uint64_t version = 1) {
  GroupLoad l;
  l.group = group;
  l.window_seq = seq;
  l.moe_layers = {5};
  l.n_experts = 4;
  l.slots_per_device = 3;
  l.window_expert_tokens = std::move(experts);
  l.window_slot_tokens = std::move(slots);
  l.window_map_version = version;
  l.window_uniform = true;
  return l;
}

EplbControl make(int slots = 1) {
  EplbControlOptions o;
  o.n_groups = 2;
  o.redundant_slots = slots;
  o.slices = 4;
  return EplbControl(o);
}

EplbReport report(int group, uint64_t version, EplbState s) {
  EplbReport r;
  r.group = group;
  r.version = version;
  r.state = s;
  r.disable_step = 40;
  r.switch_step = 41;
  return r;
}

TEST(EplbControl, OffOrEarlyRequestsGetClearStatuses) {
  std::optional<EplbCommand> c;
  EplbControl off = make(0);
  EXPECT_EQ(off.rebalance(0, c).status, 400);
  EXPECT_FALSE(c);
  EplbControl on = make();
  const EplbAnswer a = on.rebalance(0, c);
  EXPECT_EQ(a.status, 409);  // no window yet
  EXPECT_NE(a.body["error"].get<std::string>().find("window"), std::string::npos);
  EXPECT_FALSE(c);
}

TEST(EplbControl, OneHotExpertGetsAReplicaOnTheOtherDevice) {
  EplbControl e = make();
  // Window 1: group 0 routed 10 tokens to expert 0, group 1 10 to expert 0 and 2 to expert 3.
  // Device loads (slots): device 0 computed 20 (expert 0), device 1 2 (expert 3).
  e.on_window(window(0, 1, {10, 0, 0, 0}, {20, 0, 0}));
  std::optional<EplbCommand> c;
  EXPECT_EQ(e.rebalance(0, c).status, 409);  // group 1 has not reported window 1
  e.on_window(window(1, 1, {10, 0, 0, 2}, {0, 2, 0}));
  const EplbAnswer a = e.rebalance(0, c);
  ASSERT_EQ(a.status, 202) << a.body.dump();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->op, EplbOp::kPrepare);
  EXPECT_EQ(c->version, 3u);  // v1 in force, v2 the disabled map
  EXPECT_EQ(c->moe_layers, std::vector<int64_t>({5}));
  // counts [20, 0, 0, 2]: one round replicates expert 0 (then copies = N: no candidate);
  // device loads by share: device 0 = 10, device 1 = 2 -> the replica goes to device 1, its
  // redundant slot 2: physical 1 * 3 + 2 = 5. Primaries: 0, 1 (device 0), 3, 4 (device 1).
  const std::vector<std::vector<int32_t>> want = {{0, 5}, {1}, {3}, {4}};
  ASSERT_EQ(c->replicas.size(), 1u);
  EXPECT_EQ(c->replicas[0], want);
  // Predicted: device 0 = 10, device 1 = 2 + 10 = 12, mean 11. Before (measured): 20 and 2.
  EXPECT_NEAR(a.body["predicted_max_mean"][0].get<double>(), 12.0 / 11.0, 1e-12);
  EXPECT_NEAR(a.body["before_max_mean"][0].get<double>(), 20.0 / 11.0, 1e-12);

  // A second request while this one runs: 409.
  std::optional<EplbCommand> c2;
  EXPECT_EQ(e.rebalance(1, c2).status, 409);
  // Commit only after both prepared.
  EXPECT_FALSE(e.on_report(report(0, 3, EplbState::kPrepared)));
  auto commit = e.on_report(report(1, 3, EplbState::kPrepared));
  ASSERT_TRUE(commit);
  EXPECT_EQ(commit->op, EplbOp::kCommit);
  EXPECT_EQ(commit->version, 3u);
  // The map is in force only once both switched.
  EXPECT_FALSE(e.on_report(report(0, 3, EplbState::kSwitched)));
  EXPECT_EQ(e.map_version(), 1u);
  EXPECT_FALSE(e.on_report(report(1, 3, EplbState::kSwitched)));
  EXPECT_EQ(e.map_version(), 3u);
  const nlohmann::json s = e.state();
  EXPECT_EQ(s["rebalances_done"].get<int>(), 1);
  EXPECT_EQ(s["layers"][0]["replicas"][0].get<std::vector<int32_t>>(),
            std::vector<int32_t>({0, 5}));
  EXPECT_EQ(s["last_rebalance"]["switch_step"].get<std::vector<int64_t>>(),
            std::vector<int64_t>({41, 41}));
  // Window 2 under map v3: device loads 10 + 0 + 0 and 0 + 2 + 10 -> max/mean 12 / 11.
  e.on_window(window(0, 2, {10, 0, 0, 0}, {10, 0, 0}, 3));
  e.on_window(window(1, 2, {10, 0, 0, 2}, {0, 2, 10}, 3));
  EXPECT_NEAR(e.state()["layers"][0]["max_mean"]["current"].get<double>(), 12.0 / 11.0, 1e-12);
  // The map's prediction from window 2's counts [20, 0, 0, 2]: expert 0's 20 split over
  // physical 0 (device 0) and 5 (device 1): 10 and 10 + 2 -> 12 / 11 as well.
  EXPECT_NEAR(e.state()["layers"][0]["max_mean"]["current_predicted"].get<double>(), 12.0 / 11.0,
              1e-12);
  const std::string metrics = e.metrics_text();
  EXPECT_NE(metrics.find("xdeepserve_eplb_map_version 3"), std::string::npos);
  EXPECT_NE(metrics.find("xdeepserve_eplb_rebalances_total{result=\"done\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("xdeepserve_eplb_device_tokens_total{layer=\"5\",device=\"1\"} 14"),
            std::string::npos)
      << metrics;
}

TEST(EplbControl, AFailedPrepareAbortsAndTheMapStays) {
  EplbControl e = make();
  e.on_window(window(0, 1, {10, 0, 0, 0}, {10, 0, 0}));
  e.on_window(window(1, 1, {10, 0, 0, 0}, {10, 0, 0}));
  std::optional<EplbCommand> c;
  ASSERT_EQ(e.rebalance(0, c).status, 202);
  EXPECT_FALSE(e.on_report(report(0, 3, EplbState::kPrepared)));
  EplbReport bad = report(1, 3, EplbState::kFailed);
  bad.error = "injected";
  auto abort = e.on_report(bad);
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->op, EplbOp::kAbort);
  EXPECT_EQ(e.map_version(), 1u);
  const nlohmann::json s = e.state();
  EXPECT_EQ(s["rebalances_failed"].get<int>(), 1);
  EXPECT_EQ(s["phase"].get<std::string>(), "idle");
  EXPECT_NE(s["last_error"].get<std::string>().find("injected"), std::string::npos);
  // A late report of the aborted version changes nothing; a new rebalance may start.
  EXPECT_FALSE(e.on_report(report(1, 3, EplbState::kPrepared)));
  EXPECT_EQ(e.rebalance(1, c).status, 202);
  EXPECT_EQ(c->version, 3u);
}

TEST(EplbControl, SlicesAreKeptUpToTheLimit) {
  EplbControl e = make();  // 4 slices
  for (int64_t k = 1; k <= 6; ++k) {
    e.on_window(window(0, k, {1, 0, 0, 0}, {1, 0, 0}));
    e.on_window(window(1, k, {0, 0, 0, 1}, {0, 1, 0}));
  }
  EXPECT_EQ(e.state()["slices"].get<int>(), 4);
  // Cumulative counts keep every complete window: 6 tokens each for experts 0 and 3.
  EXPECT_EQ(e.state()["layers"][0]["expert_tokens"].get<std::vector<double>>(),
            std::vector<double>({6, 0, 0, 6}));
}

}  // namespace
}  // namespace xds::serve

namespace xds::serve {
namespace {

// --eplb-interval 10: due once 10 s passed since the last start, never while one runs, and
// never without a complete window or with EPLB off.
TEST(EplbControl, IntervalStartsARebalanceOnlyWhenDue) {
  EplbControlOptions o;
  o.n_groups = 2;
  o.redundant_slots = 1;
  o.interval_s = 10;
  EplbControl e(o);
  constexpr int64_t kS = 1'000'000'000;
  EXPECT_FALSE(e.due(11 * kS));  // no window yet
  e.on_window(window(0, 1, {4, 0, 0, 0}, {4, 0, 0}));
  e.on_window(window(1, 1, {4, 0, 0, 0}, {4, 0, 0}));
  EXPECT_FALSE(e.due(9 * kS));
  EXPECT_TRUE(e.due(11 * kS));
  std::optional<EplbCommand> c;
  ASSERT_EQ(e.rebalance(11 * kS, c).status, 202);
  EXPECT_FALSE(e.due(30 * kS));  // preparing
  ASSERT_TRUE(e.on_report(report(0, 3, EplbState::kFailed)));
  EXPECT_FALSE(e.due(20 * kS));  // 9 s after the last start
  EXPECT_TRUE(e.due(21 * kS));
  EplbControlOptions off = o;
  off.interval_s = 0;
  EplbControl never(off);
  never.on_window(window(0, 1, {4, 0, 0, 0}, {4, 0, 0}));
  never.on_window(window(1, 1, {4, 0, 0, 0}, {4, 0, 0}));
  EXPECT_FALSE(never.due(1000 * kS));
}

}  // namespace
}  // namespace xds::serve

namespace xds::serve {
namespace {

// An expert-count load (no window): it gives the control the model's shape.
GroupLoad counts(int group) {
  GroupLoad l;
  l.group = group;
  l.moe_layers = {5};
  l.n_experts = 4;
  l.expert_tokens = {1, 2, 3, 4};
  return l;
}

// --expert-backup with 2 redundant slots (= experts per device): each device's experts are
// copied on the other; only then may either device be lost. A scale-down stops EPLB.
TEST(EplbControl, BackupCopiesEveryExpertOnTheNextDevice) {
  EplbControl c = make(2);  // 4 experts, 2 devices, 2 + 2 slots each
  std::optional<EplbCommand> cmd;
  EXPECT_EQ(c.backup(0, cmd).status, 409);  // the shape is not known yet
  EXPECT_FALSE(c.covers({0}).ok());
  c.on_window(counts(0));
  // Identity map: expert 2 and 3 live on device 1 only.
  const Status alone = c.covers({0});
  EXPECT_FALSE(alone.ok());
  EXPECT_NE(alone.message().find("expert 2"), std::string::npos) << alone.message();
  EXPECT_TRUE(c.covers({0, 1}).ok());
  const EplbAnswer a = c.backup(1, cmd);
  ASSERT_EQ(a.status, 202) << a.body.dump();
  ASSERT_TRUE(cmd);
  EXPECT_EQ(cmd->op, EplbOp::kPrepare);
  // Device 0: slots 0-1 experts 0-1 (physical 0, 1), slots 2-3 copies of 2, 3 (physical 2, 3);
  // device 1: slots 0-1 experts 2-3 (physical 4, 5), slots 2-3 copies of 0, 1 (6, 7).
  const std::vector<std::vector<int32_t>> want = {{0, 6}, {1, 7}, {4, 2}, {5, 3}};
  ASSERT_EQ(cmd->replicas.size(), 1u);
  EXPECT_EQ(cmd->replicas[0], want);
  EXPECT_FALSE(c.covers({0}).ok());  // not in force before every device switched
  EXPECT_FALSE(c.on_report(report(0, cmd->version, EplbState::kPrepared)));
  const auto commit = c.on_report(report(1, cmd->version, EplbState::kPrepared));
  ASSERT_TRUE(commit);
  EXPECT_EQ(commit->op, EplbOp::kCommit);
  for (int g = 0; g < 2; ++g) c.on_report(report(g, cmd->version, EplbState::kSwitched));
  EXPECT_TRUE(c.idle());
  EXPECT_TRUE(c.covers({0}).ok());
  EXPECT_TRUE(c.covers({1}).ok());
  c.stop("DP group 1 was lost");
  const EplbAnswer stopped = c.rebalance(2, cmd);
  EXPECT_EQ(stopped.status, 409);
  EXPECT_NE(stopped.body.dump().find("DP group 1 was lost"), std::string::npos);
  EXPECT_FALSE(cmd);
}

}  // namespace
}  // namespace xds::serve
