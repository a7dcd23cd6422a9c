// GPT-2 byte-level alphabet: every byte 0..255 is drawn as one printable code point
// (printable Latin-1 bytes as themselves, the rest as U+0100 + n in byte order), so
// byte-level vocabularies ("Ġthe" = " the") are plain strings. Pure, thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace xds::byte_level {

// [256] byte -> code point.
const std::array<char32_t, 256>& byte_to_char();

// Code point -> byte, or nullopt if cp is not in the alphabet.
std::optional<uint8_t> char_to_byte(char32_t cp);

// Maps a byte-level token string to its raw bytes; nullopt if some character is outside the
// alphabet (such a token cannot come out of byte-level pre-tokenization).
std::optional<std::string> decode_token(std::string_view token);

// Raw bytes -> byte-level string.
std::string encode_bytes(std::string_view bytes);

}  // namespace xds::byte_level
