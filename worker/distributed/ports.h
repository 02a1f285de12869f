// Free TCP ports for rendezvous stores: what the local launcher and the worker agent
// (which holds one per slot for the jobs whose rank 0 it runs) reserve. No LibTorch.
#pragma once

#include <string>

namespace zenflow::distributed {

// A TCP port that was free on `host` a moment ago (bind to port 0, read it, close): another
// process may take it before it is used; PortReservation closes that window.
// Throws std::runtime_error when no socket can be bound.
int find_free_port(const std::string& host = "127.0.0.1");

// Holds a free TCP port: a socket bound to it with SO_REUSEADDR and not listening, so
// that the kernel gives the port to no other bind(0) or outgoing connection while a
// listener that also sets SO_REUSEADDR (c10d's TCPStore server does) can still bind it.
// Throws std::runtime_error when no socket can be bound. Not thread-safe.
class PortReservation {
 public:
  explicit PortReservation(const std::string& host = "127.0.0.1");
  ~PortReservation();
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  int port() const { return port_; }
  void release();  // closes the socket (also done by the destructor)

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace zenflow::distributed
