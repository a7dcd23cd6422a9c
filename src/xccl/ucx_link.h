// UcxLink: a two-device link between processes on different hosts, over UCX (Debian's libucx)
// -- what DistFlow (P104) pairs a prefill and a decode DP group with when they do not share a
// host (transfer_backend.h picks "shm" or "ucx" from the peers' addresses).
//
// Rendezvous over TCP: the listener (rank 0) binds host:port, the connecting side is rank 1.
// Before anything else the two prove the cluster secret to each other (challenge-response,
// ucx_handshake.h): both send a fresh random nonce, rank 1 answers with a keyed BLAKE2b of
// its rank, the epoch and both nonces, and rank 0 checks it (constant time) before it answers
// with its own; rank 1 checks that. A peer that cannot prove the secret fails both sides ("the
// peer did not prove the cluster secret") and has received a nonce only. Only then each side
// creates a UCP context and worker (transports from UcxLinkOptions::tls, e.g. "tcp", else
// UCX's own choice: RDMA where the hardware has it), allocates its control arena (the same
// ArenaLayout as every fabric: signals, app area) and registers it, registers the region it
// exports, if any (e.g. the KV cache), and sends its hello:
//   UcxHello (host byte order, both sides x86-64) | worker address | arena rkey | region rkey
// Each side reads a whole message before judging it, so that a rejection does not reset the
// connection under the peer. A different magic, version, rank, epoch or arena config fails
// both sides with an error naming the field and both values. The TCP socket stays open: its
// EOF is the peer's death (as is a UCX endpoint error), after which operations fail instead
// of waiting.
//
// Silent peers cost nothing: UcxListener::accept_ready() never waits on a peer. It accepts
// whoever is connecting (sending each its challenge), keeps them pending, and advances a
// peer's handshake only as its bytes arrive; a peer still pending after timeout_ms is dropped,
// and at most kMaxPending wait. fd() is an epoll fd over the listening socket, the pending
// peers and a timer (xccl/peer_acceptor.h; which also pauses accepting when out of
// descriptors), so a caller that polls fd() wakes for each of them.
//
// The link's Transport (name "ucx", async_completion) addresses
//   MemDesc{peer, offset, bytes, kArenaRegion}  -> the peer's control arena (its rkey)
//   MemDesc{peer, offset, bytes, kExportRegion} -> the region the peer exports (its rkey)
//   MemDesc{self, ...}                          -> local memory, copied at once (kDone)
// put/get are ucp_put_nbx/ucp_get_nbx and return kInProgress: the source of a put and the
// destination of a get must stay untouched until flush() returns kDone. put_with_signal puts
// the data, fences the worker (ucp_worker_fence: the data lands before what follows) and puts
// the 8-byte signal word; test_signal reads the local word with acquire. flush() progresses
// the worker until every operation issued before it completed: kFailed when one failed, the
// peer died, or flush_timeout_ms passed.
//
// One-sided over TCP is emulated by UCX with active messages, so the *target* must progress
// its worker: with progress_thread (the default) a thread does that while the owner computes
// (it sleeps on the worker's event fd when idle); without it, the owner calls progress().
//
// Usage (a decode side pulls one request's KV blocks from the prefill side that listens):
//   prefill: auto lis = UcxListener::listen("0.0.0.0", 7100);
//            UcxLinkOptions o; o.epoch = e; o.secret = cluster_secret; o.exported = kv_span;
//            auto link = lis->accept(o);                    // rank 0 (or accept_ready(o))
//   decode:  UcxLinkOptions o; o.epoch = e; o.secret = cluster_secret;
//            auto link = ucx_connect("10.0.0.2", 7100, o);  // rank 1
//            Transport& t = (*link)->transport();
//            for (i, block b of the request)
//              t.get(dst + i * kBlockBytes, {0, b * kBlockBytes, kBlockBytes, kExportRegion},
//                    0, kBlockBytes);
//            if (t.flush() != OpState::kDone) -> the link is lost: fail the request
//
// Leaving: the side that receives the last signal waits until peer_alive() is false before it
// goes; otherwise the signaller's flush may see it gone before the acknowledgement arrives.
//
// Thread-safety: the worker runs in UCS_THREAD_MODE_MULTI; transport calls may come from any
// thread. Listener: one thread at a time (after a fork, in one of the processes only: they
// share its epoll fd). The link owns everything it registered; the
// exported span must outlive the link.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "xccl/layout.h"
#include "xccl/peer_acceptor.h"
#include "xccl/transport.h"

