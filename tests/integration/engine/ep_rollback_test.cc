// Rollback of a step on every DP group after a transient exchange error (P120). Groups are
// threads of a thread fabric, each with its own EngineCore (f32) whose MoE layers run over
// EpMoeExchange on a FaultProxyTransport around the shared-memory transport, and a loop that
// is the DP group's (engine/dp_group.cc): plan, the step header (StepSync, with the attempt),
// set_step(epoch, step, attempt), execute, StepAttempts::after_execute. A fault on one group
// at a chosen step -- a failed post in the middle of the step, the step's very last
// operation, or an injected exchange_error (EpMoeExchange::fail_next_exchange) -- must make
// every group's execute() return Abandoned and roll the step back, and the step run again:
// every request's greedy tokens equal those of an undisturbed run of the same groups, each
// group counts one rollback and the epoch stays clean. A fault on every attempt of a step
// gives up after kMaxStepAttempts with the error, having emitted only tokens of the
// undisturbed run.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/ep_moe_exchange.h"
#include "engine/step_sync.h"
#include "ep_thread_groups.h"
#include "model/registry.h"
#include "test_models.h"
#include "xccl/fault_proxy_transport.h"
#include "xccl/thread_fabric.h"

namespace xds::engine {
namespace {

const std::string& checkpoint() {
  static const std::string dir = fixtures::random_checkpoint("ep_rollback", 53, /*mtp=*/1);
  return dir;
}

enum class Fault {
  kNone,
  kPostMidStep,    // the 3rd flag the group posts to its next peer in the step fails
  kLastOperation,  // the step's last flag to that peer (the last MoE layer's release) fails
  kExchangeError,  // EpMoeExchange::fail_next_exchange()
  kEveryAttempt,   // every get of the group fails from the fault step on
};

struct Case {
  int groups = 2;
  Fault fault = Fault::kNone;
  int fault_group = 1;
  uint64_t fault_step = 2;
};

constexpr int kRequestsPerGroup = 2;
constexpr int32_t kMaxTokens = 6;

// What one group's loop saw.
struct GroupRun {
  std::map<std::string, std::vector<int32_t>> tokens;  // request id -> emitted tokens
  std::vector<Status> failures;                        // execute() errors, in order
  int64_t rollbacks = 0;
  uint64_t fired = 0;  // operations the fault proxy failed
  Status end;          // what the loop returned
};

using ep_test::ep_options;

// The flags a group posts to one peer per MoE layer of a step (one round): counts, rows
// pulled, pre-sums ready, pre-sums pulled.
constexpr uint64_t kPostsPerLayer = 4;

// The DP group's loop around one group's engine (dp_group.cc, DpGroup::run), fault included.
Status run_group(xccl::Fabric& f, const Case& c, GroupRun& out) {
  XDS_ASSIGN_OR_RETURN(auto core, EngineCore::create(ep_test::core_options(checkpoint())));
  XDS_ASSIGN_OR_RETURN(auto shm, xccl::make_transport("shm", f));
  xccl::FaultProxyTransport proxy(std::move(shm));
  xccl::Mailbox mb(f, proxy);
  EpMoeSetup setup;
  setup.model = &core->model();
  setup.mailbox = &mb;
  setup.options = ep_options();
  XDS_ASSIGN_OR_RETURN(auto ex, EpMoeExchange::create(setup));
  core->model().set_moe_exchange(ex.get());
  core->set_step_agreement([&ex] { return ex->agree_step(); });
  std::vector<int> ranks;
  for (int r = 0; r < f.world_size(); ++r) ranks.push_back(r);
  StepSync sync(mb, ranks, 60'000);

  const int64_t vocab = core->info().vocab_size;
  for (int i = 0; i < kRequestsPerGroup; ++i) {
    const int n = f.rank() * kRequestsPerGroup + i;
    XDS_RETURN_IF_ERROR(core->add_request(ep_test::request_of(n, vocab, /*seed_base=*/100, kMaxTokens)));
  }
  int64_t main_moe_layers = 0;
  for (int64_t l : core->info().moe_layers) main_moe_layers += l < core->info().num_layers;

  StepAttempts attempts;
  uint64_t step = 0;
  bool armed = false;
  for (int iter = 0; iter < 200; ++iter) {
    XDS_ASSIGN_OR_RETURN(const StepHeader h,
                         ep_test::plan_step(*core, f.epoch(), step, attempts.attempt()));
    XDS_ASSIGN_OR_RETURN(const StepDecision d, sync.exchange(h));
    if (d.action == StepAction::kSleep) return out.end = Status::ok_status();  // all done
    if (d.action != StepAction::kRun)
      return internal_error("group {} step {}: decision {}", f.rank(), step,
                            step_action_name(d.action));
    if (f.rank() == c.fault_group && step == c.fault_step && !armed) {
      armed = true;
      const int peer = (f.rank() + 1) % f.world_size();
      switch (c.fault) {
        case Fault::kNone:
          break;
        case Fault::kPostMidStep:
          XDS_RETURN_IF_ERROR(
              proxy.add_rule({.op = xccl::FaultOp::kPutWithSignal, .peer = peer, .nth = 3})
                  .status());
          break;
        case Fault::kLastOperation:
          XDS_RETURN_IF_ERROR(proxy
                                  .add_rule({.op = xccl::FaultOp::kPutWithSignal,
                                             .peer = peer,
                                             .nth = kPostsPerLayer * uint64_t(main_moe_layers)})
                                  .status());
          break;
        case Fault::kExchangeError:
          ex->fail_next_exchange();
          break;
        case Fault::kEveryAttempt:
          XDS_RETURN_IF_ERROR(
              proxy.add_rule({.op = xccl::FaultOp::kGet, .count = xccl::kForever}).status());
          break;
      }
    }
    ex->set_step(d.epoch, uint32_t(d.step), attempts.attempt());
    const Status st = core->execute(/*lockstep=*/true);
    if (!st.ok()) out.failures.push_back(st);
    out.rollbacks = attempts.rollbacks();
    if (!attempts.after_execute(st)) return out.end = st;
    out.rollbacks = attempts.rollbacks();
    if (armed && c.fault != Fault::kExchangeError && c.fault != Fault::kNone)
      out.fired = proxy.stats(0).fired;
    if (!st.ok()) continue;  // rolled back everywhere: plan and run the step again
    step = d.next_step;
    ep_test::take_tokens(*core, out.tokens);
  }
  return internal_error("group {}: no end after 200 iterations", f.rank());
}

struct Outcome {
  std::vector<GroupRun> groups;
  std::vector<Status> statuses;
  uint64_t poison = 0;
};

Outcome run_case(const Case& c) {
  Outcome o;
  auto info = load_model_info(checkpoint());
  EXPECT_TRUE(info.ok()) << info.status().to_string();
  if (!info.ok()) return o;
  const xccl::ArenaConfig a = ep_test::arena_config(*info, c.groups, ep_options());
  auto tf = xccl::ThreadFabric::create(a, 2);
  EXPECT_TRUE(tf.ok()) << tf.status().to_string();
  if (!tf.ok()) return o;
  o.groups.resize(size_t(c.groups));
  o.statuses =
      (*tf)->run([&](xccl::Fabric& f) { return run_group(f, c, o.groups[size_t(f.rank())]); });
  o.poison = (*tf)->device(0).poison_word();
  return o;
}

// Every request's tokens, over every group.
std::map<std::string, std::vector<int32_t>> all_tokens(const Outcome& o) {
  std::map<std::string, std::vector<int32_t>> t;
  for (const GroupRun& g : o.groups) t.insert(g.tokens.begin(), g.tokens.end());
  return t;
}

const Outcome& undisturbed(int groups) {
  static std::map<int, Outcome> runs;
  auto it = runs.find(groups);
  if (it == runs.end()) {
    it = runs.emplace(groups, run_case({.groups = groups})).first;
    const Outcome& o = it->second;
    for (size_t r = 0; r < o.statuses.size(); ++r)
      EXPECT_TRUE(o.statuses[r].ok())
          << "undisturbed group " << r << ": " << o.statuses[r].to_string();
    EXPECT_EQ(all_tokens(o).size(), size_t(groups * kRequestsPerGroup));
    for (const auto& [id, t] : all_tokens(o)) EXPECT_EQ(t.size(), size_t(kMaxTokens)) << id;
    for (const GroupRun& g : o.groups) EXPECT_TRUE(g.failures.empty());
  }
  return it->second;
}

// One transient fault: every group rolled the same step back once and ran it again.
void expect_one_rollback_everywhere(const Case& c) {
  const Outcome& ref = undisturbed(c.groups);
  const Outcome o = run_case(c);
  ASSERT_EQ(o.groups.size(), size_t(c.groups));
  for (int r = 0; r < c.groups; ++r) {
    const GroupRun& g = o.groups[size_t(r)];
    EXPECT_TRUE(o.statuses[size_t(r)].ok())
        << "group " << r << ": " << o.statuses[size_t(r)].to_string();
    EXPECT_EQ(g.rollbacks, 1) << "group " << r;
    ASSERT_EQ(g.failures.size(), 1u) << "group " << r;
    EXPECT_EQ(g.failures[0].code(), StatusCode::kAbandoned) << g.failures[0].to_string();
  }
  if (c.fault != Fault::kExchangeError) {
    EXPECT_EQ(o.groups[size_t(c.fault_group)].fired, 1u);
  }
  EXPECT_EQ(o.poison, 0u) << "the epoch was poisoned";
  EXPECT_EQ(all_tokens(o), all_tokens(ref));
}

TEST(EpRollback, AFailedPostMidStepRollsTheStepBackOnEveryGroup) {
  expect_one_rollback_everywhere({.groups = 2, .fault = Fault::kPostMidStep});
}

// The failing group's last flag of the step: its peer has nothing left to wait for in the
// step's exchanges, so only the step-end agreement (agree_step) keeps it from committing.
TEST(EpRollback, AFailureAtTheStepsLastOperationStillRollsBackEveryGroup) {
  expect_one_rollback_everywhere({.groups = 2, .fault = Fault::kLastOperation, .fault_group = 0});
}

// The hook of the fault-injection endpoint (FaultKind::kExchangeError), on four groups.
TEST(EpRollback, AnInjectedExchangeErrorRollsTheStepBackOnFourGroups) {
  expect_one_rollback_everywhere(
      {.groups = 4, .fault = Fault::kExchangeError, .fault_group = 2, .fault_step = 3});
}

// fail_next_exchange() directly, on one MoE layer's exchange with zero tokens on two groups:
// armed in the middle of a step it leaves that step alone; the first run() after the next
// set_step() gives the attempt up on both groups (Abandoned, nothing poisoned); it fires
// once, and the step's next attempt and the step-end agreement go through.
TEST(EpRollback, FailNextExchangeFailsTheNextStepsFirstRunOnce) {
  auto info = load_model_info(checkpoint());
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  xccl::ArenaConfig a;
  a.world_size = 2;
  a.lanes = 1;
  a.ring_slots = 1;
  a.slot_bytes = 64;
  a.staging_bytes = EpMoeExchange::staging_bytes(*info, 2, ComputeDType::kF32, ep_options());
  a.app_bytes = 0;
  auto tf = xccl::ThreadFabric::create(a, 6);
  ASSERT_TRUE(tf.ok()) << tf.status().to_string();
  const auto st = (*tf)->run([&](xccl::Fabric& f) -> Status {
    XDS_ASSIGN_OR_RETURN(auto model, load_causal_lm(checkpoint(), ep_test::core_options(checkpoint()).model));
    XDS_ASSIGN_OR_RETURN(auto t, xccl::make_transport("shm", f));
    xccl::Mailbox mb(f, *t);
    EpMoeSetup setup;
    setup.model = model.get();
    setup.mailbox = &mb;
    setup.options = ep_options();
    XDS_ASSIGN_OR_RETURN(auto ex, EpMoeExchange::create(setup));
    MoeExchangeInput in;  // no tokens: the device still joins dispatch and combine
    in.layer = ex->moe_layers().front();
    in.top_k = model->info().experts_per_token;
    ex->set_step(f.epoch(), 0, 0);
    if (f.rank() == 0) ex->fail_next_exchange();  // mid-step: for the next step
    XDS_RETURN_IF_ERROR(ex->run(in).with_context("step 0"));
    XDS_RETURN_IF_ERROR(ex->agree_step().with_context("step 0"));
    ex->set_step(f.epoch(), 1, 0);
    const Status failed = ex->run(in);
    if (failed.code() != StatusCode::kAbandoned)
      return internal_error("rank {}: step 1 attempt 0 gave {}", f.rank(), failed.to_string());
    ex->set_step(f.epoch(), 1, 1);
    XDS_RETURN_IF_ERROR(ex->run(in).with_context("step 1 attempt 1"));
    XDS_RETURN_IF_ERROR(ex->run(in).with_context("step 1 attempt 1, a second pass"));
    return ex->agree_step().with_context("step 1 attempt 1");
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "group " << r << ": " << st[r].to_string();
  EXPECT_EQ((*tf)->device(0).poison_word(), 0u);
}

// A fault on every attempt of the step: after kMaxStepAttempts the error stands on every
// group (the DP group then exits and the instance restarts), the epoch still clean; what was
// emitted before is the undisturbed run's, nothing of the failed step.
TEST(EpRollback, AStepFailingEveryAttemptGivesUpWithTheError) {
  const Case c{.groups = 2, .fault = Fault::kEveryAttempt};
  const Outcome& ref = undisturbed(2);
  const Outcome o = run_case(c);
  ASSERT_EQ(o.groups.size(), 2u);
  const auto ref_tokens = all_tokens(ref);
  for (int r = 0; r < 2; ++r) {
    const GroupRun& g = o.groups[size_t(r)];
    EXPECT_EQ(o.statuses[size_t(r)].code(), StatusCode::kAbandoned)
        << o.statuses[size_t(r)].to_string();
    EXPECT_EQ(g.failures.size(), size_t(kMaxStepAttempts)) << "group " << r;
    EXPECT_EQ(g.rollbacks, int64_t(kMaxStepAttempts) - 1) << "group " << r;
    for (const auto& [id, t] : g.tokens) {
      // Steps 0 and 1 ran: the prefill's token and one decode.
      ASSERT_EQ(t.size(), size_t(c.fault_step)) << id;
      const std::vector<int32_t>& want = ref_tokens.at(id);
      EXPECT_TRUE(std::equal(t.begin(), t.end(), want.begin())) << id;
    }
  }
  EXPECT_EQ(o.poison, 0u);
}

}  // namespace
}  // namespace xds::engine
