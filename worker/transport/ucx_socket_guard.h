// Who UCX's own listening sockets may hear (docs/security.md, row 3).
//
// UCX's tcp transport listens on a socket of its own, one per interface it uses, and
// parses what arrives there before anything authenticates the peer: UCX 1.13 aborts the
// process on a connection request of the wrong length sent after its public magic number
// (tcp_cm.c:688, an assertion on the request's length; unchanged up to 1.18). zenflow
// cannot change what UCX parses, so it decides whom UCX hears. This library defines
// accept() and accept4() for the whole process (the executable exports them, so libucs's
// calls reach them first); a connection accepted by UCX's own code (a caller inside libucs)
// is closed at once unless it comes from an address that holds an Allowance right now. The
// transport takes one when a peer proves its secret in the handshake (transport.h) and
// drops it with that channel. Every other caller (gRPC, the handshake listener, tests)
// gets libc's accept untouched, and so does UCX until a Transport enabled the guard.
//
// What it does not do: it filters by address, not by peer. Another process on a host that
// holds a session with this one (the same IP, or hosts behind one NAT) still reaches UCX's
// socket while the session lasts.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <string>

namespace zenflow::transport::socket_guard {

// An address as 16 bytes: IPv6, or IPv4 mapped (::ffff:a.b.c.d); ports are not part of it.
using Address = std::array<uint8_t, 16>;

// The address of `sa` (AF_INET or AF_INET6); false for any other family.
bool address_of(const sockaddr* sa, socklen_t len, Address* out);
std::string address_text(const Address& a);

// While at least one Allowance for an address lives, UCX's listeners accept connections
// from it. Move-only; an empty one (default, or moved from) allows nothing.
class Allowance {
 public:
  Allowance() = default;
  explicit Allowance(const Address& a);
  Allowance(Allowance&& other) noexcept;
  Allowance& operator=(Allowance&& other) noexcept;
  Allowance(const Allowance&) = delete;
  Allowance& operator=(const Allowance&) = delete;
  ~Allowance();

 private:
  void release();
  Address address_{};
  bool held_ = false;
};

// Turns the guard on for the rest of the process (idempotent; Transport::create calls it).
void enable();

// Whether UCX's listeners would accept a connection from `a` now.
bool allowed(const Address& a);

// Connections UCX's listeners were about to accept and the guard closed, since the start.
int64_t refused();

}  // namespace zenflow::transport::socket_guard
