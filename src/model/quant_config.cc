#include "model/quant_config.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include <fmt/format.h>

#include "model/config_json.h"

namespace xds {
namespace {

using json = nlohmann::json;
using config_json::field_error;

// obj[field] must equal `want` (absent: `absent_ok` decides; null counts as absent only
// where want is null). `what` describes the expected value.
Status expect_value(std::string_view source, const std::string& path, const json& obj,
                    const char* field, const json& want, bool absent_ok) {
  const std::string key = path + "." + field;
  auto it = obj.find(field);
  if (it == obj.end()) {
    if (absent_ok) return {};
    return field_error(source, key, want.dump(), json());
  }
  if (*it != want) return field_error(source, key, want.dump(), *it);
  return {};
}

// weights or input_activations of the one config group.
Status check_args(std::string_view source, const std::string& path, const json& v,
                  const char* strategy, bool dynamic) {
  if (!v.is_object()) return field_error(source, path, "an object", v);
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "num_bits", 8, false));
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "type", "int", false));
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "symmetric", true, true));
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "strategy", strategy, false));
  // Activations: dynamic must be stated (compressed-tensors' default is static).
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "dynamic", dynamic, !dynamic));
  for (const char* f : {"group_size", "block_structure", "actorder"}) {
    XDS_RETURN_IF_ERROR(expect_value(source, path, v, f, nullptr, true));
  }
  return {};
}

// A W8A8 group's weights, input_activations and output_activations (its targets checked by
// the caller).
Status check_w8a8_args(std::string_view source, const std::string& path, const json& g) {
  if (!g.contains("weights")) return field_error(source, path + ".weights", "an object", json());
  XDS_RETURN_IF_ERROR(check_args(source, path + ".weights", g["weights"], "channel", false));
  if (!g.contains("input_activations")) {
    return field_error(source, path + ".input_activations",
                       "an object (W8A8: per-token dynamic int8 activations)", json());
  }
  XDS_RETURN_IF_ERROR(
      check_args(source, path + ".input_activations", g["input_activations"], "token", true));
  return expect_value(source, path, g, "output_activations", nullptr, true);
}

Status check_group(std::string_view source, const std::string& path, const json& g) {
  if (!g.is_object()) return field_error(source, path, "an object", g);
  XDS_RETURN_IF_ERROR(expect_value(source, path, g, "targets", json::array({"Linear"}), false));
  return check_w8a8_args(source, path, g);
}

// The weights of a pack-quantized group (4-bit, per group of columns) into q.
Status parse_w4_weights(std::string_view source, const std::string& path, const json& v,
                        IntQuantization& q) {
  if (!v.is_object()) return field_error(source, path, "an object", v);
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "num_bits", 4, false));
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "type", "int", false));
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "strategy", "group", false));
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "dynamic", false, true));
  XDS_RETURN_IF_ERROR(expect_value(source, path, v, "block_structure", nullptr, true));
  const json sym = v.value("symmetric", json(true));
  if (!sym.is_boolean()) return field_error(source, path + ".symmetric", "true or false", sym);
  q.symmetric = sym.get<bool>();
  const json g = v.value("group_size", json());
  if (!g.is_number_integer() || !(g == 32 || g == 64 || g == 128)) {
    return field_error(source, path + ".group_size", "32, 64 or 128", g);
  }
  q.group_size = g.get<int64_t>();
  const json a = v.value("actorder", json());
  if (a.is_null()) {
    q.actorder = Int4ActOrder::kNone;
  } else if (a == "group") {
    q.actorder = Int4ActOrder::kGroup;
  } else if (a == "weight") {
    q.actorder = Int4ActOrder::kWeight;
  } else {
    return field_error(source, path + ".actorder", "null, \"group\" or \"weight\"", a);
  }
  return {};
}

// A pack-quantized group: 4-bit weights, W4A16 (no input_activations) or W4A8.
Status check_w4_group(std::string_view source, const std::string& path, const json& g,
                      IntQuantization& q) {
  if (!g.is_object()) return field_error(source, path, "an object", g);
  XDS_RETURN_IF_ERROR(expect_value(source, path, g, "targets", json::array({"Linear"}), false));
  if (!g.contains("weights")) return field_error(source, path + ".weights", "an object", json());
  XDS_RETURN_IF_ERROR(parse_w4_weights(source, path + ".weights", g["weights"], q));
  const json a = g.value("input_activations", json());
  if (a.is_null()) {
    q.scheme = IntScheme::kW4A16;
  } else {
    XDS_RETURN_IF_ERROR(check_args(source, path + ".input_activations", a, "token", true));
    q.scheme = IntScheme::kW4A8;
  }
  return expect_value(source, path, g, "output_activations", nullptr, true);
}

