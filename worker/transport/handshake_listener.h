// The sockets of the connection handshake (handshake.h): a Transport's listening socket,
// which speaks nothing but the handshake, and the connecting side's one-shot connection.
//
// The listener is one thread ("zf-handshake", not UCX's progress thread) multiplexing its
// connections with poll: each must finish within `timeout_s` of its accept, at most
// `max_in_progress` run at once (past that, new connections wait in the kernel's backlog
// until one ends, so a slow-loris holds the port for `timeout_s` at most), and no
// connection's bytes are kept beyond one frame. A malformed or unauthenticated
// connection is closed (a wrong proof gets a REFUSE first); the process goes on.
// Failures are logged to stderr, at most one line a second.
#pragma once

#include <sys/socket.h>

#include <functional>
#include <memory>
#include <string>

#include "worker/transport/handshake.h"

namespace zenflow::transport {

struct ListenerOptions {
  handshake::SecretFor secret_for;  // the secret held for a client's key
  std::string address;  // this side's UCX worker address
  double timeout_s = 5;
  int max_in_progress = 64;
  std::string name;  // for logs
};

class HandshakeListener {
 public:
  // Called on the listener's thread for a peer that proved the secret, before ACCEPT goes
  // out: `peer` is its endpoint, `own_channel` the id this side receives the channel on,
  // `from` the peer's "HOST:PORT" and `from_addr` its socket address. Returns false to
  // refuse (closed without an ACCEPT).
  using Admit = std::function<bool(const handshake::Endpoint& peer, uint64_t own_channel, const std::string& from,
                                   const sockaddr_storage& from_addr)>;

  // Binds host:port (0: a free one) and starts the thread; throws TransportError naming
  // the address.
  HandshakeListener(const std::string& host, int port, ListenerOptions options, Admit admit);
  ~HandshakeListener();  // stops the thread and closes every connection
  HandshakeListener(const HandshakeListener&) = delete;
  HandshakeListener& operator=(const HandshakeListener&) = delete;

  int port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The connecting side over a fresh TCP connection to host:port, all within timeout_s,
// proving `secret` under the name `key`; returns the peer's endpoint. Throws AuthenticationError (transport.h) when either side's
// proof of the secret failed, TransportError for anything else (no connection, malformed
// answer, timeout), naming the address. `peer_addr` (when given) receives the address
// connected to.
handshake::Endpoint client_handshake(const std::string& host, int port, const std::string& secret,
                                     const std::string& key, const handshake::Endpoint& local, double timeout_s,
                                     sockaddr_storage* peer_addr = nullptr);

}  // namespace zenflow::transport
