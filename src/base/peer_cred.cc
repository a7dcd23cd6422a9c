#include "base/peer_cred.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace xds {

Result<PeerCred> peer_cred(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) {
    return internal_error("getsockopt(fd {}, SO_PEERCRED) failed: {}", fd, std::strerror(errno));
  }
  return PeerCred{cred.pid, cred.uid, cred.gid};
}

Status check_same_user(int fd) {
  XDS_ASSIGN_OR_RETURN(const PeerCred cred, peer_cred(fd));
  const uid_t ours = geteuid();
  if (cred.uid != ours) {
    return failed_precondition("peer pid {} runs as uid {}, not this process's uid {}: refused",
                               cred.pid, cred.uid, ours);
  }
  return {};
}

}  // namespace xds
