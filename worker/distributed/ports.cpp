#include "worker/distributed/ports.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <tuple>

namespace zenflow::distributed {
namespace {

// Binds a TCP socket to port 0 on `host`; returns {fd, port}. reuse: SO_REUSEADDR.
std::pair<int, int> bind_port_zero(const std::string& host, bool reuse) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "0", &hints, &res); rc != 0) {
    throw std::runtime_error("cannot resolve " + host + ": " + gai_strerror(rc));
  }
  std::string err = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = std::strerror(errno);
      continue;
    }
    const int one = 1;
    if (reuse) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        const int port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
        freeaddrinfo(res);
        return {fd, port};
      }
    }
    err = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  throw std::runtime_error("cannot bind a socket on " + host + ": " + err);
}

}  // namespace

int find_free_port(const std::string& host) {
  try {
    const auto [fd, port] = bind_port_zero(host, false);
    ::close(fd);
    return port;
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("find_free_port: ") + e.what());
  }
}

PortReservation::PortReservation(const std::string& host) {
  try {
    std::tie(fd_, port_) = bind_port_zero(host, true);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("PortReservation: ") + e.what());
  }
}

PortReservation::~PortReservation() { release(); }

void PortReservation::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace zenflow::distributed
