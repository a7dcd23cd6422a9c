#include "serve/process_watch.h"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace xds::serve {

ProcessWatch::~ProcessWatch() {
  for (const Entry& e : entries_) close(e.pidfd);
}

Status ProcessWatch::add(pid_t pid, std::string what, int32_t group) {
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    return internal_error("cannot watch {} (pid {}): pidfd_open: {}", what, pid,
                          std::strerror(errno));
  }
  entries_.push_back({pid, fd, std::move(what), group});
  return {};
}

Status ProcessWatch::replace(int32_t group, pid_t pid) {
  for (Entry& e : entries_) {
    if (e.group != group || group < 0) continue;
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) {
      return internal_error("cannot watch {} (pid {}): pidfd_open: {}", e.what, pid,
                            std::strerror(errno));
    }
    close(e.pidfd);
    e.pidfd = fd;
    e.pid = pid;
    return {};
  }
  return not_found("no watched DP group {}", group);
}

std::string ProcessWatch::deaths() const {
  std::string out;
  for (const ProcessDeath& d : dead()) out += (out.empty() ? "" : "; ") + d.what;
  return out;
}

std::vector<ProcessDeath> ProcessWatch::dead() const {
  std::vector<ProcessDeath> out;
  for (const Entry& e : entries_) {
    pollfd p{e.pidfd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) continue;  // a pidfd turns readable when its process exits
    siginfo_t info{};
    std::string what;
    // WNOWAIT: leave the child to whoever reaps it (the launcher's wait or destructor).
    if (waitid(P_PID, static_cast<id_t>(e.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid == 0) {
      what = fmt::format("{} (pid {}) ended", e.what, e.pid);
    } else if (info.si_code == CLD_EXITED) {
      what = fmt::format("{} (pid {}) exited with code {}", e.what, e.pid, info.si_status);
    } else {
      what = fmt::format("{} (pid {}) was killed by signal {} ({})", e.what, e.pid,
                         info.si_status, strsignal(info.si_status));
    }
    out.push_back({e.group, std::move(what)});
  }
  return out;
}

}  // namespace xds::serve
