// The step header: packing (hand-built words), the pure merge (hand-derived decisions), and
// the exchange over the thread fabric (every device takes the same decision as the merge of
// every device's header, computed here independently of the exchange).
#include "engine/step_sync.h"

#include <gtest/gtest.h>

#include <vector>

#include "xccl/thread_fabric.h"
#include "xccl/transport.h"

namespace xds::engine {
namespace {

StepHeader header(uint32_t tokens, uint16_t passes, uint64_t version) {
  StepHeader h;
  h.epoch = 3;
  h.step = 41;
  h.tokens = tokens;
  h.moe_passes = passes;
  h.map_version = version;
  return h;
}

TEST(StepHeader, PacksIntoTheDocumentedWords) {
  StepHeader h = header(1000, 3, 7);
  h.busy = true;
  h.requests = 12;
  h.wake_seq = 5;
  h.attempt = 2;
  const xccl::MailWords w = pack_step_header(h);
  // w0: magic "ST" @48, version 2 @40, flags (busy = 2) @32, epoch 3.
  EXPECT_EQ(w[0], 0x5354'02'02'00000003ull);
  EXPECT_EQ(w[1], 41u);
  EXPECT_EQ(w[2], (2ull << 48) | (3ull << 32) | 1000u);
  EXPECT_EQ(w[3], 7u);
  EXPECT_EQ(w[4], 12u);
  EXPECT_EQ(w[5], 5u);
}

TEST(StepHeader, RoundTripsEveryField) {
  StepHeader h;
  h.epoch = 0xFFFFFFFFu;
  h.step = 0x0123456789ABCDEFull;
  h.tokens = 0xFFFFFFFFu;
  h.moe_passes = 0xFFFF;
  h.map_version = ~0ull;
  h.abort = true;
  h.busy = true;
  h.stop = true;
  h.requests = 0x80000001u;
  h.abort_code = 0xDEADBEEFu;
  h.wake_seq = 0xFEDCBA9876543210ull;
  h.attempt = 0xFF;
  auto u = unpack_step_header(pack_step_header(h));
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  EXPECT_EQ(u->epoch, h.epoch);
  EXPECT_EQ(u->step, h.step);
  EXPECT_EQ(u->tokens, h.tokens);
  EXPECT_EQ(u->moe_passes, h.moe_passes);
  EXPECT_EQ(u->map_version, h.map_version);
  EXPECT_TRUE(u->abort && u->busy && u->stop);
  EXPECT_EQ(u->requests, h.requests);
  EXPECT_EQ(u->abort_code, h.abort_code);
  EXPECT_EQ(u->wake_seq, h.wake_seq);
  EXPECT_EQ(u->attempt, h.attempt);
}

TEST(StepHeader, RejectsWordsThatAreNotAHeader) {
  const xccl::MailWords good = pack_step_header(header(1, 1, 1));
  xccl::MailWords w = good;
  w[0] &= ~(0xFFFFull << 48);  // no magic (e.g. a plain barrier's zero words)
  EXPECT_EQ(unpack_step_header(w).status().code(), StatusCode::kDataLoss);
  EXPECT_NE(unpack_step_header(w).status().message().find("magic"), std::string::npos);
  w = good;
  w[0] += 1ull << 40;  // format version 3
  EXPECT_NE(unpack_step_header(w).status().message().find("version 3"), std::string::npos);
  w = good;
  w[0] |= 0x80ull << 32;  // an unknown flag
  EXPECT_EQ(unpack_step_header(w).status().code(), StatusCode::kDataLoss);
  w = good;
  w[2] |= 1ull << 58;  // reserved bits of word 2
  EXPECT_EQ(unpack_step_header(w).status().code(), StatusCode::kDataLoss);
}

TEST(StepMerge, SleepsUntilAWakeNewerThanAnyDeviceSaw) {
  // Device 0 consumed wake 4 before the idle step, device 1 only wake 3: both must sleep
  // until a wake newer than 4, or device 1 would wake alone on wake 4 still in its queue.
  std::vector<StepHeader> h = {header(0, 0, 1), header(0, 0, 1)};
  h[0].wake_seq = 4;
  h[1].wake_seq = 3;
  auto d = merge_step_headers(h);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->action, StepAction::kSleep);
  EXPECT_EQ(d->wake_seq, 4u);
}

TEST(StepMerge, RunsWithTheLargestPassCountAndTheOldestLoadedMap) {
  // Device 1 has no tokens; device 2 runs two MTP drafts (3 passes) and has loaded map 9
  // while the others still have 8.
  const std::vector<StepHeader> h = {header(5, 1, 8), header(0, 0, 8), header(17, 3, 9)};
  auto d = merge_step_headers(h);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->action, StepAction::kRun);
  EXPECT_EQ(d->moe_passes, 3);
  EXPECT_EQ(d->map_version, 8u);
  EXPECT_EQ(d->total_tokens, 22u);
  EXPECT_EQ(d->max_tokens, 17u);
  EXPECT_EQ(d->idle_devices, 1);
  EXPECT_EQ(d->epoch, 3u);
  EXPECT_EQ(d->step, 41u);
  EXPECT_EQ(d->next_step, 42u);
}

TEST(StepMerge, ATokenWithoutAPassCountStillRunsOnePass) {
  const std::vector<StepHeader> h = {header(2, 0, 1), header(0, 0, 1)};
  auto d = merge_step_headers(h);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->action, StepAction::kRun);
  EXPECT_EQ(d->moe_passes, 1);
}

