#include "tokenizer/utf8.h"

namespace xds::utf8 {
namespace {

// Valid second-byte range for a lead byte (Unicode Table 3-7), {0,0} for an invalid lead.
struct Lead {
  int len;
  uint8_t lo, hi;
};
Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes at s[i] that form a valid (possibly incomplete) prefix of a sequence.
size_t valid_prefix(std::string_view s, size_t i, int* need) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  const Lead l = lead_info(b0);
  *need = l.len;
  if (l.len <= 1) return l.len;
  size_t n = 1;
  if (i + 1 >= s.size()) return n;
  const auto b1 = static_cast<uint8_t>(s[i + 1]);
  if (b1 < l.lo || b1 > l.hi) return n;
  n = 2;
  for (int k = 2; k < l.len; ++k) {
    if (i + k >= s.size()) return n;
    const auto b = static_cast<uint8_t>(s[i + k]);
    if (b < 0x80 || b > 0xBF) return n;
    n = k + 1;
  }
  return n;
}

}  // namespace

size_t decode_one(std::string_view s, size_t i, char32_t* cp) {
  int need = 0;
  const size_t n = valid_prefix(s, i, &need);
  if (need == 0 || n != static_cast<size_t>(need)) return 0;
  const auto b0 = static_cast<uint8_t>(s[i]);
  char32_t c;
  switch (need) {
    case 1: c = b0; break;
    case 2: c = b0 & 0x1F; break;
    case 3: c = b0 & 0x0F; break;
    default: c = b0 & 0x07; break;
  }
  for (int k = 1; k < need; ++k) c = (c << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  *cp = c;
  return n;
}

size_t invalid_run(std::string_view s, size_t i) {
  int need = 0;
  const size_t n = valid_prefix(s, i, &need);
  return n == 0 ? 1 : n;
}

size_t find_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    const size_t n = decode_one(s, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    const size_t n = decode_one(s, i, &cp);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += invalid_run(s, i);
    }
  }
  return out;
}

size_t incomplete_tail(std::string_view s) {
  // A proper prefix of a sequence is at most 3 bytes; look for its lead byte.
  const size_t lo = s.size() >= 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i-- > lo;) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: keep looking for the lead
    int need = 0;
    const size_t n = valid_prefix(s, i, &need);
    const size_t rest = s.size() - i;
    return (need > 1 && n == rest && rest < static_cast<size_t>(need)) ? rest : 0;
  }
  return 0;
}

void append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t length(std::string_view s) {
  size_t n = 0, i = 0;
  while (i < s.size()) {
    char32_t cp;
    const size_t k = decode_one(s, i, &cp);
    i += k ? k : 1;
    ++n;
  }
  return n;
}

}  // namespace xds::utf8
