// UCX links (xccl/ucx_link.h) between two processes over TCP (UCX_TLS=tcp through the link's
// options): both sides are forked children that form the link only through host:port, as two
// hosts do; the test process never initialises UCX. Checked against byte patterns: gets, puts
// and signals both ways, an exported region pulled at odd offsets and sizes (up to several MB,
// many gets in flight before one flush), bad descriptors refused, mismatched epoch and arena
// config refused on both sides naming the field, the rendezvous errors, a peer killed mid-run
// (operations fail, no hang, peer_alive false), and the same transfer across two network
// namespaces joined by a veth pair that the test makes (skipped, with the reason, where
// namespaces cannot be created). The cluster secret: every link above proves it (the same on
// both sides); a different secret fails both sides; a raw TCP peer that answers the challenge
// wrongly reads the listener's challenge and nothing else (its wire layout written out here
// from ucx_link.h's description); no secret is refused before anything is sent; a silent TCP
// peer does not hold up a good one.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/clock.h"
#include "child_process.h"
#include "xccl/ucx_link.h"

namespace xds::xccl {
namespace {

constexpr uint64_t kBytes = 256 * 1024;
constexpr const char* kSideFlag = "--ucx-netns-side";  // main(): run one side, see run_side

// A failed check in a child: says which and exits with code 1 (the parent expects 0).
#define CHILD_CHECK(cond)                                                                         \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "child %d: %s:%d: failed: %s\n", static_cast<int>(getpid()), __FILE__, \
                   __LINE__, #cond);                                                              \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

LinkSecret secret_of(uint8_t fill) {
  LinkSecret s;
  s.fill(fill);
  return s;
}

UcxLinkOptions tcp_options(uint32_t epoch, int lanes = 2) {
  UcxLinkOptions o;
  o.secret = secret_of(0x5e);
  o.config.lanes = lanes;
  o.config.app_bytes = 1 << 20;
  o.epoch = epoch;
  o.tls = "tcp";
  o.timeout_ms = 15'000;
  o.flush_timeout_ms = 15'000;
  return o;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

using fixtures::fork_child;
using fixtures::wait_child;

bool wait_signal(Transport& t, const SignalRef& sig, uint64_t value) {
  const int64_t deadline = now_ns() + 15'000'000'000;
  while (t.test_signal(sig, value) != OpState::kDone) {
    if (now_ns() > deadline) return false;
    usleep(100);
  }
  return true;
}

bool flushed(Transport& t) {
  return t.flush() == OpState::kDone;
}

// Signal k of the peer (written by this side) := value, no data.
bool signal_peer(UcxLink& l, int k, uint64_t value) {
  const SignalRef sig{1 - l.rank(), l.layout().signal_off(l.rank(), k)};
  return l.transport().put_with_signal({}, 0, nullptr, 0, sig, value) != OpState::kFailed &&
         flushed(l.transport());
}
bool wait_peer_signal(UcxLink& l, int k, uint64_t value) {
  return wait_signal(l.transport(), {l.rank(), l.layout().signal_off(1 - l.rank(), k)}, value);
}

// Leaving in order: the side that received the last signal stays until the signaller, whose
// flush waits for the acknowledgement, has gone (else that flush may see the peer gone).
bool wait_peer_gone(UcxLink& l) {
  const int64_t deadline = now_ns() + 15'000'000'000;
  while (l.peer_alive()) {
    if (now_ns() > deadline) return false;
    usleep(1000);
  }
  return true;
}

bool bytes_equal(const std::byte* p, const std::vector<uint8_t>& want) {
  return std::memcmp(p, want.data(), want.size()) == 0;
}

// Rank 0 in one child, rank 1 in another; both exit codes must be 0.
template <typename Fn0, typename Fn1>
void run_pair(UcxListener& listener, const UcxLinkOptions& o0, const UcxLinkOptions& o1, Fn0 side0,
              Fn1 side1) {
  const uint16_t port = listener.port();
  const pid_t p0 = fork_child([&] {
    auto link = listener.accept(o0);
    if (!link.ok()) std::fprintf(stderr, "rank 0: %s\n", link.status().to_string().c_str());
    CHILD_CHECK(link.ok());
    return side0(**link);
  });
  const pid_t p1 = fork_child([&] {
    auto link = ucx_connect("127.0.0.1", port, o1);
    if (!link.ok()) std::fprintf(stderr, "rank 1: %s\n", link.status().to_string().c_str());
    CHILD_CHECK(link.ok());
    return side1(**link);
  });
  EXPECT_EQ(wait_child(p0), 0) << "rank 0";
  EXPECT_EQ(wait_child(p1), 0) << "rank 1";
}

// Each side fills half A of its app area, puts pattern into the other's half B with a signal,
// checks what it received, then pulls the other's half A. Layout of each app area:
//   [app, +kBytes) own pattern (seed 1 + rank) | [app + 512K, +kBytes) the peer's put (seed 3 +
//   peer)
int exchange(UcxLink& l) {
  Transport& t = l.transport();
  const int me = l.rank(), peer = 1 - me;
  const ArenaLayout& lay = l.layout();
  CHILD_CHECK(t.name() == "ucx" && t.caps().async_completion);
  const std::vector<uint8_t> own = pattern(kBytes, static_cast<uint8_t>(1 + me));
  std::memcpy(l.local() + lay.app, own.data(), kBytes);
  CHILD_CHECK(signal_peer(l, 0, 1));  // "my half A is written"
  const std::vector<uint8_t> to_peer = pattern(kBytes, static_cast<uint8_t>(3 + me));
  const MemDesc peer_app{peer, lay.app, 1 << 20};
  CHILD_CHECK(t.put_with_signal(peer_app, 512 * 1024, to_peer.data(), kBytes,
                                {peer, lay.signal_off(me, 1)}, 7) != OpState::kFailed);
  CHILD_CHECK(flushed(t));
  CHILD_CHECK(wait_peer_signal(l, 1, 7));
  CHILD_CHECK(bytes_equal(l.local() + lay.app + 512 * 1024,
                          pattern(kBytes, static_cast<uint8_t>(3 + peer))));
  CHILD_CHECK(wait_peer_signal(l, 0, 1));
  std::vector<uint8_t> got(kBytes);
  CHILD_CHECK(t.get(got.data(), peer_app, 0, kBytes) == OpState::kInProgress);
  CHILD_CHECK(flushed(t));
  CHILD_CHECK(got == pattern(kBytes, static_cast<uint8_t>(1 + peer)));
  // A local descriptor is copied at once.
  std::vector<uint8_t> mine(64);
  CHILD_CHECK(t.get(mine.data(), {me, lay.app, 64}, 0, 64) == OpState::kDone);
  CHILD_CHECK(std::equal(mine.begin(), mine.end(), own.begin()));
  // Done: neither side leaves while the other may still pull from it. Rank 0 says it is done,
  // rank 1 answers and leaves, rank 0 leaves once rank 1 has.
  CHILD_CHECK(l.peer_alive());
  if (me == 0) {
    CHILD_CHECK(signal_peer(l, 2, 1));
    CHILD_CHECK(wait_peer_signal(l, 2, 1));
    CHILD_CHECK(wait_peer_gone(l));
  } else {
    CHILD_CHECK(wait_peer_signal(l, 2, 1));
    CHILD_CHECK(signal_peer(l, 2, 1));
  }
  return 0;
}

TEST(XcclUcxLink, GetsPutsAndSignalsCrossBetweenTwoProcessesOverTcp) {
  auto listener = UcxListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  run_pair(*listener, tcp_options(7), tcp_options(7), exchange, exchange);
}

// DistFlow's shape: rank 0 lends a region (its KV cache); rank 1 pulls slices at odd offsets
// and sizes, many in flight before one flush, and writes one back with a signal.
TEST(XcclUcxLink, AnExportedRegionIsPulledAtOddOffsetsAndSizes) {
  auto listener = UcxListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  constexpr uint64_t kRegion = 8 * 1024 * 1024 + 333;
  const std::vector<uint8_t> whole = pattern(kRegion, 9);
  const std::vector<uint8_t> back = pattern(300'001, 77);
  constexpr uint64_t kBackAt = 5'000'003;
  struct Slice {
    uint64_t off, n;
  };
  const std::vector<Slice> slices = {{0, kRegion},     {1, 3},           {4095, 245'760 + 7},
                                     {kRegion - 5, 5}, {777, 3'000'001}, {2'500'000, 1}};
  UcxLinkOptions o0 = tcp_options(3, 1);
  std::vector<uint8_t> region(whole);  // the child's copy is what it exports
  o0.exported = {reinterpret_cast<std::byte*>(region.data()), region.size()};
  auto side0 = [&](UcxLink& l) {
    Transport& t = l.transport();
    auto desc = t.register_memory(region.data() + 100, 50);
    CHILD_CHECK(desc.ok() && desc->region == kExportRegion && desc->offset == 100);
    CHILD_CHECK(!t.register_memory(back.data(), 8).ok());  // neither arena nor region
    CHILD_CHECK(l.peer_region_bytes() == 0);
    CHILD_CHECK(wait_peer_signal(l, 0, 1));  // rank 1 wrote back and is done
    CHILD_CHECK(std::memcmp(region.data() + kBackAt, back.data(), back.size()) == 0);
    CHILD_CHECK(std::memcmp(region.data(), whole.data(), kBackAt) == 0);
    CHILD_CHECK(wait_peer_gone(l));
    return 0;
  };
  auto side1 = [&](UcxLink& l) {
    Transport& t = l.transport();
    CHILD_CHECK(l.peer_region_bytes() == kRegion);
    std::vector<std::vector<uint8_t>> got(slices.size());
    const MemDesc remote{0, 0, kRegion, kExportRegion};
    for (size_t i = 0; i < slices.size(); ++i) {
      got[i].resize(slices[i].n);
      CHILD_CHECK(t.get(got[i].data(), remote, slices[i].off, slices[i].n) != OpState::kFailed);
    }
    CHILD_CHECK(flushed(t));
    for (size_t i = 0; i < slices.size(); ++i) {
      CHILD_CHECK(std::equal(got[i].begin(), got[i].end(),
                             whole.begin() + static_cast<ptrdiff_t>(slices[i].off)));
    }
    // Bad descriptors fail at once: past the region, an unknown rank, past the descriptor.
    std::vector<uint8_t> scratch(16);
    CHILD_CHECK(t.get(scratch.data(), remote, kRegion - 8, 16) == OpState::kFailed);
    CHILD_CHECK(t.get(scratch.data(), {2, 0, 16, kExportRegion}, 0, 16) == OpState::kFailed);
    CHILD_CHECK(t.get(scratch.data(), {0, 0, 8, kArenaRegion}, 4, 8) == OpState::kFailed);
    CHILD_CHECK(t.put_with_signal(remote, kBackAt, back.data(), back.size(),
                                  {0, l.layout().signal_off(1, 0)}, 1) != OpState::kFailed);
    CHILD_CHECK(flushed(t));
    return 0;
  };
  run_pair(*listener, o0, tcp_options(3, 1), side0, side1);
}

// Both sides fail with the field named and both values.
void expect_refused(const UcxLinkOptions& o0, const UcxLinkOptions& o1, const std::string& msg0,
                    const std::string& msg1) {
  auto listener = UcxListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  const uint16_t port = listener->port();
  const pid_t p0 = fork_child([&] {
    auto link = listener->accept(o0);
    CHILD_CHECK(!link.ok());
    std::fprintf(stderr, "rank 0: %s\n", link.status().to_string().c_str());
    CHILD_CHECK(link.status().message().find(msg0) != std::string::npos);
    CHILD_CHECK(link.status().message().find("127.0.0.1:") != std::string::npos);
    return 0;
  });
  const pid_t p1 = fork_child([&] {
    auto link = ucx_connect("127.0.0.1", port, o1);
    CHILD_CHECK(!link.ok());
    std::fprintf(stderr, "rank 1: %s\n", link.status().to_string().c_str());
    CHILD_CHECK(link.status().message().find(msg1) != std::string::npos);
    return 0;
  });
  EXPECT_EQ(wait_child(p0), 0);
  EXPECT_EQ(wait_child(p1), 0);
}

TEST(XcclUcxLink, AMismatchedEpochOrArenaConfigFailsBothSidesNamingTheField) {
  expect_refused(tcp_options(7), tcp_options(8), "epoch is 8, this side's 7",
                 "epoch is 7, this side's 8");
  expect_refused(tcp_options(1, 2), tcp_options(1, 4), "lanes is 4, this side's 2",
                 "lanes is 2, this side's 4");
}

TEST(XcclUcxLink, RendezvousErrorsNameTheAddress) {
  auto listener = UcxListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  const uint16_t port = listener->port();
  const std::string where = "127.0.0.1:" + std::to_string(port);
  EXPECT_EQ(listener->address(), where);
  const auto second = UcxListener::listen("127.0.0.1", port);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(where), std::string::npos);
  UcxLinkOptions quick = tcp_options(1);
  quick.timeout_ms = 100;
  const auto nobody = listener->accept(quick);
  ASSERT_FALSE(nobody.ok());
  EXPECT_EQ(nobody.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(nobody.status().message().find(where), std::string::npos);
  // Nobody listens once the listener is gone: refused until the deadline.
  auto closed = UcxListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(closed.ok());
  const uint16_t free_port = closed->port();
  { UcxListener gone = std::move(*closed); }
  const auto refused = ucx_connect("127.0.0.1", free_port, quick);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("127.0.0.1:" + std::to_string(free_port)),
            std::string::npos)
      << refused.status().to_string();
  const auto bad_host = ucx_connect("no-such-host.invalid", 1, quick);
  ASSERT_FALSE(bad_host.ok());
  EXPECT_NE(bad_host.status().message().find("no-such-host.invalid"), std::string::npos);
}

// Rank 0 lends a region and is killed after rank 1's first pull; rank 1's next flush fails
// (it does not wait out anything longer than flush_timeout_ms), the peer reads as dead, and a
// later operation fails at once.
TEST(XcclUcxLink, APeerKilledMidRunFailsOperationsWithoutHanging) {
  auto listener = UcxListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  const uint16_t port = listener->port();
  std::vector<uint8_t> region = pattern(4 << 20, 5);
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t p0 = fork_child([&] {
    UcxLinkOptions o = tcp_options(2);
    o.exported = {reinterpret_cast<std::byte*>(region.data()), region.size()};
    auto link = listener->accept(o);
    CHILD_CHECK(link.ok());
    pause();  // serves gets from its progress thread until killed
    return 0;
  });
  const pid_t p1 = fork_child([&] {
    UcxLinkOptions o = tcp_options(2);
    o.flush_timeout_ms = 10'000;
    auto link = ucx_connect("127.0.0.1", port, o);
    CHILD_CHECK(link.ok());
    Transport& t = (*link)->transport();
    std::vector<uint8_t> got(region.size());
    const MemDesc remote{0, 0, region.size(), kExportRegion};
    CHILD_CHECK(t.get(got.data(), remote, 0, got.size()) != OpState::kFailed);
    CHILD_CHECK(flushed(t));
    CHILD_CHECK(got == region);
    CHILD_CHECK((*link)->peer_alive());
    CHILD_CHECK(write(to_parent[1], "k", 1) == 1);  // the parent kills rank 0 now
    char c;
    CHILD_CHECK(read(to_child[0], &c, 1) == 1);  // ... and says so
    bool failed = false;
    for (int i = 0; i < 3 && !failed; ++i) {
      failed = t.get(got.data(), remote, 0, got.size()) == OpState::kFailed ||
               t.flush() == OpState::kFailed;
    }
    CHILD_CHECK(failed);
    CHILD_CHECK(!(*link)->peer_alive());
    CHILD_CHECK(t.get(got.data(), remote, 0, 64) == OpState::kFailed);
    return 0;
  });
  char c;
  pollfd pf{to_parent[0], POLLIN, 0};  // a deadline: rank 1 may fail before it writes
  const bool pulled = poll(&pf, 1, 60'000) == 1 && read(to_parent[0], &c, 1) == 1;
  kill(p0, SIGKILL);
  EXPECT_EQ(wait_child(p0), 128 + SIGKILL);
  EXPECT_TRUE(pulled) << "rank 1 did not pull the region before the kill";
  EXPECT_EQ(write(to_child[1], "d", 1), 1);
  EXPECT_EQ(wait_child(p1), 0);
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) close(fd);
}

TEST(XcclUcxLink, ADifferentClusterSecretFailsBothSides) {
  UcxLinkOptions o1 = tcp_options(7);
  o1.secret = secret_of(0x11);
  // Rank 0 checks rank 1's proof first and closes; rank 1 learns it from the closed connection.
  expect_refused(tcp_options(7), o1, "the peer did not prove the cluster secret", "cluster secret");
}

TEST(XcclUcxLink, NoClusterSecretIsRefusedBeforeAnythingIsSent) {
  auto listener = UcxListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  UcxLinkOptions none = tcp_options(1);
  none.secret.reset();
  const auto link = ucx_connect("127.0.0.1", listener->port(), none);
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(link.status().message().find("no cluster secret"), std::string::npos);
  const UcxListener::Accepted a = listener->accept_ready(none);
  EXPECT_TRUE(a.formed.empty());
  ASSERT_EQ(a.refused.size(), 1u);
  EXPECT_EQ(a.refused[0].code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(listener->pending(), 0u);
}

// The challenge as ucx_link.h describes it (host byte order): magic "XUCXAUTH", version 2,
// rank, epoch, pad, 32-byte nonce; a proof is 32 bytes.
struct RawChallenge {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  uint32_t epoch;
  uint32_t pad;
  uint8_t nonce[32];
};
constexpr uint64_t kRawChallengeMagic = 0x4854554158435558ull;

// A TCP client of the listener's port (blocking).
int raw_connect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything `fd` receives until EOF (true) or an error or 10 s (false).
bool read_to_eof(int fd, std::vector<uint8_t>& got) {
  const int64_t deadline = now_ns() + 10'000'000'000;
  uint8_t buf[4096];
  while (now_ns() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t k = recv(fd, buf, sizeof(buf), 0);
    if (k == 0) return true;
    if (k < 0) return false;
    got.insert(got.end(), buf, buf + k);
  }
  return false;
}

// A peer without the secret answers the challenge with 32 wrong bytes: the listener refuses it
// naming the reason, and all the peer ever reads is the listener's challenge -- no proof, no
// hello, no rkey -- then an orderly EOF (not a reset: the listener read all it was sent).
TEST(XcclUcxLink, APeerWithAWrongProofReadsOnlyTheChallenge) {
  auto listener = UcxListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  const int raw = raw_connect(listener->port());
  ASSERT_GE(raw, 0) << std::strerror(errno);
  RawChallenge mine{kRawChallengeMagic, 2, 1, 5, 0, {}};
  for (int i = 0; i < 32; ++i) mine.nonce[i] = static_cast<uint8_t>(i * 13 + 1);
  uint8_t wrong_proof[32];
  std::memset(wrong_proof, 0x5a, sizeof(wrong_proof));
  ASSERT_EQ(send(raw, &mine, sizeof(mine), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(mine)));
  ASSERT_EQ(send(raw, wrong_proof, sizeof(wrong_proof), MSG_NOSIGNAL), 32);
  UcxLinkOptions o = tcp_options(5);
  std::vector<Status> refused;
  const int64_t deadline = now_ns() + 10'000'000'000;
  while (refused.empty() && now_ns() < deadline) {
    pollfd p{listener->fd(), POLLIN, 0};
    poll(&p, 1, 100);
    UcxListener::Accepted a = listener->accept_ready(o);
    EXPECT_TRUE(a.formed.empty());
    for (Status& st : a.refused) refused.push_back(std::move(st));
  }
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].message().find("the peer did not prove the cluster secret"),
            std::string::npos)
      << refused[0].to_string();
  EXPECT_NE(refused[0].message().find("127.0.0.1:"), std::string::npos);
  EXPECT_EQ(listener->pending(), 0u);
  std::vector<uint8_t> got;
  ASSERT_TRUE(read_to_eof(raw, got)) << "no orderly EOF: " << std::strerror(errno);
  close(raw);
  ASSERT_EQ(got.size(), sizeof(RawChallenge)) << "the listener sent more than its challenge";
  RawChallenge theirs;
  std::memcpy(&theirs, got.data(), sizeof(theirs));
  EXPECT_EQ(theirs.magic, kRawChallengeMagic);
  EXPECT_EQ(theirs.version, 2u);
  EXPECT_EQ(theirs.rank, 0);
  EXPECT_EQ(theirs.epoch, 5u);
  EXPECT_TRUE(std::any_of(theirs.nonce, theirs.nonce + 32, [](uint8_t b) { return b != 0; }));
}

// A TCP peer that connects first and says nothing: the listener keeps it pending while a good
// peer, connecting after it, links. The good peer gives up after 15 s, the listener would wait
// 60 s for the silent one's challenge: the link forming at all shows the silent peer held
// nothing up (no wall-clock assertion).
TEST(XcclUcxLink, ASilentPeerDoesNotHoldUpAGoodOne) {
  auto listener = UcxListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  const uint16_t port = listener->port();
  const int silent = raw_connect(port);
  ASSERT_GE(silent, 0) << std::strerror(errno);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);  // rank 0 -> rank 1: "the silent peer is pending"
  UcxLinkOptions o0 = tcp_options(6);
  o0.timeout_ms = 60'000;
  const pid_t p0 = fork_child([&] {
    std::unique_ptr<UcxLink> link;
    bool told = false;
    const int64_t deadline = now_ns() + 30'000'000'000;
    while (link == nullptr && now_ns() < deadline) {
      pollfd p{listener->fd(), POLLIN, 0};
      poll(&p, 1, 100);
      UcxListener::Accepted a = listener->accept_ready(o0);
      for (const Status& st : a.refused)
        std::fprintf(stderr, "rank 0: %s\n", st.to_string().c_str());
      CHILD_CHECK(a.refused.empty());
      if (!a.formed.empty()) link = std::move(a.formed.front());
      if (!told && listener->pending() >= 1) {
        CHILD_CHECK(write(ready[1], "s", 1) == 1);
        told = true;
      }
    }
    CHILD_CHECK(link != nullptr);
    CHILD_CHECK(listener->pending() == 1);  // the silent peer, still waiting
    return exchange(*link);
  });
  const pid_t p1 = fork_child([&] {
    char c;
    pollfd p{ready[0], POLLIN, 0};
    CHILD_CHECK(poll(&p, 1, 30'000) == 1 && read(ready[0], &c, 1) == 1);
    auto link = ucx_connect("127.0.0.1", port, tcp_options(6));
    if (!link.ok()) std::fprintf(stderr, "rank 1: %s\n", link.status().to_string().c_str());
    CHILD_CHECK(link.ok());
    return exchange(**link);
  });
  EXPECT_EQ(wait_child(p0), 0) << "rank 0";
  EXPECT_EQ(wait_child(p1), 0) << "rank 1";
  // The silent peer got the challenge and nothing else.
  uint8_t buf[128];
  const ssize_t n = recv(silent, buf, sizeof(buf), MSG_DONTWAIT);
  EXPECT_EQ(n, static_cast<ssize_t>(sizeof(RawChallenge)));
  for (int fd : {silent, ready[0], ready[1]}) close(fd);
}

// Runs `cmd` (through the shell, stderr folded in); its output on failure goes to `why`.
bool run_command(const std::string& cmd, std::string& why) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) {
    why = cmd + ": popen failed";
    return false;
  }
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  const int rc = pclose(f);
  if (rc != 0) why = cmd + ": " + (out.empty() ? "exit " + std::to_string(rc) : out);
  return rc == 0;
}

// Two network namespaces joined by a veth pair, addresses 10.211.N.1/24 and 10.211.N.2/24;
// deleting the namespaces (destructor, also after a failure half way) deletes the veth too.
struct VethNamespaces {
  std::string ns[2], veth[2], addr[2];
  bool made[2] = {false, false};

