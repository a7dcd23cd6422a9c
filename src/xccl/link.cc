#include "xccl/link.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/peer_cred.h"
#include "xccl/process_fabric.h"

namespace xds::xccl {
namespace {

constexpr uint64_t kHelloMagic = 0x4b4e494c53445858ull;  // "XXDSLINK"
constexpr uint32_t kHelloVersion = 2;

struct Hello {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  uint32_t epoch;
  uint32_t pad;
  ArenaConfig config;
  uint64_t region_bytes;  // the exported region's size, 0 for none (then one fd travels, not two)
};

Status errno_status(const char* what) {
  return internal_error("xccl link: {} failed: {}", what, std::strerror(errno));
}

// The abstract address of `name` and its length.
sockaddr_un address_of(const std::string& name, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string path = "xdeepserve-link-" + name;
  const size_t n = std::min(path.size(), sizeof(a.sun_path) - 1);
  std::memcpy(a.sun_path + 1, path.data(), n);  // sun_path[0] = 0: the abstract namespace
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

// Waits until `fd` is readable; DeadlineExceeded naming `what` after the deadline.
Status wait_readable(int fd, int64_t deadline_ns, const char* what) {
  while (true) {
    const int64_t left_ms = (deadline_ns - now_ns()) / 1'000'000;
    if (left_ms <= 0) return deadline_exceeded("xccl link: no {} in time", what);
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (r > 0) return {};
    if (r < 0 && errno != EINTR) return errno_status("poll");
  }
}

Status check_config(const ArenaConfig& ours, const ArenaConfig& theirs) {
  auto differ = [](const char* field, uint64_t a, uint64_t b) {
    return invalid_argument("xccl link: the peer's arena {} is {}, this side's {}", field, b, a);
  };
  if (ours.world_size != theirs.world_size) return differ("world_size", ours.world_size, theirs.world_size);
  if (ours.lanes != theirs.lanes) return differ("lanes", ours.lanes, theirs.lanes);
  if (ours.ring_slots != theirs.ring_slots) return differ("ring_slots", ours.ring_slots, theirs.ring_slots);
  if (ours.slot_bytes != theirs.slot_bytes) return differ("slot_bytes", ours.slot_bytes, theirs.slot_bytes);
  if (ours.signals_per_peer != theirs.signals_per_peer) {
    return differ("signals_per_peer", ours.signals_per_peer, theirs.signals_per_peer);
  }
  if (ours.staging_bytes != theirs.staging_bytes) {
    return differ("staging_bytes", ours.staging_bytes, theirs.staging_bytes);
  }
  if (ours.app_bytes != theirs.app_bytes) return differ("app_bytes", ours.app_bytes, theirs.app_bytes);
  return {};
}

// This side's arena: a memfd sized up front and initialised. Returns the fd and the mapping.
Status make_arena(const ArenaLayout& lay, int rank, uint32_t epoch, int& fd, std::byte*& base) {
  fd = create_owner_only_memfd(rank == 0 ? "xccl-link-r0" : "xccl-link-r1");
  if (fd < 0) return errno_status("memfd_create");
  if (fallocate(fd, 0, 0, static_cast<off_t>(lay.total)) != 0) {
    const Status st = resource_exhausted("xccl link: cannot reserve {} bytes for the arena: {}",
                                         lay.total, std::strerror(errno));
    close(fd);
    return st;
  }
  void* p = mmap(nullptr, lay.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const Status st = errno_status("mmap");
    close(fd);
    return st;
  }
  init_arena(p, lay, rank, epoch);
  base = static_cast<std::byte*>(p);
  return {};
}

// One hello and room for the fds that travel with it (SCM_RIGHTS): the arena's, then the
// exported region's when there is one.
struct HelloMessage {
  iovec iov;
  char ctrl[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  explicit HelloMessage(Hello* h) : iov{h, sizeof(Hello)} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
  }
  HelloMessage(const HelloMessage&) = delete;
  HelloMessage& operator=(const HelloMessage&) = delete;
};

Status send_hello(int sock, Hello h, int arena_fd, int region_fd) {
  HelloMessage m(&h);
  msghdr& msg = m.msg;
  const int fds[2] = {arena_fd, region_fd};
  const size_t nfds = region_fd >= 0 ? 2 : 1;
  msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  if (sendmsg(sock, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(h))) {
    return errno_status("sendmsg(hello)");
  }
  return {};
}

Status recv_hello(int sock, int64_t deadline_ns, Hello& h, int& arena_fd, int& region_fd) {
  XDS_RETURN_IF_ERROR(wait_readable(sock, deadline_ns, "hello from the peer"));
  HelloMessage m(&h);
  msghdr& msg = m.msg;
  ssize_t n;
  do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) return errno_status("recvmsg(hello)");
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  const bool rights = c != nullptr && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS;
  const size_t nfds = rights ? (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) : 0;
  int fds[2] = {-1, -1};
  if (nfds == 1 || nfds == 2) std::memcpy(fds, CMSG_DATA(c), nfds * sizeof(int));
  const size_t want = h.region_bytes != 0 ? 2 : 1;
  if (n != static_cast<ssize_t>(sizeof(h)) || nfds != want || h.magic != kHelloMagic) {
    for (int fd : fds)
      if (fd >= 0) close(fd);
    return failed_precondition("xccl link: the peer's hello is not an xccl link hello ({} bytes)",
                               n);
  }
  arena_fd = fds[0];
  region_fd = fds[1];
  return {};
}

// Both sides: arenas, hellos, checks, mappings, the peer's pidfd.
Result<std::unique_ptr<Fabric>> handshake(int sock, int rank, const ArenaConfig& config,
                                          uint32_t epoch, int64_t deadline_ns,
                                          const SharedRegion* exported) {
  // Who the peer is, from the kernel, before anything is sent (fds) or read (trusted).
  XDS_ASSIGN_OR_RETURN(const PeerCred cred, peer_cred(sock));
  if (cred.uid != geteuid()) {
    return failed_precondition(
        "xccl link: refused peer pid {} of uid {} (this side runs as uid {})", cred.pid, cred.uid,
        geteuid());
  }
  ArenaConfig cfg = config;
  cfg.world_size = 2;
  XDS_RETURN_IF_ERROR(validate(cfg));
  const ArenaLayout lay = arena_layout(cfg);
  int own_fd = -1;
  std::byte* own = nullptr;
  XDS_RETURN_IF_ERROR(make_arena(lay, rank, epoch, own_fd, own));
  std::vector<std::byte*> arenas(2, nullptr);
  arenas[static_cast<size_t>(rank)] = own;
  auto unmap_all = [&] {
    for (std::byte* a : arenas)
      if (a != nullptr) munmap(a, lay.total);
  };
  Hello mine{kHelloMagic, kHelloVersion, rank, epoch, 0, cfg,
             exported != nullptr ? exported->bytes() : 0};
  Status st = send_hello(sock, mine, own_fd, exported != nullptr ? exported->fd() : -1);
  close(own_fd);
  Hello theirs{};
  int peer_fd = -1, peer_region_fd = -1;
  if (st.ok()) st = recv_hello(sock, deadline_ns, theirs, peer_fd, peer_region_fd);
  if (st.ok() && theirs.version != kHelloVersion) {
    st = failed_precondition("xccl link: the peer speaks link version {}, this side {}",
                             theirs.version, kHelloVersion);
  }
  if (st.ok() && theirs.rank != 1 - rank) {
    st = failed_precondition("xccl link: the peer says it is rank {}, expected {}", theirs.rank,
                             1 - rank);
  }
  if (st.ok() && theirs.epoch != epoch) {
    st = invalid_argument("xccl link: the peer's epoch is {}, this side's {}", theirs.epoch, epoch);
  }
  if (st.ok()) st = check_config(cfg, theirs.config);
  if (st.ok()) {
    void* p = mmap(nullptr, lay.total, PROT_READ | PROT_WRITE, MAP_SHARED, peer_fd, 0);
    if (p == MAP_FAILED) {
      st = errno_status("mmap(peer arena)");
    } else {
      arenas[static_cast<size_t>(1 - rank)] = static_cast<std::byte*>(p);
      st = check_arena(p, lay, 1 - rank);
    }
  }
  if (peer_fd >= 0) close(peer_fd);
  Fabric::Region peer_region;
  if (st.ok() && peer_region_fd >= 0) {
    void* p = mmap(nullptr, theirs.region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                   peer_region_fd, 0);
    if (p == MAP_FAILED) {
      st = errno_status("mmap(peer region)");
    } else {
      peer_region = {static_cast<std::byte*>(p), theirs.region_bytes};
    }
  }
  if (peer_region_fd >= 0) close(peer_region_fd);
  int pidfd = -1;
  if (st.ok()) {
    pidfd = static_cast<int>(syscall(SYS_pidfd_open, cred.pid, 0));
    if (pidfd < 0) st = errno_status("pidfd_open(peer)");
  }
  if (!st.ok()) {
    unmap_all();
    if (peer_region.base != nullptr) munmap(peer_region.base, peer_region.bytes);
    return st;
  }
  std::vector<int> pidfds(2, -1);
  pidfds[static_cast<size_t>(1 - rank)] = pidfd;
  auto fabric =
      std::make_unique<ProcessFabric>(rank, epoch, lay, std::move(arenas), std::move(pidfds));
  if (exported != nullptr) fabric->attach_region(rank, {exported->data(), exported->bytes()}, false);
  if (peer_region.base != nullptr) fabric->attach_region(1 - rank, peer_region, true);
  return std::unique_ptr<Fabric>(std::move(fabric));
}

}  // namespace

Result<LinkListener> LinkListener::listen(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno_status("socket");
  socklen_t len = 0;
  const sockaddr_un a = address_of(name, len);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    const int e = errno;
    close(fd);
    if (e == EADDRINUSE) {
      return failed_precondition("xccl link: another process listens on @xdeepserve-link-{}", name);
    }
    errno = e;
    return errno_status("bind");
  }
  if (::listen(fd, 16) != 0) {
    const Status st = errno_status("listen");
    close(fd);
    return st;
  }
  XDS_ASSIGN_OR_RETURN(PeerAcceptor acceptor,
                       PeerAcceptor::create(fd, "xccl link @xdeepserve-link-" + name));
  return LinkListener(std::move(acceptor));
}

