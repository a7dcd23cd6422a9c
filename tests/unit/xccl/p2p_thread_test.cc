// P2P protocol over the thread-backed fabric (also runs under ThreadSanitizer).
// Reference: every received byte is compared with pattern(), regenerated independently.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "base/thread_pool.h"
#include "test_util.h"
#include "xccl/p2p.h"
#include "xccl/thread_fabric.h"

namespace xds::xccl {
namespace {

using testing::pattern;

ArenaConfig small_config(int world) {
  ArenaConfig c;
  c.world_size = world;
  c.lanes = 3;
  c.ring_slots = 2;
  c.slot_bytes = 4096;
  c.staging_bytes = 4096;
  c.app_bytes = 1 << 16;
  return c;
}

std::unique_ptr<ThreadFabric> make(const ArenaConfig& c) {
  auto r = ThreadFabric::create(c, 7);
  XDS_CHECK(r.ok(), "{}", r.status().to_string());
  return std::move(r).value();
}

void expect_all_ok(const std::vector<Status>& st) {
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
}

// Ring exchange: rank r sends sizes[i] bytes to r+1 and receives from r-1.
Status ring_exchange(Fabric& f, const std::vector<size_t>& sizes, int lanes, ThreadPool* pool) {
  auto t = make_transport("shm", f);
  if (!t.ok()) return t.status();
  P2p p2p(f, **t, P2pOptions{.lanes = lanes, .pool = pool, .timeout_ms = 60'000});
  const int W = f.world_size(), me = f.rank();
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto src = pattern(me, next, i, sizes[i]);
    XDS_ASSIGN_OR_RETURN(P2pHandle h, p2p.send_async(next, i, src));
    std::vector<std::byte> dst(sizes[i] + 3);
    XDS_ASSIGN_OR_RETURN(uint64_t n, p2p.recv(prev, i, dst));
    XDS_RETURN_IF_ERROR(p2p.wait(h));
    if (n != sizes[i]) return internal_error("size {} != {}", n, sizes[i]);
    dst.resize(n);
    if (dst != pattern(prev, me, i, sizes[i]))
      return internal_error("rank {}: payload {} of {} bytes from {} differs", me, i, n, prev);
  }
  return Status::ok_status();
}

TEST(XcclP2pThread, OddSizesTwoToFourRanks) {
  const std::vector<size_t> sizes = {0, 1, 7, 63, 64, 65, 4095, 4096, 4097, 3 * 4096 + 5, 70001};
  for (int W = 2; W <= 4; ++W) {
    auto tf = make(small_config(W));
    for (int lanes : {1, 3})
      expect_all_ok(tf->run([&](Fabric& f) { return ring_exchange(f, sizes, lanes, nullptr); }));
  }
}

TEST(XcclP2pThread, ParallelLanesOnAPool) {
  auto tf = make(small_config(2));
  for (int spin : {ThreadPool::kDefaultSpin, ThreadPool::kNoSpin})
  expect_all_ok(tf->run([&](Fabric& f) -> Status {
    ThreadPool pool(3, spin);  // synchronous calls run their lanes on these threads
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{.lanes = 3, .pool = &pool});
    const int peer = 1 - f.rank();
    for (size_t n : {size_t(5), size_t(4096 * 3), size_t(100000), size_t(1) << 20}) {
      for (int sender = 0; sender < 2; ++sender) {
        if (f.rank() == sender) {
          XDS_RETURN_IF_ERROR(p2p.send(peer, n, pattern(sender, peer, n, n)));
        } else {
          std::vector<std::byte> dst(n);
          XDS_ASSIGN_OR_RETURN(uint64_t got, p2p.recv(peer, n, dst));
          if (got != n || dst != pattern(peer, f.rank(), n, n))
            return internal_error("lanes payload of {} bytes differs", n);
        }
      }
    }
    return Status::ok_status();
  }));
}

// Synchronous ping-pong of one-chunk messages (the fast path: one slot on lane 0, inline up to
// 24 B) around the ring wrap, mixed with async posts (generic path) on either side of the same
// pair, with a receiver that starts late (the sender's ACK wait falls back to the generic
// engine and its futex sleep). Every payload is checked against pattern().
TEST(XcclP2pThread, SyncOneChunkFastPathMixedWithAsyncAndLateReceiver) {
  ArenaConfig c = small_config(2);
  c.lanes = 1;
  c.ring_slots = 3;
  auto tf = make(c);
  BackoffPolicy quick;  // reach the futex phase fast when the peer is late
  quick.spin_ns = 2'000;
  quick.yield_ns = 20'000;
  expect_all_ok(tf->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{.timeout_ms = 60'000, .backoff = quick});
    const int me = f.rank(), peer = 1 - me;
    const std::vector<size_t> sizes = {0, 1, 8, 23, 24, 25, 63, 64, 65, 1000, 4095, 4096, 4097};
    uint64_t ev = 0;
    for (int round = 0; round < 4; ++round)
      for (size_t n : sizes) {
        ++ev;
        const bool async_send = (ev % 5) == 0, async_recv = (ev % 7) == 0;
        const bool late = (ev % 11) == 0;
        for (int sender = 0; sender < 2; ++sender) {
          if (me == sender) {
            auto src = pattern(sender, peer, ev, n);
            if (async_send) {
              XDS_ASSIGN_OR_RETURN(P2pHandle h, p2p.send_async(peer, ev, src));
              XDS_RETURN_IF_ERROR(p2p.wait(h));
            } else {
              XDS_RETURN_IF_ERROR(p2p.send(peer, ev, src));
            }
          } else {
            if (late) std::this_thread::sleep_for(std::chrono::milliseconds(3));
            std::vector<std::byte> dst(n + 1);
            uint64_t got = 0;
            if (async_recv) {
              XDS_ASSIGN_OR_RETURN(P2pHandle h, p2p.recv_async(peer, ev, dst));
              XDS_RETURN_IF_ERROR(p2p.wait(h));
              got = p2p.bytes(h);
            } else {
              XDS_ASSIGN_OR_RETURN(got, p2p.recv(peer, ev, dst));
            }
            dst.resize(got);
            if (got != n || dst != pattern(peer, me, ev, n))
              return internal_error("rank {} event {}: {} of {} bytes, payload differs", me, ev,
                                    got, n);
          }
        }
      }
    return Status::ok_status();
  }));
}

TEST(XcclP2pThread, ManyEventsInFlightPerPair) {
  auto tf = make(small_config(2));
  expect_all_ok(tf->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{.lanes = 2});
    const int peer = 1 - f.rank();
    constexpr int kEvents = 24;
    std::vector<std::vector<std::byte>> src, dst;
    std::vector<P2pHandle> sends, recvs;
    for (int e = 0; e < kEvents; ++e) {
      src.push_back(pattern(f.rank(), peer, e, size_t(e) * 977));
      dst.emplace_back(size_t(e) * 977);
    }
    for (int e = 0; e < kEvents; ++e) {
      XDS_ASSIGN_OR_RETURN(P2pHandle h, p2p.send_async(peer, e, src[size_t(e)]));
      sends.push_back(h);
      XDS_ASSIGN_OR_RETURN(P2pHandle r, p2p.recv_async(peer, e, dst[size_t(e)]));
      recvs.push_back(r);
    }
    // Poll until everything is done, never blocking.
    bool all = false;
    while (!all) {
      all = true;
      for (auto* v : {&sends, &recvs})
        for (auto& h : *v) {
          OpState s = p2p.poll(h);
          if (s == OpState::kFailed) return p2p.status(h);
          all &= s == OpState::kDone;
        }
      std::this_thread::yield();
    }
    for (int e = 0; e < kEvents; ++e) {
      if (dst[size_t(e)] != pattern(peer, f.rank(), e, size_t(e) * 977))
        return internal_error("event {} differs", e);
      if (p2p.bytes(recvs[size_t(e)]) != size_t(e) * 977) return internal_error("byte count");
    }
    return Status::ok_status();
  }));
}

