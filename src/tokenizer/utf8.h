// UTF-8 helpers shared by the tokenizer, the detokenizer and the template engine.
// All functions are pure and thread-safe.
//
// Invalid input follows the Unicode "substitution of maximal subparts" rule (the one WHATWG
// TextDecoder, Python's errors='replace' and Rust's from_utf8_lossy use): each maximal
// prefix of a well-formed sequence that cannot be completed becomes one U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace xds::utf8 {

// Length of the well-formed sequence at s[i], or 0 if s[i] starts no well-formed sequence.
// Sets *cp to the code point when well-formed.
size_t decode_one(std::string_view s, size_t i, char32_t* cp);

// Length of the maximal subpart at s[i] when decode_one fails (>= 1): the bytes that one
// U+FFFD replaces.
size_t invalid_run(std::string_view s, size_t i);

// Byte offset of the first ill-formed byte, or npos when s is valid UTF-8.
size_t find_invalid(std::string_view s);

// s with every maximal ill-formed subpart replaced by U+FFFD.
std::string replace_invalid(std::string_view s);

// Length of the trailing bytes of s that are a proper prefix of a well-formed sequence (an
// incomplete last character that more bytes could still complete); 0..3.
size_t incomplete_tail(std::string_view s);

void append(std::string* out, char32_t cp);

// Number of code points (ill-formed bytes count one each).
size_t length(std::string_view s);

}  // namespace xds::utf8
