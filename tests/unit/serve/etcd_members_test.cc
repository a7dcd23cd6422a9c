// The gateway's membership table against hand-built etcd answers: a full read, watch events
// (puts, deletes by lease expiry, stale duplicates after a reconnect), a compaction, and
// entries that are not valid records.
#include "serve/etcd_members.h"

#include <gtest/gtest.h>

namespace xds::serve::etcd {
namespace {

constexpr const char* kPrefix = "/xdeepserve/instances/";

std::string record(const std::string& host_port, const std::string& role, int64_t running = 0) {
  return R"({"address":"tcp://)" + host_port + R"(","role":")" + role +
         R"(","model":"m","groups":[0],"load":{"running":)" + std::to_string(running) + "}}";
}

KeyValue kv(const std::string& host_port, std::string value, int64_t rev) {
  return KeyValue{std::string(kPrefix) + host_port, std::move(value), rev, 77};
}

WatchEvent put(const std::string& host_port, std::string value, int64_t rev) {
  return {WatchEventType::kPut, kv(host_port, std::move(value), rev)};
}

WatchEvent del(const std::string& host_port, int64_t rev) {
  return {WatchEventType::kDelete, KeyValue{std::string(kPrefix) + host_port, "", rev, 0}};
}

TEST(EtcdMembers, ResetReportsJoinsAndSetsTheRevision) {
  MembershipTable t(kPrefix);
  RangeAnswer r;
  r.revision = 12;
  r.kvs = {kv("h:1", record("h:1", "prefill"), 5), kv("h:2", record("h:2", "decode"), 9)};
  const MemberChanges c = t.reset(r);
  ASSERT_EQ(c.changes.size(), 2u);
  EXPECT_EQ(c.changes[0].kind, MemberChangeKind::kJoined);
  EXPECT_EQ(c.changes[0].record.address, "tcp://h:1");
  EXPECT_EQ(c.changes[1].record.role, "decode");
  EXPECT_EQ(t.revision(), 12);
  EXPECT_EQ(t.next_watch_revision(), 13);
  EXPECT_EQ(t.members().size(), 2u);
}

TEST(EtcdMembers, WatchEventsJoinUpdateAndLeave) {
  MembershipTable t(kPrefix);
  RangeAnswer r;
  r.revision = 3;
  r.kvs = {kv("h:1", record("h:1", "colocated"), 3)};
  (void)t.reset(r);

  WatchMessage m;
  m.events = {put("h:2", record("h:2", "colocated"), 4),     // a new instance
              put("h:1", record("h:1", "colocated", 5), 5),  // h:1's load changed
              del("h:1", 6)};                                // h:1's lease expired
  auto c = t.apply(m);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->changes.size(), 3u);
  EXPECT_EQ(c->changes[0].kind, MemberChangeKind::kJoined);
  EXPECT_EQ(c->changes[0].key, "/xdeepserve/instances/h:2");
  EXPECT_EQ(c->changes[1].kind, MemberChangeKind::kUpdated);
  EXPECT_EQ(c->changes[1].record.running, 5);
  EXPECT_EQ(c->changes[2].kind, MemberChangeKind::kLeft);
  EXPECT_EQ(c->changes[2].record.address, "tcp://h:1");
  EXPECT_EQ(t.revision(), 6);
  EXPECT_EQ(t.members().size(), 1u);
  EXPECT_EQ(t.members().begin()->first, "/xdeepserve/instances/h:2");

  // The same put again (unchanged) is no change; a delete of an unknown key neither.
  WatchMessage same;
  same.events = {put("h:2", record("h:2", "colocated"), 7), del("h:9", 8)};
  auto none = t.apply(same);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->changes.empty());
  EXPECT_EQ(t.revision(), 8);
}

TEST(EtcdMembers, EventsSeenAlreadyAreSkipped) {
  MembershipTable t(kPrefix);
  RangeAnswer r;
  r.revision = 10;
  r.kvs = {kv("h:1", record("h:1", "decode"), 10)};
  (void)t.reset(r);
  // A watch restarted from an older revision repeats a delete that the read already reflects.
  WatchMessage old;
  old.events = {del("h:1", 9), put("h:3", record("h:3", "decode"), 10)};
  auto c = t.apply(old);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->changes.empty());
  EXPECT_EQ(t.members().size(), 1u);
  EXPECT_EQ(t.revision(), 10);
}

TEST(EtcdMembers, AnAddressChangeUnderOneKeyIsALeaveAndAJoin) {
  MembershipTable t(kPrefix);
  RangeAnswer r;
  r.revision = 2;
  r.kvs = {kv("h:1", record("h:1", "decode"), 2)};
  (void)t.reset(r);
  WatchMessage m;
  m.events = {put("h:1", record("h:7", "decode"), 3)};
  auto c = t.apply(m);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->changes.size(), 2u);
  EXPECT_EQ(c->changes[0].kind, MemberChangeKind::kLeft);
  EXPECT_EQ(c->changes[0].record.address, "tcp://h:1");
  EXPECT_EQ(c->changes[1].kind, MemberChangeKind::kJoined);
  EXPECT_EQ(c->changes[1].record.address, "tcp://h:7");
}

TEST(EtcdMembers, AnInvalidValueIsNotAMemberAndIsReported) {
  MembershipTable t(kPrefix);
  RangeAnswer r;
  r.revision = 4;
  r.kvs = {kv("h:1", record("h:1", "decode"), 3), kv("h:2", "{\"address\":1}", 4)};
  const MemberChanges c = t.reset(r);
  ASSERT_EQ(c.changes.size(), 1u);
  ASSERT_EQ(c.rejected.size(), 1u);
  EXPECT_NE(c.rejected[0].find("/xdeepserve/instances/h:2"), std::string::npos);
  // h:1's value turns invalid: it leaves.
  WatchMessage m;
  m.events = {put("h:1", "garbage", 5)};
  auto left = t.apply(m);
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->changes.size(), 1u);
  EXPECT_EQ(left->changes[0].kind, MemberChangeKind::kLeft);
  EXPECT_TRUE(t.members().empty());
}

TEST(EtcdMembers, CompactionAbortsAndAReadAgainGivesTheDifference) {
  MembershipTable t(kPrefix);
  RangeAnswer r;
  r.revision = 5;
  r.kvs = {kv("h:1", record("h:1", "decode"), 4), kv("h:2", record("h:2", "decode"), 5)};
  (void)t.reset(r);
  WatchMessage compacted;
  compacted.canceled = true;
  compacted.compact_revision = 9;
  auto c = t.apply(compacted);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kAborted);
  EXPECT_NE(c.status().message().find("9"), std::string::npos);
  // Meanwhile h:1 left and h:3 came: the read after the compaction says so.
  RangeAnswer again;
  again.revision = 20;
  again.kvs = {kv("h:2", record("h:2", "decode"), 5), kv("h:3", record("h:3", "prefill"), 18)};
  const MemberChanges d = t.reset(again);
  ASSERT_EQ(d.changes.size(), 2u);
  EXPECT_EQ(d.changes[0].kind, MemberChangeKind::kJoined);
  EXPECT_EQ(d.changes[0].record.address, "tcp://h:3");
  EXPECT_EQ(d.changes[1].kind, MemberChangeKind::kLeft);
  EXPECT_EQ(d.changes[1].record.address, "tcp://h:1");
  EXPECT_EQ(t.next_watch_revision(), 21);

  WatchMessage cancelled;
  cancelled.canceled = true;
  cancelled.cancel_reason = "permission denied";
  auto e = t.apply(cancelled);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace xds::serve::etcd
