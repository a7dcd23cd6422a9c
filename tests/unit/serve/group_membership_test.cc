// The shell's side of a scale-down (serve/group_membership.h): who is left, the three phases
// each sent once every member answered the one before, and what ends the instance instead
// (an error, an answer out of turn, the deadline).
#include "serve/group_membership.h"

#include <gtest/gtest.h>

namespace xds::serve {
namespace {

using protocol::ReformedMsg;
using protocol::ReformPhase;

ReformedMsg answer(int32_t g, ReformPhase p, uint64_t generation = 1, std::string error = {}) {
  return ReformedMsg{g, p, generation, std::move(error)};
}

TEST(GroupMembership, ThreePhasesEachOnceEveryMemberAnswered) {
  GroupMembership m(3);
  EXPECT_EQ(m.members(), (std::vector<int32_t>{0, 1, 2}));
  auto leave = m.leave_out(1, 0, 1000);
  ASSERT_TRUE(leave.ok()) << leave.status().to_string();
  EXPECT_EQ(leave->phase, ReformPhase::kLeave);
  EXPECT_EQ(leave->generation, 1u);
  EXPECT_EQ(leave->members, (std::vector<int32_t>{0, 2}));
  EXPECT_TRUE(m.reforming());
  EXPECT_FALSE(m.member(1));
  for (ReformPhase p : {ReformPhase::kLeave, ReformPhase::kReset}) {
    auto first = m.on_reformed(answer(2, p));
    ASSERT_TRUE(first.ok());
    EXPECT_FALSE(first->send);  // group 0 has not answered
    auto again = m.on_reformed(answer(2, p));  // a repeated answer counts once
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->send);
    auto last = m.on_reformed(answer(0, p));
    ASSERT_TRUE(last.ok());
    ASSERT_TRUE(last->send);
    EXPECT_EQ(last->send->phase, p == ReformPhase::kLeave ? ReformPhase::kReset : ReformPhase::kJoin);
    EXPECT_EQ(last->send->members, (std::vector<int32_t>{0, 2}));
    EXPECT_FALSE(last->done);
  }
  ASSERT_TRUE(m.on_reformed(answer(0, ReformPhase::kJoin)).ok());
  auto done = m.on_reformed(answer(2, ReformPhase::kJoin));
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);
  EXPECT_FALSE(done->send);
  EXPECT_EQ(done->group, 1);
  EXPECT_FALSE(done->joined);
  EXPECT_FALSE(m.reforming());
  EXPECT_EQ(m.generation(), 1u);
  // The next loss: generation 2; the last group can never be left out.
  auto next = m.leave_out(0, 0, 1000);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->generation, 2u);
  EXPECT_EQ(next->members, (std::vector<int32_t>{2}));
}

TEST(GroupMembership, ALostGroupJoinsAgainThroughTheSamePhases) {
  GroupMembership m(3);
  ASSERT_TRUE(m.leave_out(1, 0, 1000).ok());
  for (ReformPhase p : {ReformPhase::kLeave, ReformPhase::kReset, ReformPhase::kJoin}) {
    ASSERT_TRUE(m.on_reformed(answer(0, p)).ok());
    ASSERT_TRUE(m.on_reformed(answer(2, p)).ok());
  }
  EXPECT_FALSE(m.join(0, 0, 1000).ok());  // serves
  EXPECT_FALSE(m.join(3, 0, 1000).ok());  // no such group
  auto leave = m.join(1, 0, 1000);
  ASSERT_TRUE(leave.ok()) << leave.status().to_string();
  EXPECT_EQ(leave->generation, 2u);
  EXPECT_EQ(leave->members, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(m.joining());
  EXPECT_EQ(m.changing(), 1);
  for (ReformPhase p : {ReformPhase::kLeave, ReformPhase::kReset, ReformPhase::kJoin}) {
    ASSERT_TRUE(m.on_reformed(answer(0, p, 2)).ok());
    ASSERT_TRUE(m.on_reformed(answer(2, p, 2)).ok());
    auto last = m.on_reformed(answer(1, p, 2));  // the group taking part answers too
    ASSERT_TRUE(last.ok());
    if (p != ReformPhase::kJoin) {
      ASSERT_TRUE(last->send);
      EXPECT_EQ(last->send->members, (std::vector<int32_t>{0, 1, 2}));
    } else {
      EXPECT_TRUE(last->done);
      EXPECT_EQ(last->group, 1);
      EXPECT_TRUE(last->joined);
    }
  }
  EXPECT_EQ(m.members(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(m.generation(), 2u);
  EXPECT_EQ(m.changing(), -1);
}

TEST(GroupMembership, WhatCannotBeLeftOut) {
  GroupMembership m(2);
  EXPECT_FALSE(m.without(5).ok());  // not a member
  ASSERT_TRUE(m.leave_out(0, 0, 1000).ok());
  EXPECT_EQ(m.leave_out(1, 0, 1000).status().code(), StatusCode::kFailedPrecondition);  // busy
  GroupMembership one(1);
  const Status last = one.without(0).status();
  EXPECT_EQ(last.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(last.message().find("last"), std::string::npos);
}

TEST(GroupMembership, AFailedPhaseAnAnswerOutOfTurnOrTheDeadlineEndTheInstance) {
  GroupMembership m(3);
  ASSERT_TRUE(m.leave_out(2, 100, 1000).ok());
  EXPECT_TRUE(m.check_deadline(1100).ok());
  EXPECT_EQ(m.check_deadline(1101).code(), StatusCode::kDeadlineExceeded);
  // A phase not sent yet, another generation, a group left out: out of turn.
  EXPECT_FALSE(m.on_reformed(answer(0, ReformPhase::kJoin)).ok());
  EXPECT_FALSE(m.on_reformed(answer(0, ReformPhase::kLeave, 2)).ok());
  EXPECT_FALSE(m.on_reformed(answer(2, ReformPhase::kLeave)).ok());
  const Status failed =
      m.on_reformed(answer(1, ReformPhase::kLeave, 1, "no copy of expert 3")).status();
  EXPECT_EQ(failed.code(), StatusCode::kAborted);
  EXPECT_NE(failed.message().find("no copy of expert 3"), std::string::npos);
}

}  // namespace
}  // namespace xds::serve