TEST(XcclP2pThread, BackgroundCopyAndCancel) {
  auto tf = make(small_config(2));
  expect_all_ok(tf->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{.lanes = 3});
    const int peer = 1 - f.rank();
    // A recv that never gets a message can be cancelled before it starts.
    std::vector<std::byte> none(8);
    XDS_ASSIGN_OR_RETURN(P2pHandle c, p2p.recv_async(peer, 99, none));
    XDS_RETURN_IF_ERROR(p2p.cancel(c));
    if (p2p.poll(c) != OpState::kCancelled) return internal_error("not cancelled");
    auto src = pattern(f.rank(), peer, 5, 300000);
    std::vector<std::byte> dst(300000);
    XDS_ASSIGN_OR_RETURN(P2pHandle s, p2p.send_async(peer, 5, src, Progress::kBackground));
    XDS_ASSIGN_OR_RETURN(P2pHandle r, p2p.recv_async(peer, 5, dst, Progress::kBackground));
    // Never call poll() on the data path: the background thread moves everything.
    while (p2p.state(s) != OpState::kDone || p2p.state(r) != OpState::kDone) {
      if (p2p.state(s) == OpState::kFailed) return p2p.status(s);
      std::this_thread::yield();
    }
    if (dst != pattern(peer, f.rank(), 5, 300000)) return internal_error("background payload");
    return Status::ok_status();
  }));
}

