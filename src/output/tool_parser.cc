#include "output/tool_parser.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "output/stop_matcher.h"

namespace xds::output {

using protocol::ToolCall;
namespace {

constexpr std::string_view kDsSectionBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsSectionEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kKimiSectionBegin = "<|tool_calls_section_begin|>";
constexpr std::string_view kKimiSectionEnd = "<|tool_calls_section_end|>";
constexpr std::string_view kKimiCallBegin = "<|tool_call_begin|>";
constexpr std::string_view kKimiCallEnd = "<|tool_call_end|>";
constexpr std::string_view kKimiArgBegin = "<|tool_call_argument_begin|>";
constexpr std::string_view kQwCallBegin = "<tool_call>";
constexpr std::string_view kQwCallEnd = "</tool_call>";

constexpr std::string_view kSpace = " \t\r\n";

// The markers of each format (section markers empty where the format has none).
struct FormatMarkers {
  std::string_view call_begin, call_end, section_begin, section_end;
};

FormatMarkers markers_of(ToolFormat f) {
  switch (f) {
    case ToolFormat::kDeepSeekV3:
      return {kDsCallBegin, kDsCallEnd, kDsSectionBegin, kDsSectionEnd};
    case ToolFormat::kKimiK2:
      return {kKimiCallBegin, kKimiCallEnd, kKimiSectionBegin, kKimiSectionEnd};
    case ToolFormat::kQwen3:
      break;
  }
  return {kQwCallBegin, kQwCallEnd, "", ""};
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(kSpace);
  return s.substr(b, e - b + 1);
}

bool all_space(std::string_view s) {
  return s.find_first_not_of(kSpace) == std::string_view::npos;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Status check_name(std::string_view name) {
  if (name.empty()) return invalid_argument("tool call: empty function name");
  if (name.find_first_of(kSpace) != std::string_view::npos ||
      name.find('<') != std::string_view::npos) {
    return invalid_argument("tool call: function name '{}' has spaces or markers", name);
  }
  return {};
}

}  // namespace

Result<ToolCall> parse_deepseek_v3_call(std::string_view body) {
  const size_t sep = body.find(kDsSep);
  if (sep == std::string_view::npos) return invalid_argument("tool call: no <｜tool▁sep｜>");
  const std::string_view head = trim(body.substr(0, sep));
  const std::string_view tail = body.substr(sep + kDsSep.size());
  ToolCall call;
  std::string_view args;
  if (tail.find("```") != std::string_view::npos) {
    // V3: TYPE<sep>NAME\n```json\nARGS\n```
    if (head != "function") return invalid_argument("tool call: type '{}' is not 'function'", head);
    const size_t nl = tail.find('\n');
    if (nl == std::string_view::npos)
      return invalid_argument("tool call: no newline after the name");
    call.name = std::string(trim(tail.substr(0, nl)));
    std::string_view fenced = trim(tail.substr(nl + 1));
    if (fenced.starts_with("```json")) {
      fenced.remove_prefix(7);
    } else if (fenced.starts_with("```")) {
      fenced.remove_prefix(3);
    } else {
      return invalid_argument("tool call: arguments are not in a ``` block");
    }
    if (!fenced.ends_with("```")) return invalid_argument("tool call: unterminated ``` block");
    fenced.remove_suffix(3);
    args = trim(fenced);
  } else {
    // V3.1: NAME<sep>ARGS
    call.name = std::string(head);
    args = trim(tail);
  }
  XDS_RETURN_IF_ERROR(check_name(call.name));
  const auto parsed = nlohmann::json::parse(args, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) {
    return invalid_argument("tool call '{}': arguments are not a JSON object", call.name);
  }
  call.arguments = std::string(args);
  return call;
}

Result<ToolCall> parse_qwen3_call(std::string_view body) {
  const auto j = nlohmann::ordered_json::parse(trim(body), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return invalid_argument("tool call: body is not a JSON object");
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string()) {
    return invalid_argument("tool call: no string field 'name'");
  }
  ToolCall call;
  call.name = name->get<std::string>();
  XDS_RETURN_IF_ERROR(check_name(call.name));
  const auto args = j.find("arguments");
  if (args == j.end()) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = args->dump();
  } else if (args->is_string()) {  // arguments already serialised by the model
    const std::string text = args->get<std::string>();
    if (!nlohmann::json::parse(text, nullptr, false).is_object()) {
      return invalid_argument("tool call '{}': arguments are not a JSON object", call.name);
    }
    call.arguments = text;
  } else {
    return invalid_argument("tool call '{}': arguments are not a JSON object", call.name);
  }
  return call;
}

Result<ToolCall> parse_kimi_k2_call(std::string_view body) {
  const size_t arg = body.find(kKimiArgBegin);
  if (arg == std::string_view::npos) {
    return invalid_argument("tool call: no <|tool_call_argument_begin|>");
  }
  const std::string_view id = trim(body.substr(0, arg));
  const std::string_view args = trim(body.substr(arg + kKimiArgBegin.size()));
  // functions.NAME:IDX
  const size_t colon = id.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == id.size() ||
      id.substr(colon + 1).find_first_not_of("0123456789") != std::string_view::npos) {
    return invalid_argument("tool call: id '{}' is not NAME:INDEX", id);
  }
  std::string_view name = id.substr(0, colon);
  if (name.starts_with("functions.")) name.remove_prefix(10);
  ToolCall call;
  call.name = std::string(name);
  XDS_RETURN_IF_ERROR(check_name(call.name));
  const auto parsed = nlohmann::json::parse(args, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) {
    return invalid_argument("tool call '{}': arguments are not a JSON object", call.name);
  }
  call.id = std::string(id);
  call.arguments = std::string(args);
  return call;
}

