// The gateway's view of its instances (serve/instance_router.h): roles, placement of whole
// requests, prefills and decode phases, the in-flight prefill counts, the handoff queue and
// failover. Every expected instance is worked out by hand from the rules in the header.
#include "serve/instance_router.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace xds::serve {
namespace {

using engine::GroupLoad;
using engine::RequestPhase;

GroupLoad group(int32_t running, int32_t waiting = 0, int64_t parked = 0) {
  GroupLoad g;
  g.running = running;
  g.waiting = waiting;
  g.kv_parked = parked;
  g.block_size = 4;
  return g;
}

std::vector<int32_t> prompt(size_t n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), 1);
  return p;
}

InstanceRoutingPolicy policy(int64_t long_prompt_tokens = 100) {
  InstanceRoutingPolicy p;
  p.long_prompt_tokens = long_prompt_tokens;
  return p;
}

TEST(InstanceRouter, StatesOfTheReportedRoles) {
  EXPECT_EQ(instance_state(protocol::InstanceRole::kColocated), InstanceState::kColocated);
  EXPECT_EQ(instance_state(protocol::InstanceRole::kPrefill), InstanceState::kPrefill);
  EXPECT_EQ(instance_state(protocol::InstanceRole::kDecode), InstanceState::kDecode);
  EXPECT_STREQ(instance_state_name(InstanceState::kPrefill), "prefill");
  EXPECT_STREQ(instance_state_name(InstanceState::kFailed), "failed");
  EXPECT_STREQ(instance_state_name(InstanceState::kUnknown), "");
  InstanceRouter r(2, InstanceRoutingPolicy{});
  EXPECT_EQ(r.state(0), InstanceState::kUnknown);
  r.report_role(0, protocol::InstanceRole::kDecode);
  EXPECT_EQ(r.state(0), InstanceState::kDecode);
  r.report_role(0, protocol::InstanceRole::kColocated);  // a later report replaces it
  EXPECT_EQ(r.state(0), InstanceState::kColocated);
}

TEST(InstanceRouter, OneInstanceTakesEveryRequestWholeAndCountsNothing) {
  InstanceRouter r(1, policy());
  r.report_role(0, protocol::InstanceRole::kPrefill);
  const InstanceRoute route = r.route(prompt(10), /*decode_phase=*/true);
  EXPECT_EQ(route.to, 0);
  EXPECT_EQ(route.phase, RequestPhase::kWhole);
  EXPECT_FALSE(route.hold);
  EXPECT_FALSE(route.no_decode);
  PrefillTicket t;
  r.count_prefill(t, 0, 10);
  EXPECT_EQ(t.instance, -1);
}

TEST(InstanceRouter, ColocatedInstancesTakeTheLeastLoadedAndZeroBeforeRolesAreKnown) {
  InstanceRouter r(3, policy());
  // Nothing reported: instance 0.
  InstanceRoute route = r.route(prompt(10), false);
  EXPECT_EQ(route.to, 0);
  EXPECT_EQ(route.phase, RequestPhase::kWhole);
  for (int32_t i = 0; i < 3; ++i) r.report_role(i, protocol::InstanceRole::kColocated);
  // Requests per group: 0 -> (3 + 1) / 1 = 4; 1 -> (1 + 2 + 0 + 1) / 2 = 2;
  // 2 -> (2 + 0 + 1) / 1 = 3 (parked KV counts).
  r.update_loads(0, {group(3, 1)});
  r.update_loads(1, {group(1, 2), group(0, 1)});
  r.update_loads(2, {group(2, 0, 1)});
  route = r.route(prompt(10), false);
  EXPECT_EQ(route.to, 1);
  EXPECT_EQ(route.phase, RequestPhase::kWhole);
  // A new report replaces the last: 1 -> (6 + 1) / 2 = 3.5, 2 is least loaded now.
  r.update_loads(1, {group(6), group(1)});
  EXPECT_EQ(r.route(prompt(10), false).to, 2);
}

