// PCRE2 wrapper for the tokenizer's Unicode regexes (Split pre-tokenizer, Replace normalizer).
//
// Compiled once with PCRE2_UTF | PCRE2_UCP (so \s, \w, \d and POSIX classes follow Unicode
// properties, as Oniguruma does for the Rust tokenizers) and JIT-compiled when available.
// Thread-safety: a Regex is immutable after compile(); per-call state lives in a
// RegexScratch that each thread owns (one per encode() call), so concurrent calls are safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace xds {

// Match data and (only when a match needs more than the default 32 KiB) a JIT stack, reused
// across find_all() calls of one thread. Not thread-safe.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class Regex;
  void* match_data_;          // pcre2_match_data*, 1 ovector pair (the whole match)
  void* match_context_;       // pcre2_match_context*
  void* jit_stack_ = nullptr;  // pcre2_jit_stack*, created on first PCRE2_ERROR_JIT_STACKLIMIT
};

class Regex {
 public:
  // `pattern` is UTF-8. The error names the pattern and PCRE2's message and offset.
  static Result<Regex> compile(std::string_view pattern);

  // Non-overlapping matches of the pattern in `text` (valid UTF-8), left to right, as byte
  // ranges [begin, end). An empty match advances by one character, as Onig's find_iter does.
  Status find_all(std::string_view text, RegexScratch* scratch,
                  std::vector<std::pair<size_t, size_t>>* out) const;
  Result<std::vector<std::pair<size_t, size_t>>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<const Code> code_;
};

}  // namespace xds
