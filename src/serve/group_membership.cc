#include "serve/group_membership.h"

#include <algorithm>

#include <fmt/format.h>

namespace xds::serve {

GroupMembership::GroupMembership(int n_groups) : n_groups_(n_groups) {
  for (int32_t g = 0; g < n_groups; ++g) members_.push_back(g);
}

bool GroupMembership::member(int32_t g) const {
  return std::find(members_.begin(), members_.end(), g) != members_.end();
}

Result<std::vector<int32_t>> GroupMembership::without(int32_t lost) const {
  if (reforming()) return failed_precondition("a scale-down is already in progress");
  if (!member(lost)) return failed_precondition("DP group {} is not serving", lost);
  if (members_.size() < 2) return failed_precondition("DP group {} is the last one", lost);
  std::vector<int32_t> left;
  for (int32_t g : members_) {
    if (g != lost) left.push_back(g);
  }
  return left;
}

Result<protocol::ReformMsg> GroupMembership::leave_out(int32_t lost, int64_t now_ns,
                                                       int64_t timeout_ns) {
  XDS_ASSIGN_OR_RETURN(std::vector<int32_t> left, without(lost));
  changing_ = lost;
  joining_ = false;
  return start(std::move(left), now_ns, timeout_ns);
}

Result<protocol::ReformMsg> GroupMembership::join(int32_t g, int64_t now_ns, int64_t timeout_ns) {
  if (reforming()) return failed_precondition("a reform is already in progress");
  if (g < 0 || g >= n_groups_ || member(g)) {
    return failed_precondition("DP group {} cannot join (it serves, or there is none)", g);
  }
  std::vector<int32_t> members = members_;
  members.insert(std::upper_bound(members.begin(), members.end(), g), g);
  changing_ = g;
  joining_ = true;
  return start(std::move(members), now_ns, timeout_ns);
}

Result<protocol::ReformMsg> GroupMembership::start(std::vector<int32_t> members, int64_t now_ns,
                                                   int64_t timeout_ns) {
  members_ = std::move(members);
  protocol::ReformMsg m;
  m.phase = protocol::ReformPhase::kLeave;
  m.generation = generation_ + 1;
  m.members = members_;
  sent_ = m;
  answered_.clear();
  deadline_ns_ = now_ns + timeout_ns;
  return m;
}

Result<GroupMembership::Next> GroupMembership::on_reformed(const protocol::ReformedMsg& r) {
  if (!sent_ || r.generation != sent_->generation || r.phase != sent_->phase ||
      !member(r.group)) {
    return failed_precondition("scale-down: an answer out of turn from DP group {} (phase {}, "
                               "generation {})",
                               r.group, static_cast<int>(r.phase), r.generation);
  }
  if (!r.error.empty()) {
    return aborted("scale-down: DP group {} failed phase {}: {}", r.group,
                   static_cast<int>(r.phase), r.error);
  }
  if (std::find(answered_.begin(), answered_.end(), r.group) == answered_.end()) {
    answered_.push_back(r.group);
  }
  Next next;
  if (answered_.size() < members_.size()) return next;
  answered_.clear();
  if (sent_->phase == protocol::ReformPhase::kJoin) {
    generation_ = sent_->generation;
    sent_.reset();
    next.done = true;
    next.group = changing_;
    next.joined = joining_;
    return next;
  }
  sent_->phase = sent_->phase == protocol::ReformPhase::kLeave ? protocol::ReformPhase::kReset
                                                               : protocol::ReformPhase::kJoin;
  next.send = *sent_;
  return next;
}

Status GroupMembership::check_deadline(int64_t now_ns) const {
  if (!sent_ || now_ns <= deadline_ns_) return {};
  return deadline_exceeded("scale-down: DP groups did not finish phase {} in time ({} of {} "
                           "answered)",
                           static_cast<int>(sent_->phase), answered_.size(), members_.size());
}

}  // namespace xds::serve
