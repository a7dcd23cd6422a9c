// Abandoning a step attempt (Mailbox::abandon, Exchange::abandon) over the thread fabric
// (label tsan): a transport operation that fails on one device (FaultProxyTransport around the
// shared-memory transport) ends the attempt with Abandoned on every device -- not a poisoned
// epoch, not a deadline -- every device gives it up together, and the re-run under the next
// attempt's keys gives the reference result (moe_reference.h). A stale message of the
// abandoned attempt is skipped, never taken; a marker that cannot be written poisons.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "moe_reference.h"
#include "xccl/fault_proxy_transport.h"
#include "xccl/thread_fabric.h"

namespace xds::xccl {
namespace {

using testing::MoeCase;

MoeConfig moe_config(const MoeCase& c) {
  return MoeConfig{.hidden = c.hidden,
                   .topk = c.topk,
                   .max_tokens = c.max_tokens,
                   .slots_per_device = c.slots,
                   .timeout_ms = 60'000};
}

ArenaConfig arena_for(const MoeCase& c) {
  ArenaConfig a;
  a.world_size = c.world;
  a.lanes = 1;
  a.ring_slots = 1;
  a.slot_bytes = 64;
  a.staging_bytes = moe_staging_bytes(moe_config(c), c.world);
  a.app_bytes = 0;
  return a;
}

MoeCase three_devices() {
  MoeCase c;
  c.world = 3;
  c.n_logical = 9;
  c.slots = 4;
  c.max_tokens = 8;
  c.n_tokens = {11, 4, 7};  // two rounds
  c.seed = 21;
  return c;
}

// One device's side: its transport (a fault proxy around shm), mailbox and exchange.
struct Device {
  Fabric& f;
  FaultProxyTransport proxy;
  Mailbox mb;
  ThreadPool pool{2};
  std::unique_ptr<Exchange> ex;
  std::vector<testing::DeviceInput> in;
  ExpertMap map;

  Device(Fabric& fabric, const MoeCase& c)
      : f(fabric),
        proxy(std::move(make_transport("shm", fabric).value())),
        mb(fabric, proxy),
        map(testing::make_map(c)) {
    ExchangeRoles roles;
    for (int r = 0; r < c.world; ++r) {
      roles.senders.push_back(r);
      roles.receivers.push_back(r);
    }
    roles.staging_base = f.layout().staging;
    ex = std::move(Exchange::create(mb, moe_config(c), roles, &pool).value());
    for (int d = 0; d < c.world; ++d) in.push_back(testing::make_input(c, d));
  }

  // One attempt of step `step`: every round, under that attempt's key and watch.
  Status attempt(const MoeCase& c, uint32_t step, uint32_t attempt, std::vector<uint16_t>& out) {
    mb.watch(attempt_tag(step, attempt));
    const int me = f.rank();
    out.assign(size_t(c.n_tokens[size_t(me)]) * size_t(c.hidden), 0xFFFF);
    return run_moe_rounds(
        *ex, in[size_t(me)].x.data(), in[size_t(me)].ids, in[size_t(me)].w, c.n_tokens[size_t(me)],
        map, collective_key(f.epoch(), (step << 2) | attempt, 5, 0),
        [&](const Exchange& e, uint16_t* y) { testing::run_experts(c, me, e, y); }, out.data());
  }
};

// Device `failing` fails the nth of its operations `rule` describes in attempt 0; every device
// must see Abandoned, give the attempt up, and match the reference in attempt 1.
void run_fault(const MoeCase& c, int failing, const FaultRule& rule) {
  auto tf = ThreadFabric::create(arena_for(c), 4);
  ASSERT_TRUE(tf.ok()) << tf.status().to_string();
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    Device d(f, c);
    if (f.rank() == failing) XDS_RETURN_IF_ERROR(d.proxy.add_rule(rule).status());
    std::vector<uint16_t> out;
    const Status first = d.attempt(c, 7, 0, out);
    if (first.code() != StatusCode::kAbandoned)
      return internal_error("rank {}: attempt 0 gave {}, expected Abandoned", f.rank(),
                            first.to_string());
    XDS_RETURN_IF_ERROR(d.ex->abandon(attempt_tag(7, 0)));
    if (d.mb.watched() != 0) return internal_error("rank {}: still watching", f.rank());
    if (f.rank() == failing && d.proxy.stats(0).fired != 1)
      return internal_error("the rule fired {} times", d.proxy.stats(0).fired);
    XDS_RETURN_IF_ERROR(d.attempt(c, 7, 1, out));
    XDS_RETURN_IF_ERROR(testing::check_combined(c, d.in[size_t(f.rank())], f.rank(), out));
    // And the step after it, as ever.
    XDS_RETURN_IF_ERROR(d.attempt(c, 8, 0, out));
    XDS_RETURN_IF_ERROR(testing::check_combined(c, d.in[size_t(f.rank())], f.rank(), out));
    return d.ex->finish();
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  EXPECT_EQ((*tf)->device(0).poison_word(), 0u);
}

// A failed post (the 2nd flag device 1 sends rank 0: its release of round 0's rows) ends
// the attempt mid-dispatch.
TEST(XcclAbandonThread, AFailedPostAbandonsTheAttemptEverywhere) {
  run_fault(three_devices(), 1, {.op = FaultOp::kPutWithSignal, .peer = 0, .nth = 2});
}

// A failed row get (dispatch pulls every remote row through the transport).
TEST(XcclAbandonThread, AFailedGetAbandonsTheAttemptEverywhere) {
  run_fault(three_devices(), 2, {.op = FaultOp::kGet, .peer = 0, .nth = 2});
}

// A failure in the second round, after the first round's combine completed everywhere.
TEST(XcclAbandonThread, AFailureInALaterRoundAbandonsTheWholeAttempt) {
  MoeCase c = three_devices();
  c.world = 2;
  c.n_logical = 8;
  c.n_tokens = {11, 4};
  // Per round device 0 posts four flags to rank 1 (counts, rows pulled, pre-sums ready,
  // pre-sums pulled); the 5th is the second round's counts.
  run_fault(c, 0, {.op = FaultOp::kPutWithSignal, .peer = 1, .nth = 5});
}

// Messages of the abandoned attempt that nobody read -- device 1's counts and ready flag,
// posted to device 0 under attempt 0's key after device 0 had given the attempt up -- are
// skipped by the re-run, never taken for its own (taking them would poison: out of step).
TEST(XcclAbandonThread, AStaleFlagOfTheAbandonedAttemptIsNotTaken) {
  MoeCase c = three_devices();
  c.world = 2;
  c.n_logical = 8;
  c.n_tokens = {5, 9};
  auto tf = ThreadFabric::create(arena_for(c), 4);
  ASSERT_TRUE(tf.ok()) << tf.status().to_string();
  std::atomic<bool> zero_gave_up{false};
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    Device d(f, c);
    const uint64_t tag = attempt_tag(3, 0);
    const uint64_t stale_key = collective_key(f.epoch(), 3 << 2, 5, 0);
    d.mb.watch(tag);
    if (f.rank() == 0) {
      // Gives the attempt up at once (as an injected fault does), before posting anything.
      zero_gave_up.store(true);
      XDS_RETURN_IF_ERROR(d.ex->abandon(tag));
    } else {
      while (!zero_gave_up.load()) std::this_thread::yield();
      // Stale flags into device 0's arena: plausible counts (one entry) and a ready flag.
      if (op_failed(d.mb.post(0, Channel::kDispatchMeta, stale_key, MailWords{1, 1, 1, 0, 0, 0})) ||
          op_failed(d.mb.post(0, Channel::kCombineReady, stale_key, MailWords{1, 0, 0, 0, 0, 0})))
        return internal_error("stale posts failed");
      XDS_RETURN_IF_ERROR(d.ex->abandon(tag));
    }
    std::vector<uint16_t> out;
    XDS_RETURN_IF_ERROR(d.attempt(c, 3, 1, out));
    XDS_RETURN_IF_ERROR(testing::check_combined(c, d.in[size_t(f.rank())], f.rank(), out));
    return d.ex->finish();
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  EXPECT_EQ((*tf)->device(0).poison_word(), 0u);
}

// Without the abandon protocol the same stale counts would be taken for the re-run's: the
// key check refuses them (out of step) -- the keys of the two attempts differ.
TEST(XcclAbandonThread, WithoutAbandoningAStaleFlagPoisonsInsteadOfBeingTaken) {
  MoeCase c = three_devices();
  c.world = 2;
  c.n_logical = 8;
  c.n_tokens = {5, 9};
  auto tf = ThreadFabric::create(arena_for(c), 4);
  ASSERT_TRUE(tf.ok()) << tf.status().to_string();
  std::atomic<bool> posted{false};
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    Device d(f, c);
    std::vector<uint16_t> out;
    if (f.rank() == 1) {
      if (op_failed(d.mb.post(0, Channel::kDispatchMeta, collective_key(f.epoch(), 3 << 2, 5, 0),
                              MailWords{1, 1, 1, 0, 0, 0})))
        return internal_error("stale post failed");
      posted.store(true);
      // Joins once device 0 judged the line (one message in flight per line, as ever).
      while (f.poison_word() == 0) std::this_thread::yield();
    } else {
      while (!posted.load()) std::this_thread::yield();
    }
    return d.attempt(c, 3, 1, out);
  });
  for (size_t r = 0; r < st.size(); ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kAborted) << "rank " << r << ": " << st[r].to_string();
    EXPECT_NE(st[r].message().find("out of step"), std::string::npos) << st[r].to_string();
  }
}

// The marker itself cannot be written (every signal of device 1 fails): there is no attempt
// to give up together any more, so the epoch is poisoned and every device says so alike.
TEST(XcclAbandonThread, AMarkerThatCannotBeWrittenPoisonsTheEpoch) {
  const MoeCase c = three_devices();
  auto tf = ThreadFabric::create(arena_for(c), 4);
  ASSERT_TRUE(tf.ok()) << tf.status().to_string();
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    Device d(f, c);
    if (f.rank() == 1)
      XDS_RETURN_IF_ERROR(
          d.proxy.add_rule({.op = FaultOp::kPutWithSignal, .count = kForever}).status());
    std::vector<uint16_t> out;
    Status s = d.attempt(c, 2, 0, out);
    if (s.code() == StatusCode::kAbandoned) s = d.ex->abandon(attempt_tag(2, 0));
    return s;
  });
  for (size_t r = 0; r < st.size(); ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kAborted) << "rank " << r << ": " << st[r].to_string();
    EXPECT_NE(st[r].message().find("could not be reached"), std::string::npos) << st[r].to_string();
  }
  EXPECT_NE((*tf)->device(0).poison_word(), 0u);
}

}  // namespace
}  // namespace xds::xccl
