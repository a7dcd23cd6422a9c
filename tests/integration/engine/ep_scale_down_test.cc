// Scale-down (P119): DP groups are threads of a thread fabric, each with its own EngineCore
// (f32) whose MoE layers run over EpMoeExchange on GroupCollectives, with backup copies of
// every group's experts in the next group's redundant slots (engine::backup_replicas). At a
// chosen step one group dies (its device marked dead, its thread gone): every survivor's step
// fails with the poisoned epoch and is rolled back; the survivors then run the three phases
// of a reform (the test plays the shell with a barrier between phases: leave, reset their
// own lines, form the fabric of the members left and switch to the maps without the lost
// group) and step on from step 0 of the new fabric. The lost group's requests are added
// again on the first survivor (recomputed from their prompts, greedy).
// Checked against an undisturbed run of the same groups: every request's tokens -- the
// survivors' own, which lost no KV, and the recomputed ones, whose experts of the lost group
// are served by the backup copies only -- are the undisturbed run's; nothing of the failed
// step was emitted.
#include <gtest/gtest.h>

#include <barrier>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/ep_moe_exchange.h"
#include "engine/eplb_maps.h"
#include "engine/group_collectives.h"
#include "engine/step_sync.h"
#include "ep_thread_groups.h"
#include "model/registry.h"
#include "test_models.h"
#include "xccl/thread_fabric.h"