// quant_method "gptq" (layout 3 of the header).
Result<IntQuantization> parse_gptq(std::string_view source, const std::string& k, const json& v) {
  IntQuantization q;
  q.scheme = IntScheme::kW4A16;
  q.format = Int4Format::kGptq;
  q.quantized_by_tensors = true;
  XDS_RETURN_IF_ERROR(expect_value(source, k, v, "bits", 4, false));
  const json g = v.value("group_size", json());
  if (!g.is_number_integer() || !(g == 32 || g == 64 || g == 128)) {
    return field_error(source, k + ".group_size", "32, 64 or 128", g);
  }
  q.group_size = g.get<int64_t>();
  for (const char* f : {"desc_act", "sym"}) {
    const json b = v.value(f, json(f == std::string_view("sym")));
    if (!b.is_boolean()) return field_error(source, k + "." + f, "true or false", b);
  }
  q.symmetric = v.value("sym", true);
  q.actorder = v.value("desc_act", false) ? Int4ActOrder::kGroup : Int4ActOrder::kNone;
  const json fmt_v = v.value("checkpoint_format", json("gptq"));
  if (fmt_v != "gptq" && fmt_v != "gptq_v2") {
    return field_error(source, k + ".checkpoint_format", "\"gptq\" or \"gptq_v2\"", fmt_v);
  }
  q.gptq_zero_minus_one = fmt_v == "gptq";
  return q;
}

// A list of module names and "re:" patterns (ignore, or a group's targets) into names and
// compiled patterns; `key` names the list in errors.
Status parse_module_list(std::string_view source, const std::string& path, const json& v,
                         std::vector<std::string>& names,
                         std::vector<IntQuantization::IgnorePattern>& patterns) {
  if (!v.is_array()) return field_error(source, path, "a list of module names", v);
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string key = fmt::format("{}[{}]", path, i);
    if (!v[i].is_string()) return field_error(source, key, "a module name or \"re:<regex>\"", v[i]);
    const std::string s = v[i].get<std::string>();
    if (!s.starts_with("re:")) {
      names.push_back(s);
      continue;
    }
    const std::string pattern = s.substr(3);
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                                     pattern.size(), PCRE2_UTF, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return field_error(source, key,
                         fmt::format("a valid regular expression ({} at offset {})",
                                     reinterpret_cast<const char*>(message), offset),
                         v[i]);
    }
    patterns.push_back({pattern, std::shared_ptr<const void>(code, [](const void* c) {
                          pcre2_code_free(static_cast<pcre2_code*>(const_cast<void*>(c)));
                        })});
  }
  return {};
}

// Whether `module` is one of `names` or matches one of `patterns` from its start (re.match:
// anchored at the start, not at the end).
bool module_listed(std::string_view module, const std::vector<std::string>& names,
                   const std::vector<IntQuantization::IgnorePattern>& patterns) {
  for (const std::string& n : names) {
    if (n == module) return true;
  }
  for (const IntQuantization::IgnorePattern& p : patterns) {
    const auto* code = static_cast<const pcre2_code*>(p.re.get());
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(module.data()), module.size(),
                               0, PCRE2_ANCHORED, md, nullptr);
    pcre2_match_data_free(md);
    if (rc >= 0) return true;
  }
  return false;
}

// Layout 2b's int8 group targets: a non-empty list of distinct entries of
// int8_head_and_kv_b_targets().
Status parse_int8_targets(std::string_view source, const std::string& path, const json& v,
                          IntQuantization& q) {
  const std::vector<std::string> allowed = int8_head_and_kv_b_targets();
  const std::string want =
      "[\"Linear\"] (the 4-bit group) or a non-empty list of distinct entries of " +
      json(allowed).dump() + " (the int8 group)";
  if (!v.is_array() || v.empty()) return field_error(source, path, want, v);
  for (size_t i = 0; i < v.size(); ++i) {
    const bool known = v[i].is_string() && std::find(allowed.begin(), allowed.end(),
                                                     v[i].get<std::string>()) != allowed.end();
    const bool repeated = std::find(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v[i]) !=
                          v.begin() + static_cast<std::ptrdiff_t>(i);
    if (!known || repeated) return field_error(source, fmt::format("{}[{}]", path, i), want, v[i]);
  }
  return parse_module_list(source, path, v, q.int8_target_names, q.int8_target_patterns);
}

