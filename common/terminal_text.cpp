#include "common/terminal_text.h"

#include <cstdint>
#include <cstdio>

namespace zenflow {
namespace {

void escape_byte(std::string& out, uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", b);
  out += buf;
}

void escape_code_point(std::string& out, uint32_t cp) {
  char buf[12];
  std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
  out += buf;
}

// The length of the valid UTF-8 sequence at s[i] and its code point; 0 when invalid, and
// -1 when s ends inside what could still become a valid sequence.
int sequence_at(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  int n = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    *cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    *cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    *cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < n; ++k) {
    if (i + static_cast<size_t>(k) >= s.size()) return -1;
    const uint8_t x = b(i + static_cast<size_t>(k));
    if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return 0;
    *cp = (*cp << 6) | (x & 0x3F);
  }
  return n;
}

bool bidi_control(uint32_t cp) { return (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069); }

// Escapes s into out; with `hold`, an incomplete sequence at the end is left unconsumed and
// its start returned (else s.size()).
size_t escape_into(std::string& out, std::string_view s, bool hold) {
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = 0;
    const int n = sequence_at(s, i, &cp);
    if (n < 0 && hold) return i;
    if (n <= 0) {
      escape_byte(out, static_cast<uint8_t>(s[i]));
      ++i;
      continue;
    }
    if (n == 1) {
      const bool control = (cp < 0x20 && cp != '\n' && cp != '\t') || cp == 0x7F;
      if (control) {
        escape_byte(out, static_cast<uint8_t>(cp));
      } else {
        out += static_cast<char>(cp);
      }
    } else if ((cp >= 0x80 && cp <= 0x9F) || bidi_control(cp)) {
      escape_code_point(out, cp);
    } else {
      out.append(s.data() + i, static_cast<size_t>(n));
    }
    i += static_cast<size_t>(n);
  }
  return i;
}

}  // namespace

std::string terminal_safe(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  escape_into(out, s, false);
  return out;
}

std::string TerminalSafeStream::feed(std::string_view chunk) {
  held_.append(chunk.data(), chunk.size());
  std::string out;
  out.reserve(held_.size());
  const size_t used = escape_into(out, held_, true);
  held_.erase(0, used);
  return out;
}

std::string TerminalSafeStream::finish() {
  std::string out = terminal_safe(held_);
  held_.clear();
  return out;
}

}  // namespace zenflow
