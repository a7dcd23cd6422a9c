// PCRE2 wrapper for the tokenizer's Unicode regexes (Split pre-tokenizer, Replace normalizer).
//
// Compiled once with PCRE2_UTF | PCRE2_UCP (so \s, \w, \d and POSIX classes follow Unicode
// properties, as Oniguruma does for the Rust tokenizers) and JIT-compiled when available.
// Thread-safety: a Regex is immutable after compile(); find_all() allocates its own match
// data and JIT stack per call, so concurrent calls are safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace xds {

class Regex {
 public:
  // `pattern` is UTF-8. The error names the pattern and PCRE2's message and offset.
  static Result<Regex> compile(std::string_view pattern);

  // Non-overlapping matches of the pattern in `text` (valid UTF-8), left to right, as byte
  // ranges [begin, end). An empty match advances by one character, as Onig's find_iter does.
  Result<std::vector<std::pair<size_t, size_t>>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<const Code> code_;
};

}  // namespace xds