  bool create(std::string& why) {
    const std::string id = std::to_string(getpid());
    const std::string subnet = "10.211." + std::to_string(getpid() % 250) + ".";
    for (int i = 0; i < 2; ++i) {
      ns[i] = "xds-ucx-" + id + "-" + std::to_string(i);
      veth[i] = "xu" + id + (i == 0 ? "a" : "b");  // <= 15 characters
      addr[i] = subnet + std::to_string(i + 1);
    }
    for (int i = 0; i < 2; ++i) {
      if (!run_command("ip netns add " + ns[i], why)) return false;
      made[i] = true;
    }
    if (!run_command("ip link add " + veth[0] + " netns " + ns[0] + " type veth peer name " +
                         veth[1] + " netns " + ns[1],
                     why)) {
      return false;
    }
    for (int i = 0; i < 2; ++i) {
      const std::string in = "ip -n " + ns[i] + " ";
      if (!run_command(in + "addr add " + addr[i] + "/24 dev " + veth[i], why) ||
          !run_command(in + "link set " + veth[i] + " up", why) ||
          !run_command(in + "link set lo up", why)) {
        return false;
      }
    }
    // The carrier comes up a moment after "link set up"; UCX skips devices not yet running.
    const int64_t deadline = now_ns() + 10'000'000'000;
    for (int i = 0; i < 2; ++i) {
      std::string out;
      while (!run_command("ip -n " + ns[i] + " link show dev " + veth[i] + " | grep -q LOWER_UP",
                          out)) {
        if (now_ns() > deadline) {
          why = veth[i] + " in " + ns[i] + " has no carrier after 10 s";
          return false;
        }
        usleep(10'000);
      }
    }
    return true;
  }
  ~VethNamespaces() {
    std::string ignored;
    for (int i = 0; i < 2; ++i)
      if (made[i]) run_command("ip netns del " + ns[i], ignored);
  }
};

// Runs one side in network namespace `ns` through `ip netns exec`, in a fresh image of this test
// binary (main() below). `ip netns exec` also remounts /sys for the namespace, where UCX finds
// its network devices; a forked child that only called setns() sees none of the namespace's.
pid_t spawn_side(const std::string& ns, int rank, const std::string& host, uint16_t port,
                 int port_fd) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return -1;
  exe[n] = 0;
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const std::string r = std::to_string(rank), p = std::to_string(port), f = std::to_string(port_fd);
  execlp("ip", "ip", "netns", "exec", ns.c_str(), exe, kSideFlag, r.c_str(), host.c_str(),
         p.c_str(), f.c_str(), static_cast<char*>(nullptr));
  std::fprintf(stderr, "cannot run ip netns exec: %s\n", std::strerror(errno));
  _exit(3);
}

// Two hosts as far as the network goes: each side in its own namespace, the link over the veth.
TEST(XcclUcxLink, GetsPutsAndSignalsCrossBetweenNetworkNamespacesOverAVethPair) {
  VethNamespaces net;
  std::string why;
  if (!net.create(why)) GTEST_SKIP() << "cannot make network namespaces here: " << why;
  int port_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);  // rank 0 writes the port it listens on
  const pid_t p0 = spawn_side(net.ns[0], 0, net.addr[0], 0, port_pipe[1]);
  close(port_pipe[1]);
  ASSERT_GT(p0, 0) << "cannot find this test's executable";
  uint16_t port = 0;
  pollfd pf{port_pipe[0], POLLIN, 0};  // a deadline: rank 0 may fail before it writes
  const bool listening =
      poll(&pf, 1, 30'000) == 1 && read(port_pipe[0], &port, sizeof(port)) == sizeof(port);
  close(port_pipe[0]);
  const pid_t p1 = listening ? spawn_side(net.ns[1], 1, net.addr[0], port, -1) : -1;
  EXPECT_EQ(wait_child(p0), 0) << "rank 0";
  ASSERT_TRUE(listening) << "rank 0 did not listen in " << net.ns[0];
  EXPECT_EQ(wait_child(p1), 0) << "rank 1";
}

}  // namespace

// One side of the namespace test: kSideFlag RANK HOST PORT PORT_FD. Rank 0 listens on HOST
// (any port) and writes the port to PORT_FD; rank 1 connects to HOST:PORT. Exit code 0: the
// exchange checked out.
int run_side(char** argv) {
  const int rank = std::atoi(argv[2]);
  const std::string host = argv[3];
  const auto port = static_cast<uint16_t>(std::atoi(argv[4]));
  const int port_fd = std::atoi(argv[5]);
  Result<std::unique_ptr<UcxLink>> link = unavailable("not formed");
  if (rank == 0) {
    auto listener = UcxListener::listen(host, 0);
    CHILD_CHECK(listener.ok());
    const uint16_t bound = listener->port();
    CHILD_CHECK(write(port_fd, &bound, sizeof(bound)) == sizeof(bound));
    close(port_fd);
    link = listener->accept(tcp_options(4));
  } else {
    link = ucx_connect(host, port, tcp_options(4));
  }
  if (!link.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, link.status().to_string().c_str());
  CHILD_CHECK(link.ok());
  if (rank == 1) CHILD_CHECK((*link)->peer_address() == host + ":" + std::to_string(port));
  return exchange(**link);
}
}  // namespace xds::xccl

int main(int argc, char** argv) {
  if (argc == 6 && std::strcmp(argv[1], xds::xccl::kSideFlag) == 0) {
    return xds::xccl::run_side(argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
