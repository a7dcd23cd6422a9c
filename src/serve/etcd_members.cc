#include "serve/etcd_members.h"

#include <optional>
#include <set>

namespace xds::serve::etcd {

void MembershipTable::set(const std::string& key, const std::string* value, MemberChanges& out) {
  auto known = members_.find(key);
  std::optional<InstanceRecord> record;
  if (value != nullptr) {
    auto parsed = parse_instance_record(*value, key);
    if (parsed.ok()) {
      record = std::move(*parsed);
    } else {
      out.rejected.push_back(parsed.status().message());
    }
  }
  if (!record) {
    if (known != members_.end()) {
      out.changes.push_back({MemberChangeKind::kLeft, key, known->second});
      members_.erase(known);
    }
    return;
  }
  if (known == members_.end()) {
    out.changes.push_back({MemberChangeKind::kJoined, key, *record});
    members_.emplace(key, std::move(*record));
    return;
  }
  if (known->second.address != record->address) {  // another instance under the same key
    out.changes.push_back({MemberChangeKind::kLeft, key, known->second});
    out.changes.push_back({MemberChangeKind::kJoined, key, *record});
  } else if (known->second != *record) {
    out.changes.push_back({MemberChangeKind::kUpdated, key, *record});
  }
  known->second = std::move(*record);
}

MemberChanges MembershipTable::reset(const RangeAnswer& snapshot) {
  MemberChanges out;
  std::set<std::string> seen;
  for (const KeyValue& kv : snapshot.kvs) {
    if (!kv.key.starts_with(prefix_)) continue;
    seen.insert(kv.key);
    set(kv.key, &kv.value, out);
  }
  for (auto it = members_.begin(); it != members_.end();) {
    if (seen.count(it->first)) {
      ++it;
      continue;
    }
    out.changes.push_back({MemberChangeKind::kLeft, it->first, it->second});
    it = members_.erase(it);
  }
  revision_ = snapshot.revision;
  return out;
}

Result<MemberChanges> MembershipTable::apply(const WatchMessage& m) {
  if (m.compact_revision > 0) {
    return aborted("etcd watch from revision {}: compacted up to revision {}; reading {} again",
                   next_watch_revision(), m.compact_revision, prefix_);
  }
  if (m.canceled) {
    return unavailable("etcd watch of {} cancelled: {}", prefix_,
                       m.cancel_reason.empty() ? "no reason given" : m.cancel_reason);
  }
  MemberChanges out;
  for (const WatchEvent& e : m.events) {
    if (e.kv.mod_revision <= revision_) continue;  // seen already
    revision_ = e.kv.mod_revision;
    if (!e.kv.key.starts_with(prefix_)) continue;
    set(e.kv.key, e.type == WatchEventType::kPut ? &e.kv.value : nullptr, out);
  }
  return out;
}

}  // namespace xds::serve::etcd
