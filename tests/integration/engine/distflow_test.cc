// DistFlow (engine/distflow.h) between two processes: the prefill side (this test process)
// exports its KV region and listens; a forked child plays the decode group, which forms the
// link only through the rendezvous socket, as a separately started process does. Checked:
// pulled blocks equal the prefill side's bytes (a pattern written per block), completions come
// back in order through more than one lap of the ring, a transfer freed before the pull is
// refused (not read as KV), and a KV format mismatch is refused naming both formats. Link
// probing (P116): a link whose prefill side holds the transfer but answers probes is slow
// but alive (every probe answered, the pull completes with the right bytes); one that stops
// answering is declared failed, poisoned, dropped by both sides, and made anew for the next
// pull -- over shared memory and over UCX. Over UCX both sides prove the cluster secret: a
// decode group with another secret gets no link (and no KV), and the prefill side links nobody.
#include "engine/distflow.h"

#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/clock.h"
#include "child_process.h"

namespace xds::engine {
namespace {

KvStorageShape test_shape() {
  KvStorageShape s;
  s.layout = mla_kv_layout(/*layers=*/2, /*latent_dim=*/64, /*rope_dim=*/16, DType::kF32);
  s.num_blocks = 8;
  s.block_size = 4;
  return s;
}

// Byte i of block b.
uint8_t pattern(int32_t b, int64_t i) { return static_cast<uint8_t>(b * 31 + i * 7 + (i >> 9)); }

void fill_blocks(KvSender& sender, const KvStorageShape& shape) {
  const int64_t block_bytes = KvStorage::bytes_for({shape.layout, 1, shape.block_size});
  std::byte* base = sender.kv_bytes().data();
  for (int32_t b = 0; b < shape.num_blocks; ++b)
    for (int64_t i = 0; i < block_bytes; ++i)
      base[b * block_bytes + i] = std::byte{pattern(b, i)};
}

using fixtures::wait_child;

// The cluster secret of the UCX cases (shared-memory links do not use it).
xccl::LinkSecret test_secret(uint8_t fill = 0x42) {
  xccl::LinkSecret s;
  s.fill(fill);
  return s;
}

std::string unique_name(const char* what) {
  return std::string("test-") + what + "-" + std::to_string(getpid());
}

// Serves the link until `want` completions arrived (or 20 s passed); returns them in order.
std::vector<uint64_t> serve_until(KvSender& sender, size_t want) {
  std::vector<uint64_t> done;
  const int64_t deadline = now_ns() + 20'000'000'000;
  while (done.size() < want && now_ns() < deadline) {
    EXPECT_TRUE(sender.accept_pending().ok());
    sender.poll_completions(done);
    usleep(100);
  }
  return done;
}

// `transfers` pulls of two blocks each over `backend`, every byte checked in the child.
void pull_and_complete(KvBackendChoice backend, int transfers) {
  const KvStorageShape shape = test_shape();
  const std::string fmt = "test format A";
  // UCX over TCP (set before any UCX context exists; the child inherits it).
  setenv("UCX_TLS", "tcp", 1);
  auto sender =
      KvSender::create(unique_name("pull"), shape, fmt,
                       backend == KvBackendChoice::kUcx ? "127.0.0.1" : "", test_secret());
  ASSERT_TRUE(sender.ok()) << sender.status().to_string();
  fill_blocks(**sender, shape);
  const int kTransfers = transfers;
  const std::string ucx_address = (*sender)->ucx_address();
  std::vector<uint64_t> ids;
  for (int t = 0; t < kTransfers; ++t) ids.push_back((*sender)->open_transfer());
  const std::string link = (*sender)->link_name();
  const pid_t child = fork();
  if (child == 0) {
    KvReceiver receiver(fmt, backend, "127.0.0.1", {}, test_secret());
    auto local = KvStorage::create(shape, -1);
    if (!local.ok()) _exit(10);
    for (int t = 0; t < kTransfers; ++t) {
      KvHandoff h;
      h.link = link;
      h.ucx_address = ucx_address;
      h.transfer = ids[static_cast<size_t>(t)];
      h.kv_format = fmt;
      h.blocks = {static_cast<int32_t>(t % 8), static_cast<int32_t>((t * 3 + 1) % 8)};
      const std::vector<int32_t> dst = {5, 2};
      if (!receiver.pull(h, dst, *local).ok()) _exit(11);
      for (size_t k = 0; k < dst.size(); ++k) {
        const std::byte* got = local->block_ptr(dst[k]);
        for (int64_t i = 0; i < local->block_bytes(); ++i)
          if (got[i] != std::byte{pattern(h.blocks[k], i)}) _exit(12);
      }
    }
    _exit(0);
  }
  const std::vector<uint64_t> done = serve_until(**sender, kTransfers);
  EXPECT_EQ(done, ids);
  EXPECT_EQ(wait_child(child), 0);
  EXPECT_EQ((*sender)->links(), 1);
}

// A handoff whose checksums do not cover its blocks is refused before any link is made.
TEST(DistFlow, AHandoffWithTheWrongNumberOfChecksumsIsRefused) {
  const KvStorageShape shape = test_shape();
  KvReceiver receiver("test format C", KvBackendChoice::kShm);
  auto local = KvStorage::create(shape, -1);
  ASSERT_TRUE(local.ok());
  KvHandoff h;
  h.link = unique_name("nobody");
  h.transfer = 1;
  h.kv_format = "test format C";
  h.blocks = {0, 1};
  h.block_sums = {7};
  const std::vector<int32_t> dst = {2, 3};
  const Status st = receiver.pull(h, dst, *local);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("1 checksums for 2 blocks"), std::string::npos) << st.message();
  EXPECT_EQ(receiver.links(), 0u);
}

// A connection to the KV link that says nothing: a decode group linking after it pulls and
// completes while the silent one is still connected (the prefill side never waits for a
// hello), and the silent one is dropped at the handshake timeout having received no fd.
TEST(DistFlow, ASilentConnectionDoesNotDelayAPull) {
  const KvStorageShape shape = test_shape();
  const std::string fmt = "test format S";
  auto sender = KvSender::create(unique_name("silent"), shape, fmt);
  ASSERT_TRUE(sender.ok()) << sender.status().to_string();
  fill_blocks(**sender, shape);
  const std::string link = (*sender)->link_name();
  int connected[2];
  ASSERT_EQ(pipe(connected), 0);
  const pid_t silent = fork();
  if (silent == 0) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string path = "xdeepserve-link-" + link;
    std::memcpy(a.sun_path + 1, path.data(), path.size());
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
    const int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    if (connect(s, reinterpret_cast<sockaddr*>(&a), len) != 0) _exit(10);
    if (write(connected[1], "c", 1) != 1) _exit(11);
    char buf[256];
    char ctrl[CMSG_SPACE(4 * sizeof(int))];
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
    const ssize_t n = recvmsg(s, &msg, 0);  // until the prefill side drops it
    _exit(n == 0 && CMSG_FIRSTHDR(&msg) == nullptr ? 0 : 12);
  }
  char c;
  ASSERT_EQ(read(connected[0], &c, 1), 1);
  const int64_t wait_until = now_ns() + 20'000'000'000;
  while ((*sender)->pending_links() == 0 && now_ns() < wait_until) {
    ASSERT_TRUE((*sender)->accept_pending().ok());
    usleep(100);
  }
  ASSERT_EQ((*sender)->pending_links(), 1u);
  constexpr int kTransfers = 3;
  std::vector<uint64_t> ids;
  for (int t = 0; t < kTransfers; ++t) ids.push_back((*sender)->open_transfer());
  const pid_t decode = fork();
  if (decode == 0) {
    KvReceiver receiver(fmt, KvBackendChoice::kShm);
    auto local = KvStorage::create(shape, -1);
    if (!local.ok()) _exit(10);
    for (int t = 0; t < kTransfers; ++t) {
      KvHandoff h;
      h.link = link;
      h.transfer = ids[static_cast<size_t>(t)];
      h.kv_format = fmt;
      h.blocks = {static_cast<int32_t>(t)};
      const std::vector<int32_t> dst = {4};
      if (!receiver.pull(h, dst, *local).ok()) _exit(11);
      const std::byte* got = local->block_ptr(4);
      for (int64_t i = 0; i < local->block_bytes(); ++i)
        if (got[i] != std::byte{pattern(t, i)}) _exit(12);
    }
    _exit(0);
  }
  EXPECT_EQ(serve_until(**sender, kTransfers), ids);
  EXPECT_EQ(wait_child(decode), 0);
  EXPECT_EQ((*sender)->links(), 1);
  EXPECT_EQ((*sender)->pending_links(), 1u);  // the silent one is still connected
  while ((*sender)->pending_links() != 0 && now_ns() < wait_until) {
    ASSERT_TRUE((*sender)->accept_pending().ok());
    usleep(1000);
  }
  EXPECT_EQ((*sender)->pending_links(), 0u);
  EXPECT_EQ(wait_child(silent), 0);
  close(connected[0]);
  close(connected[1]);
}

