// Stop strings over a choice's streamed text (the OpenAI `stop` field).
//
// push(text) returns the text that can no longer be the start of a stop string; a suffix that
// is a proper prefix of some stop string is held back until later text decides it. On a full
// match, the text before the earliest match is returned, the stop string and everything after
// it are dropped, and the matcher is stopped (OpenAI semantics: the matched text is not
// returned, finish_reason "stop"). finish() returns the held-back text when the output ends
// without a match.
//
// Matching is bytewise; the input is valid UTF-8 (the Detokenizer's output) and so are the
// stop strings, so every cut falls on a character boundary. Empty stop strings are ignored.
// Cost per push: O(held + new bytes) per stop string plus O(L^2) for the hold-back check,
// L = the longest stop string (a few dozen bytes).
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace xds::output {

struct StopPush {
  std::string text;      // released text (before the stop string when `stopped`)
  bool stopped = false;  // a stop string matched; later pushes return nothing
  std::string matched;   // the stop string that matched
};

// Length of the longest suffix of `text` that is a proper prefix of `tag` (0 if none): the
// bytes a streaming scanner must hold back because later text may complete `tag`.
size_t partial_suffix(std::string_view text, std::string_view tag);

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops = {});

  bool empty() const { return stops_.empty(); }
  StopPush push(std::string_view text);
  // Releases the held-back text (no match possible any more); "" once stopped.
  std::string finish();
  bool stopped() const { return stopped_; }
  // Bytes held back now (a partial match).
  size_t held() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace xds::output
