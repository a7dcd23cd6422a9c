// Internal to src/tokenizer: the state behind Tokenizer, shared by its two loaders
// (tokenizer.cc for tokenizer.json, tokenizer_tiktoken.cc for tiktoken.model).
// Thread-safety: immutable once a loader has returned it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tiktoken_model.h"
#include "tokenizer/tokenizer.h"

namespace xds {

struct Tokenizer::Impl {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  BpeModel model;                        // tokenizer.json's model (unused with tiktoken)
  std::optional<TiktokenModel> tiktoken;  // set: words are encoded by tiktoken's rank rule
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher;   // added tokens with normalized == false
  AddedTokenMatcher norm_matcher;  // added tokens with normalized == true
  int64_t vocab_size = 0;
  std::vector<std::string> pieces;  // [vocab_size] bytes each id decodes to
  std::vector<uint8_t> special;     // [vocab_size] 1 for special added tokens
  std::vector<int32_t> prefix, suffix;  // post-processor ids around the sequence
  std::string bos_token, eos_token;
  std::optional<int32_t> bos_id, eos_id;
  bool clean_up_spaces = false;
  int strip_leading = 0;  // decoder strips this many leading strip_char from the output
  char strip_char = ' ';
};

namespace tokenizer_detail {

// JSON text -> tree, refusing nesting deeper than kMaxJsonDepth; errors name `name`.
Result<nlohmann::json> parse_json(std::string_view text, const std::string& name);
// tokenizer_config.json token fields are a string, {"content": ...} (AddedToken) or null ("").
std::string config_token(const nlohmann::json& cfg, const char* key);
// tokenizer_config.json's add_bos_token / add_eos_token into impl->prefix / suffix (after
// bos_id / eos_id are set); errors name `cfg_name`. Returns whether either field was present.
Result<bool> apply_config_bos_eos(const nlohmann::json& cfg, const std::string& cfg_name,
                                  Tokenizer::Impl* impl);

}  // namespace tokenizer_detail
}  // namespace xds
