#include "model/config_json.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "base/read_file.h"

namespace xds::config_json {

std::string excerpt(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

Status field_error(std::string_view source, std::string_view key, std::string_view expected,
                   const json& v) {
  return invalid_argument("{}: field '{}': expected {}, found {}", source, key, expected,
                          excerpt(v));
}

Result<int64_t> get_int(std::string_view source, std::string_view key, const json& v,
                        int64_t min_value, int64_t max_value) {
  const std::string what = max_value == INT64_MAX
                               ? fmt::format("an integer >= {}", min_value)
                               : fmt::format("an integer in [{}, {}]", min_value, max_value);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(max_value)) return field_error(source, key, what, v);
    if (static_cast<int64_t>(u) < min_value) return field_error(source, key, what, v);
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < min_value || i > max_value) return field_error(source, key, what, v);
    return i;
  }
  return field_error(source, key, what, v);
}

Result<std::vector<int64_t>> get_token_ids(std::string_view source, std::string_view key,
                                           const json& v) {
  std::vector<int64_t> ids;
  if (v.is_null()) return ids;
  if (v.is_array()) {
    if (v.empty()) return field_error(source, key, "an integer or a non-empty list", v);
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0) {
        return field_error(source, key, "an integer >= 0 or a list of them", v);
      }
      ids.push_back(e.get<int64_t>());
    }
    return ids;
  }
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    return field_error(source, key, "an integer >= 0 or a list of them", v);
  }
  ids.push_back(v.get<int64_t>());
  return ids;
}

Result<json> parse_object(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("{}: not valid JSON", source);
  if (!j.is_object()) {
    return invalid_argument("{}: expected a JSON object at the top level, found {}", source,
                            excerpt(j));
  }
  return j;
}

Result<std::string> apply_generation_config(const std::string& dir,
                                            std::vector<int64_t>& eos_token_ids,
                                            std::optional<int64_t>& bos_token_id) {
  const std::string path = dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return std::string();
  XDS_ASSIGN_OR_RETURN(const std::string text, read_whole_file(path));
  XDS_ASSIGN_OR_RETURN(const json g, parse_object(text, path));
  if (const auto it = g.find("eos_token_id"); it != g.end() && !it->is_null()) {
    XDS_ASSIGN_OR_RETURN(eos_token_ids, get_token_ids(path, "eos_token_id", *it));
  }
  if (const auto it = g.find("bos_token_id"); it != g.end() && !it->is_null()) {
    XDS_ASSIGN_OR_RETURN(bos_token_id, get_int(path, "bos_token_id", *it, 0));
  }
  return path;
}

Result<double> get_positive_double(std::string_view source, std::string_view key, const json& v) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() > 0)) {
    return field_error(source, key, "a finite number > 0", v);
  }
  return v.get<double>();
}

std::string checkpoint_name(const std::string& dir) {
  std::filesystem::path path(dir);
  if (path.filename().empty()) path = path.parent_path();  // "dir/"
  return path.filename().string();
}

Status cross_error(std::string_view source, std::string_view key, std::string_view expected,
                   int64_t value) {
  return invalid_argument("{}: field '{}': expected {}, found {}", source, key, expected, value);
}

Status check_token_ids(std::string_view source, const std::vector<int64_t>& eos_token_ids,
                       const std::optional<int64_t>& bos_token_id, int64_t vocab_size) {
  for (int64_t id : eos_token_ids) {
    if (id >= vocab_size) {
      return cross_error(source, "eos_token_id", fmt::format("ids < vocab_size ({})", vocab_size),
                         id);
    }
  }
  if (bos_token_id && *bos_token_id >= vocab_size) {
    return cross_error(source, "bos_token_id", fmt::format("an id < vocab_size ({})", vocab_size),
                       *bos_token_id);
  }
  return {};
}

}  // namespace xds::config_json