TEST(InstanceRouter, InFlightPrefillsCountAsLoadUntilTheyEnd) {
  InstanceRouter r(2, policy(/*long_prompt_tokens=*/100));
  for (int32_t i = 0; i < 2; ++i) {
    r.report_role(i, protocol::InstanceRole::kColocated);
    r.update_loads(i, {group(1)});
  }
  EXPECT_EQ(r.route(prompt(10), false).to, 0);  // tie: the lower index
  PrefillTicket a;
  r.count_prefill(a, 0, 10);
  EXPECT_EQ(a.instance, 0);
  EXPECT_FALSE(a.long_prompt);
  // 0: 1 + 1 sent = 2 > 1: instance 1.
  EXPECT_EQ(r.route(prompt(10), false).to, 1);
  r.count_prefill(a, 1, 10);  // counted already: unchanged
  EXPECT_EQ(a.instance, 0);
  // A long prompt avoids 0, which prefills a short one, even at equal load: 1 then.
  PrefillTicket b;
  r.count_prefill(b, 1, 10);                     // both at 2 now, both prefill short prompts
  EXPECT_EQ(r.route(prompt(150), false).to, 0);  // all hold short ones: least loaded, tie -> 0
  r.end_prefill(a);
  EXPECT_EQ(a.instance, -1);
  r.end_prefill(a);  // ended already: nothing
  // 0 is back at 1 and clean of short prompts; 1 at 2 holds one.
  EXPECT_EQ(r.route(prompt(150), false).to, 0);
  PrefillTicket c;
  r.count_prefill(c, 0, 150);
  EXPECT_TRUE(c.long_prompt);
  // A short prompt now avoids 0 (prefilling a long one) though both are at 2.
  EXPECT_EQ(r.route(prompt(10), false).to, 1);
}

TEST(InstanceRouter, TheInstanceHoldingThePromptsBlocksWins) {
  InstanceRouter r(2, policy());
  for (int32_t i = 0; i < 2; ++i) r.report_role(i, protocol::InstanceRole::kColocated);
  r.update_loads(0, {group(1)});
  r.update_loads(1, {group(2)});
  const std::vector<int32_t> p = prompt(12);  // 3 blocks of 4
  EXPECT_EQ(r.route(p, false).to, 0);
  const std::vector<uint64_t> chain = prompt_block_hashes(p, 4);
  ASSERT_EQ(chain.size(), 3u);
  r.update_blocks(1, chain, {});
  // 1 holds 3 leading blocks, its load 2 is within 1 + 2 of the least loaded.
  EXPECT_EQ(r.route(p, false).to, 1);
  EXPECT_EQ(r.cached_blocks(), (std::vector<size_t>{0, 3}));
  // The first block evicted: no leading hit left on 1.
  r.update_blocks(1, {}, std::vector<uint64_t>{chain[0]});
  EXPECT_EQ(r.route(p, false).to, 0);
  EXPECT_EQ(r.cached_blocks(), (std::vector<size_t>{0, 2}));
}

TEST(InstanceRouter, DisaggregatedPrefillsAndDecodesGoToTheirRoles) {
  // 0 prefill, 1 and 2 decode, 3 colocated.
  InstanceRouter r(4, policy());
  r.report_role(0, protocol::InstanceRole::kPrefill);
  r.report_role(1, protocol::InstanceRole::kDecode);
  r.report_role(2, protocol::InstanceRole::kDecode);
  r.report_role(3, protocol::InstanceRole::kColocated);
  r.update_loads(0, {group(5)});
  r.update_loads(1, {group(4)});
  r.update_loads(2, {group(1), group(3)});  // 2 per group
  r.update_loads(3, {group(0)});
  InstanceRoute route = r.route(prompt(10), false);
  EXPECT_EQ(route.to, 0);
  EXPECT_EQ(route.phase, RequestPhase::kPrefillOnly);
  EXPECT_FALSE(route.hold);
  route = r.route(prompt(10), /*decode_phase=*/true);
  EXPECT_EQ(route.to, 2);
  EXPECT_EQ(route.phase, RequestPhase::kDecode);
  // While a handoff waits, new prefills hold; decode phases do not.
  EXPECT_TRUE(r.handoffs().defer("h1"));
  EXPECT_TRUE(r.route(prompt(10), false).hold);
  EXPECT_FALSE(r.route(prompt(10), true).hold);
}

TEST(InstanceRouter, FailoverTakesAnInstanceOutAndWhatIsLeftRunsWholeRequests) {
  InstanceRouter r(2, policy());
  r.report_role(0, protocol::InstanceRole::kPrefill);
  r.report_role(1, protocol::InstanceRole::kDecode);
  r.update_loads(1, {group(1)});
  r.update_blocks(1, std::vector<uint64_t>{7, 8}, {});
  EXPECT_TRUE(r.continues_elsewhere(/*decode_phase=*/true, /*streamed=*/false));
  EXPECT_FALSE(r.continues_elsewhere(true, /*streamed=*/true));
  EXPECT_FALSE(r.continues_elsewhere(false, false));
  EXPECT_TRUE(r.mark_failed(1));  // 0 is left
  EXPECT_EQ(r.state(1), InstanceState::kFailed);
  r.report_role(1, protocol::InstanceRole::kDecode);  // a late report does not bring it back
  EXPECT_EQ(r.state(1), InstanceState::kFailed);
  EXPECT_TRUE(r.group_loads().empty());
  EXPECT_EQ(r.cached_blocks(), (std::vector<size_t>{0, 0}));
  EXPECT_FALSE(r.continues_elsewhere(true, false));  // no decode instance left
  const InstanceRoute decode = r.route(prompt(10), true);
  EXPECT_TRUE(decode.no_decode);
  // Prefill alone is not disaggregated: the prefill instance runs new requests whole.
  const InstanceRoute whole = r.route(prompt(10), false);
  EXPECT_EQ(whole.to, 0);
  EXPECT_EQ(whole.phase, RequestPhase::kWhole);
  EXPECT_FALSE(r.mark_failed(0));  // none left
}

