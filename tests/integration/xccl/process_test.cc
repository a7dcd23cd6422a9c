// XCCL across device processes (memfd arenas, SCM_RIGHTS, pidfds), run under ASan.
// Same protocol code as the thread-fabric tests; here the devices are real processes, the
// sizes go to 64 MB, up to 11 processes share the 2 cores, and a device is SIGKILLed.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "a2e_reference.h"
#include "base/thread_pool.h"
#include "xccl/launcher.h"
#include "xccl/p2p.h"

namespace xds::xccl {
namespace {

using testing::pattern;

// Runs fn in every device; a device reports failure on stderr and with exit code 1.
void launch_ok(const LaunchOptions& o, const std::function<Status(Fabric&)>& fn) {
  auto r = launch_devices(o, [&](Fabric& f) {
    Status st = fn(f);
    if (!st.ok()) std::fprintf(stderr, "device %d: %s\n", f.rank(), st.to_string().c_str());
    return st.ok() ? 0 : 1;
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (size_t i = 0; i < r->size(); ++i)
    EXPECT_TRUE((*r)[i].ok()) << "device " << i << " exit " << (*r)[i].exit_code << " signal "
                              << (*r)[i].signal;
}

int count_dir(const char* path) {
  int n = 0;
  if (DIR* d = opendir(path)) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

// memfd links held by this (launcher) process.
int memfds_held() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) {
    char buf[256] = {};
    const std::string p = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(p.c_str(), buf, sizeof(buf) - 1) > 0 && std::strstr(buf, "memfd:xccl")) ++n;
  }
  closedir(d);
  return n;
}

Status exchange_sizes(Fabric& f, const std::vector<size_t>& sizes, int lanes, ThreadPool* pool) {
  XDS_ASSIGN_OR_RETURN(auto t, make_transport("shm", f));
  P2p p2p(f, *t, P2pOptions{.lanes = lanes, .pool = pool, .timeout_ms = 120'000});
  const int W = f.world_size(), me = f.rank(), next = (me + 1) % W, prev = (me + W - 1) % W;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto src = pattern(me, next, i, sizes[i]);
    std::vector<std::byte> dst(sizes[i]);
    if (W == 2 && pool != nullptr) {  // synchronous pairs so the lanes run on the pool
      for (int s = 0; s < 2; ++s) {
        if (me == s)
          XDS_RETURN_IF_ERROR(p2p.send(next, i, src));
        else
          XDS_RETURN_IF_ERROR(p2p.recv(prev, i, dst).status());
      }
    } else {
      XDS_ASSIGN_OR_RETURN(P2pHandle h, p2p.send_async(next, i, src));
      XDS_RETURN_IF_ERROR(p2p.recv(prev, i, dst).status());
      XDS_RETURN_IF_ERROR(p2p.wait(h));
    }
    if (dst != pattern(prev, me, i, sizes[i]))
      return internal_error("rank {}: message {} ({} bytes) differs", me, i, sizes[i]);
  }
  return Status::ok_status();
}

TEST(XcclProcess, P2pZeroTo64MBTwoDevicesWithLanes) {
  LaunchOptions o;
  o.devices = 2;
  o.arena.lanes = 2;
  o.arena.ring_slots = 4;
  o.arena.slot_bytes = 256 * 1024;
  o.cpus = {0, 1};
  launch_ok(o, [](Fabric& f) {
    ThreadPool pool(2);
    return exchange_sizes(f, {0, 1, 8, 63, 4097, 65536 + 7, 1 << 20, (9 << 20) + 3, 64 << 20}, 2,
                          &pool);
  });
}

TEST(XcclProcess, P2pRingOfFourAndEightDevices) {
  for (int W : {4, 8}) {
    LaunchOptions o;
    o.devices = W;
    o.arena.lanes = 2;
    o.arena.ring_slots = 2;
    o.arena.slot_bytes = 16 * 1024;
    launch_ok(o, [](Fabric& f) {
      return exchange_sizes(f, {0, 5, 16 * 1024 + 1, 200000}, 2, nullptr);
    });
  }
}

TEST(XcclProcess, DispatchCombineTwoToEightDevices) {
  for (int W : {2, 5, 8}) {
    testing::MoeCase c;
    c.world = W;
    c.n_logical = 2 * W + 1;
    c.slots = 4;
    c.hidden = 256;
    c.topk = 6;
    c.max_tokens = 32;
    c.int8 = W == 5;
    c.seed = 100 + uint64_t(W);
    for (int d = 0; d < W; ++d) c.n_tokens.push_back(d == 1 ? 0 : 9 + 11 * d);  // >32: rounds
    LaunchOptions o;
    o.devices = W;
    o.arena.lanes = 1;
    o.arena.slot_bytes = 64;
    o.arena.ring_slots = 1;
    o.arena.staging_bytes = moe_staging_bytes(MoeConfig{.hidden = c.hidden,
                                                        .topk = c.topk,
                                                        .max_tokens = c.max_tokens,
                                                        .slots_per_device = c.slots,
                                                        .int8 = c.int8},
                                              W);
    launch_ok(o, [&](Fabric& f) -> Status {
      XDS_ASSIGN_OR_RETURN(auto t, make_transport("shm", f));
      Mailbox mb(f, *t);
      ExchangeRoles roles;
      for (int r = 0; r < W; ++r) roles.senders.push_back(r);
      roles.receivers = roles.senders;
      roles.staging_base = f.layout().staging;
      XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb,
                                                     MoeConfig{.hidden = c.hidden,
                                                               .topk = c.topk,
                                                               .max_tokens = c.max_tokens,
                                                               .slots_per_device = c.slots,
                                                               .int8 = c.int8,
                                                               .timeout_ms = 120'000},
                                                     roles, nullptr));
      const auto in = testing::make_input(c, f.rank());
      std::vector<uint16_t> out(in.x.size());
      XDS_RETURN_IF_ERROR(run_moe_rounds(
          *ex, in.x.data(), in.ids, in.w, c.n_tokens[size_t(f.rank())], testing::make_map(c), 1,
          [&](const Exchange& e, uint16_t* y) {
            testing::run_experts(c, f.rank(), e, y);
          },
          out.data()));
      return testing::check_combined(c, in, f.rank(), out);
    });
  }
}

TEST(XcclProcess, A2eTrampolineElevenDevices) {
  testing::A2eCase c = testing::a2e_case(/*int8=*/true);
  LaunchOptions o;
  o.devices = 11;
  o.arena = testing::a2e_arena(c);
  launch_ok(o, [&](Fabric& f) { return testing::run_a2e_device(f, c, nullptr); });
}

// Rank 2 is SIGKILLed while sending 32 MB to rank 0; rank 1 waits on rank 2 for something
// else. Both survivors must fail with the same error naming peer 2; then a new epoch of two
// devices works, and nothing is left behind.
TEST(XcclProcess, SigkilledPeerMidTransferPoisonsTheEpochThenANewEpochWorks) {
  const int shm_before = count_dir("/dev/shm");
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  {
    LaunchOptions o;
    o.devices = 3;
    o.arena.lanes = 2;
    o.arena.ring_slots = 2;
    o.arena.slot_bytes = 64 * 1024;
    o.epoch = 5;
    auto r = launch_devices(o, [&](Fabric& f) -> int {
      close(fds[0]);
      auto t = make_transport("shm", f);
      P2p p2p(f, **t, P2pOptions{.lanes = 2, .timeout_ms = 60'000});
      if (f.rank() == 2) {
        auto big = pattern(2, 0, 1, 32 << 20);
        auto h = p2p.send_async(0, 1, big);
        for (int i = 0; i < 20; ++i) p2p.poll(*h);  // some chunks are in flight
        raise(SIGKILL);
      }
      Status st;
      if (f.rank() == 0) {
        // Start draining only after rank 2 has filled the 2-slot rings and died, so the
        // transfer is always cut mid-way (a fast receiver could otherwise finish all 32 MB
        // within rank 2's 20 polls).
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        std::vector<std::byte> dst(32 << 20);
        st = p2p.recv(2, 1, dst).status();
      } else {
        st = p2p.wait_signal(2, 0, 1);
      }
      const std::string line = std::to_string(f.rank()) + " " + st.to_string() + "\n";
      (void)!write(fds[1], line.data(), line.size());
      return st.code() == StatusCode::kAborted ? 0 : 1;
    });
    close(fds[1]);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ((*r)[2].signal, SIGKILL);
    EXPECT_TRUE((*r)[0].ok());
    EXPECT_TRUE((*r)[1].ok());
  }
  std::string all;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) all.append(buf, size_t(n));
  close(fds[0]);
  const std::string want = "Aborted: xccl epoch 5 poisoned: peer 2 is dead during";
  const size_t nl = all.find('\n');
  ASSERT_NE(nl, std::string::npos) << all;
  const std::string a = all.substr(2, nl - 2), b = all.substr(nl + 3, all.size() - nl - 4);
  EXPECT_EQ(a, b) << all;
  EXPECT_NE(a.find(want), std::string::npos) << all;
  // Nothing left: no /dev/shm entry, no memfd held here.
  EXPECT_EQ(count_dir("/dev/shm"), shm_before);
  EXPECT_EQ(memfds_held(), 0);
  // New membership (the two survivors' worth of devices), new epoch: works.
  LaunchOptions o;
  o.devices = 2;
  o.epoch = 6;
  launch_ok(o, [](Fabric& f) { return exchange_sizes(f, {10, 300000}, 1, nullptr); });
  EXPECT_EQ(count_dir("/dev/shm"), shm_before);
}

}  // namespace
}  // namespace xds::xccl
