// The gateway's view of the instances registered in etcd: the entries under the prefix, kept
// up to date from one full read (a range) and the watch events after it, with the revision
// bookkeeping that lets a watch resume where the last one stopped (docs/design/membership.md).
//
//   reset(range at revision R)  ──▶ table = the entries read; revision = R
//   apply(watch message)        ──▶ each event newer than `revision` applied; revision = the
//                                   last event's mod_revision
//   next_watch_revision()       ──▶ revision + 1: where a (re)started watch begins
//   a message with compact_revision > 0 ──▶ Aborted: the events since `revision` are lost;
//                                   the caller reads everything again (reset)
//
// Each call returns what changed for the gateway: an instance joined (a key appears, or its
// value changes address), its entry was updated (role, load), or it left (its key was deleted,
// by a lease's expiry or a revoke, or its value stopped parsing). An entry whose value is not a
// valid InstanceRecord is not a member; why is listed in `rejected`.
//
// Thread-safety: not thread-safe; the watcher's thread owns it. Pure.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "serve/etcd_json.h"

namespace xds::serve::etcd {

enum class MemberChangeKind { kJoined, kUpdated, kLeft };

struct MemberChange {
  MemberChangeKind kind = MemberChangeKind::kJoined;
  std::string key;
  InstanceRecord record;  // the new record (kJoined, kUpdated) or the last one (kLeft)
};

struct MemberChanges {
  std::vector<MemberChange> changes;
  std::vector<std::string> rejected;  // entries that are not valid records: why
};

class MembershipTable {
 public:
  explicit MembershipTable(std::string prefix) : prefix_(std::move(prefix)) {}

  // A full read of the prefix replaces the table: entries gone since are kLeft, new ones
  // kJoined, changed ones kUpdated (or kLeft + kJoined when the address changed).
  MemberChanges reset(const RangeAnswer& snapshot);
  // One watch message. Aborted naming the compacted revision when the watch lost events
  // (compact_revision > 0); Unavailable when etcd cancelled the watch otherwise. Events at or
  // below revision() (seen already, e.g. again after a reconnect) are skipped.
  Result<MemberChanges> apply(const WatchMessage& m);

  int64_t revision() const { return revision_; }
  int64_t next_watch_revision() const { return revision_ + 1; }
  const std::map<std::string, InstanceRecord>& members() const { return members_; }

 private:
  // Sets `key` to `value` (parsed) or removes it (deleted, or a value that does not parse).
  void set(const std::string& key, const std::string* value, MemberChanges& out);

  std::string prefix_;
  int64_t revision_ = 0;
  std::map<std::string, InstanceRecord> members_;
};

}  // namespace xds::serve::etcd
