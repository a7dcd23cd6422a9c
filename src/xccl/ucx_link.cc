#include "xccl/ucx_link.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "xccl/ucx_handshake.h"
#include "xccl/ucx_worker.h"

namespace xds::xccl {
namespace {

Status errno_status(const std::string& where, const char* what) {
  return internal_error("xccl ucx link {}: {} failed: {}", where, what, std::strerror(errno));
}

std::string address_string(const std::string& host, uint16_t port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

// The first address of host:port (numeric or a name).
Status resolve(const std::string& host, uint16_t port, sockaddr_storage& out, socklen_t& len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return invalid_argument("xccl ucx link: cannot resolve '{}': {}", host, gai_strerror(rc));
  }
  std::memcpy(&out, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  freeaddrinfo(res);
  return {};
}

Status check_config(const ArenaConfig& ours, const ArenaConfig& theirs, const std::string& where) {
  auto differ = [&](const char* field, uint64_t a, uint64_t b) {
    return invalid_argument("xccl ucx link {}: the peer's arena {} is {}, this side's {}", where,
                            field, b, a);
  };
  if (ours.lanes != theirs.lanes) return differ("lanes", ours.lanes, theirs.lanes);
  if (ours.ring_slots != theirs.ring_slots)
    return differ("ring_slots", ours.ring_slots, theirs.ring_slots);
  if (ours.slot_bytes != theirs.slot_bytes)
    return differ("slot_bytes", ours.slot_bytes, theirs.slot_bytes);
  if (ours.signals_per_peer != theirs.signals_per_peer) {
    return differ("signals_per_peer", ours.signals_per_peer, theirs.signals_per_peer);
  }
  if (ours.staging_bytes != theirs.staging_bytes) {
    return differ("staging_bytes", ours.staging_bytes, theirs.staging_bytes);
  }
  if (ours.app_bytes != theirs.app_bytes)
    return differ("app_bytes", ours.app_bytes, theirs.app_bytes);
  return {};
}

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

class UcxTransport;

class UcxLinkImpl final : public UcxLink {
 public:
  UcxLinkImpl(int rank, uint32_t epoch, const ArenaLayout& lay, std::string peer)
      : rank_(rank), epoch_(epoch), layout_(lay), peer_(std::move(peer)) {}
  ~UcxLinkImpl() override;

  int rank() const override { return rank_; }
  uint32_t epoch() const override { return epoch_; }
  const ArenaLayout& layout() const override { return layout_; }
  std::byte* local() const override { return arena_.get(); }
  uint64_t peer_region_bytes() const override { return worker_->peer(UcxMemory::kRegion).bytes; }
  const std::string& peer_address() const override { return peer_; }
  Transport& transport() override;
  bool peer_alive() override;
  void progress() override { worker_->progress(); }

  // Arena, worker, registrations (before the hello).
  Status prepare(const UcxLinkOptions& o);
  // The peer's hello checked, the endpoint made; the link takes `sock`.
  Status connect(const UcxHello& t, const UcxPacked& theirs, int sock);

  int sock_ = -1;
  int rank_;
  uint32_t epoch_;
  ArenaLayout layout_;
  std::string peer_;
  std::span<std::byte> exported_;
  std::unique_ptr<std::byte, FreeDeleter> arena_;
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<UcxTransport> transport_;
  std::atomic<bool> dead_{false};
  int flush_timeout_ms_ = 0;
  bool progress_thread_ = true;
};

// MemDesc -> (which memory, remote address) for the peer; local descriptors are copied here.
class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(UcxLinkImpl& l) : l_(l) {}
  std::string_view name() const override { return "ucx"; }
  TransportCaps caps() const override {
    return {.load_store = false, .async_completion = true, .non_temporal = false};
  }

  Result<MemDesc> register_memory(const void* ptr, uint64_t bytes) override {
    auto* p = static_cast<const std::byte*>(ptr);
    const std::byte* a = l_.local();
    if (p >= a && p + bytes <= a + l_.layout().total) {
      return MemDesc{l_.rank(), static_cast<uint64_t>(p - a), bytes, kArenaRegion};
    }
    const std::span<std::byte> r = l_.exported_;
    if (!r.empty() && p >= r.data() && p + bytes <= r.data() + r.size()) {
      return MemDesc{l_.rank(), static_cast<uint64_t>(p - r.data()), bytes, kExportRegion};
    }
    return invalid_argument(
        "register_memory: [{}, +{}) is outside rank {}'s arena and exported region", ptr, bytes,
        l_.rank());
  }

  OpState put(const MemDesc& dst, uint64_t off, const void* src, uint64_t n) override {
    if (dst.rank == l_.rank()) {
      std::byte* p = local_address(dst, off, n, "put");
      if (p == nullptr) return OpState::kFailed;
      copy_bytes(p, src, n);
      return OpState::kDone;
    }
    uint64_t addr = 0;
    if (!remote_address(dst, off, n, "put", addr) || !usable()) return OpState::kFailed;
    return l_.worker_->put(memory_of(dst), addr, src, n) ? OpState::kInProgress : OpState::kFailed;
  }

  OpState get(void* dst, const MemDesc& src, uint64_t off, uint64_t n) override {
    if (src.rank == l_.rank()) {
      std::byte* p = local_address(src, off, n, "get");
      if (p == nullptr) return OpState::kFailed;
      copy_bytes(dst, p, n);
      return OpState::kDone;
    }
    uint64_t addr = 0;
    if (!remote_address(src, off, n, "get", addr) || !usable()) return OpState::kFailed;
    return l_.worker_->get(dst, memory_of(src), addr, n) ? OpState::kInProgress : OpState::kFailed;
  }

  OpState put_with_signal(const MemDesc& dst, uint64_t off, const void* src, uint64_t n,
                          const SignalRef& sig, uint64_t value) override {
    if (sig.rank != 1 - l_.rank() || sig.offset % 8 != 0 || sig.offset + 8 > l_.layout().total) {
      XDS_LOG_ERROR(
          "xccl ucx link {}: put_with_signal to signal (rank {}, offset {}): not an "
          "aligned word of the peer's arena",
          l_.peer_, sig.rank, sig.offset);
      return OpState::kFailed;
    }
    if (n != 0 && put(dst, off, src, n) == OpState::kFailed) return OpState::kFailed;
    if (!l_.worker_->fence()) return OpState::kFailed;
    const uint64_t addr = l_.worker_->peer(UcxMemory::kArena).base + sig.offset;
    return l_.worker_->put_word(UcxMemory::kArena, addr, value) ? OpState::kInProgress
                                                                : OpState::kFailed;
  }

  OpState test_signal(const SignalRef& sig, uint64_t value) override {
    if (sig.rank != l_.rank() || sig.offset % 8 != 0 || sig.offset + 8 > l_.layout().total) {
      XDS_LOG_ERROR(
          "xccl ucx link {}: test_signal of (rank {}, offset {}): not an aligned "
          "word of this side's arena",
          l_.peer_, sig.rank, sig.offset);
      return OpState::kFailed;
    }
    if (!l_.worker_->has_progress_thread()) l_.worker_->progress();
    const auto* w = reinterpret_cast<const std::atomic<uint64_t>*>(l_.local() + sig.offset);
    return w->load(std::memory_order_acquire) >= value ? OpState::kDone : OpState::kInProgress;
  }

  OpState flush() override {
    const int64_t deadline = now_ns() + int64_t{l_.flush_timeout_ms_} * 1'000'000;
    const Status st = l_.worker_->flush(deadline, [this] { return l_.peer_alive(); });
    if (st.ok()) return OpState::kDone;
    XDS_LOG_WARN("xccl ucx link {}: flush: {}", l_.peer_, st.to_string());
    return OpState::kFailed;
  }

 private:
  static UcxMemory memory_of(const MemDesc& d) {
    return d.region == kArenaRegion ? UcxMemory::kArena : UcxMemory::kRegion;
  }
  bool usable() {
    return !l_.dead_.load(std::memory_order_acquire) && !l_.worker_->endpoint_failed();
  }
  // Checks d (+off, n) against a memory of `bytes`; logs what is wrong.
  bool in_bounds(const MemDesc& d, uint64_t off, uint64_t n, uint64_t bytes, const char* op) {
    const bool ok = (d.region == kArenaRegion || d.region == kExportRegion) && bytes != 0 &&
                    off + n <= d.bytes && d.offset + d.bytes <= bytes;
    if (!ok) {
      XDS_LOG_ERROR(
          "xccl ucx link {}: {} of [{} + {}, +{}) outside rank {}'s {} ({} bytes, "
          "descriptor {} bytes)",
          l_.peer_, op, d.offset, off, n, d.rank,
          d.region == kArenaRegion ? "arena" : "exported region", bytes, d.bytes);
    }
    return ok;
  }
  std::byte* local_address(const MemDesc& d, uint64_t off, uint64_t n, const char* op) {
    std::byte* base = d.region == kArenaRegion ? l_.local() : l_.exported_.data();
    const uint64_t bytes = d.region == kArenaRegion ? l_.layout().total : l_.exported_.size();
    return in_bounds(d, off, n, bytes, op) ? base + d.offset + off : nullptr;
  }
  bool remote_address(const MemDesc& d, uint64_t off, uint64_t n, const char* op, uint64_t& addr) {
    if (d.rank != 1 - l_.rank()) {
      XDS_LOG_ERROR("xccl ucx link {}: {} names rank {}; a link has ranks 0 and 1", l_.peer_, op,
                    d.rank);
      return false;
    }
    const UcxRemoteMemory& m = l_.worker_->peer(memory_of(d));
    if (!in_bounds(d, off, n, m.bytes, op)) return false;
    addr = m.base + d.offset + off;
    return true;
  }
  UcxLinkImpl& l_;
};

Transport& UcxLinkImpl::transport() {
  return *transport_;
}

bool UcxLinkImpl::peer_alive() {
  if (dead_.load(std::memory_order_acquire)) return false;
  bool dead = worker_->endpoint_failed();
  pollfd p{sock_, POLLIN | POLLRDHUP, 0};
  if (!dead && poll(&p, 1, 0) > 0) {
    char c;
    dead = (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0 ||
           recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  if (dead) dead_.store(true, std::memory_order_release);
  return !dead;
}

UcxLinkImpl::~UcxLinkImpl() {
  transport_.reset();
  worker_.reset();
  if (sock_ >= 0) close(sock_);
}

Status UcxLinkImpl::prepare(const UcxLinkOptions& o) {
  flush_timeout_ms_ = o.flush_timeout_ms;
  progress_thread_ = o.progress_thread;
  exported_ = o.exported;
  arena_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, layout_.total)));
  if (arena_ == nullptr) {
    return resource_exhausted("xccl ucx link: cannot allocate the {}-byte arena", layout_.total);
  }
  std::memset(arena_.get(), 0, layout_.total);
  init_arena(arena_.get(), layout_, rank_, epoch_);
  XDS_ASSIGN_OR_RETURN(
      worker_, UcxWorker::create(o.tls, o.ucx_config, {arena_.get(), layout_.total}, o.exported));
  return {};
}

Status UcxLinkImpl::connect(const UcxHello& t, const UcxPacked& theirs, int sock) {
  if (t.version != kUcxLinkVersion) {
    return failed_precondition(
        "xccl ucx link {}: the peer speaks ucx link version {}, this side {}", peer_, t.version,
        kUcxLinkVersion);
  }
  if (t.rank != 1 - rank_) {
    return failed_precondition("xccl ucx link {}: the peer says it is rank {}, expected {}", peer_,
                               t.rank, 1 - rank_);
  }
  if (t.epoch != epoch_) {
    return invalid_argument("xccl ucx link {}: the peer's epoch is {}, this side's {}", peer_,
                            t.epoch, epoch_);
  }
  XDS_RETURN_IF_ERROR(check_config(layout_.cfg, t.config, peer_));
  if (t.arena_bytes != layout_.total) {
    return failed_precondition("xccl ucx link {}: the peer's arena is {} bytes, this side's {}",
                               peer_, t.arena_bytes, layout_.total);
  }
  XDS_RETURN_IF_ERROR(worker_->connect(theirs, peer_));
  sock_ = sock;
  transport_ = std::make_unique<UcxTransport>(*this);
  if (progress_thread_) worker_->start_progress_thread();
  return {};
}

// A UcxLinkImpl between prepare() and connect(), and the hello it sends.
class UcxLinkDraftImpl final : public UcxLinkDraft {
 public:
  explicit UcxLinkDraftImpl(std::unique_ptr<UcxLinkImpl> link) : link_(std::move(link)) {
    const UcxLinkImpl& l = *link_;
    const UcxPacked& mine = l.worker_->packed();
    hello_ = {kHelloMagic,
              kUcxLinkVersion,
              l.rank_,
              l.epoch_,
              0,
              l.layout_.cfg,
              mine.arena.base,
              mine.arena.bytes,
              mine.region.base,
              mine.region.bytes,
              static_cast<uint32_t>(mine.worker_address.size()),
              static_cast<uint32_t>(mine.arena.rkey.size()),
              static_cast<uint32_t>(mine.region.rkey.size()),
              0};
  }
  const UcxHello& hello() const override { return hello_; }
  const UcxPacked& packed() const override { return link_->worker_->packed(); }
  Result<std::unique_ptr<UcxLink>> finish(const UcxHello& theirs, const UcxPacked& blobs,
                                          int sock) override {
    XDS_RETURN_IF_ERROR(link_->connect(theirs, blobs, sock));
    return std::unique_ptr<UcxLink>(std::move(link_));
  }

