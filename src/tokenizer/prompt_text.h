// Prompt text with provenance. Every byte of a prompt is either trusted — written by the
// operator (the CLI's --prompt) or by the chat template itself (its literals, bos_token) — or
// untrusted: it came from a request (message content, names, tool descriptions and call
// arguments, a raw /v1/completions prompt). The tokenizer matches added and special tokens
// only inside trusted bytes, so a user who types "<｜end▁of▁sentence｜>" gets the ids of that
// text, not the EOS id (docs/design/tokenizer.md, "Untrusted text").
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace xds {

// Byte range [begin, end) of a string.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const TextRange&) const = default;
};

// The untrusted byte ranges of a string: sorted, non-empty, disjoint and not adjacent (the
// helpers below keep this form).
using TaintRanges = std::vector<TextRange>;

namespace taint {
// Marks [begin, end) untrusted too (any position; merges with neighbours).
void add(TaintRanges* t, size_t begin, size_t end);
// The ranges of a string `src` appended at byte `offset` of the string `t` describes.
void append(TaintRanges* t, const TaintRanges& src, size_t offset);
// The ranges of the substring [begin, end), relative to `begin`.
TaintRanges slice(const TaintRanges& t, size_t begin, size_t end);
// Whether any byte of [begin, end) is untrusted.
bool overlaps(const TaintRanges& t, size_t begin, size_t end);
}  // namespace taint

struct PromptText {
  std::string text;
  TaintRanges untrusted;  // byte ranges of `text`

  static PromptText trusted(std::string s) { return {std::move(s), {}}; }
  static PromptText from_request(std::string s) {
    PromptText p{std::move(s), {}};
    if (!p.text.empty()) p.untrusted.push_back({0, p.text.size()});
    return p;
  }

  // The text as maximal runs of equal trust, in order (empty text: no spans).
  struct Span {
    std::string text;
    bool trusted = true;
    bool operator==(const Span&) const = default;
  };
  std::vector<Span> spans() const;
};

}  // namespace xds
