// GroupMembership: which DP groups of an instance serve, and the shell's side of a scale-down
// (P119, docs/design/reliability.md "Scale-down"): a lost group is left out and the others
// form a fabric of their own in three phases (protocol::ReformMsg), each sent to every
// member once every member answered the one before:
//
//   leave_out(g) ─kLeave─▶ members ─ReformedMsg ×M─▶ kReset ─▶ … ─▶ kJoin ─▶ … ─▶ done
//   join(g)      the same, with g (started again) among the members (rejoin)
//
// A member that answers with an error, an answer out of turn, or a reform still running at
// its deadline ends the instance (the shell starts it again, whole).
//
// Thread-safety: not thread-safe; the shell's loop owns it. Pure apart from the clock values
// passed in.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "base/status.h"
#include "protocol/messages.h"

namespace xds::serve {

class GroupMembership {
 public:
  explicit GroupMembership(int n_groups);

  const std::vector<int32_t>& members() const { return members_; }  // serving, ascending
  bool member(int32_t g) const;
  bool reforming() const { return sent_.has_value(); }
  uint64_t generation() const { return generation_; }

  // The members that would go on without `lost`. FailedPrecondition when `lost` is not a
  // member, is the last one, or a reform runs.
  Result<std::vector<int32_t>> without(int32_t lost) const;
  // Starts leaving `lost` out (checked as without()): the kLeave for every member left.
  Result<protocol::ReformMsg> leave_out(int32_t lost, int64_t now_ns, int64_t timeout_ns);
  // Starts taking `g` (started again, loaded) back: the kLeave for every member, g included.
  // FailedPrecondition when g is a member already, out of range, or a reform runs.
  Result<protocol::ReformMsg> join(int32_t g, int64_t now_ns, int64_t timeout_ns);
  // The group the reform in flight leaves out or takes back, and which (-1 when none runs).
  int32_t changing() const { return sent_ ? changing_ : -1; }
  bool joining() const { return joining_; }
  // A member's answer. `send`: the next phase, for every member; `done`: the members formed
  // their fabric (the reform is over). An error ends the instance.
  struct Next {
    std::optional<protocol::ReformMsg> send;
    bool done = false;
    int32_t group = -1;   // done: the group left out or taken back
    bool joined = false;  // done: taken back (join) rather than left out
  };
  Result<Next> on_reformed(const protocol::ReformedMsg& r);
  // The error once a reform runs past its deadline; ok otherwise.
  Status check_deadline(int64_t now_ns) const;

 private:
  Result<protocol::ReformMsg> start(std::vector<int32_t> members, int64_t now_ns,
                                    int64_t timeout_ns);
  int n_groups_;
  std::vector<int32_t> members_;
  int32_t changing_ = -1;
  bool joining_ = false;
  uint64_t generation_ = 0;
  std::optional<protocol::ReformMsg> sent_;  // the phase in flight
  std::vector<int32_t> answered_;            // members that answered it
  int64_t deadline_ns_ = 0;
};

}  // namespace xds::serve
