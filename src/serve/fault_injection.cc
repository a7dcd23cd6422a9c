#include "serve/fault_injection.h"

#include <array>

namespace xds::serve {
namespace {

using protocol::FaultKind;

constexpr std::array<std::pair<FaultKind, const char*>, 7> kKinds = {{
    {FaultKind::kKill, "kill"},
    {FaultKind::kHang, "hang"},
    {FaultKind::kExchangeError, "exchange_error"},
    {FaultKind::kLinkDelay, "link_delay"},
    {FaultKind::kLinkDrop, "link_drop"},
    {FaultKind::kRetireKvBlocks, "retire_kv_blocks"},
    {FaultKind::kKvCorrupt, "kv_corrupt"},
}};

// The integer field `name` of `j` into *out (absent: unchanged), at least `min`.
Status read_int(const nlohmann::json& j, const char* name, int64_t min, int64_t* out) {
  const auto it = j.find(name);
  if (it == j.end()) return {};
  if (!it->is_number_integer()) {
    return invalid_argument("fault: '{}' must be an integer, got {}", name, it->dump());
  }
  const int64_t v = it->get<int64_t>();
  if (v < min) return invalid_argument("fault: '{}' must be at least {}, got {}", name, min, v);
  *out = v;
  return {};
}

}  // namespace

const char* fault_kind_name(FaultKind kind) {
  for (const auto& [k, name] : kKinds) {
    if (k == kind) return name;
  }
  return "unknown";
}

Result<protocol::FaultSpec> parse_fault(std::string_view body, int32_t instances) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument("fault: the body must be a JSON object");
  }
  for (const auto& [key, value] : j.items()) {
    static constexpr std::array<const char*, 6> kFields = {
        "kind", "instance", "group", "after_steps", "duration_ms", "blocks"};
    bool known = false;
    for (const char* f : kFields) known = known || key == f;
    if (!known) return invalid_argument("fault: unknown field '{}'", key);
  }
  protocol::FaultSpec f;
  const auto kind = j.find("kind");
  if (kind == j.end() || !kind->is_string()) {
    return invalid_argument(
        "fault: 'kind' is required: kill, hang, exchange_error, link_delay, link_drop, "
        "retire_kv_blocks or kv_corrupt");
  }
  bool found = false;
  for (const auto& [k, name] : kKinds) {
    if (*kind == name) {
      f.kind = k;
      found = true;
    }
  }
  if (!found) {
    return invalid_argument(
        "fault: unknown kind '{}' (kill, hang, exchange_error, link_delay, link_drop, "
        "retire_kv_blocks, kv_corrupt)",
        kind->get<std::string>());
  }
  int64_t instance = 0, group = 0;
  XDS_RETURN_IF_ERROR(read_int(j, "instance", 0, &instance));
  XDS_RETURN_IF_ERROR(read_int(j, "group", 0, &group));
  XDS_RETURN_IF_ERROR(read_int(j, "after_steps", 0, &f.after_steps));
  XDS_RETURN_IF_ERROR(read_int(j, "duration_ms", 0, &f.duration_ms));
  XDS_RETURN_IF_ERROR(read_int(j, "blocks", 1, &f.blocks));
  if (instance >= instances) {
    return invalid_argument("fault: 'instance' {} is out of range: the gateway has {}", instance,
                            instances);
  }
  if (group > 1024) return invalid_argument("fault: 'group' {} is out of range", group);
  const bool link = f.kind == FaultKind::kLinkDelay || f.kind == FaultKind::kLinkDrop;
  if (link && f.duration_ms <= 0) {
    return invalid_argument("fault: {} needs 'duration_ms' > 0", fault_kind_name(f.kind));
  }
  f.instance = static_cast<int32_t>(instance);
  f.group = static_cast<int32_t>(group);
  return f;
}

nlohmann::json fault_json(const protocol::FaultSpec& f) {
  nlohmann::json j = {{"id", f.id},
                      {"kind", fault_kind_name(f.kind)},
                      {"instance", f.instance},
                      {"group", f.group},
                      {"after_steps", f.after_steps}};
  if (f.duration_ms > 0) j["duration_ms"] = f.duration_ms;
  if (f.kind == FaultKind::kRetireKvBlocks || f.kind == FaultKind::kKvCorrupt)
    j["blocks"] = f.blocks;
  return j;
}

void FaultLog::accepted(const protocol::FaultSpec& f, int64_t now_ns) {
  entries_.push_back(Entry{f, now_ns, {}});
}

void FaultLog::observe(int32_t instance, const std::string& what, int64_t now_ns) {
  for (Entry& e : entries_) {
    if (e.fault.instance == instance) {
      e.after.emplace_back(static_cast<double>(now_ns - e.accepted_ns) * 1e-9, what);
    }
  }
}

nlohmann::json FaultLog::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const Entry& e : entries_) {
    nlohmann::json j = fault_json(e.fault);
    nlohmann::json after = nlohmann::json::array();
    for (const auto& [s, event] : e.after) after.push_back({{"s", s}, {"event", event}});
    j["after"] = std::move(after);
    list.push_back(std::move(j));
  }
  return {{"faults", std::move(list)}};
}

}  // namespace xds::serve
