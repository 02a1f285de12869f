// What a stranger sends to a Transport's listening port (worker/transport/handshake.h):
// garbage, truncated and oversized handshakes, a wrong proof, a stall, a crowd. Each
// attack is a raw TCP connection to 127.0.0.1 that the attacker closes itself (or that
// the listener closes); nothing here needs a secret.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "worker/transport/handshake.h"

namespace zenflow::test_support {

// A TCP connection to 127.0.0.1:port, from `from` when given (any 127/8 address is lo's, so
// "127.0.0.2" is a second host on this one); -1 when none is made.
inline int connect_raw(int port, const char* from = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && from) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    if (::inet_pton(AF_INET, from, &src.sin_addr) != 1 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

inline bool send_all(int fd, const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the peer closes (true) or `limit` passes (false); what it sent goes to `got`.
inline bool wait_closed(int fd, std::chrono::milliseconds limit, std::string* got = nullptr) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;  // closed (or reset)
    if (got) got->append(buf, static_cast<size_t>(n));
  }
}

// What aborts a UCX 1.13 process through its tcp transport's own listening socket: UCX's
// public magic number, then a connection-manager message (active message id 32,
// UCT_AM_ID_MAX) announcing 4 bytes that say CONN_REQ (1): a request shorter than its
// packet, which tcp_cm.c:688 asserts on before anything checks who sent it.
inline std::string ucx_tcp_short_connection_request() {
  std::string b;
  auto put = [&b](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
  };
  put(0xCAFEBABE12345678ull, 8);  // UCT_TCP_MAGIC_NUMBER
  put(32, 1);                     // uct_tcp_am_hdr_t::am_id: UCT_TCP_EP_CM_AM_ID
  put(4, 4);                      // uct_tcp_am_hdr_t::length
  put(1, 4);                      // uct_tcp_cm_conn_event_t: UCT_TCP_CM_CONN_REQ
  return b;
}

// One attack: the bytes a stranger sends before closing its connection.
struct Attack {
  std::string name;
  std::string bytes;
};

// Garbage, a truncated and an oversized handshake, a bad version: none carries a valid
// frame that could be answered with more than a CHALLENGE.
inline std::vector<Attack> garbage_attacks() {
  namespace hs = zenflow::transport::handshake;
  std::mt19937 rng(7);
  std::string random(4096, '\0');
  for (char& c : random) c = static_cast<char>(rng());
  const hs::Nonce nonce{};
  const std::string hello = hs::encode_frame(hs::FrameType::kHello, hs::encode_hello(nonce, ""));
  std::string oversized = hs::encode_frame(hs::FrameType::kProof, "");
  for (int i = 8; i < 12; ++i) oversized[i] = '\xff';  // a body of 4 GiB announced
  std::string bad_version = hello;
  bad_version[4] = 9;
  std::string huge_address = hs::encode_frame(hs::FrameType::kProof, std::string(hs::kMaxBodyBytes, 'a'));
  return {{"16 bytes of 0xff", std::string(16, '\xff')},
          {"1024 zero bytes", std::string(1024, '\0')},
          {"4096 random bytes", random},
          {"a truncated HELLO", hello.substr(0, hello.size() - 5)},
          {"a length of 4 GiB", hello + oversized},
          {"a PROOF whose address fills the body", hello + huge_address},
          {"another version", bad_version},
          {"one megabyte of HELLOs", std::string(1 << 20, 'Z')}};
}

}  // namespace zenflow::test_support
