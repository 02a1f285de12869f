// Bearer tokens for every zenflow RPC: reading token files, comparing in constant time,
// and which role a request's `authorization` metadata grants.
//
// Two tokens, from files (never argv, env or logs): the admin token (JobService: submit,
// cancel, logs) and the worker join token (WorkerService). The admin token is accepted on
// WorkerService too; a worker token on JobService is PERMISSION_DENIED. No gRPC here, so
// the rules are unit-tested without a server (rpc.h applies them to a ServerContext).
#pragma once

#include <string>
#include <string_view>

namespace zenflow::rpc {

// Reads a token file: a regular file of at most 4 KiB whose content, without surrounding
// whitespace, is 16..1024 printable non-space ASCII characters. Throws
// std::invalid_argument naming the path and what is wrong ("... is empty", "... holds
// 5 characters; a token needs at least 16"). The token itself never appears in a message.
std::string read_token_file(const std::string& path);

// A new token: `bytes` bytes from the kernel's random source as hex (2 x bytes characters).
// Throws std::runtime_error when /dev/urandom cannot be read.
std::string random_token(size_t bytes = 32);

// A worker's session: the secret RegisterWorker hands one incarnation of one worker (a
// random_token), which every later WorkerService call of that incarnation carries in this
// metadata. The join token only registers; the session says which worker is calling.
inline constexpr char kSessionMetadata[] = "x-zenflow-session";
// SHA-256 of `session`, 32 raw bytes: all the coordinator keeps of a session.
std::string session_digest(std::string_view session);

// a == b in time that depends only on the lengths (no early exit on the first difference).
bool constant_time_equal(std::string_view a, std::string_view b);

enum class Role { kNone, kWorker, kAdmin };
const char* role_name(Role r);

// Maps `authorization` metadata to a role. A value must be exactly "Bearer " + token.
class TokenAuthority {
 public:
  TokenAuthority() = default;  // no tokens: every request is kNone (for clients' tests)
  TokenAuthority(std::string admin_token, std::string worker_token);
  // kNone when the header is absent, malformed or matches neither token. Both tokens are
  // always compared (constant time, no early exit on the first match).
  Role role_of(std::string_view authorization) const;
  bool has_tokens() const { return !admin_.empty(); }

 private:
  std::string admin_;
  std::string worker_;
};

struct HostPort {
  std::string host;
  int port = 0;
  std::string str() const;  // "host:port", "[v6]:port"
};
// "HOST:PORT" or "[V6]:PORT", port 0..65535. Throws std::invalid_argument naming `what`
// (e.g. "--listen") and the bad value.
HostPort parse_host_port(const std::string& text, const std::string& what);

// True for localhost, 127.0.0.0/8 and ::1: the only addresses a coordinator may listen on
// without token files.
bool is_loopback_host(const std::string& host);

}  // namespace zenflow::rpc