TEST(StepMerge, AllIdleSleepsBusySkipsAllStoppingStops) {
  std::vector<StepHeader> h = {header(0, 0, 4), header(0, 0, 4), header(0, 0, 4)};
  auto d = merge_step_headers(h);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->action, StepAction::kSleep);
  EXPECT_EQ(d->next_step, 41u);  // a step not run does not advance
  EXPECT_EQ(d->idle_devices, 3);

  h[1].busy = true;  // a KV transfer in flight somewhere: do not sleep
  EXPECT_EQ(merge_step_headers(h)->action, StepAction::kSkip);
  h[1].busy = false;

  h[0].stop = h[2].stop = true;  // two of three drained: nobody stops yet
  EXPECT_EQ(merge_step_headers(h)->action, StepAction::kSleep);
  h[1].stop = true;
  EXPECT_EQ(merge_step_headers(h)->action, StepAction::kStop);

  h[2].tokens = 1;  // work outranks a stop request
  h[2].moe_passes = 1;
  EXPECT_EQ(merge_step_headers(h)->action, StepAction::kRun);
}

TEST(StepMerge, AbortOutranksEverythingAndNamesTheLowestRequester) {
  std::vector<StepHeader> h = {header(3, 1, 1), header(4, 1, 1), header(5, 1, 1),
                               header(0, 0, 1)};
  h[3].step = 40;  // out of step as well: a requested abort is still what is reported
  h[2].abort = true;
  h[2].abort_code = 77;
  h[1].abort = true;
  h[1].abort_code = 5;
  auto d = merge_step_headers(h);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->action, StepAction::kAbort);
  EXPECT_EQ(d->cause, AbortCause::kRequested);
  EXPECT_EQ(d->abort_rank, 1);
  EXPECT_EQ(d->abort_code, 5u);
}

