// Unicode pieces the tokenizers need: UTF-8 decoding, letter/number/space classes, NFC.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace zenflow::model::unicode {

// Returned by decode_utf8 for a byte that does not start a valid UTF-8 sequence
// (overlong forms, surrogates and code points above U+10FFFF are invalid).
constexpr char32_t kInvalid = 0xFFFFFFFF;

// Decodes the code point starting at s[i] (i < s.size()) into *cp and returns its
// length in bytes (1..4). An invalid sequence yields *cp = kInvalid and length 1, so
// callers can carry such bytes through unchanged.
std::size_t decode_utf8(std::string_view s, std::size_t i, char32_t* cp);

// Appends the UTF-8 encoding of a valid code point.
void append_utf8(std::string& out, char32_t cp);

// General category L* (\p{L}) and N* (\p{N}), and the White_Space property (what \s
// matches in Oniguruma, Rust's regex and Python's `regex`). kInvalid is none of them.
// The tables are generated from Python's unicodedata (see unicode_tables.inc for the
// Unicode version). Thread-safe.
bool is_letter(char32_t cp);
bool is_number(char32_t cp);
bool is_whitespace(char32_t cp);

// The Unicode version of the tables behind the functions here, e.g. "14.0.0".
const char* unicode_version();

// The three classes above as bits, in one lookup (for scanners).
constexpr unsigned char kLetterClass = 1, kNumberClass = 2, kSpaceClass = 4;
unsigned char classify(char32_t cp);

// Canonical composition (NFC) of UTF-8 text. Invalid bytes are passed through
// unchanged and block composition across them. Thread-safe.
std::string nfc(std::string_view text);

}  // namespace zenflow::model::unicode
