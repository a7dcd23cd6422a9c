// tiktoken's BPE as Kimi K2 publishes it: a `tiktoken.model` text file of lines
// "base64(token bytes) rank", the rank being the token's id. Encoding a word (raw bytes,
// already split by the pre-tokenizer) follows tiktoken: a word that is itself a token is that
// token; otherwise start from single bytes and repeatedly merge the adjacent pair whose
// concatenation has the lowest rank (leftmost among equals) until no adjacent concatenation
// is a token. O(n^2) in the word length, as in tiktoken (words are short after the split).
//
// The Kimi K2 layout (tokenization_kimi.py): the split pattern below, and 256 + 2 special
// tokens at ids [num_base, num_base + 258), named by tokenizer_config.json's
// added_tokens_decoder and "<|reserved_token_ID|>" where it names none.
//
// Thread-safety: immutable after parse(); encode_word() is const and re-entrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tokenizer/bpe_model.h"

namespace xds {

// Kimi K2's split pattern in PCRE2 syntax. The published one (fancy-regex syntax) writes the
// letter classes minus Han as class intersections, `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]`;
// PCRE2 10.42 has no intersection, so each is `(?:(?!\p{Han})[...])`, which matches the same
// characters one at a time.
extern const char kKimiSplitPattern[];

// Number of special ids after the base vocabulary (tokenization_kimi.py:
// num_reserved_special_tokens + 2).
constexpr int32_t kKimiNumSpecialTokens = 258;

class TiktokenModel {
 public:
  // `text` is a tiktoken.model file; `name` prefixes errors ("dir/tiktoken.model: line 7: ...").
  // Every line is "BASE64 RANK" (an empty last line is allowed); ranks are unique and dense,
  // [0, number of lines); every single byte 0..255 must be a token (tiktoken needs them).
  static Result<TiktokenModel> parse(std::string_view text, const std::string& name);

  // Appends the ids of one word (raw bytes, non-empty).
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;

  // Number of ranked tokens (the first special id).
  int32_t size() const { return static_cast<int32_t>(id_to_bytes_.size()); }
  // Bytes of token `id` (0 <= id < size()).
  const std::string& token_bytes(int32_t id) const { return id_to_bytes_[id]; }
  std::optional<int32_t> id_of_bytes(std::string_view bytes) const;

 private:
  std::vector<std::string> id_to_bytes_;  // [size] raw bytes of each rank
  StringIdMap bytes_to_id_;               // raw bytes -> rank
};

// Standard base64 (RFC 4648, '=' padding) -> bytes; nullopt when `s` is not well formed.
std::optional<std::string> base64_decode(std::string_view s);
std::string base64_encode(std::string_view bytes);

}  // namespace xds