TEST(StepMerge, DevicesOutOfStepAbort) {
  std::vector<StepHeader> h = {header(3, 1, 1), header(4, 1, 1), header(0, 0, 1)};
  h[2].step = 42;
  auto d = merge_step_headers(h);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->action, StepAction::kAbort);
  EXPECT_EQ(d->cause, AbortCause::kStepMismatch);
  EXPECT_EQ(d->abort_rank, 2);
  h[2].step = 41;
  h[1].epoch = 2;
  d = merge_step_headers(h);
  EXPECT_EQ(d->cause, AbortCause::kEpochMismatch);
  EXPECT_EQ(d->abort_rank, 1);
  // The same step, another attempt (a device that did not roll the step back).
  h[1].epoch = 3;
  h[2].attempt = 1;
  d = merge_step_headers(h);
  EXPECT_EQ(d->action, StepAction::kAbort);
  EXPECT_EQ(d->cause, AbortCause::kAttemptMismatch);
  EXPECT_EQ(d->abort_rank, 2);
  for (StepHeader& x : h) x.attempt = 1;
  d = merge_step_headers(h);
  EXPECT_EQ(d->action, StepAction::kRun);
  EXPECT_EQ(d->attempt, 1u);
  EXPECT_EQ(merge_step_headers({}).status().code(), StatusCode::kInvalidArgument);
}

// Only an abandoned attempt (every device gave it up together) is run again, and only while
// fewer than kMaxStepAttempts (3) attempts of the step failed; a poisoned epoch never.
TEST(StepRetry, OnlyAbandonedAttemptsBelowTheLimitRunAgain) {
  const Status gone = abandoned("step attempt abandoned");
  EXPECT_TRUE(retry_step(gone, 0));
  EXPECT_TRUE(retry_step(gone, 1));
  EXPECT_FALSE(retry_step(gone, 2));
  EXPECT_FALSE(retry_step(aborted("xccl epoch 1 poisoned: peer 1 is dead"), 0));
  EXPECT_FALSE(retry_step(internal_error("x"), 0));
  EXPECT_FALSE(retry_step(Status::ok_status(), 0));

  StepAttempts a;
  EXPECT_TRUE(a.after_execute(gone));  // attempt 0 of step s fails
  EXPECT_EQ(a.attempt(), 1u);
  EXPECT_TRUE(a.after_execute({}));  // attempt 1 runs: the next step starts at 0
  EXPECT_EQ(a.attempt(), 0u);
  EXPECT_EQ(a.rollbacks(), 1);
  EXPECT_TRUE(a.after_execute(gone));
  EXPECT_TRUE(a.after_execute(gone));
  EXPECT_EQ(a.attempt(), 2u);
  EXPECT_FALSE(a.after_execute(gone));  // the third failure in a row stands
  EXPECT_EQ(a.rollbacks(), 3);
  StepAttempts b;
  EXPECT_FALSE(b.after_execute(aborted("poisoned")));
  EXPECT_EQ(b.rollbacks(), 0);
  EXPECT_EQ(b.attempt(), 0u);
}

// What device r posts in step s of the threaded test: a deterministic mix of idle, busy,
// working, MTP and map-loading devices.
StepHeader scripted(int r, uint64_t s) {
  StepHeader h;
  h.epoch = 9;
  h.step = s;
  const uint64_t v = (s * 7 + uint64_t(r) * 3) % 5;
  h.tokens = (s % 4 == 3) ? 0 : uint32_t(v == 0 ? 0 : v * 10 + uint64_t(r));
  h.moe_passes = h.tokens == 0 ? 0 : uint16_t(1 + (v + uint64_t(r)) % 3);
  h.map_version = 100 + (s + uint64_t(r)) / 3;
  h.busy = s % 8 == 7 && r == 1;
  h.requests = uint32_t(r + s);
  return h;
}

