#include "tokenizer/prompt_text.h"

#include <algorithm>

namespace xds {
namespace taint {

void add(TaintRanges* t, size_t begin, size_t end) {
  if (begin >= end) return;
  // First range that ends at or after `begin` (touching counts: adjacent ranges merge).
  auto lo = std::lower_bound(t->begin(), t->end(), begin,
                             [](const TextRange& r, size_t b) { return r.end < b; });
  auto hi = lo;
  while (hi != t->end() && hi->begin <= end) {
    begin = std::min(begin, hi->begin);
    end = std::max(end, hi->end);
    ++hi;
  }
  lo = t->erase(lo, hi);
  t->insert(lo, TextRange{begin, end});
}

void append(TaintRanges* t, const TaintRanges& src, size_t offset) {
  for (const TextRange& r : src) add(t, r.begin + offset, r.end + offset);
}

TaintRanges slice(const TaintRanges& t, size_t begin, size_t end) {
  TaintRanges out;
  for (const TextRange& r : t) {
    const size_t b = std::max(r.begin, begin), e = std::min(r.end, end);
    if (b < e) out.push_back({b - begin, e - begin});
  }
  return out;
}

bool overlaps(const TaintRanges& t, size_t begin, size_t end) {
  return std::any_of(t.begin(), t.end(),
                     [&](const TextRange& r) { return r.begin < end && begin < r.end; });
}

}  // namespace taint

std::vector<PromptText::Span> PromptText::spans() const {
  std::vector<Span> out;
  size_t pos = 0;
  for (const TextRange& r : untrusted) {
    if (r.begin > pos) out.push_back({text.substr(pos, r.begin - pos), true});
    out.push_back({text.substr(r.begin, r.end - r.begin), false});
    pos = r.end;
  }
  if (pos < text.size()) out.push_back({text.substr(pos), true});
  return out;
}

}  // namespace xds