namespace xds::xccl {

// The cluster secret's 32 bytes (protocol::ClusterSecret::bytes; xccl depends on base only).
using LinkSecret = std::array<uint8_t, 32>;

struct UcxLinkOptions {
  // Required: both sides prove it before anything registered is sent (unset: InvalidArgument).
  std::optional<LinkSecret> secret;
  ArenaConfig config;       // the control arena (world_size is set to 2)
  uint32_t epoch = 0;       // both sides must agree
  int timeout_ms = 10'000;  // rendezvous and handshake (the listener: per pending peer)
  int flush_timeout_ms = 30'000;
  std::span<std::byte> exported;  // lent to the peer (its kExportRegion); empty for none
  std::string tls;                // UCX_TLS of this link's context ("tcp"); empty: UCX's choice
  bool progress_thread = true;    // serve the peer's one-sided operations in the background
  // Further UCX settings of this link's context: names without "UCX_" and, for a transport's
  // settings, without its prefix: {"TX_SEG_SIZE", "64k"}, {"RX_SEG_SIZE", "64k"} are
  // UCX_TCP_TX/RX_SEG_SIZE (TCP segments of 64 KB instead of 8 KB: fewer fragments per
  // emulated get; docs/benchmarks.md, "KV transfer"). The environment's UCX_* apply otherwise.
  // UCX checks transport settings only when it opens the transports: a name no transport
  // knows is not an error, UCX prints "invalid configurations" once.
  std::vector<std::pair<std::string, std::string>> ucx_config;
};

class UcxLink {
 public:
  virtual ~UcxLink() = default;
  UcxLink(const UcxLink&) = delete;
  UcxLink& operator=(const UcxLink&) = delete;

  virtual int rank() const = 0;  // 0: the listener, 1: the connecting side
  virtual uint32_t epoch() const = 0;
  virtual const ArenaLayout& layout() const = 0;        // both arenas' layout
  virtual std::byte* local() const = 0;                 // this side's control arena
  virtual uint64_t peer_region_bytes() const = 0;       // 0 when the peer exports none
  virtual const std::string& peer_address() const = 0;  // "host:port" of the TCP socket
  virtual Transport& transport() = 0;
  // False once the peer is known to be gone (TCP EOF or UCX endpoint error). A syscall.
  virtual bool peer_alive() = 0;
  // Progresses the worker once; needed only without the progress thread.
  virtual void progress() = 0;

 protected:
  UcxLink() = default;
};

class UcxHandshake;  // ucx_handshake.h

class UcxListener {
 public:
  // Binds host:port (port 0: the kernel picks; see port()). FailedPrecondition naming the
  // address when it is taken.
  static Result<UcxListener> listen(const std::string& host, uint16_t port);
  UcxListener(UcxListener&& o) noexcept;
  UcxListener& operator=(UcxListener&& o) noexcept;
  ~UcxListener();

  uint16_t port() const { return port_; }
  const std::string& address() const { return address_; }
  // Readable when there is work for accept_ready(): a peer connecting, a pending peer's bytes,
  // a pending peer's deadline. Poll it beside other sockets.
  int fd() const { return acceptor_.fd(); }

  struct Accepted {
    std::vector<std::unique_ptr<UcxLink>> formed;  // links formed now (this side rank 0)
    // Peers dropped now (no proof of the secret, a bad hello, silent past timeout_ms), and
    // accept failures (one per pause when out of descriptors).
    std::vector<Status> refused;
  };
  // Never waits for a peer. Accepts every peer connecting now, advances each pending peer's
  // handshake with the bytes it has sent, forms the links of those done, and drops those that
  // have waited options.timeout_ms. InvalidArgument in refused (and nothing accepted) without
  // options.secret.
  Accepted accept_ready(const UcxLinkOptions& options);
  size_t pending() const;

  // Waits up to options.timeout_ms for one link (accept_ready() in a loop). DeadlineExceeded
  // naming the address when none formed in time; a refused peer's error when one was refused
  // and none formed.
  Result<std::unique_ptr<UcxLink>> accept(const UcxLinkOptions& options);

  // At most this many peers wait in the pending list; more are refused.
  static constexpr size_t kMaxPending = 64;

 private:
  UcxListener(PeerAcceptor acceptor, uint16_t port, std::string address);
  void accept_connecting(const UcxLinkOptions& options, Accepted& out);

  PeerAcceptor acceptor_;
  uint16_t port_ = 0;
  std::string address_;  // "host:port"
  std::vector<std::unique_ptr<UcxHandshake>> pending_;
  std::vector<std::unique_ptr<UcxLink>> stash_;  // formed beyond what accept() returned
};

// Connects to host:port and forms the link (this side rank 1), retrying until the listener is
// up or options.timeout_ms passes: then Unavailable naming the address. InvalidArgument
// without options.secret (before connecting).
Result<std::unique_ptr<UcxLink>> ucx_connect(const std::string& host, uint16_t port,
                                             const UcxLinkOptions& options);

}  // namespace xds::xccl