TEST(StepSyncThread, EveryDeviceTakesTheSameDecisionEveryStep) {
  constexpr int kWorld = 4, kSteps = 40;
  xccl::ArenaConfig cfg;
  cfg.world_size = kWorld;
  cfg.lanes = 1;
  cfg.ring_slots = 1;
  cfg.slot_bytes = 64;
  cfg.staging_bytes = 0;
  cfg.app_bytes = 0;
  auto tf = xccl::ThreadFabric::create(cfg, 9);
  ASSERT_TRUE(tf.ok()) << tf.status().to_string();
  std::vector<std::vector<StepDecision>> seen(kWorld);
  auto st = (*tf)->run([&](xccl::Fabric& f) -> Status {
    XDS_ASSIGN_OR_RETURN(auto t, xccl::make_transport("shm", f));
    xccl::Mailbox mb(f, *t);
    StepSync sync(mb, {0, 1, 2, 3}, 60'000);
    for (int i = 0; i < kSteps; ++i) {
      XDS_ASSIGN_OR_RETURN(StepDecision d, sync.exchange(scripted(f.rank(), uint64_t(i))));
      seen[size_t(f.rank())].push_back(d);
    }
    return Status::ok_status();
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(st[size_t(r)].ok()) << st[size_t(r)].to_string();
  for (int i = 0; i < kSteps; ++i) {
    std::vector<StepHeader> all;
    for (int r = 0; r < kWorld; ++r) all.push_back(scripted(r, uint64_t(i)));
    // The independent expectation, from the rules (not from merge_step_headers).
    uint64_t total = 0, min_version = ~0ull;
    int passes = 0;
    bool busy = false;
    for (const StepHeader& h : all) {
      total += h.tokens;
      min_version = std::min(min_version, h.map_version);
      passes = std::max(passes, int(h.moe_passes));
      busy |= h.busy;
    }
    const StepAction want =
        total > 0 ? StepAction::kRun : busy ? StepAction::kSkip : StepAction::kSleep;
    for (int r = 0; r < kWorld; ++r) {
      const StepDecision& d = seen[size_t(r)][size_t(i)];
      EXPECT_EQ(d.action, want) << "step " << i << " rank " << r;
      EXPECT_EQ(d.total_tokens, total) << "step " << i << " rank " << r;
      EXPECT_EQ(d.map_version, min_version) << "step " << i << " rank " << r;
      if (want == StepAction::kRun) {
        EXPECT_EQ(d.moe_passes, std::max(passes, 1));
      }
      EXPECT_EQ(d.step, uint64_t(i));
    }
  }
  // The script has each kind of step.
  int kinds[3] = {0, 0, 0};
  for (const StepDecision& d : seen[0]) ++kinds[std::min(int(d.action), 2)];
  EXPECT_GT(kinds[0], 0);
  EXPECT_GT(kinds[1], 0);
  EXPECT_GT(kinds[2], 0);
}

TEST(StepSyncThread, AnAbortingDeviceEndsTheStepForEveryone) {
  xccl::ArenaConfig cfg;
  cfg.world_size = 3;
  cfg.lanes = 1;
  cfg.ring_slots = 1;
  cfg.slot_bytes = 64;
  cfg.staging_bytes = 0;
  cfg.app_bytes = 0;
  auto tf = xccl::ThreadFabric::create(cfg, 2);
  ASSERT_TRUE(tf.ok());
  std::vector<StepDecision> got(3);
  auto st = (*tf)->run([&](xccl::Fabric& f) -> Status {
    XDS_ASSIGN_OR_RETURN(auto t, xccl::make_transport("shm", f));
    xccl::Mailbox mb(f, *t);
    StepSync sync(mb, {0, 1, 2}, 60'000);
    StepHeader h;
    h.epoch = 2;
    h.step = 5;
    h.tokens = 4;
    h.moe_passes = 1;
    h.abort = f.rank() == 2;
    h.abort_code = f.rank() == 2 ? 13 : 0;
    XDS_ASSIGN_OR_RETURN(got[size_t(f.rank())], sync.exchange(h));
    return Status::ok_status();
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(st[size_t(r)].ok()) << st[size_t(r)].to_string();
    EXPECT_EQ(got[size_t(r)].action, StepAction::kAbort);
    EXPECT_EQ(got[size_t(r)].abort_rank, 2);
    EXPECT_EQ(got[size_t(r)].abort_code, 13u);
  }
}

}  // namespace
}  // namespace xds::engine
