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
// Either side may also export a SharedRegion (e.g. a prefill DP group's KV cache): its fd
// travels with the hello, the peer maps it, and both see it as Fabric::region(rank), addressed
// by MemDesc{rank, offset, bytes, kExportRegion}. One region can be exported over many links.
//
// Thread-safety: a LinkListener is used by one thread at a time; links are independent.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "xccl/fabric.h"
#include "xccl/shared_region.h"

namespace xds::xccl {

class LinkListener {
 public:
  // Binds "@xdeepserve-link-<name>". FailedPrecondition when another process listens there.
  static Result<LinkListener> listen(const std::string& name);
  LinkListener(LinkListener&& o) noexcept;
  LinkListener& operator=(LinkListener&& o) noexcept;
  ~LinkListener();

  // Readable when a peer is connecting (poll it beside other sockets, then accept()).
  int fd() const { return fd_; }
  // Waits up to timeout_ms for one peer and forms the link (this side rank 0).
  // DeadlineExceeded when nobody connects in time; the handshake's errors otherwise.
  // `exported`, when given, must outlive the fabric.
  Result<std::unique_ptr<Fabric>> accept(const ArenaConfig& config, uint32_t epoch,
                                         int timeout_ms, const SharedRegion* exported = nullptr);

 private:
  explicit LinkListener(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Connects to the listener `name` and forms the link (this side rank 1), waiting up to
// timeout_ms for the listener and its hello. Unavailable naming the address when nobody
// listens.
Result<std::unique_ptr<Fabric>> link_connect(const std::string& name, const ArenaConfig& config,
                                             uint32_t epoch, int timeout_ms,
                                             const SharedRegion* exported = nullptr);

}  // namespace xds::xccl
