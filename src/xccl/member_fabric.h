// MemberFabric: the devices of a fabric that are still members, renumbered, under a new epoch
// -- what the survivors of a lost device form when an instance scales down instead of starting
// again (P119; docs/design/reliability.md, "Scale-down").
//
// The parent fabric's arenas stay mapped; the view keeps only the members' arenas, in the
// order of `members` (parent ranks, ascending), so member i is rank i of the view: the
// arena layout (sized for the parent's world) has room for every index a smaller world uses,
// and rank 0 of the view (the first member) holds the authoritative PoisonLine. A lost
// device's arena is never read or written through the view.
//
// Forming a view safely (the shell drives it, engine/dp_group.cc):
//   1. every member stops using the old fabric (it left every collective: a peer's death or
//      poison ended them) and says so;
//   2. once all have, every member calls reset_protocol_lines() on its own arena and says so
//      (nobody writes into another arena between 1 and 3: no stale post lands after a reset);
//   3. once all have, every member makes its view and its transport, mailbox and collectives
//      on it, under the new epoch.
//
// Thread-safety: as Fabric.
#pragma once

#include <memory>
#include <vector>

#include "base/status.h"
#include "xccl/fabric.h"

namespace xds::xccl {

class MemberFabric final : public Fabric {
 public:
  // InvalidArgument unless members are distinct parent ranks, ascending, and include the
  // parent's own rank. The parent must outlive the view.
  static Result<std::unique_ptr<MemberFabric>> create(Fabric& parent, std::vector<int> members,
                                                      uint32_t epoch);

  bool peer_alive(int r) override { return parent_.peer_alive(members_[static_cast<size_t>(r)]); }
  Status watch_peer(int r, int pid) override {
    return parent_.watch_peer(members_[static_cast<size_t>(r)], pid);
  }
  // The parent rank of view rank r.
  int parent_rank(int r) const { return members_[static_cast<size_t>(r)]; }
  const std::vector<int>& members() const { return members_; }

 private:
  MemberFabric(Fabric& parent, int rank, std::vector<int> members, uint32_t epoch,
               std::vector<std::byte*> arenas);
  Fabric& parent_;
  std::vector<int> members_;
};

// Zeroes the protocol lines of this device's own arena: the PoisonLine, the DoorbellLine and
// every line and slot of the metadata and managed areas ([kLine, layout.staging)). The
// IdentityLine, the staging and the application area stay. Only while no device uses the
// fabric (step 2 above).
void reset_protocol_lines(Fabric& f);

}  // namespace xds::xccl
