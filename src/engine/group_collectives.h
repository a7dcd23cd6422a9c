// GroupCollectives: what a DP group steps together with the other groups of its instance on
// -- the fabric, its transport, mailbox and step-header exchange -- and how that changes when
// the instance scales down (P119, docs/design/reliability.md "Scale-down").
//
// At start the fabric is the instance's (every group; rank = group id). After a scale-down
// it is an xccl::MemberFabric over the groups that go on (`members`, group ids ascending;
// rank i = members[i]) under epoch (generation << 12) | (instance epoch mod 4096), so that no
// key of an earlier fabric matches. Everything above (the expert exchange, EPLB) addresses
// ranks of fabric(); member() turns a rank back into a group id (heartbeats name groups).
//
// Thread-safety: the device's collective thread only (as the Mailbox).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "engine/step_sync.h"
#include "xccl/fabric.h"
#include "xccl/mailbox.h"
#include "xccl/member_fabric.h"
#include "xccl/transport.h"

namespace xds::engine {

class GroupCollectives {
 public:
  // Over the instance's fabric. wait_hook(group) is called from inside waits (Fabric::
  // set_wait_hook) with the group waited on. sync_ranks > 0: the step headers go between
  // ranks 0 .. sync_ranks - 1 only (an A/E instance: its attention groups; the expert devices
  // after them take no part); 0: every rank.
  static Result<std::unique_ptr<GroupCollectives>> create(xccl::Fabric& instance,
                                                          int64_t step_timeout_ms,
                                                          std::function<void(int)> wait_hook,
                                                          int sync_ranks = 0);

  xccl::Fabric& fabric() { return view_ ? static_cast<xccl::Fabric&>(*view_) : instance_; }
  xccl::Mailbox& mailbox() { return *mailbox_; }
  StepSync& sync() { return *sync_; }
  const std::vector<int>& members() const { return members_; }
  int member(int rank) const { return rank < 0 ? rank : members_[static_cast<size_t>(rank)]; }
  uint64_t generation() const { return generation_; }

  // The scale-down's second phase: clears this device's arena's protocol lines
  // (xccl::reset_protocol_lines). Only once every member stopped using the fabric.
  void reset_own_lines() { xccl::reset_protocol_lines(fabric()); }
  // The third: the fabric of `members` (group ids, ascending, a subset of the current ones
  // holding this group) under `generation` (> the current one), with a new transport,
  // mailbox and step sync. On error nothing changes.
  Status reform(std::vector<int> members, uint64_t generation);

 private:
  GroupCollectives(xccl::Fabric& instance, int64_t step_timeout_ms,
                   std::function<void(int)> wait_hook)
      : instance_(instance), step_timeout_ms_(step_timeout_ms), wait_hook_(std::move(wait_hook)) {}
  // Transport, mailbox and step sync on `f` (fabric() after the call).
  Status build_on(xccl::Fabric& f);

  xccl::Fabric& instance_;
  int64_t step_timeout_ms_;
  std::function<void(int)> wait_hook_;
  int sync_ranks_ = 0;
  std::vector<int> members_;  // [fabric().world_size()] group id of each rank
  uint64_t generation_ = 0;
  std::unique_ptr<xccl::MemberFabric> view_;  // after a scale-down
  std::unique_ptr<xccl::Transport> transport_;
  std::unique_ptr<xccl::Mailbox> mailbox_;
  std::unique_ptr<StepSync> sync_;
};

}  // namespace xds::engine
