// Optional typed fields of the objects in tokenizer.json and tokenizer_config.json.
// nlohmann's value(key, fallback) throws when the field holds another type (a string where a
// bool belongs); field_or() returns a Status naming the file and the field instead, so that a
// malformed file is an error, never an exception escaping the loader. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace xds::json_field {

// What each supported type is called in errors.
template <typename T>
constexpr const char* type_word() {
  if constexpr (std::is_same_v<T, bool>)
    return "a boolean";
  else if constexpr (std::is_same_v<T, std::string>)
    return "a string";
  else
    return "an integer";
}

// obj[key] as a T (bool, int64_t or std::string), or `fallback` when obj is not an object or
// the field is absent or null. `where` is the object's path ("decoder.decoders[1]"), `file`
// the file's name; errors read "<file>: field '<where>.<key>': expected a boolean, got "x"".
template <typename T>
Result<T> field_or(const nlohmann::json& obj, const char* key, T fallback, const std::string& file,
                   const std::string& where) {
  static_assert(std::is_same_v<T, bool> || std::is_same_v<T, int64_t> ||
                std::is_same_v<T, std::string>);
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else if constexpr (std::is_same_v<T, std::string>) {
    ok = it->is_string();
  } else {
    ok = it->is_number_integer() &&
         !(it->is_number_unsigned() &&
           it->template get<uint64_t>() >
               static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  }
  if (!ok) {
    std::string found = it->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (found.size() > 80) found = found.substr(0, 77) + "...";
    return invalid_argument("{}: field '{}{}{}': expected {}, got {}", file, where,
                            where.empty() ? "" : ".", key, type_word<T>(), found);
  }
  return it->template get<T>();
}

}  // namespace xds::json_field