LinkListener::LinkListener(LinkListener&& o) noexcept
    : acceptor_(std::move(o.acceptor_)),
      pending_(std::move(o.pending_)),
      stash_(std::move(o.stash_)) {
  o.pending_.clear();
}

LinkListener& LinkListener::operator=(LinkListener&& o) noexcept {
  if (this != &o) {
    close_all();
    acceptor_ = std::move(o.acceptor_);
    pending_ = std::move(o.pending_);
    o.pending_.clear();
    stash_ = std::move(o.stash_);
  }
  return *this;
}

LinkListener::~LinkListener() {
  close_all();
}

void LinkListener::close_all() {
  for (const Pending& p : pending_) close(p.sock);
  pending_.clear();
}

void LinkListener::drop_pending(size_t i) {
  acceptor_.unwatch(pending_[i].sock);
  close(pending_[i].sock);
  pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
}

// The timer at the earliest pending deadline (or the end of an accept pause).
void LinkListener::arm_timer() {
  int64_t earliest = 0;
  for (const Pending& p : pending_)
    earliest = earliest == 0 ? p.deadline_ns : std::min(earliest, p.deadline_ns);
  acceptor_.arm_timer(earliest);
}

// Accepts every peer connecting now: another uid is refused and closed before anything is
// sent; the others wait in the pending list for their hello. An accept failure ends the round
// (out of descriptors: the acceptor pauses, and this is its one error of the pause).
void LinkListener::accept_connecting(int handshake_timeout_ms, Accepted& out) {
  while (true) {
    Result<int> next = acceptor_.accept_next();
    if (!next.ok()) {
      out.refused.push_back(next.status());
      return;
    }
    const int sock = *next;
    if (sock < 0) return;
    Status st = check_same_user(sock);
    if (st.ok() && pending_.size() >= kMaxPending) {
      st = resource_exhausted("{} peers already wait for their hello", pending_.size());
    }
    if (st.ok()) st = acceptor_.watch(sock);
    if (!st.ok()) {
      close(sock);
      out.refused.push_back(st.with_context("xccl link"));
      continue;
    }
    pending_.push_back({sock, now_ns() + int64_t{handshake_timeout_ms} * 1'000'000});
  }
}