// 2,500 transfers: more than two laps of the 1,024-slot completion ring.
TEST(DistFlow, PulledBlocksAreThePrefillSidesBytesAndCompletionsComeBackInOrder) {
  pull_and_complete(KvBackendChoice::kShm, 2500);
}

// The same over a UCX link (TCP on 127.0.0.1), past one lap of the ring.
TEST(DistFlow, TheSameOverUcx) { pull_and_complete(KvBackendChoice::kUcx, 1100); }

// A decode group whose cluster secret differs: its pull fails naming the secret, the prefill
// side refuses it (nothing linked), and a UCX listener without a secret is refused up front.
TEST(DistFlow, ADecodeGroupWithAnotherClusterSecretGetsNoLinkOverUcx) {
  const KvStorageShape shape = test_shape();
  const std::string fmt = "test format U";
  setenv("UCX_TLS", "tcp", 1);
  const auto no_secret = KvSender::create(unique_name("nosecret"), shape, fmt, "127.0.0.1");
  ASSERT_FALSE(no_secret.ok());
  EXPECT_EQ(no_secret.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_secret.status().message().find("cluster secret"), std::string::npos);
  auto sender = KvSender::create(unique_name("secret"), shape, fmt, "127.0.0.1", test_secret());
  ASSERT_TRUE(sender.ok()) << sender.status().to_string();
  KvHandoff h;
  h.link = (*sender)->link_name();
  h.ucx_address = (*sender)->ucx_address();
  h.transfer = (*sender)->open_transfer();
  h.kv_format = fmt;
  h.blocks = {1};
  const pid_t child = fork();
  if (child == 0) {
    auto local = KvStorage::create(shape, -1);
    if (!local.ok()) _exit(10);
    KvReceiver receiver(fmt, KvBackendChoice::kUcx, "127.0.0.1", {}, test_secret(0x43));
    const Status st = receiver.pull(h, std::vector<int32_t>{0}, *local);
    std::fprintf(stderr, "decode side: %s\n", st.to_string().c_str());
    if (st.ok()) _exit(11);
    if (st.message().find("cluster secret") == std::string::npos) _exit(12);
    KvReceiver none(fmt, KvBackendChoice::kUcx);  // no secret: refused before connecting
    const Status st2 = none.pull(h, std::vector<int32_t>{0}, *local);
    _exit(st2.code() == StatusCode::kFailedPrecondition ? 0 : 13);
  }
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    EXPECT_TRUE((*sender)->accept_pending().ok());
    usleep(1000);
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ((*sender)->links(), 0);
}

