#include "xccl/process_fabric.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace xds::xccl {

ProcessFabric::ProcessFabric(int rank, uint32_t epoch, const ArenaLayout& layout,
                             std::vector<std::byte*> arenas, std::vector<int> pidfds)
    : Fabric(rank, epoch, layout, std::move(arenas)), pidfds_(std::move(pidfds)) {}

ProcessFabric::~ProcessFabric() {
  for (int r = 0; r < world_size(); ++r) munmap(arena(r), layout().total);
  for (const Region& g : owned_regions_) munmap(g.base, g.bytes);
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
}

void ProcessFabric::attach_region(int r, Region region, bool owned) {
  set_region(r, region);
  if (owned) owned_regions_.push_back(region);
}

bool ProcessFabric::peer_alive(int r) {
  const int fd = pidfds_[static_cast<size_t>(r)];
  if (fd < 0) return true;
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;  // a pidfd turns readable when its process exits
}

Status ProcessFabric::watch_peer(int r, int pid) {
  if (r < 0 || r >= world_size() || r == rank()) {
    return invalid_argument("xccl: no peer {} to watch (rank {} of {})", r, rank(), world_size());
  }
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return internal_error("xccl: pidfd_open({}) for peer {}: {}", pid, r, errno);
  int& slot = pidfds_[static_cast<size_t>(r)];
  if (slot >= 0) close(slot);
  slot = fd;
  return Status::ok_status();
}

}  // namespace xds::xccl