LinkListener::Accepted LinkListener::accept_ready(const ArenaConfig& config, uint32_t epoch,
                                                  int handshake_timeout_ms,
                                                  const SharedRegion* exported) {
  Accepted out;
  out.formed = std::move(stash_);
  stash_.clear();
  accept_connecting(handshake_timeout_ms, out);
  const int64_t now = now_ns();
  for (size_t i = 0; i < pending_.size();) {
    pollfd p{pending_[i].sock, POLLIN, 0};
    const bool ready = poll(&p, 1, 0) > 0;  // a hello, or a hang-up (then the hello check fails)
    if (!ready && now < pending_[i].deadline_ns) {
      ++i;
      continue;
    }
    if (!ready) {
      auto cred = peer_cred(pending_[i].sock);
      out.refused.push_back(
          deadline_exceeded("xccl link: peer pid {} sent no hello within {} ms; dropped",
                            cred.ok() ? cred->pid : 0, handshake_timeout_ms));
      drop_pending(i);
      continue;
    }
    // The hello is there: the handshake reads it without waiting.
    const int sock = pending_[i].sock;
    const int64_t deadline = pending_[i].deadline_ns;
    acceptor_.unwatch(sock);
    pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
    auto fabric = handshake(sock, /*rank=*/0, config, epoch, std::max(deadline, now + 1), exported);
    close(sock);
    if (fabric.ok()) {
      out.formed.push_back(std::move(fabric).value());
    } else {
      out.refused.push_back(fabric.status());
    }
  }
  arm_timer();
  return out;
}