TEST(InstanceRouter, ARecoveringInstanceIsOutUntilItAnswersReadyAndARestartIsSeen) {
  InstanceRouter r(2, policy());
  r.report_role(0, protocol::InstanceRole::kColocated);
  r.report_role(1, protocol::InstanceRole::kColocated);
  r.update_loads(0, {group(0)});
  r.update_loads(1, {group(5)});
  EXPECT_EQ(r.route(prompt(10), false).to, 0);  // the less loaded
  EXPECT_FALSE(r.restarted(0, 77));              // a first answer is no restart
  EXPECT_TRUE(r.mark_failed(0, /*recovering=*/true, "DP group 1 died"));  // 1 still serves
  EXPECT_EQ(r.state(0), InstanceState::kRecovering);
  EXPECT_STREQ(instance_state_name(InstanceState::kRecovering), "recovering");
  EXPECT_FALSE(r.serving(0));
  EXPECT_EQ(r.why(0), "DP group 1 died");
  EXPECT_EQ(r.route(prompt(10), false).to, 1);  // nothing goes to 0 meanwhile
  r.report_role(0, protocol::InstanceRole::kColocated);  // a report alone does not bring it back
  EXPECT_EQ(r.state(0), InstanceState::kRecovering);
  EXPECT_TRUE(r.restarted(0, 78));   // a new incarnation
  EXPECT_FALSE(r.restarted(0, 78));  // seen already
  EXPECT_EQ(r.incarnation(0), 78u);
  EXPECT_TRUE(r.rejoin(0, protocol::InstanceRole::kColocated));
  EXPECT_FALSE(r.rejoin(0, protocol::InstanceRole::kColocated));  // serving already
  EXPECT_TRUE(r.serving(0));
  EXPECT_EQ(r.why(0), "");
  EXPECT_EQ(r.route(prompt(10), false).to, 0);  // its loads were forgotten: no load
}

TEST(InstanceRouter, WithNothingServingARequestHasNowhereToGo) {
  InstanceRouter one(1, policy());
  EXPECT_EQ(one.route(prompt(3), false).to, 0);
  EXPECT_FALSE(one.mark_failed(0, /*recovering=*/true));
  EXPECT_FALSE(one.any_serving());
  EXPECT_EQ(one.route(prompt(3), false).to, -1);
  InstanceRouter two(2, policy());  // roles not reported yet: the first that may serve
  two.heard_all(10);
  two.mark_failed(0);
  EXPECT_EQ(two.route(prompt(3), false).to, 1);
  two.mark_failed(1, true);
  EXPECT_EQ(two.route(prompt(3), false).to, -1);
  EXPECT_TRUE(two.silent(1'000'000, 1).empty());  // out already: not silent again
}

TEST(InstanceRouter, InstancesFromEtcdJoinWithNewIndicesAndLeaveForGood) {
  InstanceRouter r(0, policy());  // a gateway on etcd starts with none registered
  EXPECT_EQ(r.route(prompt(3), false).to, -1);
  EXPECT_FALSE(r.any_present());
  EXPECT_EQ(r.add_instance(), 0);
  EXPECT_TRUE(r.any_present());
  EXPECT_EQ(r.state(0), InstanceState::kUnknown);
  EXPECT_EQ(r.route(prompt(3), false).to, 0);  // routable before it reports a role
  r.report_role(0, protocol::InstanceRole::kColocated);
  EXPECT_EQ(r.add_instance(), 1);
  r.report_role(1, protocol::InstanceRole::kColocated);
  r.update_loads(0, {group(4)});
  r.update_loads(1, {group(1)});
  EXPECT_EQ(r.route(prompt(3), false).to, 1);  // the less loaded
  r.mark_left(1, "lease expired");
  EXPECT_EQ(r.state(1), InstanceState::kLeft);
  EXPECT_STREQ(instance_state_name(InstanceState::kLeft), "left");
  EXPECT_FALSE(r.serving(1));
  EXPECT_EQ(r.why(1), "lease expired");
  EXPECT_EQ(r.route(prompt(3), false).to, 0);
  // A left instance neither rejoins nor takes a role again (it registers as a new index).
  EXPECT_FALSE(r.rejoin(1, protocol::InstanceRole::kColocated));
  r.report_role(1, protocol::InstanceRole::kColocated);
  EXPECT_EQ(r.state(1), InstanceState::kLeft);
  // A recovering instance is still present (worth waiting for); a left one is not.
  r.mark_failed(0, /*recovering=*/true);
  EXPECT_TRUE(r.any_present());
  EXPECT_EQ(r.route(prompt(3), false).to, -1);
  r.mark_left(0, "revoked");
  EXPECT_FALSE(r.any_present());
  EXPECT_EQ(r.add_instance(), 2);  // indices are never reused
  EXPECT_EQ(r.route(prompt(3), false).to, 2);
}

