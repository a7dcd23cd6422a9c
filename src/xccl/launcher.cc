#include "xccl/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "xccl/process_fabric.h"
#include "xccl/shared_region.h"

namespace xds::xccl {
namespace {

constexpr int kMaxFdsPerMessage = 253;  // SCM_MAX_FD

// Fixed part of the message each child receives; followed by world_size pids.
struct Hello {
  int32_t rank;
  uint32_t epoch;
  int32_t cpu;        // first core; -1: no pinning
  int32_t cpu_count;  // cores [cpu, cpu + cpu_count)
  ArenaConfig cfg;
};

Status errno_status(const char* what) {
  return internal_error("xccl launcher: {} failed: {}", what, std::strerror(errno));
}

Status send_hello(int sock, const Hello& h, const std::vector<pid_t>& pids,
                  const std::vector<int>& fds) {
  std::vector<char> data(sizeof(Hello) + pids.size() * sizeof(pid_t));
  std::memcpy(data.data(), &h, sizeof(Hello));
  std::memcpy(data.data() + sizeof(Hello), pids.data(), pids.size() * sizeof(pid_t));
  iovec iov{data.data(), data.size()};
  std::vector<char> ctrl(CMSG_SPACE(sizeof(int) * fds.size()));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl.data();
  msg.msg_controllen = ctrl.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  if (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0) return errno_status("sendmsg(SCM_RIGHTS)");
  return Status::ok_status();
}

// The device's life once it has its identity, arenas and peers: pinned, every arena mapped
// (and checked), a pidfd per peer, then fn on its fabric. Closes `fds`.
[[noreturn]] void run_device(const Hello& h, const std::vector<pid_t>& pids,
                             const std::vector<int>& fds, const std::function<int(Fabric&)>& fn) {
  const int W = h.cfg.world_size;
  if (h.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int32_t c = 0; c < std::max(1, h.cpu_count); ++c) CPU_SET(h.cpu + c, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  const ArenaLayout lay = arena_layout(h.cfg);
  std::vector<std::byte*> arenas;
  for (int r = 0; r < W; ++r) {
    void* p = mmap(nullptr, lay.total, PROT_READ | PROT_WRITE, MAP_SHARED, fds[size_t(r)], 0);
    if (p == MAP_FAILED) _exit(114);
    close(fds[size_t(r)]);
    Status st = check_arena(p, lay, r);
    if (!st.ok()) {
      std::fprintf(stderr, "xccl device %d: %s\n", h.rank, st.to_string().c_str());
      _exit(115);
    }
    arenas.push_back(static_cast<std::byte*>(p));
  }
  std::vector<int> pidfds(static_cast<size_t>(W), -1);
  for (int r = 0; r < W; ++r)
    if (r != h.rank)
      pidfds[size_t(r)] = static_cast<int>(syscall(SYS_pidfd_open, pids[size_t(r)], 0));
  int code;
  {
    ProcessFabric fabric(h.rank, h.epoch, lay, std::move(arenas), std::move(pidfds));
    code = fn(fabric);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

[[noreturn]] void child_main(int sock, pid_t launcher, const std::function<int(Fabric&)>& fn) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(111);  // the launcher died before prctl
  std::vector<char> data(sizeof(Hello) + kMaxWorld * sizeof(pid_t));
  std::vector<char> ctrl(CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage));
  iovec iov{data.data(), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl.data();
  msg.msg_controllen = ctrl.size();
  ssize_t n;
  do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < static_cast<ssize_t>(sizeof(Hello))) _exit(112);  // launcher gave up
  close(sock);
  Hello h;
  std::memcpy(&h, data.data(), sizeof(Hello));
  const int W = h.cfg.world_size;
  std::vector<pid_t> pids(static_cast<size_t>(W));
  std::memcpy(pids.data(), data.data() + sizeof(Hello), pids.size() * sizeof(pid_t));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS ||
      c->cmsg_len != CMSG_LEN(sizeof(int) * static_cast<size_t>(W)))
    _exit(113);
  std::vector<int> fds(static_cast<size_t>(W));
  std::memcpy(fds.data(), CMSG_DATA(c), sizeof(int) * fds.size());
  run_device(h, pids, fds, fn);
}

}  // namespace

DeviceGroup::DeviceGroup(DeviceGroup&& o) noexcept
    : pids_(std::move(o.pids_)),
      reaped_(o.reaped_),
      arena_fds_(std::move(o.arena_fds_)),
      opts_(std::move(o.opts_)),
      fn_(std::move(o.fn_)) {
  o.pids_.clear();
  o.arena_fds_.clear();
}
DeviceGroup& DeviceGroup::operator=(DeviceGroup&& o) noexcept {
  std::swap(pids_, o.pids_);
  std::swap(reaped_, o.reaped_);
  std::swap(arena_fds_, o.arena_fds_);
  std::swap(opts_, o.opts_);
  std::swap(fn_, o.fn_);
  return *this;
}

DeviceGroup::~DeviceGroup() {
  for (int fd : arena_fds_) close(fd);
  if (reaped_) return;
  for (pid_t p : pids_) kill(p, SIGKILL);
  for (pid_t p : pids_) {
    int st;
    while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
    }
  }
}