 private:
  std::unique_ptr<UcxLinkImpl> link_;
  UcxHello hello_{};
};

// The connecting side's handshake: advanced as the listener's bytes arrive, until done.
Result<std::unique_ptr<UcxLink>> handshake_as_rank1(int sock, const UcxLinkOptions& o,
                                                    int64_t deadline, const std::string& where) {
  UcxHandshake h(sock, /*rank=*/1, where, deadline);
  XDS_RETURN_IF_ERROR(h.start(o));
  while (true) {
    const OpState s = h.advance(o);
    if (s == OpState::kDone) return h.take_link();
    if (s == OpState::kFailed) return h.status();
    XDS_RETURN_IF_ERROR(ucx_wait_fd(h.sock(), POLLIN, deadline, where, h.waiting_for()));
  }
}

std::string peer_name(const sockaddr_storage& peer, socklen_t len) {
  char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&peer), len, host, sizeof(host), serv, sizeof(serv),
              NI_NUMERICHOST | NI_NUMERICSERV);
  return address_string(host, static_cast<uint16_t>(std::atoi(serv)));
}

}  // namespace

Result<std::unique_ptr<UcxLinkDraft>> ucx_link_draft(int rank, const UcxLinkOptions& o,
                                                     const std::string& peer) {
  ArenaConfig cfg = o.config;
  cfg.world_size = 2;
  XDS_RETURN_IF_ERROR(validate(cfg));
  auto link = std::make_unique<UcxLinkImpl>(rank, o.epoch, arena_layout(cfg), peer);
  XDS_RETURN_IF_ERROR(link->prepare(o));
  return std::unique_ptr<UcxLinkDraft>(std::make_unique<UcxLinkDraftImpl>(std::move(link)));
}