// Layout 2b: the two groups of a "mixed-precision" config into q, in either order.
Status parse_mixed_groups(std::string_view source, const std::string& groups_key,
                          const json& groups, IntQuantization& q) {
  if (!groups.is_object() || groups.size() != 2) {
    return field_error(source, groups_key,
                       "two groups (format \"mixed-precision\": a 4-bit [\"Linear\"] group "
                       "and an int8 group for lm_head / kv_b_proj)",
                       groups);
  }
  bool have_w4 = false, have_int8 = false;
  for (auto it = groups.begin(); it != groups.end(); ++it) {
    const std::string path = groups_key + "." + it.key();
    const json& g = it.value();
    if (!g.is_object()) return field_error(source, path, "an object", g);
    const json targets = g.value("targets", json());
    const bool linear = targets == json::array({"Linear"});
    if (linear ? have_w4 : have_int8) {
      return field_error(source, path + ".targets",
                         linear ? "not [\"Linear\"] again (the int8 group names its modules)"
                                : "[\"Linear\"] (one group is the 4-bit one)",
                         targets);
    }
    if (linear) {
      XDS_RETURN_IF_ERROR(expect_value(source, path, g, "format", "pack-quantized", false));
      XDS_RETURN_IF_ERROR(check_w4_group(source, path, g, q));
      have_w4 = true;
    } else {
      XDS_RETURN_IF_ERROR(parse_int8_targets(source, path + ".targets", targets, q));
      XDS_RETURN_IF_ERROR(expect_value(source, path, g, "format", "int-quantized", false));
      XDS_RETURN_IF_ERROR(check_w8a8_args(source, path, g));
      have_int8 = true;
    }
  }
  return {};
}

}  // namespace

bool IntQuantization::quantizes(std::string_view module) const {
  if (quantized_by_tensors) return true;
  return !module_listed(module, ignore_names, ignore_patterns);
}

IntScheme IntQuantization::scheme_of(std::string_view module) const {
  if (int4() && module_listed(module, int8_target_names, int8_target_patterns)) {
    return IntScheme::kW8A8;
  }
  return scheme;
}

std::vector<std::string> int8_head_and_kv_b_targets() {
  return {"lm_head", "re:.*kv_b_proj$", "re:.*shared_head\\.head$"};
}

const char* int_scheme_name(IntScheme s) {
  switch (s) {
    case IntScheme::kW8A8:
      return "w8a8";
    case IntScheme::kW4A16:
      return "w4a16";
    case IntScheme::kW4A8:
      return "w4a8";
  }
  return "?";
}

Result<IntQuantization> parse_int_quantization(std::string_view source, std::string_view key,
                                               const json& v) {
  const std::string k(key);
  if (!v.is_object()) return field_error(source, k, "an object", v);
  if (v.value("quant_method", json()) == "gptq") return parse_gptq(source, k, v);
  XDS_RETURN_IF_ERROR(expect_value(source, k, v, "quant_method", "compressed-tensors", false));
  const json format = v.value("format", json());
  if (format != "int-quantized" && format != "pack-quantized" && format != "mixed-precision") {
    return field_error(source, k + ".format",
                       "\"int-quantized\" (W8A8), \"pack-quantized\" (W4A16, W4A8) or "
                       "\"mixed-precision\" (W4 with an int8 lm_head / kv_b_proj group)",
                       format);
  }
  const bool w4 = format == "pack-quantized";
  XDS_RETURN_IF_ERROR(expect_value(source, k, v, "quantization_status", "compressed", true));
  XDS_RETURN_IF_ERROR(expect_value(source, k, v, "kv_cache_scheme", nullptr, true));
  if (v.contains("sparsity_config")) {
    const json& s = v["sparsity_config"];
    if (!s.is_null() && !(s.is_object() && s.empty())) {
      return field_error(source, k + ".sparsity_config", "null or {} (no sparsity)", s);
    }
  }
  const std::string groups_key = k + ".config_groups";
  const json groups = v.value("config_groups", json());
  IntQuantization q;
  if (format == "mixed-precision") {
    q.format = Int4Format::kPackQuantized;
    XDS_RETURN_IF_ERROR(parse_mixed_groups(source, groups_key, groups, q));
  } else if (!groups.is_object() || groups.size() != 1) {
    return field_error(source, groups_key,
                       "an object with exactly one group (two: format \"mixed-precision\")",
                       groups);
  } else if (const std::string group_key = groups_key + "." + groups.begin().key(); w4) {
    q.format = Int4Format::kPackQuantized;
    XDS_RETURN_IF_ERROR(check_w4_group(source, group_key, groups.begin().value(), q));
  } else {
    XDS_RETURN_IF_ERROR(check_group(source, group_key, groups.begin().value()));
  }
  if (v.contains("ignore") && !v["ignore"].is_null()) {
    XDS_RETURN_IF_ERROR(
        parse_module_list(source, k + ".ignore", v["ignore"], q.ignore_names, q.ignore_patterns));
  }
  return q;
}