Result<DeviceGroup> DeviceGroup::spawn(const LaunchOptions& opts,
                                       const std::function<int(Fabric&)>& fn) {
  ArenaConfig cfg = opts.arena;
  cfg.world_size = opts.devices;
  XDS_RETURN_IF_ERROR(validate(cfg));
  if (opts.devices > kMaxFdsPerMessage)
    return invalid_argument("xccl launcher: {} devices exceed the {} fds one message can carry",
                            opts.devices, kMaxFdsPerMessage);
  const ArenaLayout lay = arena_layout(cfg);
  const size_t W = static_cast<size_t>(opts.devices);
  std::fflush(stdout);
  std::fflush(stderr);

  DeviceGroup g;
  std::vector<int> parent_ends;
  const pid_t launcher = getpid();
  for (size_t i = 0; i < W; ++i) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
      for (int fd : parent_ends) close(fd);
      return errno_status("socketpair");
    }
    const pid_t pid = fork();
    if (pid < 0) {
      close(sv[0]);
      close(sv[1]);
      for (int fd : parent_ends) close(fd);
      return errno_status("fork");
    }
    if (pid == 0) {
      close(sv[0]);
      for (int fd : parent_ends) close(fd);
      child_main(sv[1], launcher, fn);
    }
    close(sv[1]);
    parent_ends.push_back(sv[0]);
    g.pids_.push_back(pid);
  }

  // Arenas: memfd, sized up front, identity written, then handed over.
  std::vector<int> fds;
  auto close_all = [&] {
    for (int fd : fds) close(fd);
    for (int fd : parent_ends) close(fd);
  };
  for (size_t r = 0; r < W; ++r) {
    const std::string name = fmt::format("xccl-e{}-r{}", opts.epoch, r);
    const int fd = create_owner_only_memfd(name.c_str());
    if (fd < 0) {
      Status st = errno_status("memfd_create");
      close_all();
      return st;
    }
    fds.push_back(fd);
    if (fallocate(fd, 0, 0, static_cast<off_t>(lay.total)) != 0) {
      Status st = resource_exhausted(
          "xccl launcher: cannot reserve {} bytes for the arena of rank "
          "{}: {}",
          lay.total, r, std::strerror(errno));
      close_all();
      return st;
    }
    void* p = mmap(nullptr, lay.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      Status st = errno_status("mmap");
      close_all();
      return st;
    }
    init_arena(p, lay, static_cast<int>(r), opts.epoch);
    munmap(p, lay.total);
  }
  for (size_t r = 0; r < W; ++r) {
    Hello h{static_cast<int32_t>(r), opts.epoch,
            opts.cpus.empty() ? -1 : opts.cpus[r % opts.cpus.size()], opts.cpus_per_device,
            cfg};
    Status st = send_hello(parent_ends[r], h, g.pids_, fds);
    if (!st.ok()) {
      close_all();
      return st;
    }
  }
  if (opts.keep_arenas) {
    g.arena_fds_ = std::move(fds);
    fds.clear();
    g.opts_ = opts;
    g.opts_.arena = cfg;
    g.fn_ = fn;
  }
  close_all();
  return g;
}

Result<pid_t> DeviceGroup::respawn(int rank) {
  if (arena_fds_.empty() || rank < 0 || static_cast<size_t>(rank) >= pids_.size())
    return failed_precondition("xccl launcher: device {} cannot be started again (keep_arenas "
                               "off, or no such device)",
                               rank);
  const pid_t old = pids_[size_t(rank)];
  int st = 0;
  pid_t r;
  do r = waitpid(old, &st, 0);  // it died: reap it (a live one would block here)
  while (r < 0 && errno == EINTR);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid < 0) return errno_status("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(111);
    std::vector<int> fds;
    for (int fd : arena_fds_) fds.push_back(dup(fd));  // run_device closes what it gets
    std::vector<pid_t> pids = pids_;
    pids[size_t(rank)] = getpid();
    const Hello h{rank, opts_.epoch,
                  opts_.cpus.empty() ? -1 : opts_.cpus[size_t(rank) % opts_.cpus.size()],
                  opts_.cpus_per_device, opts_.arena};
    run_device(h, pids, fds, fn_);
  }
  pids_[size_t(rank)] = pid;
  return pid;
}

Result<std::vector<DeviceExit>> DeviceGroup::wait() {
  std::vector<DeviceExit> out;
  for (pid_t p : pids_) {
    int st = 0;
    pid_t r;
    do r = waitpid(p, &st, 0);
    while (r < 0 && errno == EINTR);
    if (r < 0) return errno_status("waitpid");
    DeviceExit e;
    if (WIFEXITED(st)) e.exit_code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) e.signal = WTERMSIG(st);
    out.push_back(e);
  }
  reaped_ = true;
  return out;
}

Result<std::vector<DeviceExit>> launch_devices(const LaunchOptions& opts,
                                               const std::function<int(Fabric&)>& fn) {
  XDS_ASSIGN_OR_RETURN(DeviceGroup g, DeviceGroup::spawn(opts, fn));
  return g.wait();
}

}  // namespace xds::xccl
