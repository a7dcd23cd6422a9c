// Reading a checkpoint's config.json / generation_config.json: the pieces every
// architecture's config parser shares, so that their errors read alike:
//   "<file>: field '<key>': expected <what>, found <json value>".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace xds::config_json {

using json = nlohmann::json;

// A short rendering of a JSON value for error messages (at most 80 characters).
std::string excerpt(const json& v);

// InvalidArgument "<source>: field '<key>': expected <expected>, found <v>".
Status field_error(std::string_view source, std::string_view key, std::string_view expected,
                   const json& v);

// An integer in [min_value, max_value]; else field_error naming the range.
Result<int64_t> get_int(std::string_view source, std::string_view key, const json& v,
                        int64_t min_value, int64_t max_value = INT64_MAX);

// eos_token_id: an integer >= 0 or a non-empty list of them; null gives none.
Result<std::vector<int64_t>> get_token_ids(std::string_view source, std::string_view key,
                                           const json& v);

// InvalidArgument "<source>: field '<key>': expected <expected>, found <value>", for checks
// across fields (the value already parsed).
Status cross_error(std::string_view source, std::string_view key, std::string_view expected,
                   int64_t value);

// The eos and bos ids inside the vocabulary; `source` names the file that set them.
Status check_token_ids(std::string_view source, const std::vector<int64_t>& eos_token_ids,
                       const std::optional<int64_t>& bos_token_id, int64_t vocab_size);

// Field parsers for any config with `std::optional<int64_t> bos_token_id` and
// `std::vector<int64_t> eos_token_ids`: bos null or an id >= 0; eos as get_token_ids.
template <class Config>
Status parse_bos(std::string_view source, std::string_view key, const json& v, Config& c) {
  if (v.is_null()) return {};
  XDS_ASSIGN_OR_RETURN(int64_t id, get_int(source, key, v, 0));
  c.bos_token_id = id;
  return {};
}

template <class Config>
Status parse_eos(std::string_view source, std::string_view key, const json& v, Config& c) {
  XDS_ASSIGN_OR_RETURN(c.eos_token_ids, get_token_ids(source, key, v));
  return {};
}

// A finite number > 0; else field_error.
Result<double> get_positive_double(std::string_view source, std::string_view key, const json& v);

// The class of a pointer to member (for the field parsers below).
template <class T>
struct member_class;
template <class C, class V>
struct member_class<V C::*> {
  using type = C;
};
template <auto M>
using member_class_t = typename member_class<decltype(M)>::type;

// Field parsers of a config table (FieldSpec rows), each storing into the member M of the
// family's config: an integer in [kMin, kMax], a finite number > 0, or a boolean.
template <auto M, int64_t kMin, int64_t kMax = INT64_MAX>
Status parse_int_field(std::string_view source, std::string_view key, const json& v,
                       member_class_t<M>& c) {
  XDS_ASSIGN_OR_RETURN(c.*M, get_int(source, key, v, kMin, kMax));
  return {};
}

template <auto M>
Status parse_positive_field(std::string_view source, std::string_view key, const json& v,
                            member_class_t<M>& c) {
  XDS_ASSIGN_OR_RETURN(c.*M, get_positive_double(source, key, v));
  return {};
}

template <auto M>
Status parse_bool_field(std::string_view source, std::string_view key, const json& v,
                        member_class_t<M>& c) {
  if (!v.is_boolean()) return field_error(source, key, "true or false", v);
  c.*M = v.get<bool>();
  return {};
}

// `text` parsed as a JSON object; InvalidArgument naming `source` otherwise.
Result<json> parse_object(const std::string& text, const std::string& source);

// generation_config.json in `dir`, if present, overrides the eos and bos ids read from
// config.json (as Hugging Face's generate() takes them from there). Returns that file's path
// when it was read (for the caller's checks of the ids against its vocabulary), else "".
Result<std::string> apply_generation_config(const std::string& dir,
                                            std::vector<int64_t>& eos_token_ids,
                                            std::optional<int64_t>& bos_token_id);

// The checkpoint directory's last path component ("dir/" included): the model's name.
std::string checkpoint_name(const std::string& dir);

}  // namespace xds::config_json
