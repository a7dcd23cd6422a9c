// Link: a two-device fabric between two processes started separately on one host -- what
// DistFlow (P102) pairs a prefill and a decode DP group with, so that a dead peer poisons
// only that link, never either instance's own fabric.
//
// Rendezvous over a SOCK_SEQPACKET Unix socket in Linux's abstract namespace
// ("@xdeepserve-link-NAME": nothing in the file system, nothing left behind). The listener is
// rank 0, the connecting side rank 1. Each side creates its own arena (memfd, sized with
// fallocate, identity written), then both send a hello (magic, version, rank, epoch, arena
// config) carrying the arena's fd with SCM_RIGHTS, and check the other's: a different epoch
// or arena config fails both sides with an error naming the field and both values. Each maps
// both arenas, closes the fds, and watches the peer through a pidfd opened from the socket's
// SO_PEERCRED (not from anything the peer says). Rank 0's arena holds the link's poison word,
// as in every fabric.
//
// Peer checks: both sides check the other with SO_PEERCRED (base/peer_cred.h) right after
// connect()/accept(), before anything is sent or read: a peer of another uid is refused and
// closed without receiving a fd (the abstract namespace is open to every local user, and the
// fds passed here map read-write). The connecting side checks the listener too, so a squatter
// on the name gets nothing either.
//
// Silent peers cost nothing: the listener never blocks on a peer's hello. accept_ready()
// accepts (and checks) whoever is connecting, keeps each in a pending list, and forms a link
// only once that peer's hello has arrived; a pending peer with no hello after the handshake
// timeout is dropped. fd() is an epoll fd over the listening socket, the pending peers and a
// timer at the earliest pending deadline, so a caller that polls fd() wakes for each of them
// (xccl/peer_acceptor.h). Out of descriptors (accept failing with EMFILE and the like), the
// listener pauses accepting, 100 ms doubling to 1 s, and reports one error per pause.
//
// Either side may also export a SharedRegion (e.g. a prefill DP group's KV cache): its fd
// travels with the hello, the peer maps it, and both see it as Fabric::region(rank), addressed
// by MemDesc{rank, offset, bytes, kExportRegion}. One region can be exported over many links.
//
// Thread-safety: a LinkListener is used by one thread at a time; links are independent.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "xccl/fabric.h"
#include "xccl/peer_acceptor.h"
#include "xccl/shared_region.h"

namespace xds::xccl {

class LinkListener {
 public:
  // Binds "@xdeepserve-link-<name>". FailedPrecondition when another process listens there.
  static Result<LinkListener> listen(const std::string& name);
  LinkListener(LinkListener&& o) noexcept;
  LinkListener& operator=(LinkListener&& o) noexcept;
  ~LinkListener();

  // Readable when there is work for accept_ready(): a peer connecting, a pending peer's hello,
  // or a pending peer's handshake deadline. Poll it beside other sockets.
  int fd() const { return acceptor_.fd(); }

  struct Accepted {
    std::vector<std::unique_ptr<Fabric>> formed;  // links formed now (this side rank 0)
    // Peers dropped now (another uid, a bad hello, no hello in time), and accept failures
    // (one per pause when out of descriptors).
    std::vector<Status> refused;
  };
  // Never waits. Accepts every peer connecting now (refusing other uids at once), forms the
  // link of each pending peer whose hello arrived, drops pending peers that have waited
  // handshake_timeout_ms. `exported`, when given, must outlive the fabrics.
  Accepted accept_ready(const ArenaConfig& config, uint32_t epoch, int handshake_timeout_ms,
                        const SharedRegion* exported = nullptr);
  // Pending peers: accepted, same uid, hello not arrived yet.
  size_t pending() const { return pending_.size(); }

  // Waits up to timeout_ms for one link (accept_ready() in a loop). DeadlineExceeded when
  // none formed in time; a refused peer's error when one was refused and none formed.
  Result<std::unique_ptr<Fabric>> accept(const ArenaConfig& config, uint32_t epoch,
                                         int timeout_ms, const SharedRegion* exported = nullptr);

  // At most this many peers wait in the pending list; more are refused.
  static constexpr size_t kMaxPending = 64;

 private:
  struct Pending {
    int sock = -1;
    int64_t deadline_ns = 0;
  };
  explicit LinkListener(PeerAcceptor acceptor) : acceptor_(std::move(acceptor)) {}
  void accept_connecting(int handshake_timeout_ms, Accepted& out);
  void drop_pending(size_t i);
  void arm_timer();
  void close_all();

  PeerAcceptor acceptor_;  // the listening socket; fd() watches it and every pending socket
  std::vector<Pending> pending_;
  std::vector<std::unique_ptr<Fabric>> stash_;  // formed beyond what accept() returned
};

// Connects to the listener `name` and forms the link (this side rank 1), waiting up to
// timeout_ms for the listener and its hello. Unavailable naming the address when nobody
// listens.
Result<std::unique_ptr<Fabric>> link_connect(const std::string& name, const ArenaConfig& config,
                                             uint32_t epoch, int timeout_ms,
                                             const SharedRegion* exported = nullptr);

}  // namespace xds::xccl
