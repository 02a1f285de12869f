// UTF-8 for protobuf `string` fields: a proto3 string must be valid UTF-8, or the message
// cannot be parsed at the other end (gRPC then answers "No message returned"). Every string
// that comes from bytes nobody validated (a rank's output, a message built from it, a row
// stored by an older build) passes through valid_utf8() before it reaches one.
#pragma once

#include <string>
#include <string_view>

namespace zenflow {

// `s` with every invalid UTF-8 sequence (a stray continuation byte, a truncated sequence,
// an overlong encoding, a surrogate, a code point past U+10FFFF) replaced by U+FFFD. Valid
// input comes back unchanged.
std::string valid_utf8(std::string_view s);

// Whether `s` is valid UTF-8 (valid_utf8(s) == s).
bool is_valid_utf8(std::string_view s);

// At most `max_bytes` of `s`, cut at a code point boundary (never inside a sequence).
std::string_view utf8_prefix(std::string_view s, size_t max_bytes);

}  // namespace zenflow
