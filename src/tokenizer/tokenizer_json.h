// Fast reader for tokenizer.json: a SAX pass that builds the small parts as a JSON tree but
// streams "model.vocab" (100k+ entries) and "model.merges" straight into flat vectors, instead
// of a std::map-backed DOM (roughly halves load time and memory for the published files).
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace xds {

struct TokenizerJson {
  nlohmann::json root;  // everything except model.vocab / model.merges (left as empty containers)
  std::vector<std::pair<std::string, int64_t>> vocab;            // model.vocab in file order
  std::vector<std::pair<std::string, std::string>> merges;       // model.merges, either form
  bool has_vocab = false, has_merges = false;
};

// `name` prefixes errors ("dir/tokenizer.json: invalid JSON: ...",
// "...: field 'model.merges[7]': expected ...").
Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& name);

}  // namespace xds