Result<UcxListener> UcxListener::listen(const std::string& host, uint16_t port) {
  const std::string where = address_string(host, port);
  sockaddr_storage sa{};
  socklen_t len = 0;
  XDS_RETURN_IF_ERROR(resolve(host, port, sa, len));
  const int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno_status(where, "socket");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&sa), len) != 0) {
    const int e = errno;
    close(fd);
    if (e == EADDRINUSE) {
      return failed_precondition("xccl ucx link: another process listens on {}", where);
    }
    return internal_error("xccl ucx link: cannot bind {}: {}", where, std::strerror(e));
  }
  if (::listen(fd, 16) != 0) {
    const Status st = errno_status(where, "listen");
    close(fd);
    return st;
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const uint16_t p =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  XDS_ASSIGN_OR_RETURN(PeerAcceptor acceptor,
                       PeerAcceptor::create(fd, "xccl ucx link " + address_string(host, p)));
  return UcxListener(std::move(acceptor), p, address_string(host, p));
}

UcxListener::UcxListener(PeerAcceptor acceptor, uint16_t port, std::string address)
    : acceptor_(std::move(acceptor)), port_(port), address_(std::move(address)) {}
UcxListener::UcxListener(UcxListener&& o) noexcept = default;
UcxListener& UcxListener::operator=(UcxListener&& o) noexcept = default;
UcxListener::~UcxListener() = default;