// The decode group's asynchronous receive: pulls posted to the puller's thread complete, each
// once, with the prefill side's bytes in the posted blocks.
TEST(DistFlow, ThePullerCompletesEveryPostedPull) {
  const KvStorageShape shape = test_shape();
  const std::string fmt = "test format P";
  auto sender = KvSender::create(unique_name("puller"), shape, fmt);
  ASSERT_TRUE(sender.ok()) << sender.status().to_string();
  fill_blocks(**sender, shape);
  constexpr int kPulls = 40;
  std::vector<uint64_t> ids;
  for (int t = 0; t < kPulls; ++t) ids.push_back((*sender)->open_transfer());
  const std::string link = (*sender)->link_name();
  const pid_t child = fork();
  if (child == 0) {
    auto local = KvStorage::create(shape, -1);
    if (!local.ok()) _exit(10);
    std::vector<int> seen(kPulls, 0);
    {
      KvPuller puller(KvReceiver(fmt), *local);
      // One pull in flight per destination block at a time: block t % 8, posted in rounds.
      for (int round = 0; round < kPulls / 8; ++round) {
        for (int t = round * 8; t < round * 8 + 8; ++t) {
          KvHandoff h;
          h.link = link;
          h.transfer = ids[static_cast<size_t>(t)];
          h.kv_format = fmt;
          h.blocks = {static_cast<int32_t>((t * 5) % 8)};
          puller.post(t, h, {static_cast<int32_t>(t % 8)});
        }
        std::vector<KvPuller::Done> done;
        const int64_t deadline = now_ns() + 20'000'000'000;
        while (done.size() < 8 && now_ns() < deadline) {
          puller.poll(done);
          usleep(100);
        }
        if (done.size() != 8) _exit(11);
        for (const KvPuller::Done& d : done) {
          if (!d.status.ok()) _exit(12);
          seen[static_cast<size_t>(d.seq)] += 1;
          const std::byte* got = local->block_ptr(static_cast<int32_t>(d.seq % 8));
          for (int64_t i = 0; i < local->block_bytes(); ++i)
            if (got[i] != std::byte{pattern(static_cast<int32_t>((d.seq * 5) % 8), i)}) _exit(13);
        }
      }
      if (puller.pulled_bytes() != kPulls * local->block_bytes()) _exit(14);
    }
    for (int n : seen)
      if (n != 1) _exit(15);
    _exit(0);
  }
  const std::vector<uint64_t> done = serve_until(**sender, kPulls);
  EXPECT_EQ(done, ids);
  EXPECT_EQ(wait_child(child), 0);
}