Result<std::unique_ptr<Fabric>> LinkListener::accept(const ArenaConfig& config, uint32_t epoch,
                                                     int timeout_ms, const SharedRegion* exported) {
  const int64_t deadline = now_ns() + int64_t{timeout_ms} * 1'000'000;
  while (true) {
    Accepted a = accept_ready(config, epoch, timeout_ms, exported);
    if (!a.formed.empty()) {
      std::unique_ptr<Fabric> first = std::move(a.formed.front());
      for (size_t i = 1; i < a.formed.size(); ++i) stash_.push_back(std::move(a.formed[i]));
      return first;
    }
    if (!a.refused.empty()) return a.refused.front();
    XDS_RETURN_IF_ERROR(wait_readable(acceptor_.fd(), deadline, "peer connecting"));
  }
}

Result<std::unique_ptr<Fabric>> link_connect(const std::string& name, const ArenaConfig& config,
                                             uint32_t epoch, int timeout_ms,
                                             const SharedRegion* exported) {
  const int64_t deadline = now_ns() + int64_t{timeout_ms} * 1'000'000;
  socklen_t len = 0;
  const sockaddr_un a = address_of(name, len);
  while (true) {
    const int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0) return errno_status("socket");
    if (connect(sock, reinterpret_cast<const sockaddr*>(&a), len) == 0) {
      auto fabric = handshake(sock, /*rank=*/1, config, epoch, deadline, exported);
      close(sock);
      return fabric;
    }
    const int e = errno;
    close(sock);
    if ((e != ECONNREFUSED && e != ENOENT && e != EAGAIN) || now_ns() >= deadline) {
      return unavailable("xccl link: nobody listens on @xdeepserve-link-{} ({})", name,
                         std::strerror(e));
    }
    usleep(10'000);  // the listener may not be up yet
  }
}

}  // namespace xds::xccl