TEST(XcclP2pThread, TooSmallBufferIsDrainedAndThePairStillWorks) {
  auto tf = make(small_config(2));
  auto st = tf->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{.lanes = 2});
    if (f.rank() == 0) {
      XDS_RETURN_IF_ERROR(p2p.send(1, 1, pattern(0, 1, 1, 10000)));
      return p2p.send(1, 2, pattern(0, 1, 2, 333));
    }
    std::vector<std::byte> small(100), ok(333);
    auto r = p2p.recv(0, 1, small);
    if (r.ok() || r.status().code() != StatusCode::kInvalidArgument)
      return internal_error("expected InvalidArgument, got {}", r.status().to_string());
    XDS_RETURN_IF_ERROR(p2p.recv(0, 2, ok).status());
    return ok == pattern(0, 1, 2, 333) ? Status::ok_status() : internal_error("payload");
  });
  expect_all_ok(st);
}

TEST(XcclP2pThread, ZeroCopyPutAndPullGet) {
  auto tf = make(small_config(3));
  expect_all_ok(tf->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{});
    const int W = f.world_size(), me = f.rank(), next = (me + 1) % W, prev = (me + W - 1) % W;
    // Write 1000 bytes into next's app area at offset 64*me, signal it.
    XDS_RETURN_IF_ERROR(
        p2p.put(p2p.app_desc(next), 4096 * uint64_t(me), pattern(me, next, 0, 1000), 2, 1));
    XDS_RETURN_IF_ERROR(p2p.wait_signal(prev, 2, 1));
    std::vector<std::byte> got(1000);
    XDS_RETURN_IF_ERROR(p2p.get(got, p2p.app_desc(me), 4096 * uint64_t(prev)));
    if (got != pattern(prev, me, 0, 1000)) return internal_error("put payload");
    // Pull what prev put into its own successor (me): read my area from the peer's view.
    std::vector<std::byte> pulled(1000);
    XDS_RETURN_IF_ERROR(p2p.get(pulled, p2p.app_desc(next), 4096 * uint64_t(me)));
    if (pulled != pattern(me, next, 0, 1000)) return internal_error("get payload");
    auto bad = p2p.get(pulled, p2p.app_desc(next), (1 << 16) - 10);
    return bad.code() == StatusCode::kInvalidArgument ? Status::ok_status()
                                                      : internal_error("out of range get passed");
  }));
}

TEST(XcclP2pThread, SilentPeerFailsEveryoneIdentically) {
  auto tf = make(small_config(3));
  auto st = tf->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{.timeout_ms = f.rank() == 0 ? 300 : 20'000});
    if (f.rank() == 1) return Status::ok_status();  // silent: never sends
    if (f.rank() == 0) {
      std::vector<std::byte> buf(10);
      return p2p.recv(1, 3, buf).status();
    }
    return p2p.wait_signal(0, 0, 1);  // rank 2 waits on rank 0, long deadline
  });
  EXPECT_TRUE(st[1].ok());
  ASSERT_EQ(st[0].code(), StatusCode::kAborted) << st[0].to_string();
  EXPECT_EQ(st[0].to_string(), st[2].to_string());
  EXPECT_NE(st[0].message().find("peer 1 was silent"), std::string::npos) << st[0].to_string();
  EXPECT_NE(st[0].message().find("during recv"), std::string::npos) << st[0].to_string();
  EXPECT_NE(st[0].message().find("epoch 7"), std::string::npos) << st[0].to_string();
}

TEST(XcclP2pThread, DeadPeerIsNamedAndANewEpochWorks) {
  auto tf = make(small_config(2));
  auto st = tf->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{.timeout_ms = 20'000});
    if (f.rank() == 1) {
      tf->mark_dead(1);
      return Status::ok_status();
    }
    std::vector<std::byte> buf(10);
    return p2p.recv(1, 3, buf).status();
  });
  ASSERT_EQ(st[0].code(), StatusCode::kAborted) << st[0].to_string();
  EXPECT_NE(st[0].message().find("peer 1 is dead during recv"), std::string::npos)
      << st[0].to_string();
  // Later operations of the poisoned epoch fail at once.
  auto again = tf->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{});
    return p2p.send(1 - f.rank(), 1, pattern(0, 0, 0, 10));
  });
  EXPECT_EQ(again[0].to_string(), st[0].to_string());
  // New membership, new epoch: works.
  auto fresh = ThreadFabric::create(small_config(2), 8);
  ASSERT_TRUE(fresh.ok());
  expect_all_ok((*fresh)->run([&](Fabric& f) { return ring_exchange(f, {10, 5000}, 2, nullptr); }));
}

TEST(XcclP2pThread, EventMismatchPoisonsAsOutOfStep) {
  auto tf = make(small_config(2));
  auto st = tf->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    P2p p2p(f, **t, P2pOptions{.timeout_ms = 5'000});
    if (f.rank() == 0) return p2p.send(1, 1, pattern(0, 1, 1, 10));
    std::vector<std::byte> buf(10);
    return p2p.recv(0, 2, buf).status();
  });
  EXPECT_EQ(st[0].to_string(), st[1].to_string());
  EXPECT_NE(st[1].message().find("out of step"), std::string::npos) << st[1].to_string();
}

}  // namespace
}  // namespace xds::xccl
