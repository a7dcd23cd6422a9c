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
#include "xccl/ucx_worker.h"

namespace xds::xccl {
namespace {

constexpr uint64_t kHelloMagic = 0x4b4e494c58435558ull;  // "XUCXLINK"
constexpr uint32_t kHelloVersion = 1;
constexpr uint32_t kMaxBlobBytes = 1 << 16;  // a worker address or a packed rkey

// Sent first by both sides; the three blobs follow in this order.
struct UcxHello {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  uint32_t epoch;
  uint32_t pad;
  ArenaConfig config;
  uint64_t arena_base, arena_bytes;
  uint64_t region_base, region_bytes;  // 0, 0: no exported region
  uint32_t worker_address_bytes, arena_rkey_bytes, region_rkey_bytes, pad2;
};

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

// Waits for `events` on fd; DeadlineExceeded naming `what` and `where` after the deadline.
Status wait_fd(int fd, short events, int64_t deadline_ns, const std::string& where,
               const char* what) {
  while (true) {
    const int64_t left_ms = (deadline_ns - now_ns()) / 1'000'000;
    if (left_ms <= 0) return deadline_exceeded("xccl ucx link {}: no {} in time", where, what);
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (r > 0) return {};
    if (r < 0 && errno != EINTR) return errno_status(where, "poll");
  }
}

Status send_all(int sock, const void* data, size_t n, int64_t deadline, const std::string& where) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    XDS_RETURN_IF_ERROR(wait_fd(sock, POLLOUT, deadline, where, "room to send the hello"));
    const ssize_t k = send(sock, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return errno_status(where, "send(hello)");
    p += k;
    n -= static_cast<size_t>(k);
  }
  return {};
}

Status recv_all(int sock, void* data, size_t n, int64_t deadline, const std::string& where) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    XDS_RETURN_IF_ERROR(wait_fd(sock, POLLIN, deadline, where, "hello from the peer"));
    const ssize_t k = recv(sock, p, n, MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return errno_status(where, "recv(hello)");
    if (k == 0) {
      return unavailable("xccl ucx link {}: the peer closed the connection during the hello",
                         where);
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
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
  UcxLinkImpl(int sock, int rank, uint32_t epoch, const ArenaLayout& lay, std::string peer)
      : sock_(sock), rank_(rank), epoch_(epoch), layout_(lay), peer_(std::move(peer)) {}
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

  Status init(const UcxLinkOptions& o, int64_t deadline);

  int sock_;
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

// Arena, UCX, hellos, checks, endpoint.
Status UcxLinkImpl::init(const UcxLinkOptions& o, int64_t deadline) {
  flush_timeout_ms_ = o.flush_timeout_ms;
  exported_ = o.exported;
  arena_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, layout_.total)));
  if (arena_ == nullptr) {
    return resource_exhausted("xccl ucx link: cannot allocate the {}-byte arena", layout_.total);
  }
  std::memset(arena_.get(), 0, layout_.total);
  init_arena(arena_.get(), layout_, rank_, epoch_);
  XDS_ASSIGN_OR_RETURN(
      worker_, UcxWorker::create(o.tls, o.ucx_config, {arena_.get(), layout_.total}, o.exported));
  const UcxPacked& mine = worker_->packed();
  UcxHello h{kHelloMagic,
             kHelloVersion,
             rank_,
             epoch_,
             0,
             layout_.cfg,
             mine.arena.base,
             mine.arena.bytes,
             mine.region.base,
             mine.region.bytes,
             static_cast<uint32_t>(mine.worker_address.size()),
             static_cast<uint32_t>(mine.arena.rkey.size()),
             static_cast<uint32_t>(mine.region.rkey.size()),
             0};
  XDS_RETURN_IF_ERROR(send_all(sock_, &h, sizeof(h), deadline, peer_));
  XDS_RETURN_IF_ERROR(
      send_all(sock_, mine.worker_address.data(), mine.worker_address.size(), deadline, peer_));
  XDS_RETURN_IF_ERROR(
      send_all(sock_, mine.arena.rkey.data(), mine.arena.rkey.size(), deadline, peer_));
  XDS_RETURN_IF_ERROR(
      send_all(sock_, mine.region.rkey.data(), mine.region.rkey.size(), deadline, peer_));

