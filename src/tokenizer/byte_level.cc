#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace xds::byte_level {
namespace {
struct Tables {
  std::array<char32_t, 256> b2c{};
  std::array<int16_t, 324> c2b{};  // code points < 0x144 only
  Tables() {
    c2b.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      b2c[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      c2b[b2c[b]] = static_cast<int16_t>(b);
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}
}  // namespace

const std::array<char32_t, 256>& byte_to_char() { return tables().b2c; }

std::optional<uint8_t> char_to_byte(char32_t cp) {
  if (cp >= tables().c2b.size() || tables().c2b[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(tables().c2b[cp]);
}

std::optional<std::string> decode_token(std::string_view token) {
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    char32_t cp;
    const size_t n = utf8::decode_one(token, i, &cp);
    if (n == 0) return std::nullopt;
    const auto b = char_to_byte(cp);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    i += n;
  }
  return out;
}

std::string encode_bytes(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) utf8::append(&out, byte_to_char()[static_cast<uint8_t>(c)]);
  return out;
}

}  // namespace xds::byte_level