size_t UcxListener::pending() const {
  return pending_.size();
}

// Accepts every peer connecting now and sends it the challenge; it waits in the pending list
// for its answer. An accept failure ends the round (out of descriptors: the acceptor pauses,
// and this is its one error of the pause).
void UcxListener::accept_connecting(const UcxLinkOptions& options, Accepted& out) {
  while (true) {
    Result<int> next = acceptor_.accept_next();
    if (!next.ok()) {
      out.refused.push_back(next.status());
      return;
    }
    if (*next < 0) return;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    getpeername(*next, reinterpret_cast<sockaddr*>(&peer), &len);
    auto h = std::make_unique<UcxHandshake>(*next, /*rank=*/0, peer_name(peer, len),
                                            now_ns() + int64_t{options.timeout_ms} * 1'000'000);
    Status st;
    if (pending_.size() >= kMaxPending) {
      st = resource_exhausted("xccl ucx link {}: {} peers already wait in the handshake; refused",
                              h->peer(), pending_.size());
    }
    if (st.ok()) st = h->start(options);
    if (st.ok()) st = acceptor_.watch(h->sock());
    if (!st.ok()) {
      out.refused.push_back(st);
      continue;  // ~UcxHandshake closes the socket
    }
    pending_.push_back(std::move(h));
  }
}