namespace xds::engine {
namespace {

const std::string& checkpoint() {
  static const std::string dir = fixtures::random_checkpoint("ep_scale_down", 61, /*mtp=*/1);
  return dir;
}

constexpr int kRequestsPerGroup = 2;
constexpr int32_t kMaxTokens = 6;

struct Case {
  int groups = 2;
  int lost = -1;          // the group that dies (-1: none)
  uint64_t lost_at = 2;   // at this step, after the header exchange
};

struct GroupRun {
  std::map<std::string, std::vector<int32_t>> tokens;  // request id -> emitted tokens
  std::vector<Status> failures;                        // execute() errors, in order
  Status end;
};

using ep_test::ep_options;

EngineRequest request_of(int n, int64_t vocab) {
  return ep_test::request_of(n, vocab, /*seed_base=*/300, kMaxTokens);
}

// Every group's redundant slots hold copies of the previous group's experts (the weights the
// model mapped), under maps of version 2 that name them.
Status install_backups(CausalLm& model, EpMoeExchange& ex, int groups, int redundant) {
  const ModelInfo& info = model.info();
  eplb::Shape shape;
  shape.n_experts = int(info.n_routed_experts);
  shape.n_devices = groups;
  shape.redundant_slots = redundant;
  const std::vector<std::vector<int32_t>> reps = backup_replicas(shape);
  const int spd = shape.slots_per_device();
  for (int64_t l : ex.moe_layers()) {
    for (int e = 0; e < shape.n_experts; ++e) {
      for (int32_t p : reps[size_t(e)]) {
        if (p / spd != ex.rank() || p % spd < shape.experts_per_device()) continue;
        XDS_RETURN_IF_ERROR(
            ex.set_redundant_slot(l, p % spd, e, &model.moe_weights(l)->experts[size_t(e)]));
      }
    }
  }
  std::vector<std::vector<std::vector<int32_t>>> per_layer(ex.moe_layers().size(), reps);
  XDS_ASSIGN_OR_RETURN(auto maps, layer_maps(shape, info.num_layers + info.n_mtp_layers,
                                             ex.moe_layers(), per_layer, /*version=*/2));
  return ex.set_expert_maps(std::move(maps));
}

Status run_group(xccl::ThreadFabric& tf, xccl::Fabric& f, const Case& c,
                 std::barrier<>* survivors, GroupRun& out) {
  XDS_ASSIGN_OR_RETURN(auto core, EngineCore::create(ep_test::core_options(checkpoint())));
  XDS_ASSIGN_OR_RETURN(auto coll, GroupCollectives::create(f, 60'000, nullptr));
  const int redundant = int(core->info().n_routed_experts) / c.groups;
  EpMoeSetup setup;
  setup.model = &core->model();
  setup.mailbox = &coll->mailbox();
  setup.options = ep_options(redundant);
  XDS_ASSIGN_OR_RETURN(auto ex, EpMoeExchange::create(setup));
  XDS_RETURN_IF_ERROR(install_backups(core->model(), *ex, c.groups, redundant));
  core->model().set_moe_exchange(ex.get());
  core->set_step_agreement([&ex] { return ex->agree_step(); });

  const int64_t vocab = core->info().vocab_size;
  for (int i = 0; i < kRequestsPerGroup; ++i)
    XDS_RETURN_IF_ERROR(core->add_request(request_of(f.rank() * kRequestsPerGroup + i, vocab)));

  StepAttempts attempts;
  uint64_t step = 0;
  bool reformed = false;
  for (int iter = 0; iter < 300; ++iter) {
    XDS_ASSIGN_OR_RETURN(const StepHeader h, ep_test::plan_step(*core, coll->fabric().epoch(),
                                                               step, attempts.attempt()));
    XDS_ASSIGN_OR_RETURN(const StepDecision d, coll->sync().exchange(h));
    if (d.action == StepAction::kSleep) return out.end = Status::ok_status();  // all done
    if (d.action != StepAction::kRun)
      return internal_error("group {} step {}: decision {}", f.rank(), step,
                            step_action_name(d.action));
    if (!reformed && f.rank() == c.lost && step == c.lost_at) {
      tf.mark_dead(f.rank());  // gone before its step's exchange
      return out.end = Status::ok_status();
    }
    ex->set_step(d.epoch, uint32_t(d.step), attempts.attempt());
    const Status st = core->execute(/*lockstep=*/true);
    if (!st.ok()) out.failures.push_back(st);
    if (!attempts.after_execute(st)) {
      if (reformed || st.code() != StatusCode::kAborted || survivors == nullptr) return out.end = st;
      // The shell's three phases; the step was rolled back.
      std::vector<int> after;
      for (int g = 0; g < c.groups; ++g)
        if (g != c.lost) after.push_back(g);
      const std::vector<int> before = coll->members();
      survivors->arrive_and_wait();  // every survivor left the fabric
      coll->reset_own_lines();
      survivors->arrive_and_wait();  // every survivor cleared its lines
      XDS_RETURN_IF_ERROR(coll->reform(after, 1));
      XDS_RETURN_IF_ERROR(ex->reform(coll->mailbox(), before, after));
      reformed = true;
      step = 0;
      attempts.restart_attempts();
      if (f.rank() == after.front()) {  // the lost group's requests, recomputed here
        for (int i = 0; i < kRequestsPerGroup; ++i)
          XDS_RETURN_IF_ERROR(core->add_request(request_of(c.lost * kRequestsPerGroup + i, vocab)));
      }
      continue;
    }
    if (!st.ok()) continue;
    step = d.next_step;
    ep_test::take_tokens(*core, out.tokens);
  }
  return internal_error("group {}: no end after 300 iterations", f.rank());
}

struct Outcome {
  std::vector<GroupRun> groups;
  std::vector<Status> statuses;
};

Outcome run_case(const Case& c) {
  Outcome o;
  auto info = load_model_info(checkpoint());
  EXPECT_TRUE(info.ok()) << info.status().to_string();
  if (!info.ok()) return o;
  const int redundant = int(info->n_routed_experts) / c.groups;
  const xccl::ArenaConfig a = ep_test::arena_config(*info, c.groups, ep_options(redundant));
  auto tf = xccl::ThreadFabric::create(a, 3);
  EXPECT_TRUE(tf.ok()) << tf.status().to_string();
  if (!tf.ok()) return o;
  std::barrier<> survivors(c.lost >= 0 ? c.groups - 1 : c.groups);
  o.groups.resize(size_t(c.groups));
  o.statuses = (*tf)->run([&](xccl::Fabric& f) {
    return run_group(**tf, f, c, c.lost >= 0 ? &survivors : nullptr, o.groups[size_t(f.rank())]);
  });
  return o;
}

std::map<std::string, std::vector<int32_t>> all_tokens(const Outcome& o, int skip_group = -1) {
  std::map<std::string, std::vector<int32_t>> t;
  for (size_t g = 0; g < o.groups.size(); ++g)
    if (int(g) != skip_group) t.insert(o.groups[g].tokens.begin(), o.groups[g].tokens.end());
  return t;
}

void expect_survivors_go_on(const Case& c) {
  const Outcome ref = run_case({.groups = c.groups});
  for (size_t r = 0; r < ref.statuses.size(); ++r)
    ASSERT_TRUE(ref.statuses[r].ok()) << "undisturbed group " << r << ": " << ref.statuses[r].to_string();
  const auto want = all_tokens(ref);
  ASSERT_EQ(want.size(), size_t(c.groups * kRequestsPerGroup));
  for (const auto& [id, t] : want) ASSERT_EQ(t.size(), size_t(kMaxTokens)) << id;

  const Outcome o = run_case(c);
  ASSERT_EQ(o.statuses.size(), size_t(c.groups));
  for (int r = 0; r < c.groups; ++r) {
    EXPECT_TRUE(o.statuses[size_t(r)].ok()) << "group " << r << ": " << o.statuses[size_t(r)].to_string();
    if (r == c.lost) continue;
    const GroupRun& g = o.groups[size_t(r)];
    ASSERT_EQ(g.failures.size(), 1u) << "group " << r;  // the step the loss struck
    EXPECT_EQ(g.failures[0].code(), StatusCode::kAborted) << g.failures[0].to_string();
  }
  // The lost group's own tokens (before it died) are dropped: its requests were recomputed.
  EXPECT_EQ(all_tokens(o, c.lost), want);
}

// Two groups: the survivor goes on alone (a fabric of one).
TEST(EpScaleDown, TheSurvivorOfTwoGroupsGoesOnAloneWithTheBackupCopies) {
  expect_survivors_go_on({.groups = 2, .lost = 1, .lost_at = 2});
}

// Four groups, the third lost: three go on, renumbered (group 3 is rank 2 of the new fabric).
TEST(EpScaleDown, ThreeOfFourGroupsGoOnRenumbered) {
  expect_survivors_go_on({.groups = 4, .lost = 2, .lost_at = 3});
}

}  // namespace
}  // namespace xds::engine
