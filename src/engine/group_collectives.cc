#include "engine/group_collectives.h"

#include <algorithm>
#include <thread>

namespace xds::engine {

Result<std::unique_ptr<GroupCollectives>> GroupCollectives::create(
    xccl::Fabric& instance, int64_t step_timeout_ms, std::function<void(int)> wait_hook,
    int sync_ranks) {
  std::unique_ptr<GroupCollectives> c(
      new GroupCollectives(instance, step_timeout_ms, std::move(wait_hook)));
  c->sync_ranks_ = sync_ranks;
  for (int r = 0; r < instance.world_size(); ++r) c->members_.push_back(r);
  XDS_RETURN_IF_ERROR(c->build_on(instance));
  return c;
}

Status GroupCollectives::build_on(xccl::Fabric& f) {
  XDS_ASSIGN_OR_RETURN(auto transport, xccl::make_transport("shm", f));
  auto mailbox = std::make_unique<xccl::Mailbox>(f, *transport);
  std::vector<int> ranks;
  const int synced = sync_ranks_ > 0 ? std::min(sync_ranks_, f.world_size()) : f.world_size();
  for (int r = 0; r < synced; ++r) ranks.push_back(r);
  auto sync = std::make_unique<StepSync>(*mailbox, std::move(ranks), step_timeout_ms_);
  // Waits inside collectives answer heartbeats, on this thread only, naming the group.
  f.set_wait_hook([this, self = std::this_thread::get_id()](int blocking) {
    if (wait_hook_ && std::this_thread::get_id() == self) wait_hook_(member(blocking));
  });
  sync_ = std::move(sync);
  mailbox_ = std::move(mailbox);
  transport_ = std::move(transport);
  return {};
}

Status GroupCollectives::reform(std::vector<int> members, uint64_t generation) {
  if (generation <= generation_ || generation > 0xFF) {
    return invalid_argument("scale-down: generation {} after {} (at most 255)", generation,
                            generation_);
  }
  for (int g : members) {
    if (g < 0 || g >= instance_.world_size()) {
      return invalid_argument("scale-down: DP group {} is not one of the instance's {}", g,
                              instance_.world_size());
    }
  }
  const uint32_t epoch = static_cast<uint32_t>(generation << 12) | (instance_.epoch() & 0xFFF);
  XDS_ASSIGN_OR_RETURN(auto view, xccl::MemberFabric::create(instance_, members, epoch));
  const std::vector<int> before = members_;
  members_ = std::move(members);
  Status st = build_on(*view);
  if (!st.ok()) {
    members_ = before;
    return st;
  }
  view_ = std::move(view);  // the old view (if any) goes after everything built on it
  generation_ = generation;
  return {};
}

}  // namespace xds::engine
