// Who is on the other end of a local (AF_UNIX) socket, and whether we trust it.
//
// The project's own Unix sockets (XCCL links, DistFlow's KV link) pass memfds -- arenas and
// exported regions such as a KV cache -- with SCM_RIGHTS. Their abstract-namespace names are
// reachable by every local uid, so before any fd is passed and before anything read is trusted
// each side checks its peer with SO_PEERCRED (what the kernel recorded at connect(), not
// anything the peer says): the peer's uid must be ours (geteuid()).
//
// Thread-safety: free functions without state; safe from any thread.
#pragma once

#include <sys/types.h>

#include "base/status.h"

namespace xds {

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The peer's credentials from SO_PEERCRED. Internal naming errno when `fd` is not a connected
// Unix socket.
Result<PeerCred> peer_cred(int fd);

// Ok when the peer of `fd` runs as our effective uid; FailedPrecondition naming the peer's
// pid and uid and ours otherwise. The caller closes the socket and passes nothing over it.
Status check_same_user(int fd);

}  // namespace xds
