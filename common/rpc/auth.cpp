#include "common/rpc/auth.h"

#include <fstream>

#include <arpa/inet.h>
#include <openssl/sha.h>

#include <cctype>
#include <stdexcept>

#include "common/input_file.h"

namespace zenflow::rpc {
namespace {

constexpr size_t kMaxTokenFileBytes = 4096;
constexpr size_t kMinTokenChars = 16;
constexpr size_t kMaxTokenChars = 1024;
constexpr std::string_view kBearer = "Bearer ";

}  // namespace

std::string random_token(size_t bytes) {
  std::ifstream in("/dev/urandom", std::ios::binary);
  std::string raw(bytes, '\0');
  in.read(raw.data(), static_cast<std::streamsize>(bytes));
  if (!in) throw std::runtime_error("cannot read /dev/urandom");
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string read_token_file(const std::string& path) {
  std::string text;
  try {
    text = read_regular_file(path, kMaxTokenFileBytes, "token file");
  } catch (const InputError& e) {
    throw std::invalid_argument(e.what());
  }
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  std::string token = text.substr(b, e - b);
  if (token.empty()) throw std::invalid_argument("token file " + path + " is empty");
  for (char c : token)
    if (c < 0x21 || c > 0x7e)
      throw std::invalid_argument("token file " + path +
                                  " holds a space or non-printable character; a token is one word of printable ASCII");
  if (token.size() < kMinTokenChars)
    throw std::invalid_argument("token file " + path + " holds " + std::to_string(token.size()) +
                                " characters; a token needs at least " + std::to_string(kMinTokenChars) +
                                " (e.g. openssl rand -hex 32)");
  if (token.size() > kMaxTokenChars)
    throw std::invalid_argument("token file " + path + " holds more than " + std::to_string(kMaxTokenChars) +
                                " characters");
  return token;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Compare over the longer length so the time does not reveal a common prefix; the
  // length difference is folded into the result.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

const char* role_name(Role r) {
  switch (r) {
    case Role::kAdmin: return "admin";
    case Role::kWorker: return "worker";
    case Role::kNone: break;
  }
  return "none";
}

TokenAuthority::TokenAuthority(std::string admin_token, std::string worker_token)
    : admin_(std::move(admin_token)), worker_(std::move(worker_token)) {
  if (admin_.empty() || worker_.empty()) throw std::invalid_argument("both an admin and a worker token are needed");
  if (constant_time_equal(admin_, worker_))
    throw std::invalid_argument("the admin and worker tokens are the same; they must differ");
}

Role TokenAuthority::role_of(std::string_view authorization) const {
  if (admin_.empty() || authorization.substr(0, kBearer.size()) != kBearer) return Role::kNone;
  const std::string_view token = authorization.substr(kBearer.size());
  const bool admin = constant_time_equal(token, admin_);
  const bool worker = constant_time_equal(token, worker_);
  return admin ? Role::kAdmin : worker ? Role::kWorker : Role::kNone;
}

std::string HostPort::str() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

HostPort parse_host_port(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument(what + ": " + why + ", got \"" + text + "\" (expected HOST:PORT, e.g. 127.0.0.1:7070)");
  };
  HostPort hp;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') throw bad("bad IPv6 form");
    hp.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) throw bad("no port");
    hp.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (hp.host.empty()) throw bad("empty host");
  if (port.empty() || port.size() > 5) throw bad("bad port");
  for (char c : port)
    if (!std::isdigit(static_cast<unsigned char>(c))) throw bad("bad port");
  hp.port = std::stoi(port);
  if (hp.port > 65535) throw bad("port above 65535");
  return hp;
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

std::string session_digest(std::string_view session) {
  std::string digest(SHA256_DIGEST_LENGTH, '\0');
  SHA256(reinterpret_cast<const unsigned char*>(session.data()), session.size(),
         reinterpret_cast<unsigned char*>(digest.data()));
  return digest;
}

}  // namespace zenflow::rpc
