// s3:// URIs: what a job spec may name instead of a local path (checkpoint.dir). Header-only:
// the job spec's validation uses it without linking the S3 client (s3.h).
#pragma once

#include <cctype>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace zenflow::storage {

// "s3://bucket/key..." (the key may be empty or a prefix).
inline bool is_s3_uri(const std::string& s) { return s.rfind("s3://", 0) == 0; }

struct S3Uri {
  std::string bucket;
  std::string key;
  std::string text() const { return "s3://" + bucket + (key.empty() ? "" : "/" + key); }
  // This URI as a prefix without its trailing '/'s ("s3://b/run/" -> "s3://b/run").
  S3Uri trimmed() const {
    S3Uri t = *this;
    while (!t.key.empty() && t.key.back() == '/') t.key.pop_back();
    return t;
  }
  // This URI with `name` appended after a '/' (none doubled).
  S3Uri child(const std::string& name) const {
    S3Uri c = *this;
    if (!c.key.empty() && c.key.back() != '/') c.key += '/';
    c.key += !name.empty() && name[0] == '/' ? name.substr(1) : name;
    return c;
  }
};

// A directory for zenflow's local copies: `given` when not empty, else $<env_var>, else
// $XDG_CACHE_HOME/zenflow/<sub>, else $HOME/.cache/zenflow/<sub> (/tmp without a $HOME).
inline std::string zenflow_cache_dir(const std::string& given, const char* env_var, const std::string& sub) {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (!given.empty()) return given;
  if (!env(env_var).empty()) return env(env_var);
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/zenflow/" + sub;
  return (env("HOME").empty() ? std::string("/tmp") : env("HOME")) + "/.cache/zenflow/" + sub;
}

// Throws std::invalid_argument naming `uri` and what is wrong with it: S3's bucket naming
// rules (3-63 characters of a-z, 0-9, '.' and '-', starting and ending with a letter or a
// digit), a key of at most 1024 bytes without control characters.
inline S3Uri parse_s3_uri(const std::string& uri) {
  if (!is_s3_uri(uri)) throw std::invalid_argument("'" + uri.substr(0, 200) + "' is not an s3:// URI");
  const std::string rest = uri.substr(5);
  const size_t slash = rest.find('/');
  S3Uri u{rest.substr(0, slash), slash == std::string::npos ? "" : rest.substr(slash + 1)};
  auto lower_or_digit = [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c));
  };
  bool ok = u.bucket.size() >= 3 && u.bucket.size() <= 63;
  for (char c : u.bucket) ok = ok && (lower_or_digit(c) || c == '.' || c == '-');
  ok = ok && lower_or_digit(u.bucket.front()) && lower_or_digit(u.bucket.back());
  if (!ok)
    throw std::invalid_argument("'" + uri.substr(0, 200) + "': the bucket name '" + u.bucket.substr(0, 100) +
                                "' is not 3-63 characters of a-z, 0-9, '.' and '-'");
  if (u.key.size() > 1024) throw std::invalid_argument("'" + uri.substr(0, 200) + "': the key is longer than 1024 bytes");
  for (unsigned char c : u.key)
    if (c < 0x20 || c == 0x7f)
      throw std::invalid_argument("'" + uri.substr(0, 200) + "': the key holds a control character");
  return u;
}

}  // namespace zenflow::storage