UcxListener::Accepted UcxListener::accept_ready(const UcxLinkOptions& options) {
  Accepted out;
  out.formed = std::move(stash_);
  stash_.clear();
  if (!options.secret) {
    out.refused.push_back(invalid_argument(
        "xccl ucx link {}: no cluster secret (UcxLinkOptions::secret): nobody is accepted",
        address_));
    return out;
  }
  accept_connecting(options, out);
  int64_t earliest = 0;
  for (size_t i = 0; i < pending_.size();) {
    UcxHandshake& h = *pending_[i];
    const OpState s = h.advance(options);
    if (s == OpState::kInProgress && now_ns() < h.deadline_ns()) {
      earliest = earliest == 0 ? h.deadline_ns() : std::min(earliest, h.deadline_ns());
      ++i;
      continue;
    }
    acceptor_.unwatch(h.sock());
    if (s == OpState::kDone) {
      out.formed.push_back(h.take_link());
    } else if (s == OpState::kFailed) {
      out.refused.push_back(h.status());
    } else {
      out.refused.push_back(deadline_exceeded("xccl ucx link {}: no {} within {} ms; dropped",
                                              h.peer(), h.waiting_for(), options.timeout_ms));
    }
    pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
  }
  acceptor_.arm_timer(earliest);
  return out;
}

Result<std::unique_ptr<UcxLink>> UcxListener::accept(const UcxLinkOptions& options) {
  const int64_t deadline = now_ns() + int64_t{options.timeout_ms} * 1'000'000;
  while (true) {
    Accepted a = accept_ready(options);
    if (!a.formed.empty()) {
      std::unique_ptr<UcxLink> first = std::move(a.formed.front());
      for (size_t i = 1; i < a.formed.size(); ++i) stash_.push_back(std::move(a.formed[i]));
      return first;
    }
    if (!a.refused.empty()) return a.refused.front();
    XDS_RETURN_IF_ERROR(ucx_wait_fd(acceptor_.fd(), POLLIN, deadline, address_, "peer connecting"));
  }
}

Result<std::unique_ptr<UcxLink>> ucx_connect(const std::string& host, uint16_t port,
                                             const UcxLinkOptions& options) {
  const int64_t deadline = now_ns() + int64_t{options.timeout_ms} * 1'000'000;
  const std::string where = address_string(host, port);
  if (!options.secret) {
    return invalid_argument(
        "xccl ucx link {}: no cluster secret (UcxLinkOptions::secret): a UCX link proves it to "
        "its peer before any memory key is handed out",
        where);
  }
  sockaddr_storage sa{};
  socklen_t len = 0;
  XDS_RETURN_IF_ERROR(resolve(host, port, sa, len));
  while (true) {
    const int sock = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock < 0) return errno_status(where, "socket");
    int e = 0;
    if (connect(sock, reinterpret_cast<const sockaddr*>(&sa), len) != 0) e = errno;
    if (e == EINPROGRESS) {  // an unreachable host answers nothing: wait, with the deadline
      const Status st = ucx_wait_fd(sock, POLLOUT, deadline, where, "answer to connect");
      if (!st.ok()) {
        close(sock);
        return unavailable("xccl ucx link: nobody answers at {} ({})", where, st.message());
      }
      socklen_t el = sizeof(e);
      getsockopt(sock, SOL_SOCKET, SO_ERROR, &e, &el);
    }
    if (e == 0) return handshake_as_rank1(sock, options, deadline, where);
    close(sock);
    if (e != ECONNREFUSED || now_ns() >= deadline) {
      return unavailable("xccl ucx link: nobody listens on {} ({})", where, std::strerror(e));
    }
    usleep(20'000);  // the listener may not be up yet
  }
}

}  // namespace xds::xccl
