#include "serve/etcd_json.h"

#include <array>
#include <charconv>

#include <nlohmann/json.hpp>

#include "base/json_depth.h"

namespace xds::serve::etcd {
namespace {

using nlohmann::json;

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// -1 for a byte outside the alphabet.
int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

Result<json> parse_json(std::string_view body, std::string_view call) {
  if (json_nesting_exceeds(body, kMaxJsonDepth)) {
    return invalid_argument("etcd {}: the answer nests deeper than {}", call, kMaxJsonDepth);
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument("etcd {}: the answer is not a JSON object: '{}'", call,
                            body.substr(0, 200));
  }
  return j;
}

// {"error": "...", "message": "...", "code": N} (unary) or {"error": {"message": ...}}
// (streaming): Unavailable with etcd's message; ok otherwise.
Status error_of(const json& j, std::string_view call) {
  auto it = j.find("error");
  if (it == j.end()) return {};
  std::string message;
  if (it->is_string()) {
    message = it->get<std::string>();
  } else if (it->is_object() && it->contains("message") && (*it)["message"].is_string()) {
    message = (*it)["message"].get<std::string>();
  } else {
    message = it->dump();
  }
  return unavailable("etcd {}: {}", call, message);
}

// An int64 field written as a string or a number; `fallback` when absent.
Result<int64_t> int64_field(const json& j, const char* field, std::string_view call,
                            int64_t fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  return invalid_argument("etcd {}: field '{}' is not an int64: {}", call, field, it->dump());
}

// A base64 string field; "" when absent.
Result<std::string> bytes_field(const json& j, const char* field, std::string_view call) {
  auto it = j.find(field);
  if (it == j.end()) return std::string();
  if (!it->is_string()) {
    return invalid_argument("etcd {}: field '{}' is not a string: {}", call, field, it->dump());
  }
  return base64_decode(it->get_ref<const std::string&>(),
                       fmt::format("etcd {} field '{}'", call, field));
}

Result<KeyValue> parse_kv(const json& j, std::string_view call) {
  if (!j.is_object()) return invalid_argument("etcd {}: a kv is not an object: {}", call, j.dump());
  KeyValue kv;
  XDS_ASSIGN_OR_RETURN(kv.key, bytes_field(j, "key", call));
  XDS_ASSIGN_OR_RETURN(kv.value, bytes_field(j, "value", call));
  XDS_ASSIGN_OR_RETURN(kv.mod_revision, int64_field(j, "mod_revision", call, 0));
  XDS_ASSIGN_OR_RETURN(kv.lease, int64_field(j, "lease", call, 0));
  if (kv.key.empty()) return invalid_argument("etcd {}: a kv without a key: {}", call, j.dump());
  return kv;
}

Result<int64_t> header_revision(const json& j, std::string_view call) {
  auto it = j.find("header");
  if (it == j.end() || !it->is_object()) return int64_t{0};
  return int64_field(*it, "revision", call, 0);
}

// A streamed line's {"result": {...}}, or the error it carries.
Result<json> stream_result(std::string_view line, std::string_view call) {
  XDS_ASSIGN_OR_RETURN(json j, parse_json(line, call));
  XDS_RETURN_IF_ERROR(error_of(j, call));
  auto it = j.find("result");
  if (it == j.end() || !it->is_object()) {
    return invalid_argument("etcd {}: a streamed answer without 'result': '{}'", call,
                            line.substr(0, 200));
  }
  return *it;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) |
                       uint32_t{static_cast<uint8_t>(bytes[i + 2])};
    for (int s = 18; s >= 0; s -= 6) out.push_back(kAlphabet[(v >> s) & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

Result<std::string> base64_decode(std::string_view text, std::string_view what) {
  if (text.size() % 4 != 0) {
    return invalid_argument("{}: base64 of length {} (not a multiple of 4)", what, text.size());
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int pad = 0;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      int d = 0;
      if (c == '=' && last && k >= 2 && (k == 3 || text[i + 3] == '=')) {
        ++pad;
      } else if ((d = base64_value(c)) < 0 || pad > 0) {
        return invalid_argument("{}: byte {} ('{}') is not base64", what, i + k,
                                static_cast<unsigned char>(c) < 0x20 ? '?' : c);
      }
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out.push_back(static_cast<char>((v >> 16) & 0xff));
    if (pad < 2) out.push_back(static_cast<char>((v >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(v & 0xff));
  }
  return out;
}

std::string prefix_range_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string range_prefix_request(std::string_view prefix) {
  return json{{"key", base64_encode(prefix)},
              {"range_end", base64_encode(prefix_range_end(prefix))}}
      .dump();
}

std::string put_request(std::string_view key, std::string_view value, int64_t lease) {
  json j{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  return j.dump();
}

std::string lease_grant_request(int64_t ttl_s) {
  return json{{"TTL", std::to_string(ttl_s)}}.dump();
}

std::string lease_id_request(int64_t lease) {
  return json{{"ID", std::to_string(lease)}}.dump();
}

std::string watch_create_request(std::string_view prefix, int64_t start_revision) {
  return json{{"create_request",
               {{"key", base64_encode(prefix)},
                {"range_end", base64_encode(prefix_range_end(prefix))},
                {"start_revision", std::to_string(start_revision)}}}}
      .dump();
}

std::string compaction_request(int64_t revision) {
  return json{{"revision", std::to_string(revision)}, {"physical", true}}.dump();
}

Result<RangeAnswer> parse_range_answer(std::string_view body) {
  XDS_ASSIGN_OR_RETURN(json j, parse_json(body, "range"));
  XDS_RETURN_IF_ERROR(error_of(j, "range"));
  RangeAnswer out;
  XDS_ASSIGN_OR_RETURN(out.revision, header_revision(j, "range"));
  if (out.revision <= 0) return invalid_argument("etcd range: no header.revision in the answer");
  if (auto it = j.find("kvs"); it != j.end()) {
    if (!it->is_array()) return invalid_argument("etcd range: 'kvs' is not an array");
    for (const json& kv : *it) {
      XDS_ASSIGN_OR_RETURN(KeyValue v, parse_kv(kv, "range"));
      out.kvs.push_back(std::move(v));
    }
  }
  return out;
}

Result<LeaseGrant> parse_lease_grant_answer(std::string_view body) {
  XDS_ASSIGN_OR_RETURN(json j, parse_json(body, "lease grant"));
  XDS_RETURN_IF_ERROR(error_of(j, "lease grant"));
  LeaseGrant g;
  XDS_ASSIGN_OR_RETURN(g.id, int64_field(j, "ID", "lease grant", 0));
  XDS_ASSIGN_OR_RETURN(g.ttl_s, int64_field(j, "TTL", "lease grant", 0));
  if (g.id == 0 || g.ttl_s <= 0) {
    return invalid_argument("etcd lease grant: no lease in the answer: '{}'", body.substr(0, 200));
  }
  return g;
}

Result<int64_t> parse_keepalive_answer(std::string_view body) {
  // The first line of the stream (the keep-alive ends it after one answer).
  const std::string_view line = body.substr(0, body.find('\n'));
  XDS_ASSIGN_OR_RETURN(json r, stream_result(line, "lease keepalive"));
  return int64_field(r, "TTL", "lease keepalive", 0);
}

Status parse_unary_answer(std::string_view body, std::string_view call) {
  XDS_ASSIGN_OR_RETURN(json j, parse_json(body, call));
  return error_of(j, call);
}

Result<WatchMessage> parse_watch_message(std::string_view line) {
  XDS_ASSIGN_OR_RETURN(json r, stream_result(line, "watch"));
  WatchMessage m;
  XDS_ASSIGN_OR_RETURN(m.revision, header_revision(r, "watch"));
  m.created = r.value("created", false);
  m.canceled = r.value("canceled", false);
  XDS_ASSIGN_OR_RETURN(m.compact_revision, int64_field(r, "compact_revision", "watch", 0));
  if (auto it = r.find("cancel_reason"); it != r.end() && it->is_string()) {
    m.cancel_reason = it->get<std::string>();
  }
  if (auto it = r.find("events"); it != r.end()) {
    if (!it->is_array()) return invalid_argument("etcd watch: 'events' is not an array");
    for (const json& e : *it) {
      if (!e.is_object() || !e.contains("kv")) {
        return invalid_argument("etcd watch: an event without 'kv': {}", e.dump());
      }
      WatchEvent ev;
      const std::string type =
          e.contains("type") && e["type"].is_string() ? e["type"].get<std::string>() : "PUT";
      if (type == "DELETE") {
        ev.type = WatchEventType::kDelete;
      } else if (type != "PUT") {
        return invalid_argument("etcd watch: event type '{}' (expected PUT or DELETE)", type);
      }
      XDS_ASSIGN_OR_RETURN(ev.kv, parse_kv(e["kv"], "watch"));
      m.events.push_back(std::move(ev));
    }
  }
  return m;
}

std::string instance_record_json(const InstanceRecord& r) {
  return json{{"address", r.address},
              {"role", r.role},
              {"model", r.model},
              {"groups", r.groups},
              {"load", {{"running", r.running}, {"waiting", r.waiting}, {"kv_usage", r.kv_usage}}}}
      .dump();
}

Result<InstanceRecord> parse_instance_record(std::string_view text, std::string_view where) {
  if (json_nesting_exceeds(text, kMaxJsonDepth)) {
    return invalid_argument("etcd entry {}: nests deeper than {}", where, kMaxJsonDepth);
  }
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument("etcd entry {}: the value is not a JSON object", where);
  }
  auto string_field = [&](const char* field, bool required) -> Result<std::string> {
    auto it = j.find(field);
    if (it == j.end() && !required) return std::string();
    if (it == j.end() || !it->is_string()) {
      return invalid_argument("etcd entry {}: field '{}' must be a string", where, field);
    }
    return it->get<std::string>();
  };
  InstanceRecord r;
  XDS_ASSIGN_OR_RETURN(r.address, string_field("address", true));
  XDS_ASSIGN_OR_RETURN(r.role, string_field("role", true));
  XDS_ASSIGN_OR_RETURN(r.model, string_field("model", false));
  const bool tcp = r.address.starts_with("tcp://") && r.address.find(':', 6) != std::string::npos;
  if (!tcp && !(r.address.starts_with("ipc://") && r.address.size() > 6)) {
    return invalid_argument(
        "etcd entry {}: field 'address' must be tcp://HOST:PORT or ipc://PATH, "
        "got '{}'",
        where, r.address);
  }
  if (r.role != "colocated" && r.role != "prefill" && r.role != "decode") {
    return invalid_argument(
        "etcd entry {}: field 'role' must be colocated, prefill or decode, "
        "got '{}'",
        where, r.role);
  }
  auto groups = j.find("groups");
  if (groups == j.end() || !groups->is_array()) {
    return invalid_argument("etcd entry {}: field 'groups' must be an array of group numbers",
                            where);
  }
  for (const json& g : *groups) {
    if (!g.is_number_integer() || g.get<int64_t>() < 0 || g.get<int64_t>() > 1023) {
      return invalid_argument("etcd entry {}: field 'groups' holds {}, not a group number", where,
                              g.dump());
    }
    r.groups.push_back(g.get<int32_t>());
  }
  if (auto load = j.find("load"); load != j.end() && load->is_object()) {
    // Informational: a field of another type is left at 0 (an integer count must be an
    // integer: a float such as 1e30 has no int64 value).
    auto field = [&](const char* name, bool integer) -> const json* {
      auto it = load->find(name);
      if (it == load->end()) return nullptr;
      return (integer ? it->is_number_integer() : it->is_number()) ? &*it : nullptr;
    };
    if (const json* v = field("running", true)) r.running = v->get<int64_t>();
    if (const json* v = field("waiting", true)) r.waiting = v->get<int64_t>();
    if (const json* v = field("kv_usage", false)) r.kv_usage = v->get<double>();
  }
  return r;
}

std::string instance_key(std::string_view prefix, std::string_view address) {
  const size_t scheme = address.find("://");
  return std::string(prefix) +
         std::string(scheme == std::string_view::npos ? address : address.substr(scheme + 3));
}

}  // namespace xds::serve::etcd
