#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace xds {
namespace {

bool is_unicode_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Start of the character that ends at `end` (exclusive).
size_t char_start_before(std::string_view s, size_t end) {
  size_t k = end - 1;
  while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
  return k;
}

// Word characters for single_word: letters, digits, marks and '_' (approximated as ASCII
// alphanumerics, '_' and every non-space non-ASCII character).
bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  return !is_unicode_space(c);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : tokens_(tokens) {
  nodes_.emplace_back();
  for (size_t t = 0; t < tokens_.size(); ++t) {
    if (tokens_[t].content.empty()) continue;
    int32_t n = 0;
    for (const char ch : tokens_[t].content) {
      const auto b = static_cast<uint8_t>(ch);
      int32_t c = child(n, b);
      if (c < 0) {
        c = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& ch_list = nodes_[n].children;
        ch_list.insert(std::lower_bound(ch_list.begin(), ch_list.end(), std::make_pair(b, int32_t{-1})),
                       {b, c});
      }
      n = c;
    }
    if (nodes_[n].token < 0) nodes_[n].token = static_cast<int32_t>(t);  // first definition wins
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  const auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, int32_t{-1}));
  return (it != ch.end() && it->first == b) ? it->second : -1;
}

std::vector<AddedSegment> AddedTokenMatcher::split(std::string_view text,
                                                   const TaintRanges& untrusted) const {
  std::vector<AddedSegment> out;
  size_t seg_start = 0, i = 0;
  size_t next_untrusted = 0;  // index of the first untrusted range that ends after i
  while (i < text.size()) {
    while (next_untrusted < untrusted.size() && untrusted[next_untrusted].end <= i)
      ++next_untrusted;
    size_t limit = text.size();  // a token's content must end by here: trusted bytes only
    if (next_untrusted < untrusted.size()) {
      const TextRange& r = untrusted[next_untrusted];
      if (r.begin <= i) {  // inside untrusted text: no token starts here
        i = r.end;
        continue;
      }
      limit = r.begin;
    }
    // Longest token starting at i (that satisfies single_word).
    int32_t best = -1;
    size_t best_end = 0;
    int32_t n = 0;
    for (size_t k = i; k < limit; ++k) {
      n = child(n, static_cast<uint8_t>(text[k]));
      if (n < 0) break;
      const int32_t t = nodes_[n].token;
      if (t < 0) continue;
      if (tokens_[t].single_word) {
        char32_t cp;
        bool ok = true;
        if (i > 0) {
          const size_t ps = char_start_before(text, i);
          if (utf8::decode_one(text, ps, &cp) && is_word_char(cp)) ok = false;
        }
        if (k + 1 < text.size() && utf8::decode_one(text, k + 1, &cp) && is_word_char(cp)) ok = false;
        if (!ok) continue;
      }
      best = t;
      best_end = k + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    size_t b = i, e = best_end;
    char32_t cp;
    if (tokens_[best].lstrip) {
      while (b > seg_start) {
        const size_t ps = char_start_before(text, b);
        if (!utf8::decode_one(text, ps, &cp) || !is_unicode_space(cp)) break;
        b = ps;
      }
    }
    if (tokens_[best].rstrip) {
      while (e < text.size()) {
        const size_t n2 = utf8::decode_one(text, e, &cp);
        if (n2 == 0 || !is_unicode_space(cp)) break;
        e += n2;
      }
    }
    if (b > seg_start) out.push_back({-1, seg_start, b});
    out.push_back({tokens_[best].id, b, e});
    seg_start = i = e;
  }
  if (seg_start < text.size()) out.push_back({-1, seg_start, text.size()});
  return out;
}

}  // namespace xds
