#include "xccl/member_fabric.h"

#include <algorithm>
#include <cstring>

namespace xds::xccl {

Result<std::unique_ptr<MemberFabric>> MemberFabric::create(Fabric& parent, std::vector<int> members,
                                                           uint32_t epoch) {
  const auto me = std::find(members.begin(), members.end(), parent.rank());
  if (members.empty() || me == members.end()) {
    return invalid_argument("member fabric: rank {} is not among the {} member(s)", parent.rank(),
                            members.size());
  }
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= parent.world_size() ||
        (i > 0 && members[i] <= members[i - 1])) {
      return invalid_argument(
          "member fabric: members must be distinct ranks of the {} device(s), ascending; "
          "member {} is {}",
          parent.world_size(), i, members[i]);
    }
  }
  std::vector<std::byte*> arenas;
  for (int r : members) arenas.push_back(parent.arena(r));
  const int rank = static_cast<int>(me - members.begin());
  return std::unique_ptr<MemberFabric>(
      new MemberFabric(parent, rank, std::move(members), epoch, std::move(arenas)));
}

MemberFabric::MemberFabric(Fabric& parent, int rank, std::vector<int> members, uint32_t epoch,
                           std::vector<std::byte*> arenas)
    : Fabric(rank, epoch, parent.layout(), std::move(arenas)),
      parent_(parent),
      members_(std::move(members)) {
  for (size_t i = 0; i < members_.size(); ++i) set_region(static_cast<int>(i), parent.region(members_[i]));
}

void reset_protocol_lines(Fabric& f) {
  std::byte* base = f.local();
  const uint64_t end = f.layout().staging;
  // Plain stores: nobody reads these lines until the next step of the protocol above, which
  // the shell orders after this (a socket round trip, a full barrier between the devices).
  std::memset(base + kLine, 0, end - kLine);
}

}  // namespace xds::xccl