nlohmann::ordered_json w8a8_quantization_json(const std::vector<std::string>& ignore) {
  using ojson = nlohmann::ordered_json;
  auto args = [](const char* strategy, bool dynamic) {
    return ojson{{"num_bits", 8},        {"type", "int"},
                 {"symmetric", true},    {"group_size", nullptr},
                 {"strategy", strategy}, {"block_structure", nullptr},
                 {"dynamic", dynamic},   {"actorder", nullptr},
                 {"observer", "minmax"}, {"observer_kwargs", ojson::object()}};
  };
  ojson group = {{"targets", {"Linear"}},
                 {"weights", args("channel", false)},
                 {"input_activations", args("token", true)},
                 {"output_activations", nullptr}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "int-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", group}}},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"sparsity_config", ojson::object()},
          {"global_compression_ratio", nullptr}};
}

}  // namespace xds

namespace xds {

nlohmann::ordered_json w4_pack_quantized_json(int64_t group_size, bool symmetric,
                                              bool int8_activations,
                                              const std::vector<std::string>& ignore) {
  using ojson = nlohmann::ordered_json;
  ojson weights = {{"num_bits", 4},          {"type", "int"},
                   {"symmetric", symmetric}, {"group_size", group_size},
                   {"strategy", "group"},    {"block_structure", nullptr},
                   {"dynamic", false},       {"actorder", nullptr},
                   {"observer", "minmax"},   {"observer_kwargs", ojson::object()}};
  ojson acts = nullptr;
  if (int8_activations) {
    acts = {{"num_bits", 8},       {"type", "int"},
            {"symmetric", true},   {"group_size", nullptr},
            {"strategy", "token"}, {"block_structure", nullptr},
            {"dynamic", true},     {"actorder", nullptr},
            {"observer", nullptr}, {"observer_kwargs", ojson::object()}};
  }
  ojson group = {{"targets", {"Linear"}},
                 {"weights", weights},
                 {"input_activations", acts},
                 {"output_activations", nullptr}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", group}}},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"sparsity_config", ojson::object()},
          {"global_compression_ratio", nullptr}};
}

nlohmann::ordered_json w4_int8_head_quantization_json(int64_t group_size, bool symmetric,
                                                      bool int8_activations,
                                                      const std::vector<std::string>& ignore) {
  using ojson = nlohmann::ordered_json;
  ojson q = w4_pack_quantized_json(group_size, symmetric, int8_activations, ignore);
  q["format"] = "mixed-precision";
  ojson& w4_group = q["config_groups"]["group_0"];
  w4_group["format"] = "pack-quantized";
  ojson int8_group = w8a8_quantization_json({})["config_groups"]["group_0"];
  int8_group["targets"] = int8_head_and_kv_b_targets();
  int8_group["format"] = "int-quantized";
  q["config_groups"]["group_1"] = int8_group;
  return q;
}

nlohmann::ordered_json w4_gptq_json(int64_t group_size, bool symmetric) {
  return {{"quant_method", "gptq"},     {"bits", 4},
          {"group_size", group_size},   {"desc_act", false},
          {"sym", symmetric},           {"damp_percent", 0.01},
          {"true_sequential", true},    {"static_groups", false},
          {"checkpoint_format", "gptq"}};
}

}  // namespace xds
