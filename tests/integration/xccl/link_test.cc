// Links (xccl/link.h) between two processes that did not fork from one launcher: each test's
// child forks from the test process but forms the fabric only through the rendezvous socket,
// as a separately started process does. Checked: one-sided gets, puts and signals in both
// directions, the peer's death seen through its pidfd, a mismatched arena config refused on
// both sides naming the field, the timeouts, and one listener per name. Peer checks: a peer
// of another uid (a child running as "nobody") gets no fd, either way round; a peer that
// connects and stays silent neither delays another peer's link nor stays forever. Out of
// descriptors, the listener reports one error per pause instead of spinning, and accepts the
// waiting peer once descriptors are free again.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/clock.h"
#include "child_process.h"
#include "xccl/link.h"
#include "xccl/transport.h"

namespace xds::xccl {
namespace {

constexpr uint64_t kBytes = 256 * 1024;

ArenaConfig config_with_lanes(int lanes) {
  ArenaConfig c;
  c.lanes = lanes;
  c.app_bytes = 1 << 20;
  return c;
}

std::string unique_name(const char* what) {
  return std::string(what) + "-" + std::to_string(getpid());
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

using fixtures::fork_child;
using fixtures::wait_child;

// Polls a local signal word until it holds `value`; false after 10 s.
bool wait_signal(Transport& t, const SignalRef& sig, uint64_t value) {
  const int64_t deadline = now_ns() + 10'000'000'000;
  while (t.test_signal(sig, value) != OpState::kDone) {
    if (now_ns() > deadline) return false;
    usleep(200);
  }
  return true;
}

// Sets signal `sig` on the peer (an 8-byte put into its app area carries it).
bool signal_peer(Transport& t, const Fabric& f, const SignalRef& sig, uint64_t value) {
  const uint64_t word = value;
  const MemDesc dst{sig.rank, f.layout().app + (1 << 19), 8};
  return t.put_with_signal(dst, 0, &word, 8, sig, value) != OpState::kFailed &&
         t.flush() != OpState::kFailed;
}

TEST(XcclLink, GetsPutsAndSignalsCrossBetweenSeparateProcesses) {
  const std::string name = unique_name("data");
  auto listener = LinkListener::listen(name);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  // Signals: "go" (rank 0 -> 1) once A is written; "put" (1 -> 0) once B is; "done" (0 -> 1).
  const pid_t child = fork_child([&] {
    auto fabric = link_connect(name, config_with_lanes(2), 7, 10'000);
    if (!fabric.ok()) return 10;
    Fabric& f = **fabric;
    if (f.rank() != 1 || f.world_size() != 2 || f.epoch() != 7) return 11;
    auto t = make_transport("shm", f);
    if (!t.ok()) return 12;
    const ArenaLayout& lay = f.layout();
    if (!wait_signal(**t, {1, lay.signal_off(0, 0)}, 1)) return 13;
    std::vector<uint8_t> got(kBytes);
    const MemDesc remote{0, lay.app, kBytes * 2};
    if ((*t)->get(got.data(), remote, 0, kBytes) != OpState::kDone) return 14;
    if (got != pattern(kBytes, 1)) return 15;
    const std::vector<uint8_t> b = pattern(kBytes, 2);
    if ((*t)->put_with_signal(remote, kBytes, b.data(), kBytes, {0, lay.signal_off(1, 0)}, 1) ==
        OpState::kFailed) {
      return 16;
    }
    if ((*t)->flush() == OpState::kFailed) return 17;
    if (!wait_signal(**t, {1, lay.signal_off(0, 1)}, 1)) return 18;
    return 0;
  });
  auto fabric = listener->accept(config_with_lanes(2), 7, 10'000);
  ASSERT_TRUE(fabric.ok()) << fabric.status().to_string();
  Fabric& f = **fabric;
  EXPECT_EQ(f.rank(), 0);
  EXPECT_EQ(f.world_size(), 2);
  auto t = make_transport("shm", f);
  ASSERT_TRUE(t.ok());
  const ArenaLayout& lay = f.layout();
  const std::vector<uint8_t> a = pattern(kBytes, 1);
  std::memcpy(f.local() + lay.app, a.data(), kBytes);
  ASSERT_TRUE(signal_peer(**t, f, {1, lay.signal_off(0, 0)}, 1));
  ASSERT_TRUE(wait_signal(**t, {0, lay.signal_off(1, 0)}, 1));
  const auto* got = reinterpret_cast<const uint8_t*>(f.local() + lay.app + kBytes);
  const std::vector<uint8_t> b(got, got + kBytes);
  EXPECT_EQ(b, pattern(kBytes, 2));
  ASSERT_TRUE(signal_peer(**t, f, {1, lay.signal_off(0, 1)}, 1));
  EXPECT_EQ(wait_child(child), 0);
  EXPECT_FALSE(f.peer_alive(1));  // exited: its pidfd says so
}

// DistFlow's shape: one side exports a region (its KV cache) over two links in turn; each
// peer pulls a slice one-sidedly and checks it byte for byte against the pattern.
TEST(XcclLink, AnExportedRegionIsPulledByEachPeerItIsLinkedTo) {
  const std::string name = unique_name("region");
  auto listener = LinkListener::listen(name);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  constexpr uint64_t kRegion = 3 * 1024 * 1024 + 4096;
  auto region = SharedRegion::create("test-region", kRegion);
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  const std::vector<uint8_t> whole = pattern(kRegion, 9);
  std::memcpy(region->data(), whole.data(), kRegion);
  for (uint64_t peer = 0; peer < 2; ++peer) {
    const uint64_t off = 12345 + peer * 1'000'000, n = 1'500'000;
    const pid_t child = fork_child([&] {
      auto fabric = link_connect(name, config_with_lanes(1), 3, 10'000);
      if (!fabric.ok()) return 10;
      Fabric& f = **fabric;
      if (f.region(0).bytes != kRegion || f.region(1).base != nullptr) return 11;
      auto t = make_transport("shm", f);
      if (!t.ok()) return 12;
      std::vector<uint8_t> got(n);
      const MemDesc remote{0, off, n, kExportRegion};
      if ((*t)->get(got.data(), remote, 0, n) != OpState::kDone) return 13;
      if (!std::equal(got.begin(), got.end(), whole.begin() + static_cast<ptrdiff_t>(off))) {
        return 14;
      }
      return 0;
    });
    auto fabric = listener->accept(config_with_lanes(1), 3, 10'000, &*region);
    ASSERT_TRUE(fabric.ok()) << fabric.status().to_string();
    EXPECT_EQ((*fabric)->region(0).base, region->data());
    EXPECT_EQ((*fabric)->region(1).bytes, 0u);
    EXPECT_EQ(wait_child(child), 0) << "peer " << peer;
  }
}

TEST(XcclLink, APeerThatDiesIsSeenThroughItsPidfd) {
  const std::string name = unique_name("death");
  auto listener = LinkListener::listen(name);
  ASSERT_TRUE(listener.ok());
  const pid_t child = fork_child([&] {
    auto fabric = link_connect(name, config_with_lanes(2), 1, 10'000);
    if (!fabric.ok()) return 10;
    pause();  // until killed
    return 0;
  });
  auto fabric = listener->accept(config_with_lanes(2), 1, 10'000);
  ASSERT_TRUE(fabric.ok()) << fabric.status().to_string();
  EXPECT_TRUE((*fabric)->peer_alive(1));
  kill(child, SIGKILL);
  EXPECT_EQ(wait_child(child), 128 + SIGKILL);
  EXPECT_FALSE((*fabric)->peer_alive(1));
}

TEST(XcclLink, AMismatchedArenaConfigFailsBothSidesNamingTheField) {
  const std::string name = unique_name("config");
  auto listener = LinkListener::listen(name);
  ASSERT_TRUE(listener.ok());
  const pid_t child = fork_child([&] {
    auto fabric = link_connect(name, config_with_lanes(4), 1, 10'000);
    if (fabric.ok()) return 10;
    return fabric.status().message().find("lanes is 2, this side's 4") != std::string::npos ? 0 : 11;
  });
  auto fabric = listener->accept(config_with_lanes(2), 1, 10'000);
  ASSERT_FALSE(fabric.ok());
  EXPECT_NE(fabric.status().message().find("lanes is 4, this side's 2"), std::string::npos)
      << fabric.status().to_string();
  EXPECT_EQ(wait_child(child), 0);
}

TEST(XcclLink, TimeoutsAndOneListenerPerName) {
  const std::string name = unique_name("alone");
  auto listener = LinkListener::listen(name);
  ASSERT_TRUE(listener.ok());
  const auto second = LinkListener::listen(name);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  const auto nobody = listener->accept(config_with_lanes(2), 1, 100);
  ASSERT_FALSE(nobody.ok());
  EXPECT_EQ(nobody.status().code(), StatusCode::kDeadlineExceeded);
  const auto no_listener = link_connect(unique_name("nobody"), config_with_lanes(2), 1, 100);
  ASSERT_FALSE(no_listener.ok());
  EXPECT_EQ(no_listener.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(no_listener.status().message().find("xdeepserve-link-nobody"), std::string::npos);
}

constexpr uid_t kNobody = 65534;

// A raw SOCK_SEQPACKET connection to the listener `name` (what any local process can open).
int raw_connect(const std::string& name) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string path = "xdeepserve-link-" + name;
  std::memcpy(a.sun_path + 1, path.data(), path.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&a), len) != 0) return -1;
  return s;
}

// Reads from `s` until the other side closes; true when it closed having sent no bytes and
// no fds (SCM_RIGHTS). A close with our bytes unread reads as a reset: nothing received either.
bool closed_without_anything(int s) {
  char buf[512];
  char ctrl[CMSG_SPACE(4 * sizeof(int))];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  ssize_t n;
  do n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  const bool closed = n == 0 || (n < 0 && errno == ECONNRESET);
  return closed && (n < 0 || CMSG_FIRSTHDR(&msg) == nullptr);
}

// Polls the listener (as DistFlow's prefill group does) until `done` says so or 20 s passed,
// collecting what accept_ready() gives.
template <typename Done>
void serve_listener(LinkListener& l, const ArenaConfig& c, int handshake_ms,
                    LinkListener::Accepted& got, Done done) {
  const int64_t deadline = now_ns() + 20'000'000'000;
  while (!done() && now_ns() < deadline) {
    pollfd p{l.fd(), POLLIN, 0};
    poll(&p, 1, 100);
    LinkListener::Accepted a = l.accept_ready(c, 1, handshake_ms);
    for (auto& f : a.formed) got.formed.push_back(std::move(f));
    for (auto& st : a.refused) got.refused.push_back(std::move(st));
  }
}

TEST(XcclLinkPeers, APeerOfAnotherUidIsRefusedAndReceivesNoFd) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as uid 65534";
  const std::string name = unique_name("nobody-in");
  auto listener = LinkListener::listen(name);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  const pid_t child = fork_child([&] {
    if (setgid(kNobody) != 0 || setuid(kNobody) != 0) return 10;
    const int s = raw_connect(name);
    if (s < 0) return 11;
    // Says hello-sized nothing useful, then waits for the listener's answer: none may come.
    const char junk[8] = {};
    (void)!send(s, junk, sizeof(junk), MSG_NOSIGNAL);
    return closed_without_anything(s) ? 0 : 12;
  });
  LinkListener::Accepted got;
  serve_listener(*listener, config_with_lanes(1), 10'000, got,
                 [&] { return !got.refused.empty(); });
  ASSERT_EQ(got.refused.size(), 1u);
  EXPECT_TRUE(got.formed.empty());
  EXPECT_EQ(got.refused[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(got.refused[0].message().find("uid 65534"), std::string::npos)
      << got.refused[0].to_string();
  EXPECT_EQ(listener->pending(), 0u);
  EXPECT_EQ(wait_child(child), 0);
  // The listener still serves its own user.
  const pid_t peer =
      fork_child([&] { return link_connect(name, config_with_lanes(1), 1, 10'000).ok() ? 0 : 10; });
  auto fabric = listener->accept(config_with_lanes(1), 1, 10'000);
  EXPECT_TRUE(fabric.ok()) << fabric.status().to_string();
  EXPECT_EQ(wait_child(peer), 0);
}

// A squatter of another uid on the name: the connecting side refuses it and sends no fd.
TEST(XcclLinkPeers, AListenerOfAnotherUidIsRefusedByTheConnectingSide) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as uid 65534";
  const std::string name = unique_name("nobody-out");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t squatter = fork_child([&] {
    if (setgid(kNobody) != 0 || setuid(kNobody) != 0) return 10;
    auto l = LinkListener::listen(name);
    if (!l.ok()) return 11;
    (void)!write(ready[1], "r", 1);
    const int64_t deadline = now_ns() + 10'000'000'000;
    while (now_ns() < deadline) {
      LinkListener::Accepted a = l->accept_ready(config_with_lanes(1), 1, 10'000);
      if (!a.formed.empty()) return 12;  // must never link to root
      if (!a.refused.empty()) return 0;
      usleep(1000);
    }
    return 13;
  });
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  auto fabric = link_connect(name, config_with_lanes(1), 1, 10'000);
  ASSERT_FALSE(fabric.ok());
  EXPECT_EQ(fabric.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(fabric.status().message().find("uid 65534"), std::string::npos)
      << fabric.status().to_string();
  EXPECT_EQ(wait_child(squatter), 0);
  close(ready[0]);
  close(ready[1]);
}

// A peer that connects and says nothing: a real peer that connects after it links and moves
// data while the silent one is still pending; then the silent one is dropped at the handshake
// timeout, having received nothing.
TEST(XcclLinkPeers, ASilentPeerDelaysNobodyAndIsDroppedAfterTheHandshakeTimeout) {
  const std::string name = unique_name("silent");
  auto listener = LinkListener::listen(name);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  int connected[2];
  ASSERT_EQ(pipe(connected), 0);
  const pid_t silent = fork_child([&] {
    const int s = raw_connect(name);
    if (s < 0) return 10;
    (void)!write(connected[1], "c", 1);
    return closed_without_anything(s) ? 0 : 11;
  });
  char c;
  ASSERT_EQ(read(connected[0], &c, 1), 1);
  close(connected[0]);
  close(connected[1]);
  constexpr int kHandshakeMs = 3'000;
  LinkListener::Accepted got;
  // Accept the silent one first: it is pending.
  serve_listener(*listener, config_with_lanes(1), kHandshakeMs, got,
                 [&] { return listener->pending() == 1; });
  ASSERT_EQ(listener->pending(), 1u);
  const pid_t real = fork_child([&] {
    auto fabric = link_connect(name, config_with_lanes(1), 1, 10'000);
    if (!fabric.ok()) return 10;
    Fabric& f = **fabric;
    auto t = make_transport("shm", f);
    if (!t.ok()) return 11;
    if (!wait_signal(**t, {1, f.layout().signal_off(0, 0)}, 1)) return 14;  // "written"
    std::vector<uint8_t> got_bytes(4096);
    const MemDesc remote{0, f.layout().app, 4096};
    if ((*t)->get(got_bytes.data(), remote, 0, 4096) != OpState::kDone) return 12;
    return got_bytes == pattern(4096, 5) ? 0 : 13;
  });
  serve_listener(*listener, config_with_lanes(1), kHandshakeMs, got,
                 [&] { return !got.formed.empty(); });
  ASSERT_EQ(got.formed.size(), 1u);
  Fabric& f = *got.formed[0];
  const std::vector<uint8_t> a = pattern(4096, 5);
  std::memcpy(f.local() + f.layout().app, a.data(), a.size());
  auto t = make_transport("shm", f);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(signal_peer(**t, f, {1, f.layout().signal_off(0, 0)}, 1));
  EXPECT_EQ(wait_child(real), 0);  // the transfer completed
  EXPECT_EQ(listener->pending(), 1u);  // the silent peer is still connected and pending
  EXPECT_TRUE(got.refused.empty());
  serve_listener(*listener, config_with_lanes(1), kHandshakeMs, got,
                 [&] { return !got.refused.empty(); });
  ASSERT_EQ(got.refused.size(), 1u);
  EXPECT_EQ(got.refused[0].code(), StatusCode::kDeadlineExceeded) << got.refused[0].to_string();
  EXPECT_EQ(listener->pending(), 0u);
  EXPECT_EQ(wait_child(silent), 0);
}

// In a child whose descriptors are all taken (RLIMIT_NOFILE lowered, then filled with dups), a
// peer connects: accept fails with EMFILE. Polling fd() for 300 ms as DistFlow's loop does
// wakes a few times and yields at most one error per pause (100 ms, then 200 ms), not one per
// call; once descriptors are free the waiting peer links.
TEST(XcclLinkPeers, OutOfDescriptorsTheListenerPausesInsteadOfSpinning) {
  const std::string name = unique_name("emfile");
  int full[2];
  ASSERT_EQ(pipe(full), 0);  // listener -> test: "every descriptor is taken"
  const pid_t listening = fork_child([&] {
    close(full[0]);
    auto l = LinkListener::listen(name);
    if (!l.ok()) return 10;
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 11;
    lim.rlim_cur = 256;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return 12;
    std::vector<int> taken;
    for (int fd; (fd = dup(l->fd())) >= 0;) taken.push_back(fd);
    if (errno != EMFILE) return 13;
    (void)!write(full[1], "f", 1);
    close(full[1]);  // one descriptor free again: take it too
    for (int fd; (fd = dup(l->fd())) >= 0;) taken.push_back(fd);
    // The peer's connection arrives: the first error.
    std::vector<Status> errors;
    const int64_t deadline = now_ns() + 10'000'000'000;
    while (errors.empty() && now_ns() < deadline) {
      pollfd p{l->fd(), POLLIN, 0};
      poll(&p, 1, 50);
      LinkListener::Accepted a = l->accept_ready(config_with_lanes(1), 1, 10'000);
      if (!a.formed.empty()) return 14;
      errors = std::move(a.refused);
    }
    // 300 ms of polling from the first error, still out of descriptors.
    const int64_t window_end = now_ns() + 300'000'000;
    if (errors.size() != 1 || errors[0].code() != StatusCode::kResourceExhausted) return 15;
    std::fprintf(stderr, "listener: %s\n", errors[0].to_string().c_str());
    int calls = 0, wakeups = 0, more_errors = 0;
    while (now_ns() < window_end) {
      pollfd p{l->fd(), POLLIN, 0};
      if (poll(&p, 1, 50) > 0) ++wakeups;
      LinkListener::Accepted a = l->accept_ready(config_with_lanes(1), 1, 10'000);
      ++calls;
      if (!a.formed.empty()) return 16;
      for (const Status& st : a.refused) {
        if (st.code() != StatusCode::kResourceExhausted) return 17;
        ++more_errors;
      }
    }
    std::fprintf(stderr, "listener: 300 ms: %d calls, %d wakeups, %d more errors\n", calls, wakeups,
                 more_errors);
    // Pauses end at about +100 ms and +300 ms: one error each, at most.
    if (more_errors > 2 || wakeups > 8) return 18;
    for (int fd : taken) close(fd);
    std::unique_ptr<Fabric> formed;
    const int64_t deadline2 = now_ns() + 10'000'000'000;
    while (formed == nullptr && now_ns() < deadline2) {
      pollfd p{l->fd(), POLLIN, 0};
      poll(&p, 1, 100);
      LinkListener::Accepted a = l->accept_ready(config_with_lanes(1), 1, 10'000);
      if (!a.formed.empty()) formed = std::move(a.formed.front());
    }
    if (formed == nullptr) return 19;
    // Stay until the peer has finished its side (it opens a pidfd of this process).
    while (formed->peer_alive(1) && now_ns() < deadline2) usleep(1000);
    return 0;
  });
  close(full[1]);
  char c;
  pollfd pf{full[0], POLLIN, 0};
  ASSERT_TRUE(poll(&pf, 1, 20'000) == 1 && read(full[0], &c, 1) == 1) << "the child did not fill";
  close(full[0]);
  const pid_t peer = fork_child([&] {
    auto fabric = link_connect(name, config_with_lanes(1), 1, 15'000);
    if (!fabric.ok()) std::fprintf(stderr, "peer: %s\n", fabric.status().to_string().c_str());
    return fabric.ok() ? 0 : 10;
  });
  EXPECT_EQ(wait_child(listening), 0);
  EXPECT_EQ(wait_child(peer), 0);
}

// Regions and arenas are memfds of mode 0600 (a memfd starts at 0777).
TEST(XcclLinkPeers, MemfdsAreOwnerOnly) {
  auto region = SharedRegion::create("test-mode", 4096);
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  struct stat st{};
  ASSERT_EQ(fstat(region->fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  const int fd = create_owner_only_memfd("test-mode-raw");
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  close(fd);
}

}  // namespace
}  // namespace xds::xccl
