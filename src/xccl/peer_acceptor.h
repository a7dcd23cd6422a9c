// PeerAcceptor: the accepting half of a listener that never waits on a peer -- shared by
// LinkListener (xccl/link.h) and UcxListener (xccl/ucx_link.h).
//
// It owns the listening socket (non-blocking), an epoll fd over that socket, the sockets of
// the peers its owner keeps pending (watch()/unwatch(); the owner closes them), and a timer.
// fd() is the epoll fd: a caller that polls it wakes for a peer connecting, a pending peer's
// bytes, or the timer (the earliest pending deadline, or the end of a pause).
//
// Out of descriptors or memory: accept4 failing with EMFILE, ENFILE, ENOBUFS or ENOMEM fails
// again at once (the connection stays in the backlog and the socket stays readable), so the
// acceptor pauses instead: it reports the error once, takes the listening socket out of the
// epoll set (fd() is not readable for it meanwhile) and tries again when the pause is over --
// kFirstPauseMs, doubling up to 1 s while accept keeps failing, reset by a success
// (base/accept_backoff.h). A caller polling fd() thus wakes about once per pause, and logs one
// error per pause.
//
// Thread-safety: one thread at a time.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace xds::xccl {

class PeerAcceptor {
 public:
  static constexpr int kFirstPauseMs = 100;

  // Takes `listen_fd` (bound, listening, non-blocking; closed here on failure). `what` names
  // the listener in errors ("xccl link @xdeepserve-link-NAME").
  static Result<PeerAcceptor> create(int listen_fd, std::string what);
  PeerAcceptor(PeerAcceptor&& o) noexcept;
  PeerAcceptor& operator=(PeerAcceptor&& o) noexcept;
  ~PeerAcceptor();

  int fd() const { return epoll_fd_; }
  int listen_fd() const { return listen_fd_; }

  // The socket (SOCK_NONBLOCK | SOCK_CLOEXEC) of a peer connecting now; -1 when none is, or
  // while paused. An error when accept4 failed: ResourceExhausted naming the pause it starts
  // (a shortage, above), Internal otherwise (once; the next call tries again).
  Result<int> accept_next();
  bool paused() const { return paused_until_ns_ != 0; }

  // Adds / removes a pending peer's socket to / from the epoll set.
  Status watch(int sock);
  void unwatch(int sock);

  // Sets the timer at the earlier of `deadline_ns` (the earliest pending peer's, 0: none) and
  // the end of the pause, if any; disarms it with neither. Reads the timer's count first, so
  // that fd() is not readable for an old expiry.
  void arm_timer(int64_t deadline_ns);

 private:
  PeerAcceptor(int listen_fd, int epoll_fd, int timer_fd, std::string what)
      : listen_fd_(listen_fd), epoll_fd_(epoll_fd), timer_fd_(timer_fd), what_(std::move(what)) {}
  void close_all();

  int listen_fd_ = -1;
  int epoll_fd_ = -1;  // over listen_fd_ (unless paused), timer_fd_ and the watched sockets
  int timer_fd_ = -1;
  std::string what_;
  int pause_ms_ = 0;             // the current pause's length, 0 after a success
  int64_t paused_until_ns_ = 0;  // 0: not paused (listen_fd_ is in the epoll set)
};

}  // namespace xds::xccl