  // The peer's whole hello is read before it is judged: closing with its bytes unread would
  // reset the connection, and the peer would see "connection reset" instead of the reason.
  UcxHello t{};
  XDS_RETURN_IF_ERROR(recv_all(sock_, &t, sizeof(t), deadline, peer_));
  if (t.magic != kHelloMagic) {
    return failed_precondition(
        "xccl ucx link {}: the peer's hello is not an xccl ucx hello "
        "(magic {:#x})",
        peer_, t.magic);
  }
  if (t.worker_address_bytes == 0 || t.worker_address_bytes > kMaxBlobBytes ||
      t.arena_rkey_bytes == 0 || t.arena_rkey_bytes > kMaxBlobBytes ||
      t.region_rkey_bytes > kMaxBlobBytes || (t.region_rkey_bytes == 0) != (t.region_bytes == 0)) {
    return failed_precondition(
        "xccl ucx link {}: the peer's hello is malformed (address {} "
        "bytes, rkeys {} and {} bytes, region {} bytes)",
        peer_, t.worker_address_bytes, t.arena_rkey_bytes, t.region_rkey_bytes, t.region_bytes);
  }
  UcxPacked theirs;
  theirs.worker_address.resize(t.worker_address_bytes);
  theirs.arena = {t.arena_base, t.arena_bytes, std::vector<uint8_t>(t.arena_rkey_bytes)};
  theirs.region = {t.region_base, t.region_bytes, std::vector<uint8_t>(t.region_rkey_bytes)};
  XDS_RETURN_IF_ERROR(
      recv_all(sock_, theirs.worker_address.data(), t.worker_address_bytes, deadline, peer_));
  XDS_RETURN_IF_ERROR(
      recv_all(sock_, theirs.arena.rkey.data(), t.arena_rkey_bytes, deadline, peer_));
  XDS_RETURN_IF_ERROR(
      recv_all(sock_, theirs.region.rkey.data(), t.region_rkey_bytes, deadline, peer_));
  if (t.version != kHelloVersion) {
    return failed_precondition(
        "xccl ucx link {}: the peer speaks ucx link version {}, this "
        "side {}",
        peer_, t.version, kHelloVersion);
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
  transport_ = std::make_unique<UcxTransport>(*this);
  if (o.progress_thread) worker_->start_progress_thread();
  return {};
}

Result<std::unique_ptr<UcxLink>> form_link(int sock, int rank, const UcxLinkOptions& o,
                                           int64_t deadline, std::string peer) {
  ArenaConfig cfg = o.config;
  cfg.world_size = 2;
  if (Status st = validate(cfg); !st.ok()) {
    close(sock);
    return st;
  }
  auto link =
      std::make_unique<UcxLinkImpl>(sock, rank, o.epoch, arena_layout(cfg), std::move(peer));
  XDS_RETURN_IF_ERROR(link->init(o, deadline));
  return std::unique_ptr<UcxLink>(std::move(link));
}

}  // namespace

Result<UcxListener> UcxListener::listen(const std::string& host, uint16_t port) {
  const std::string where = address_string(host, port);
  sockaddr_storage sa{};
  socklen_t len = 0;
  XDS_RETURN_IF_ERROR(resolve(host, port, sa, len));
  const int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
  if (::listen(fd, 4) != 0) {
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
  return UcxListener(fd, p, address_string(host, p));
}

UcxListener::UcxListener(UcxListener&& o) noexcept
    : fd_(o.fd_), port_(o.port_), address_(std::move(o.address_)) {
  o.fd_ = -1;
}
UcxListener& UcxListener::operator=(UcxListener&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(port_, o.port_);
  std::swap(address_, o.address_);
  return *this;
}
UcxListener::~UcxListener() {
  if (fd_ >= 0) close(fd_);
}

Result<std::unique_ptr<UcxLink>> UcxListener::accept(const UcxLinkOptions& options) {
  const int64_t deadline = now_ns() + int64_t{options.timeout_ms} * 1'000'000;
  XDS_RETURN_IF_ERROR(wait_fd(fd_, POLLIN, deadline, address_, "peer connecting"));
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  const int sock = accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
  if (sock < 0) return errno_status(address_, "accept");
  char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<sockaddr*>(&peer), len, host, sizeof(host), serv, sizeof(serv),
              NI_NUMERICHOST | NI_NUMERICSERV);
  return form_link(sock, /*rank=*/0, options, deadline,
                   address_string(host, static_cast<uint16_t>(std::atoi(serv))));
}

Result<std::unique_ptr<UcxLink>> ucx_connect(const std::string& host, uint16_t port,
                                             const UcxLinkOptions& options) {
  const int64_t deadline = now_ns() + int64_t{options.timeout_ms} * 1'000'000;
  const std::string where = address_string(host, port);
  sockaddr_storage sa{};
  socklen_t len = 0;
  XDS_RETURN_IF_ERROR(resolve(host, port, sa, len));
  while (true) {
    const int sock = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock < 0) return errno_status(where, "socket");
    int e = 0;
    if (connect(sock, reinterpret_cast<const sockaddr*>(&sa), len) != 0) e = errno;
    if (e == EINPROGRESS) {  // an unreachable host answers nothing: wait, with the deadline
      const Status st = wait_fd(sock, POLLOUT, deadline, where, "answer to connect");
      if (!st.ok()) {
        close(sock);
        return unavailable("xccl ucx link: nobody answers at {} ({})", where, st.message());
      }
      socklen_t el = sizeof(e);
      getsockopt(sock, SOL_SOCKET, SO_ERROR, &e, &el);
    }
    if (e == 0) return form_link(sock, /*rank=*/1, options, deadline, where);
    close(sock);
    if (e != ECONNREFUSED || now_ns() >= deadline) {
      return unavailable("xccl ucx link: nobody listens on {} ({})", where, std::strerror(e));
    }
    usleep(20'000);  // the listener may not be up yet
  }
}

}  // namespace xds::xccl