Result<ToolParser> ToolParser::create(std::string_view kind, uint64_t id_seed) {
  if (kind == "deepseek_v3") return ToolParser(ToolFormat::kDeepSeekV3, id_seed);
  if (kind == "qwen3") return ToolParser(ToolFormat::kQwen3, id_seed);
  if (kind == "kimi_k2") return ToolParser(ToolFormat::kKimiK2, id_seed);
  return invalid_argument("tool call parser '{}' is unknown (known: deepseek_v3, qwen3, kimi_k2)",
                          kind);
}

std::string ToolParser::next_id() {
  const uint64_t k = id_seed_ + 0x632be59bd9b4e019ULL * static_cast<uint64_t>(num_calls_ + 1);
  const uint64_t a = splitmix64(k);
  const uint64_t b = splitmix64(a ^ 0xd1b54a32d192ed03ULL);
  return fmt::format("call_{:016x}{:08x}", a, static_cast<uint32_t>(b));
}

void ToolParser::emit_content(std::string_view s, ToolSplit* out) {
  if (s.empty()) return;
  if ((after_call_ || !gap_.empty()) && all_space(s)) {
    gap_.append(s);  // undecided: dropped if a call or the end follows
    return;
  }
  out->content += gap_;
  out->content.append(s);
  gap_.clear();
  gap_has_section_ = false;
  after_call_ = false;
}

void ToolParser::end_call(std::string_view body, ToolSplit* out) {
  Result<ToolCall> call = format_ == ToolFormat::kDeepSeekV3 ? parse_deepseek_v3_call(body)
                          : format_ == ToolFormat::kKimiK2   ? parse_kimi_k2_call(body)
                                                             : parse_qwen3_call(body);
  if (!call.ok()) {
    const FormatMarkers m = markers_of(format_);
    const std::string raw = std::string(m.call_begin) + std::string(body) + std::string(m.call_end);
    out->content += gap_;
    out->content += raw;
    gap_.clear();
    gap_has_section_ = false;
    after_call_ = false;
    return;
  }
  if (call->id.empty()) call->id = next_id();  // Kimi K2 calls carry the model's id
  ++num_calls_;
  out->calls.push_back(std::move(call).value());
  gap_.clear();
  gap_has_section_ = false;
  after_call_ = true;
}

ToolSplit ToolParser::push(std::string_view text) {
  ToolSplit out;
  const FormatMarkers fm = markers_of(format_);
  const std::string_view call_begin = fm.call_begin;
  const std::string_view call_end = fm.call_end;
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(text);
  std::string_view rest = buf;
  while (!rest.empty()) {
    if (in_call_) {
      const size_t pos = rest.find(call_end);
      if (pos == std::string_view::npos) {
        held_.assign(rest);  // the call is not complete yet
        return out;
      }
      end_call(rest.substr(0, pos), &out);
      rest.remove_prefix(pos + call_end.size());
      in_call_ = false;
      continue;
    }
    // Content: the earliest marker decides.
    struct Marker {
      std::string_view text;
      int kind;  // 0 call begin, 1 section begin, 2 section end
    };
    Marker markers[3] = {{call_begin, 0}, {fm.section_begin, 1}, {fm.section_end, 2}};
    size_t best = std::string_view::npos;
    const Marker* hit = nullptr;
    size_t hold = 0;
    for (const Marker& m : markers) {
      if (m.text.empty()) continue;
      const size_t pos = rest.find(m.text);
      if (pos < best) {
        best = pos;
        hit = &m;
      }
      hold = std::max(hold, partial_suffix(rest, m.text));
    }
    if (hit == nullptr) {
      emit_content(rest.substr(0, rest.size() - hold), &out);
      held_.assign(rest.substr(rest.size() - hold));
      return out;
    }
    emit_content(rest.substr(0, best), &out);
    rest.remove_prefix(best + hit->text.size());
    if (hit->kind == 0) {
      in_call_ = true;
    } else if (hit->kind == 1) {
      gap_.append(hit->text);
      gap_has_section_ = true;
    } else if (!after_call_) {
      emit_content(hit->text, &out);  // a section end with no call before it is text
    }
  }
  return out;
}

ToolSplit ToolParser::finish() {
  ToolSplit out;
  if (in_call_) {
    // An unfinished call: its text, marker included, is content.
    out.content += gap_;
    out.content.append(markers_of(format_).call_begin);
    out.content += held_;
    in_call_ = false;
  } else {
    if (gap_has_section_ || !after_call_) out.content += gap_;
    out.content += held_;
  }
  held_.clear();
  gap_.clear();
  gap_has_section_ = false;
  after_call_ = false;
  return out;
}

}  // namespace xds::output
