// Numbers written as text in the files zenflow reads (pricing catalog, job profiles):
// one parser, one wording of its errors.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace zenflow {

// Parses all of `text` as a finite number >= 0 into *out. Returns "" on success, else the
// reason for the caller to put after its key: "must be a finite number, got TEXT" or
// "must be >= 0, got TEXT".
inline std::string parse_nonnegative_number(const std::string& text, double* out) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
    return "must be a finite number, got " + text;
  if (v < 0) return "must be >= 0, got " + text;
  *out = v;
  return "";
}

}  // namespace zenflow
