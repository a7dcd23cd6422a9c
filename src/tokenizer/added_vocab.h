// Added tokens of tokenizer.json ("added_tokens": special and non-special), matched in the text
// before pre-tokenization, leftmost-longest, with the lstrip / rstrip / single_word options.
// Matching walks a byte trie of the token contents from each position: O(text bytes x longest
// token), independent of the number of added tokens.
// Thread-safety: immutable after construction; split() is const and re-entrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/prompt_text.h"

namespace xds {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;  // matched against the normalized text instead of the raw text
};

// One piece of text after added-token matching: either a token id or a text range.
struct AddedSegment {
  int32_t id;        // -1 for a text range
  size_t begin, end;  // byte range in the input (for a token: what it consumed, incl. stripped)
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  bool empty() const { return tokens_.empty(); }
  // Tiles `text` into text ranges and matched tokens, in order. A token matches only where
  // its content lies wholly outside the `untrusted` byte ranges (prompt_text.h); its
  // lstrip / rstrip may still take whitespace from them.
  std::vector<AddedSegment> split(std::string_view text, const TaintRanges& untrusted = {}) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                 // index into tokens_ when terminal
  };
  int32_t child(int32_t node, uint8_t b) const;
  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;  // nodes_[0] is the root
};

}  // namespace xds
