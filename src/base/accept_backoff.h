// How long a listener waits before its next accept() -- a pure policy, shared by the HTTP
// server (serve/http_server.cc) and XCCL's link listeners (xccl/peer_acceptor.h).
//
// accept() that fails because the process or system is out of descriptors or memory (EMFILE,
// ENFILE, ENOBUFS, ENOMEM) fails again at once: the pending connection stays in the backlog
// and the listener stays readable, so retrying immediately spins a core and floods the log.
// Such failures back off `first_ms` (10 ms unless the caller says otherwise), doubling up to
// 1 s; a success (or a failure that concerns only the one connection, e.g. ECONNABORTED)
// retries at once and resets the delay.
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cerrno>

namespace xds {

inline constexpr int kAcceptBackoffFirstMs = 10;
inline constexpr int kAcceptBackoffMaxMs = 1000;

// Whether accept() failing with `error` (errno) is a shortage that the next accept() would
// meet too.
inline bool accept_error_is_shortage(int error) {
  return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM;
}

// The delay before the next accept(), given the previous delay and the last accept()'s errno
// (0: it succeeded): 0, or first_ms doubling up to kAcceptBackoffMaxMs.
inline int next_accept_delay_ms(int previous_ms, int error, int first_ms = kAcceptBackoffFirstMs) {
  if (!accept_error_is_shortage(error)) return 0;
  if (previous_ms <= 0) return first_ms;
  return std::min(previous_ms * 2, kAcceptBackoffMaxMs);
}

}  // namespace xds