TEST(InstanceRouter, SilentInstancesAreThoseNotHeardWithinTheTimeout) {
  InstanceRouter r(3, policy());
  r.heard_all(1000);
  r.heard(1, 1900);
  EXPECT_TRUE(r.silent(1500, 500).empty());  // 500 is not past 500
  EXPECT_EQ(r.silent(1501, 500), (std::vector<int32_t>{0, 2}));
  r.mark_failed(2);
  EXPECT_EQ(r.silent(5000, 500), (std::vector<int32_t>{0, 1}));  // failed ones are out already
}

TEST(InstanceRouter, AnInstanceNeverHeardFromIsNotSilentYet) {
  InstanceRouter r(2, policy());
  r.heard(1, 1000);  // instance 0 still loads its model: its timer has not started
  EXPECT_TRUE(r.silent(1500, 500).empty());
  EXPECT_EQ(r.silent(1501, 500), (std::vector<int32_t>{1}));
  r.heard(0, 100'000);  // its first answer starts it
  EXPECT_EQ(r.silent(100'600, 500), (std::vector<int32_t>{0, 1}));
}

TEST(InstanceRouter, GroupLoadsAreNumberedAcrossInstances) {
  InstanceRouter r(2, policy());
  r.update_loads(0, {group(1), group(2)});
  r.update_loads(1, {group(3)});
  const std::vector<GroupLoad> l = r.group_loads();
  ASSERT_EQ(l.size(), 3u);
  for (int32_t g = 0; g < 3; ++g) {
    EXPECT_EQ(l[static_cast<size_t>(g)].group, g);
    EXPECT_EQ(l[static_cast<size_t>(g)].running, g + 1);
  }
}

TEST(HandoffQueue, DefersOnceOffersTheHeadAndDropsTheGone) {
  HandoffQueue q;
  std::set<std::string> alive = {"a", "b", "c"};
  auto is_alive = [&](const std::string& id) { return alive.count(id) > 0; };
  EXPECT_EQ(q.offer(is_alive), std::nullopt);
  EXPECT_TRUE(q.defer("a"));
  EXPECT_TRUE(q.defer("b"));
  EXPECT_FALSE(q.defer("b"));  // waits already: not counted again
  EXPECT_TRUE(q.defer("c"));
  EXPECT_EQ(q.offer(is_alive), "a");
  EXPECT_EQ(q.offer(is_alive), std::nullopt);  // one offer at a time
  EXPECT_FALSE(q.defer("a"));                  // refused again: keeps its place, the offer is over
  EXPECT_FALSE(q.offer_in_flight());
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.offer(is_alive), "a");
  q.taken("b");  // not the head: nothing
  EXPECT_EQ(q.size(), 3u);
  q.taken("a");
  EXPECT_EQ(q.size(), 2u);
  EXPECT_FALSE(q.offer_in_flight());
  // b is gone (cancelled elsewhere): dropped, c offered in the same call.
  alive.erase("b");
  EXPECT_EQ(q.offer(is_alive), "c");
  EXPECT_EQ(q.size(), 1u);
  // c's offer is in flight when it goes away: the offer ends, the next head can be offered.
  EXPECT_TRUE(q.offer_in_flight());
  q.cancel("c");
  EXPECT_TRUE(q.empty());
  EXPECT_FALSE(q.offer_in_flight());
  EXPECT_TRUE(q.defer("d"));
  EXPECT_EQ(q.offer(is_alive), std::nullopt);  // d is not alive in this test
  alive.insert("e");
  EXPECT_TRUE(q.defer("e"));
  EXPECT_EQ(q.offer(is_alive), "e");
}

}  // namespace
}  // namespace xds::serve
