// etcd's v3 API as its JSON gateway speaks it (grpc-gateway over HTTP/1.1): the request bodies
// the gateway and the instances send, and the answers they read. Pure functions, no I/O;
// serve/etcd_client.h does the HTTP.
//
// Conventions of that gateway (etcd 3.4 and later):
//   - keys and values are base64 (RFC 4648, with padding) inside the JSON;
//   - int64 fields (revision, lease ID, TTL) are JSON strings ("7587899417140579077"); numbers
//     are accepted too;
//   - fields at their default value are left out: a watch event without "type" is a PUT, a
//     keep-alive answer without "TTL" means the lease is gone;
//   - streaming calls (/v3/watch, /v3/lease/keepalive) answer one JSON object per line, each
//     wrapped as {"result": {...}} or {"error": {...}};
//   - a failed unary call answers {"error": "...", "message": "...", "code": N} (a gRPC code).
//
// Thread-safety: pure functions on values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace xds::serve::etcd {

std::string base64_encode(std::string_view bytes);
// InvalidArgument naming `what` for a character outside the alphabet or a bad length.
Result<std::string> base64_decode(std::string_view text, std::string_view what);

// The range_end that, with key = prefix, selects every key starting with `prefix` (the prefix
// with its last byte below 0xff incremented and the rest dropped; "\0" for all keys).
std::string prefix_range_end(std::string_view prefix);

// ---- request bodies ----
std::string range_prefix_request(std::string_view prefix);
// lease 0: no lease.
std::string put_request(std::string_view key, std::string_view value, int64_t lease);
std::string lease_grant_request(int64_t ttl_s);
// /v3/lease/keepalive and /v3/lease/revoke.
std::string lease_id_request(int64_t lease);
// Watches every key under `prefix` from `start_revision` (inclusive), with the previous value
// of deleted keys left out.
std::string watch_create_request(std::string_view prefix, int64_t start_revision);
// Drops the history before `revision` (what an operator's periodic compaction does).
std::string compaction_request(int64_t revision);

// ---- answers ----
struct KeyValue {
  std::string key;    // decoded
  std::string value;  // decoded; empty for a DELETE event
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: none
};

struct RangeAnswer {
  int64_t revision = 0;  // the store's revision the read saw (header.revision)
  std::vector<KeyValue> kvs;
};

enum class WatchEventType { kPut, kDelete };

struct WatchEvent {
  WatchEventType type = WatchEventType::kPut;
  KeyValue kv;
};

// One line of a /v3/watch stream.
struct WatchMessage {
  int64_t revision = 0;  // header.revision: the store's revision when it was sent (0: absent)
  bool created = false;  // the answer to the create request
  bool canceled = false;
  // > 0: the start revision was compacted away; the watch is cancelled and the reader must
  // read everything again (the events in between are lost).
  int64_t compact_revision = 0;
  std::string cancel_reason;
  std::vector<WatchEvent> events;  // in revision order
};

struct LeaseGrant {
  int64_t id = 0;
  int64_t ttl_s = 0;
};

// Each parser: InvalidArgument naming the call and the field for malformed JSON or missing
// fields; Unavailable carrying etcd's message for an {"error": ...} answer.
Result<RangeAnswer> parse_range_answer(std::string_view body);
Result<LeaseGrant> parse_lease_grant_answer(std::string_view body);
// The lease's remaining TTL in seconds; 0 when etcd no longer knows the lease (expired or
// revoked).
Result<int64_t> parse_keepalive_answer(std::string_view body);
// A put, a revoke: only whether etcd answered an error.
Status parse_unary_answer(std::string_view body, std::string_view call);
Result<WatchMessage> parse_watch_message(std::string_view line);

// ---- what an instance publishes ----

// The JSON value under an instance's key:
//   {"address": "tcp://10.0.0.5:8100", "role": "decode", "model": "kjv-moe-tiny",
//    "groups": [0, 1], "load": {"running": 3, "waiting": 0, "kv_usage": 0.25}}
// address, role and groups are required; model and load are informational.
struct InstanceRecord {
  std::string address;          // the shell's ZeroMQ address (tcp://HOST:PORT)
  std::string role;             // colocated | prefill | decode
  std::string model;            // the served model's name
  std::vector<int32_t> groups;  // the DP groups serving, ascending
  int64_t running = 0;          // requests running, over the groups
  int64_t waiting = 0;          // requests waiting, over the groups
  double kv_usage = 0;          // KV blocks used / total, over the groups, in [0, 1]

  bool operator==(const InstanceRecord&) const = default;
};

std::string instance_record_json(const InstanceRecord& r);
// InvalidArgument naming `where` (the key) and the field that is missing or of the wrong type,
// or an address that is not tcp://HOST:PORT or ipc://..., or an unknown role.
Result<InstanceRecord> parse_instance_record(std::string_view json, std::string_view where);

// The key of an instance under `prefix`: prefix + the address without its scheme
// ("/xdeepserve/instances/" + "10.0.0.5:8100"); one key per address, so an instance started
// again at the same address replaces its own entry.
std::string instance_key(std::string_view prefix, std::string_view address);

}  // namespace xds::serve::etcd
