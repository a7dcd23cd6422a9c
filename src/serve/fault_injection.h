// Fault injection (POST /admin/faults with --fault-injection): the JSON schema of a fault, its
// validation, and the gateway's log of the faults it sent and what followed each.
//
//   {"kind": "kill" | "hang" | "exchange_error" | "link_delay" | "link_drop" |
//            "retire_kv_blocks" | "kv_corrupt",
//    "instance": I,        // the instance's index in the gateway's list (0: serve's first)
//    "group": G,           // its DP group
//    "after_steps": S,     // that group's steps after the fault arrives (default 0)
//    "duration_ms": D,     // link_delay / link_drop: how long the link misbehaves (> 0)
//    "blocks": B}          // retire_kv_blocks: how many of the group's KV blocks in use;
//                          // kv_corrupt: how many blocks of its next KV pull (a decode
//                          // group) land corrupted (default 1)
//
// The gateway answers 202 {"id": N} once the instance's shell forwarded it to the group, and
// GET /admin/faults lists every fault with what the gateway saw afterwards (the instance
// failed and recovered, a rollback, ...).
//
// Thread-safety: parse_fault is pure; FaultLog is not thread-safe (the gateway's mutex).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "protocol/payloads.h"

namespace xds::serve {

// "kill", "hang", ...; "unknown" for a value outside the enum.
const char* fault_kind_name(protocol::FaultKind kind);

// The body of POST /admin/faults, checked against the gateway's `instances`. InvalidArgument
// naming the field that is wrong (the group's upper bound is the shell's to check).
Result<protocol::FaultSpec> parse_fault(std::string_view body, int32_t instances);

nlohmann::json fault_json(const protocol::FaultSpec& f);

class FaultLog {
 public:
  // A fault the shell accepted; its id is f.id.
  void accepted(const protocol::FaultSpec& f, int64_t now_ns);
  // Something the gateway saw on `instance` ("failed: DP group 1 was killed", "recovered"):
  // appended, with the seconds since the fault, to every fault of that instance.
  void observe(int32_t instance, const std::string& what, int64_t now_ns);
  // {"faults": [{"id", "kind", ..., "after": [{"s": 0.4, "event": "..."}]}]}
  nlohmann::json to_json() const;

 private:
  struct Entry {
    protocol::FaultSpec fault;
    int64_t accepted_ns = 0;
    std::vector<std::pair<double, std::string>> after;
  };
  std::vector<Entry> entries_;
};

}  // namespace xds::serve
