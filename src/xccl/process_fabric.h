// ProcessFabric: a Fabric whose devices are processes that map each other's arenas (memfd
// segments) and watch each other through pidfds. Made by the launcher (launcher.h: forked
// device groups) and by links (link.h: two processes started separately).
//
// Thread-safety: as Fabric.
#pragma once

#include <cstddef>
#include <vector>

#include "xccl/fabric.h"

namespace xds::xccl {

class ProcessFabric final : public Fabric {
 public:
  // Takes ownership of the mappings (each layout.total bytes) and of the pidfds ([world
  // size], -1 for self: a peer without one is taken as alive).
  ProcessFabric(int rank, uint32_t epoch, const ArenaLayout& layout, std::vector<std::byte*> arenas,
                std::vector<int> pidfds);
  ~ProcessFabric() override;
  bool peer_alive(int r) override;
  Status watch_peer(int r, int pid) override;
  // Rank r's exported region (link.h); with `owned` the mapping is unmapped with the fabric.
  void attach_region(int r, Region region, bool owned);

 private:
  std::vector<int> pidfds_;
  std::vector<Region> owned_regions_;
};

}  // namespace xds::xccl