// Probing thresholds for the tests: slow after 20 ms, so that the held pulls probe at once;
// a generous probe timeout where the prefill side answers, a short one where it must not.
KvProbeOptions probe_options(int64_t probe_timeout_ms) {
  KvProbeOptions o;
  o.slack_ns = 20'000'000;
  o.probe_timeout_ns = probe_timeout_ms * 1'000'000;
  return o;
}

// Serves the links (answering probes when `answer`) until `fd` is readable (or 20 s passed);
// returns the probes answered.
int serve_until_readable(KvSender& sender, int fd, bool answer) {
  int answered = 0;
  std::vector<uint64_t> done;
  const int64_t deadline = now_ns() + 20'000'000'000;
  while (now_ns() < deadline) {
    EXPECT_TRUE(sender.accept_pending().ok());
    if (answer) answered += sender.answer_probes();
    sender.poll_completions(done);
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) > 0) break;
    usleep(100);
  }
  EXPECT_TRUE(done.empty());
  return answered;
}

// The prefill side holds its links until the decode side has probed three times, answering
// every probe (a decode side sends probe n + 1 only after it saw probe n answered, so it has
// counted at least two): the pull waits, saturated, then completes with the bytes.
void held_link_is_saturated(KvBackendChoice backend) {
  const KvStorageShape shape = test_shape();
  const std::string fmt = "test format H";
  setenv("UCX_TLS", "tcp", 1);
  auto sender =
      KvSender::create(unique_name("held"), shape, fmt,
                       backend == KvBackendChoice::kUcx ? "127.0.0.1" : "", test_secret());
  ASSERT_TRUE(sender.ok()) << sender.status().to_string();
  fill_blocks(**sender, shape);
  (*sender)->hold_links(true);
  const uint64_t id = (*sender)->open_transfer();
  const std::string link = (*sender)->link_name(), ucx_address = (*sender)->ucx_address();
  const pid_t child = fixtures::fork_child([&] {
    KvReceiver receiver(fmt, backend, "127.0.0.1", probe_options(/*probe_timeout_ms=*/10'000),
                        test_secret());
    auto local = KvStorage::create(shape, -1);
    if (!local.ok()) return 10;
    KvHandoff h;
    h.link = link;
    h.ucx_address = ucx_address;
    h.transfer = id;
    h.kv_format = fmt;
    h.blocks = {3, 6};
    const std::vector<int32_t> dst = {0, 1};
    const Status st = receiver.pull(h, dst, *local);
    if (!st.ok()) {
      std::fprintf(stderr, "pull: %s\n", st.to_string().c_str());
      return 11;
    }
    for (size_t k = 0; k < dst.size(); ++k)
      for (int64_t i = 0; i < local->block_bytes(); ++i)
        if (local->block_ptr(dst[k])[i] != std::byte{pattern(h.blocks[k], i)}) return 12;
    if (receiver.probes_saturated() < 2) return 13;
    return receiver.links() == 1 ? 0 : 14;
  });
  int answered = 0;
  std::vector<uint64_t> done;
  const int64_t deadline = now_ns() + 20'000'000'000;
  while (done.empty() && now_ns() < deadline) {
    ASSERT_TRUE((*sender)->accept_pending().ok());
    answered += (*sender)->answer_probes();
    if (answered >= 3) (*sender)->hold_links(false);
    (*sender)->poll_completions(done);
    usleep(100);
  }
  EXPECT_GE(answered, 3);
  EXPECT_EQ(done, std::vector<uint64_t>{id});
  EXPECT_EQ(fixtures::wait_child(child), 0);
  EXPECT_EQ((*sender)->links(), 1);
}

TEST(DistFlow, AHeldLinkThatAnswersProbesIsSaturatedAndThePullCompletes) {
  held_link_is_saturated(KvBackendChoice::kShm);
}

TEST(DistFlow, AHeldLinkThatAnswersProbesIsSaturatedOverUcx) {
  held_link_is_saturated(KvBackendChoice::kUcx);
}

// The prefill side holds its links and answers no probe: the pull fails Unavailable naming
// the link and the probe, the decode side forgets the link and the prefill side drops it;
// released, the next pull links anew and completes.
void silent_link_is_failed_and_made_again(KvBackendChoice backend) {
  const KvStorageShape shape = test_shape();
  const std::string fmt = "test format F";
  setenv("UCX_TLS", "tcp", 1);
  auto sender =
      KvSender::create(unique_name("failed"), shape, fmt,
                       backend == KvBackendChoice::kUcx ? "127.0.0.1" : "", test_secret());
  ASSERT_TRUE(sender.ok()) << sender.status().to_string();
  fill_blocks(**sender, shape);
  (*sender)->hold_links(true);
  const uint64_t first = (*sender)->open_transfer(), second = (*sender)->open_transfer();
  const std::string link = (*sender)->link_name(), ucx_address = (*sender)->ucx_address();
  int failed[2], go[2];
  ASSERT_EQ(pipe(failed), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fixtures::fork_child([&] {
    KvReceiver receiver(fmt, backend, "127.0.0.1", probe_options(/*probe_timeout_ms=*/300),
                        test_secret());
    auto local = KvStorage::create(shape, -1);
    if (!local.ok()) return 10;
    KvHandoff h;
    h.link = link;
    h.ucx_address = ucx_address;
    h.transfer = first;
    h.kv_format = fmt;
    h.blocks = {2};
    const std::vector<int32_t> dst = {7};
    const Status st = receiver.pull(h, dst, *local);
    const std::string report = st.to_string();
    if (write(failed[1], report.data(), report.size()) != static_cast<ssize_t>(report.size()))
      return 11;
    if (pull_state(st) != PullState::kLinkFailed || receiver.links() != 0) return 12;
    char c;
    if (read(go[0], &c, 1) != 1) return 13;
    h.transfer = second;
    h.blocks = {5};
    if (!receiver.pull(h, dst, *local).ok()) return 14;
    for (int64_t i = 0; i < local->block_bytes(); ++i)
      if (local->block_ptr(7)[i] != std::byte{pattern(5, i)}) return 15;
    return receiver.links() == 1 ? 0 : 16;
  });
  EXPECT_EQ(serve_until_readable(**sender, failed[0], /*answer=*/false), 0);
  char buf[512];
  const ssize_t n = read(failed[0], buf, sizeof(buf));
  const std::string report(buf, static_cast<size_t>(std::max<ssize_t>(n, 0)));
  EXPECT_NE(report.find("Unavailable"), std::string::npos) << report;
  EXPECT_NE(report.find(link), std::string::npos) << report;
  EXPECT_NE(report.find("probe 1 unanswered"), std::string::npos) << report;
  // The decode side poisoned (shared memory) or closed (UCX) the link: dropped here.
  std::vector<uint64_t> done;
  int dropped = 0;
  const int64_t deadline = now_ns() + 20'000'000'000;
  while (dropped == 0 && now_ns() < deadline) {
    dropped = (*sender)->drop_failed_links(done);
    usleep(1000);
  }
  EXPECT_EQ(dropped, 1);
  EXPECT_EQ((*sender)->links(), 0);
  EXPECT_TRUE(done.empty());
  (*sender)->hold_links(false);
  ASSERT_EQ(write(go[1], "g", 1), 1);
  EXPECT_EQ(serve_until(**sender, 1), std::vector<uint64_t>{second});
  EXPECT_EQ(fixtures::wait_child(child), 0);
  EXPECT_EQ((*sender)->links(), 1);  // made anew
  for (int fd : {failed[0], failed[1], go[0], go[1]}) close(fd);
}

TEST(DistFlow, ALinkThatStopsAnsweringIsFailedDroppedAndMadeAgain) {
  silent_link_is_failed_and_made_again(KvBackendChoice::kShm);
}

TEST(DistFlow, ALinkThatStopsAnsweringIsFailedOverUcx) {
  silent_link_is_failed_and_made_again(KvBackendChoice::kUcx);
}

TEST(DistFlow, AFreedTransferIsRefusedAndAFormatMismatchNamesBothFormats) {
  const KvStorageShape shape = test_shape();
  auto sender = KvSender::create(unique_name("refuse"), shape, "format A");
  ASSERT_TRUE(sender.ok()) << sender.status().to_string();
  const uint64_t freed = (*sender)->open_transfer();
  (*sender)->close_transfer(freed);
  const std::string link = (*sender)->link_name();
  int pipe_fd[2];
  ASSERT_EQ(pipe(pipe_fd), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fd[0]);
    auto local = KvStorage::create(shape, -1);
    if (!local.ok()) _exit(10);
    KvHandoff h;
    h.link = link;
    h.transfer = freed;
    h.kv_format = "format A";
    h.blocks = {0};
    const std::vector<int32_t> dst = {1};
    KvReceiver receiver("format A");
    const Status st = receiver.pull(h, dst, *local);
    std::string report = st.to_string() + "\n";
    // A decode group keeping another format: refused when it links, naming both.
    KvReceiver other("format B");
    h.kv_format = "format B";
    report += other.pull(h, dst, *local).to_string();
    (void)!write(pipe_fd[1], report.data(), report.size());
    _exit(0);
  }
  close(pipe_fd[1]);
  std::string report;
  const int64_t deadline = now_ns() + 20'000'000'000;
  char buf[512];
  while (now_ns() < deadline) {
    ASSERT_TRUE((*sender)->accept_pending().ok());
    pollfd p{pipe_fd[0], POLLIN, 0};
    if (poll(&p, 1, 1) > 0) {
      const ssize_t n = read(pipe_fd[0], buf, sizeof(buf));
      if (n <= 0) break;
      report.append(buf, static_cast<size_t>(n));
    }
  }
  close(pipe_fd[0]);
  EXPECT_EQ(wait_child(child), 0);
  EXPECT_NE(report.find("already freed"), std::string::npos) << report;
  EXPECT_NE(report.find("'format A'"), std::string::npos) << report;
  EXPECT_NE(report.find("'format B'"), std::string::npos) << report;
}

}  // namespace
}  // namespace xds::engine
