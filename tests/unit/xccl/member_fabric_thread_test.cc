// Scale-down at the fabric level (xccl/member_fabric.h), over the thread fabric (label tsan):
// one of three devices dies in the middle of a barrier, the survivors' barrier fails with the
// poisoned epoch; after the survivors cleared their own lines (reset_protocol_lines) they
// form a MemberFabric of the two of them -- renumbered, a new epoch, clean poison line -- on
// which barriers and all-gathers work again, many times over (sequence numbers start afresh
// on both sides), and whose liveness is the parent's, per member.
#include "xccl/member_fabric.h"

#include <gtest/gtest.h>

#include <barrier>
#include <fmt/format.h>
#include <memory>
#include <vector>

#include "xccl/mailbox.h"
#include "xccl/thread_fabric.h"
#include "xccl/transport.h"

namespace xds::xccl {
namespace {

ArenaConfig small_arena(int world) {
  ArenaConfig a;
  a.world_size = world;
  a.lanes = 1;
  a.ring_slots = 1;
  a.slot_bytes = 64;
  a.staging_bytes = 4096;
  a.app_bytes = 0;
  return a;
}

WaitCtx ctx() { return WaitCtx{OpKind::kBarrier, deadline_after_ms(20'000), {}}; }

std::vector<int> others(const Fabric& f) {
  std::vector<int> p;
  for (int r = 0; r < f.world_size(); ++r)
    if (r != f.rank()) p.push_back(r);
  return p;
}

TEST(MemberFabric, SurvivorsOfADeadDeviceStepOnAsAFabricOfTheirOwn) {
  auto tf = ThreadFabric::create(small_arena(3), 7);
  ASSERT_TRUE(tf.ok()) << tf.status().to_string();
  std::barrier<> survivors(2);
  const std::vector<Status> st = (*tf)->run([&](Fabric& f) -> Status {
    XDS_ASSIGN_OR_RETURN(auto t, make_transport("shm", f));
    auto mb = std::make_unique<Mailbox>(f, *t);
    XDS_RETURN_IF_ERROR(barrier(*mb, others(f), collective_key(7, 0, 1, 0), ctx()));
    if (f.rank() == 1) {  // dies before the second barrier
      (*tf)->mark_dead(1);
      return Status::ok_status();
    }
    const Status lost = barrier(*mb, others(f), collective_key(7, 1, 1, 0), ctx());
    if (lost.code() != StatusCode::kAborted)
      return internal_error("rank {}: the barrier with a dead peer gave {}", f.rank(),
                            lost.to_string());
    mb.reset();
    t.reset();
    survivors.arrive_and_wait();  // both left the fabric
    reset_protocol_lines(f);
    survivors.arrive_and_wait();  // both cleared their lines
    XDS_ASSIGN_OR_RETURN(auto view, MemberFabric::create(f, {0, 2}, 0x1007));
    if (view->world_size() != 2 || view->rank() != (f.rank() == 0 ? 0 : 1) ||
        view->parent_rank(1) != 2 || view->epoch() != 0x1007u || view->poison_word() != 0)
      return internal_error("rank {}: the view is rank {} of {}, poison {:x}", f.rank(),
                            view->rank(), view->world_size(), view->poison_word());
    if (!view->peer_alive(0) || !view->peer_alive(1))
      return internal_error("rank {}: a member looks dead", f.rank());
    XDS_ASSIGN_OR_RETURN(auto vt, make_transport("shm", *view));
    Mailbox vmb(*view, *vt);
    const std::vector<int> peer = others(*view);
    for (uint32_t step = 0; step < 20; ++step) {
      XDS_RETURN_IF_ERROR(barrier(vmb, peer, collective_key(0x1007, step, 1, 0), ctx())
                              .with_context(fmt::format("rank {} step {}", f.rank(), step)));
      MailWords mine{};
      mine[0] = uint64_t(f.rank()) * 1000 + step;
      MailWords got[1]{};
      XDS_RETURN_IF_ERROR(
          allgather_words(vmb, peer, collective_key(0x1007, step, 2, 0), mine, ctx(), got));
      const uint64_t want = uint64_t(f.rank() == 0 ? 2 : 0) * 1000 + step;
      if (got[0][0] != want)
        return internal_error("rank {} step {}: got {} from its peer, want {}", f.rank(), step,
                              got[0][0], want);
    }
    return Status::ok_status();
  });
  for (size_t r = 0; r < st.size(); ++r) EXPECT_TRUE(st[r].ok()) << r << ": " << st[r].to_string();
}

TEST(MemberFabric, MembersMustBeAscendingDevicesHoldingThisOne) {
  auto tf = ThreadFabric::create(small_arena(3), 2);
  ASSERT_TRUE(tf.ok());
  Fabric& f = (*tf)->device(1);
  EXPECT_EQ(MemberFabric::create(f, {0, 2}, 9).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MemberFabric::create(f, {2, 1}, 9).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MemberFabric::create(f, {1, 3}, 9).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MemberFabric::create(f, {}, 9).status().code(), StatusCode::kInvalidArgument);
  auto v = MemberFabric::create(f, {1, 2}, 9);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ((*v)->rank(), 0);
  EXPECT_EQ((*v)->arena(1), f.arena(2));
  (*tf)->mark_dead(2);
  EXPECT_FALSE((*v)->peer_alive(1));  // the parent's device 2
  EXPECT_TRUE((*v)->peer_alive(0));
}

}  // namespace
}  // namespace xds::xccl
