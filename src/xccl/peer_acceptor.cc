#include "xccl/peer_acceptor.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/accept_backoff.h"
#include "base/clock.h"

namespace xds::xccl {
namespace {

Status epoll_add(int epoll_fd, int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return internal_error("epoll_ctl(ADD, fd {}) failed: {}", fd, std::strerror(errno));
  }
  return {};
}

}  // namespace

Result<PeerAcceptor> PeerAcceptor::create(int listen_fd, std::string what) {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  const int timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  Status st;
  if (ep < 0 || timer < 0) {
    st = internal_error("{}: epoll/timerfd: {}", what, std::strerror(errno));
  } else {
    st = epoll_add(ep, listen_fd);
    if (st.ok()) st = epoll_add(ep, timer);
  }
  if (!st.ok()) {
    for (int f : {listen_fd, ep, timer})
      if (f >= 0) close(f);
    return st.with_context(what);
  }
  return PeerAcceptor(listen_fd, ep, timer, std::move(what));
}

PeerAcceptor::PeerAcceptor(PeerAcceptor&& o) noexcept
    : listen_fd_(std::exchange(o.listen_fd_, -1)),
      epoll_fd_(std::exchange(o.epoll_fd_, -1)),
      timer_fd_(std::exchange(o.timer_fd_, -1)),
      what_(std::move(o.what_)),
      pause_ms_(o.pause_ms_),
      paused_until_ns_(o.paused_until_ns_) {}

PeerAcceptor& PeerAcceptor::operator=(PeerAcceptor&& o) noexcept {
  if (this != &o) {
    close_all();
    listen_fd_ = std::exchange(o.listen_fd_, -1);
    epoll_fd_ = std::exchange(o.epoll_fd_, -1);
    timer_fd_ = std::exchange(o.timer_fd_, -1);
    what_ = std::move(o.what_);
    pause_ms_ = o.pause_ms_;
    paused_until_ns_ = o.paused_until_ns_;
  }
  return *this;
}

PeerAcceptor::~PeerAcceptor() {
  close_all();
}

void PeerAcceptor::close_all() {
  for (int* f : {&listen_fd_, &epoll_fd_, &timer_fd_}) {
    if (*f >= 0) close(*f);
    *f = -1;
  }
}

Result<int> PeerAcceptor::accept_next() {
  if (paused_until_ns_ != 0) {
    if (now_ns() < paused_until_ns_) return -1;
    paused_until_ns_ = 0;  // the pause is over: watch the listening socket again
    XDS_RETURN_IF_ERROR(epoll_add(epoll_fd_, listen_fd_).with_context(what_));
  }
  while (true) {
    const int sock = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (sock >= 0) {
      pause_ms_ = 0;
      return sock;
    }
    const int e = errno;
    if (e == EINTR || e == ECONNABORTED) continue;
    if (e == EAGAIN || e == EWOULDBLOCK) return -1;
    pause_ms_ = next_accept_delay_ms(pause_ms_, e, kFirstPauseMs);
    if (pause_ms_ == 0) return internal_error("{}: accept failed: {}", what_, std::strerror(e));
    paused_until_ns_ = now_ns() + int64_t{pause_ms_} * 1'000'000;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
    return resource_exhausted("{}: accept failed: {}; not accepting for {} ms", what_,
                              std::strerror(e), pause_ms_);
  }
}

Status PeerAcceptor::watch(int sock) {
  return epoll_add(epoll_fd_, sock).with_context(what_);
}

void PeerAcceptor::unwatch(int sock) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, sock, nullptr);
}

void PeerAcceptor::arm_timer(int64_t deadline_ns) {
  uint64_t expirations = 0;
  (void)!read(timer_fd_, &expirations, sizeof(expirations));
  int64_t at = deadline_ns;
  if (paused_until_ns_ != 0) at = at == 0 ? paused_until_ns_ : std::min(at, paused_until_ns_);
  itimerspec t{};
  if (at != 0) {
    // CLOCK_MONOTONIC is now_ns()'s clock (steady_clock on Linux); at least 1 ns, as 0 disarms.
    at = std::max<int64_t>(at, 1);
    t.it_value.tv_sec = at / 1'000'000'000;
    t.it_value.tv_nsec = at % 1'000'000'000;
  }
  timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &t, nullptr);
}

}  // namespace xds::xccl
