// Pure functions of XCCL: arena layout, chunk plans, poison words, back-off phases.
// Expected values are derived by hand from the formulas drawn in layout.h.
#include <gtest/gtest.h>

#include <algorithm>

#include "xccl/p2p.h"
#include "xccl/wait.h"

namespace xds::xccl {
namespace {

TEST(XcclLayout, OffsetsFollowTheDrawnFormulas) {
  ArenaConfig c;
  c.world_size = 3;
  c.lanes = 2;
  c.ring_slots = 4;
  c.slot_bytes = 1024;
  c.signals_per_peer = 5;
  c.staging_bytes = 10000;
  c.app_bytes = 5000;
  ASSERT_TRUE(validate(c).ok());
  const ArenaLayout a = arena_layout(c);
  EXPECT_EQ(a.meta, 4096u);
  EXPECT_EQ(a.heads, 4096u + 64 * 3 * 2);      // 4480
  EXPECT_EQ(a.signals, 4480u + 64 * 3 * 2);    // 4864
  EXPECT_EQ(a.mailboxes, 4864u + 64 * 3 * 5);  // 5824
  const uint64_t box_end = 5824 + 64 * kMailboxChannels * 3;
  EXPECT_EQ(a.managed, (box_end + 4095) / 4096 * 4096);
  EXPECT_EQ(a.staging, (a.managed + (64 + 1024) * 3 * 2 * 4 + 4095) / 4096 * 4096);
  EXPECT_EQ(a.app, (a.staging + 10000 + 4095) / 4096 * 4096);
  EXPECT_EQ(a.total, (a.app + 5000 + 4095) / 4096 * 4096);
  EXPECT_EQ(a.tail_off(2, 1), 4096u + 64 * 5);
  EXPECT_EQ(a.head_off(1, 0), 4480u + 64 * 2);
  EXPECT_EQ(a.signal_off(2, 4), 4864u + 64 * 14);
  EXPECT_EQ(a.mailbox_off(Channel::kCombineReady, 1), 5824u + 64 * (2 * 3 + 1));
  // Slot of (peer 1, lane 1, seq 6): ring index 6 % 4 = 2 -> (1*2*4 + 1*4 + 2) = 14th slot.
  EXPECT_EQ(a.slot_off(1, 1, 6), a.managed + 14 * (64 + 1024));
}

TEST(XcclLayout, EveryLineIsItsOwnCacheLineAndRegionsDoNotOverlap) {
  ArenaConfig c;
  c.world_size = 8;
  c.lanes = 4;
  const ArenaLayout a = arena_layout(c);
  EXPECT_GE(a.meta, sizeof(ArenaHeader));
  for (int p = 0; p < 8; ++p)
    for (int l = 0; l < 4; ++l) {
      EXPECT_EQ(a.tail_off(p, l) % 64, 0u);
      EXPECT_EQ(a.head_off(p, l) % 64, 0u);
      EXPECT_NE(a.tail_off(p, l) / 64, a.head_off(p, l) / 64);
      EXPECT_LT(a.tail_off(p, l), a.heads);
    }
  EXPECT_LE(a.signal_off(7, c.signals_per_peer - 1) + 64, a.mailboxes);
  EXPECT_LE(a.mailbox_off(Channel::kBarrier, 7) + 64, a.managed);
  EXPECT_LE(a.slot_off(7, 3, uint64_t(c.ring_slots) - 1) + a.slot_stride(), a.staging);
  EXPECT_EQ(a.total % 4096, 0u);
}

TEST(XcclLayout, ValidateNamesTheField) {
  ArenaConfig c;
  c.slot_bytes = 100;
  Status st = validate(c);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("slot_bytes"), std::string::npos);
  EXPECT_NE(st.message().find("100"), std::string::npos);
  c = ArenaConfig{};
  c.world_size = 0;
  EXPECT_NE(validate(c).message().find("world_size"), std::string::npos);
}

TEST(XcclChunks, PlansCoverTheMessageExactlyOnce) {
  for (uint64_t total : {0ull, 1ull, 63ull, 64ull, 65ull, 1000ull, 4096ull, 4097ull, 1ull << 20,
                         (64ull << 20) + 3}) {
    for (int lanes : {1, 2, 3, 8}) {
      const ChunkPlan p = plan_chunks(total, lanes, 4096);
      ASSERT_GE(p.n_chunks, 1u);
      ASSERT_LE(p.chunk_bytes, 4096u);
      ASSERT_LE(p.lanes_used, lanes);
      if (total == 0) {
        EXPECT_EQ(p.n_chunks, 1u);
        continue;
      }
      EXPECT_EQ(p.chunk_bytes % 64, 0u);
      EXPECT_GE(p.chunk_bytes * p.n_chunks, total);
      EXPECT_LT(p.chunk_bytes * (p.n_chunks - 1), total);  // no empty trailing chunk
      uint64_t sum = 0;
      for (int l = 0; l < p.lanes_used; ++l) sum += lane_chunk_count(p, l);
      EXPECT_EQ(sum, p.n_chunks);
      EXPECT_EQ(lane_chunk_count(p, p.lanes_used), 0u);
    }
  }
  // 10000 bytes over 3 lanes: ceil(10000/3) = 3334 -> 3392 (64-aligned), 3 chunks, 3 lanes.
  const ChunkPlan p = plan_chunks(10000, 3, 1 << 20);
  EXPECT_EQ(p.chunk_bytes, 3392u);
  EXPECT_EQ(p.n_chunks, 3u);
  EXPECT_EQ(p.lanes_used, 3);
  // Small messages do not spread over lanes they cannot fill.
  EXPECT_EQ(plan_chunks(8, 4, 4096).lanes_used, 1);
}

TEST(XcclPoison, RoundTripsAndReadsTheSameEverywhere) {
  PoisonRecord r{12345, 4095, PoisonReason::kDead, OpKind::kCombine, 17};
  const uint64_t w = encode_poison(r);
  EXPECT_NE(w, 0u);
  const PoisonRecord d = decode_poison(w);
  EXPECT_EQ(d.epoch, 12345u);
  EXPECT_EQ(d.peer, 4095);
  EXPECT_EQ(d.reason, PoisonReason::kDead);
  EXPECT_EQ(d.op, OpKind::kCombine);
  EXPECT_EQ(d.detector, 17);
  const Status st = poison_status(d);
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_EQ(
      st.message(),
      "xccl epoch 12345 poisoned: peer 4095 is dead during combine (first noticed by rank 17)");
}

TEST(XcclBackoff, SpinThenYieldThenSleep) {
  BackoffPolicy p{.spin_ns = 100, .yield_ns = 1000, .sleep_ns = 50};
  EXPECT_EQ(backoff_phase(0, p), BackoffPhase::kSpin);
  EXPECT_EQ(backoff_phase(99, p), BackoffPhase::kSpin);
  EXPECT_EQ(backoff_phase(100, p), BackoffPhase::kYield);
  EXPECT_EQ(backoff_phase(999, p), BackoffPhase::kYield);
  EXPECT_EQ(backoff_phase(1000, p), BackoffPhase::kSleep);
  EXPECT_EQ(backoff_phase(int64_t(1) << 40, p), BackoffPhase::kSleep);
}

TEST(XcclTransport, TableHasShmAndUnknownNamesAreNotFound) {
  ASSERT_FALSE(transport_table().empty());
  EXPECT_EQ(transport_table()[0].name, "shm");
}

}  // namespace
}  // namespace xds::xccl
