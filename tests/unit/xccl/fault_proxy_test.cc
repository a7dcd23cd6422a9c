// FaultProxyTransport against the plain shared-memory transport it wraps: without rules every
// operation leaves the bytes and states the plain one does; with rules exactly the chosen
// operations fail, vanish or wait, and every other one is the plain one's. Device 0 of a
// three-device thread fabric drives both (no device threads needed: the arenas are heap).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "test_util.h"
#include "xccl/fault_proxy_transport.h"
#include "xccl/thread_fabric.h"

namespace xds::xccl {
namespace {

constexpr uint64_t kBlock = 4096;  // bytes per test block in the application area

struct Rig {
  std::unique_ptr<ThreadFabric> tf;
  std::unique_ptr<Transport> plain;
  std::unique_ptr<FaultProxyTransport> proxy;

  Rig() {
    ArenaConfig a;
    a.world_size = 3;
    a.lanes = 1;
    a.ring_slots = 1;
    a.slot_bytes = 64;
    a.staging_bytes = 4096;
    a.app_bytes = 64 * kBlock;
    auto f = ThreadFabric::create(a, 1);
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    tf = std::move(*f);
    auto p = make_transport("shm", fabric());
    auto q = make_transport("shm", fabric());
    EXPECT_TRUE(p.ok() && q.ok());
    plain = std::move(*p);
    proxy = std::make_unique<FaultProxyTransport>(std::move(*q));
  }
  Fabric& fabric() { return tf->device(0); }
  // Block b of rank r's application area.
  MemDesc block(int r, int b) const {
    return MemDesc{r, tf->device(0).layout().app + uint64_t(b) * kBlock, kBlock};
  }
  std::byte* bytes(int r, int b) { return fabric().arena(r) + block(r, b).offset; }
  // A signal word of rank r (written by rank 0's line).
  SignalRef signal(int r, int k) const {
    return SignalRef{r, tf->device(0).layout().signal_off(0, k)};
  }
  uint64_t word(const SignalRef& s) {
    return reinterpret_cast<std::atomic<uint64_t>*>(fabric().arena(s.rank) + s.offset)->load();
  }
};

std::vector<std::byte> data(uint64_t event, size_t n = kBlock) {
  return testing::pattern(0, 1, event, n);
}

bool zero(const std::byte* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != std::byte{0}) return false;
  return true;
}

TEST(FaultProxy, WithoutRulesEveryOperationIsThePlainTransports) {
  Rig g;
  Transport& plain = *g.plain;
  Transport& proxy = *g.proxy;
  EXPECT_EQ(proxy.caps().load_store, plain.caps().load_store);
  EXPECT_EQ(proxy.caps().async_completion, plain.caps().async_completion);
  // The same operations, the plain transport into blocks 0.., the proxy into blocks 8...
  for (int r : {1, 2}) {
    const auto d = data(uint64_t(r), 1000);
    EXPECT_EQ(plain.put(g.block(r, 0), 24, d.data(), d.size()), OpState::kDone);
    EXPECT_EQ(proxy.put(g.block(r, 8), 24, d.data(), d.size()), OpState::kDone);
    EXPECT_EQ(std::memcmp(g.bytes(r, 0), g.bytes(r, 8), kBlock), 0);
    std::vector<std::byte> a(1000), b(1000);
    EXPECT_EQ(plain.get(a.data(), g.block(r, 0), 24, a.size()), OpState::kDone);
    EXPECT_EQ(proxy.get(b.data(), g.block(r, 8), 24, b.size()), OpState::kDone);
    EXPECT_EQ(a, d);
    EXPECT_EQ(b, d);
    EXPECT_EQ(plain.put_with_signal(g.block(r, 1), 0, d.data(), 64, g.signal(r, 0), 7),
              OpState::kDone);
    EXPECT_EQ(proxy.put_with_signal(g.block(r, 9), 0, d.data(), 64, g.signal(r, 1), 7),
              OpState::kDone);
    EXPECT_EQ(std::memcmp(g.bytes(r, 1), g.bytes(r, 9), kBlock), 0);
    EXPECT_EQ(g.word(g.signal(r, 0)), 7u);
    EXPECT_EQ(g.word(g.signal(r, 1)), 7u);
  }
  // test_signal reads the local word: the same answers.
  EXPECT_EQ(plain.put_with_signal({}, 0, nullptr, 0, g.signal(0, 2), 5), OpState::kDone);
  for (uint64_t v : {4u, 5u, 6u})
    EXPECT_EQ(proxy.test_signal(g.signal(0, 2), v), plain.test_signal(g.signal(0, 2), v)) << v;
  EXPECT_EQ(proxy.flush(), plain.flush());
  auto desc = proxy.register_memory(g.bytes(0, 3), 128);
  auto want = plain.register_memory(g.bytes(0, 3), 128);
  ASSERT_TRUE(desc.ok() && want.ok());
  EXPECT_EQ(desc->offset, want->offset);
  EXPECT_FALSE(proxy.register_memory(g.bytes(1, 0), 8).ok());  // another rank's arena
}

// "The 3rd put to rank 1 fails": puts to rank 2 are not counted; the failed put leaves its
// block untouched, every other put lands as with the plain transport.
TEST(FaultProxy, TheNthPutToOneRankFails) {
  Rig g;
  auto rule = g.proxy->add_rule({.op = FaultOp::kPut, .peer = 1, .nth = 3});
  ASSERT_TRUE(rule.ok());
  for (int i = 0; i < 5; ++i) {
    const auto d = data(uint64_t(10 + i));
    EXPECT_EQ(g.proxy->put(g.block(2, i), 0, d.data(), d.size()), OpState::kDone);
    const OpState s = g.proxy->put(g.block(1, i), 0, d.data(), d.size());
    EXPECT_EQ(g.plain->put(g.block(1, 16 + i), 0, d.data(), d.size()), OpState::kDone);
    if (i == 2) {
      EXPECT_EQ(s, OpState::kFailed);
      EXPECT_TRUE(zero(g.bytes(1, i), kBlock));
    } else {
      EXPECT_EQ(s, OpState::kDone) << i;
      EXPECT_EQ(std::memcmp(g.bytes(1, i), g.bytes(1, 16 + i), kBlock), 0) << i;
    }
    EXPECT_EQ(std::memcmp(g.bytes(2, i), d.data(), kBlock), 0) << i;
  }
  EXPECT_EQ(g.proxy->stats(*rule).matched, 5u);
  EXPECT_EQ(g.proxy->stats(*rule).fired, 1u);
}

// "Every get is delayed 20 ms": each returns the plain transport's bytes, after the delay (a
// sleep never returns early).
TEST(FaultProxy, EveryGetIsDelayed) {
  Rig g;
  const auto d = data(3);
  ASSERT_EQ(g.plain->put(g.block(2, 0), 0, d.data(), d.size()), OpState::kDone);
  auto rule = g.proxy->add_rule({.op = FaultOp::kGet,
                                 .count = kForever,
                                 .action = FaultAction::kDelay,
                                 .delay_ns = 20'000'000});
  ASSERT_TRUE(rule.ok());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    std::vector<std::byte> got(kBlock);
    EXPECT_EQ(g.proxy->get(got.data(), g.block(2, 0), 0, kBlock), OpState::kDone);
    EXPECT_EQ(got, d);
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(60));
  EXPECT_EQ(g.proxy->stats(*rule).fired, 3u);
  // Puts are not gets: not delayed, not counted.
  EXPECT_EQ(g.proxy->put(g.block(2, 1), 0, d.data(), 8), OpState::kDone);
  EXPECT_EQ(g.proxy->stats(*rule).matched, 3u);
}

