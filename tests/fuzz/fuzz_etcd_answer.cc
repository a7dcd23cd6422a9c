// Fuzz target: what the gateway and the instances read from etcd (serve/etcd_json.h,
// serve/etcd_members.h) -- answers of etcd's JSON gateway and the instance records anyone with
// write access to etcd can put. Input: one selector byte, then the text:
//   0 range answer   1 watch line   2 keep-alive answer   3 lease grant   4 instance record
//
// Checked beyond "no crash, no hang, no exception": a failure is InvalidArgument (malformed) or
// Unavailable (etcd's own error answer); a parsed record survives a round trip through
// instance_record_json(); a parsed range or watch message applies to a membership table whose
// every member is then a valid record.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/check.h"
#include "serve/etcd_json.h"
#include "serve/etcd_members.h"

namespace {

using namespace xds::serve::etcd;

void check_failure(const xds::Status& st) {
  XDS_CHECK(
      st.code() == xds::StatusCode::kInvalidArgument || st.code() == xds::StatusCode::kUnavailable,
      "{}", st.to_string());
}

void check_members(const MembershipTable& t) {
  for (const auto& [key, record] : t.members()) {
    auto again = parse_instance_record(instance_record_json(record), key);
    XDS_CHECK(again.ok() && *again == record, "member {} does not round-trip", key);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  MembershipTable table("/p/");
  switch (data[0] % 5) {
    case 0: {
      auto r = parse_range_answer(text);
      if (!r.ok()) return check_failure(r.status()), 0;
      (void)table.reset(*r);
      XDS_CHECK(table.revision() == r->revision, "the table's revision is not the read's");
      check_members(table);
      break;
    }
    case 1: {
      auto m = parse_watch_message(text);
      if (!m.ok()) return check_failure(m.status()), 0;
      auto applied = table.apply(*m);
      if (!applied.ok()) {
        XDS_CHECK(m->canceled || m->compact_revision > 0, "{}", applied.status().to_string());
      }
      check_members(table);
      break;
    }
    case 2: {
      auto ttl = parse_keepalive_answer(text);
      if (!ttl.ok()) check_failure(ttl.status());
      break;
    }
    case 3: {
      auto g = parse_lease_grant_answer(text);
      if (!g.ok()) return check_failure(g.status()), 0;
      XDS_CHECK(g->id != 0 && g->ttl_s > 0, "a grant without a lease was accepted");
      break;
    }
    default: {
      auto r = parse_instance_record(text, "/p/fuzz");
      if (!r.ok()) return check_failure(r.status()), 0;
      auto again = parse_instance_record(instance_record_json(*r), "/p/fuzz");
      XDS_CHECK(again.ok() && *again == *r, "a record does not round-trip");
      break;
    }
  }
  return 0;
}