// "Drop the next signal": reported done, yet neither the data nor the signal word arrives;
// the signal after it goes through.
TEST(FaultProxy, TheNextSignalIsDropped) {
  Rig g;
  auto rule = g.proxy->add_rule({.op = FaultOp::kPutWithSignal, .action = FaultAction::kDrop});
  ASSERT_TRUE(rule.ok());
  const auto d = data(4, 256);
  EXPECT_EQ(g.proxy->put_with_signal(g.block(1, 0), 0, d.data(), d.size(), g.signal(1, 0), 1),
            OpState::kDone);
  EXPECT_TRUE(zero(g.bytes(1, 0), kBlock));
  EXPECT_EQ(g.word(g.signal(1, 0)), 0u);
  EXPECT_EQ(g.proxy->put_with_signal(g.block(1, 0), 0, d.data(), d.size(), g.signal(1, 0), 2),
            OpState::kDone);
  EXPECT_EQ(std::memcmp(g.bytes(1, 0), d.data(), d.size()), 0);
  EXPECT_EQ(g.word(g.signal(1, 0)), 2u);
  EXPECT_EQ(g.proxy->stats(*rule).matched, 2u);
  EXPECT_EQ(g.proxy->stats(*rule).fired, 1u);
}

// test_signal and flush: a dropped test_signal reads "not there yet", a failed one kFailed;
// the first rule that takes an operation decides; bad rules are refused; clear() ends them.
TEST(FaultProxy, SignalsFlushesRuleOrderAndValidation) {
  Rig g;
  ASSERT_EQ(g.plain->put_with_signal({}, 0, nullptr, 0, g.signal(0, 0), 9), OpState::kDone);
  ASSERT_TRUE(g.proxy->add_rule({.op = FaultOp::kTestSignal, .action = FaultAction::kDrop}).ok());
  ASSERT_TRUE(g.proxy->add_rule({.op = FaultOp::kTestSignal, .nth = 1, .count = 2}).ok());
  EXPECT_EQ(g.proxy->test_signal(g.signal(0, 0), 9), OpState::kInProgress);  // rule 0 decides
  EXPECT_EQ(g.proxy->test_signal(g.signal(0, 0), 9), OpState::kFailed);      // rule 1's 2nd
  EXPECT_EQ(g.proxy->test_signal(g.signal(0, 0), 9), OpState::kDone);
  EXPECT_EQ(g.proxy->stats(0).fired, 1u);
  EXPECT_EQ(g.proxy->stats(1).fired, 1u);
  EXPECT_EQ(g.proxy->stats(1).matched, 3u);
  // A flush addresses no rank: a rule for rank 1 never takes it, one for any rank does.
  ASSERT_TRUE(g.proxy->add_rule({.op = FaultOp::kFlush, .peer = 1}).ok());
  EXPECT_EQ(g.proxy->flush(), OpState::kDone);
  ASSERT_TRUE(g.proxy->add_rule({.op = FaultOp::kFlush}).ok());
  EXPECT_EQ(g.proxy->flush(), OpState::kFailed);
  g.proxy->clear();
  EXPECT_EQ(g.proxy->flush(), OpState::kDone);
  EXPECT_EQ(g.proxy->test_signal(g.signal(0, 0), 9), OpState::kDone);
  for (const FaultRule& bad : {FaultRule{.nth = 0}, FaultRule{.count = 0}, FaultRule{.peer = -2},
                               FaultRule{.action = FaultAction::kDelay, .delay_ns = -1}}) {
    const auto r = g.proxy->add_rule(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
  }
}

// Gets from four threads at once (the copy lanes' pattern): the rule takes exactly its count
// of operations whatever the interleaving, and every other get returns the plain bytes.
TEST(FaultProxy, CountsHoldAcrossThreads) {
  Rig g;
  const auto d = data(5);
  ASSERT_EQ(g.plain->put(g.block(1, 0), 0, d.data(), d.size()), OpState::kDone);
  auto rule = g.proxy->add_rule({.op = FaultOp::kGet, .peer = 1, .nth = 5, .count = 10});
  ASSERT_TRUE(rule.ok());
  std::atomic<int> failed{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      std::vector<std::byte> got(256);
      for (int i = 0; i < 25; ++i) {
        std::fill(got.begin(), got.end(), std::byte{0});
        if (g.proxy->get(got.data(), g.block(1, 0), 0, got.size()) == OpState::kFailed)
          ++failed;
        else if (std::memcmp(got.data(), d.data(), got.size()) != 0)
          ++wrong;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 10);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(g.proxy->stats(*rule).matched, 100u);
  EXPECT_EQ(g.proxy->stats(*rule).fired, 10u);
}

}  // namespace
}  // namespace xds::xccl
