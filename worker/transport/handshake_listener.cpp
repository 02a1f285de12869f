// The handshake's sockets (handshake_listener.h).
#include "worker/transport/handshake_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <thread>
#include <vector>

#include "worker/transport/transport.h"

namespace zenflow::transport {
namespace {

using Clock = std::chrono::steady_clock;
using handshake::State;

std::string address_text(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
  getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV);
  const bool v6 = sa->sa_family == AF_INET6;
  return (v6 ? "[" : "") + std::string(host) + (v6 ? "]:" : ":") + serv;
}

sockaddr_storage resolve(const std::string& host, int port, bool passive, socklen_t* len, const char* what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string serv = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), serv.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    throw TransportError(std::string(what) + " " + host + ":" + serv + ": cannot resolve the host (" +
                         gai_strerror(rc) + ")");
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return ss;
}

int remaining_ms(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1000));
}

// Sends what it can of `out` (nonblocking); false when the peer is gone.
bool send_some(int fd, std::string& out) {
  while (!out.empty()) {
    const ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      out.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

struct Conn {
  int fd = -1;
  std::string from;
  sockaddr_storage from_addr;
  Clock::time_point deadline;
  handshake::ServerHandshake hs;
  uint64_t own_channel = 0;
  std::string out;
  bool finished = false;  // close once `out` is sent
};

}  // namespace

struct HandshakeListener::Impl {
  ListenerOptions opt;
  Admit admit;
  int listen_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::atomic<bool> stop{false};
  std::thread thread;
  std::list<Conn> conns;
  Clock::time_point last_log{};
  int64_t unlogged = 0;

  void log_failure(const Conn& c, const std::string& why) {
    const auto now = Clock::now();
    if (now - last_log < std::chrono::seconds(1)) {
      ++unlogged;
      return;
    }
    std::fprintf(
        stderr, "zenflow transport (%s): handshake from %s failed: %s%s\n", opt.name.c_str(), c.from.c_str(),
        why.c_str(),
        unlogged ? (" (and " + std::to_string(unlogged) + " more since the last line)").c_str() : "");
    unlogged = 0;
    last_log = now;
  }

  void accept_new() {
    for (int i = 0; i < 16 && static_cast<int>(conns.size()) < opt.max_in_progress; ++i) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd =
          ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of descriptors: the backlog keeps it for later
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      const uint64_t id = handshake::random_channel_id();
      conns.push_back(
          Conn{fd, address_text(reinterpret_cast<sockaddr*>(&ss), len), ss,
               Clock::now() + std::chrono::microseconds(static_cast<int64_t>(opt.timeout_s * 1e6)),
               handshake::ServerHandshake(opt.secret_for, {opt.address, id}, handshake::random_nonce()), id, "",
               false});
    }
  }

  // Reads what arrived; false when the connection is to be closed now.
  bool on_readable(Conn& c) {
    uint8_t buf[4096];
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (n <= 0) {
      log_failure(c, "the peer closed the connection before finishing it");
      return false;
    }
    c.out += c.hs.feed(buf, static_cast<size_t>(n));
    if (c.hs.state() == State::kFailed) {
      log_failure(c, c.hs.error());
      c.finished = true;  // a REFUSE, when there is one, goes out first
    } else if (c.hs.state() == State::kAccepted) {
      bool admitted = false;
      try {
        admitted = admit(c.hs.peer(), c.own_channel, c.from, c.from_addr);
      } catch (const std::exception& e) {
        log_failure(c, std::string("admitting it threw: ") + e.what());
      }
      if (!admitted) return false;
      c.finished = true;
    }
    return true;
  }

  void run() {
    std::vector<pollfd> fds;
    while (!stop) {
      fds.clear();
      fds.push_back({wake_fd, POLLIN, 0});
      const bool room = static_cast<int>(conns.size()) < opt.max_in_progress;
      fds.push_back({listen_fd, static_cast<short>(room ? POLLIN : 0), 0});
      auto next_deadline = Clock::now() + std::chrono::seconds(1);
      for (const Conn& c : conns) {
        fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
        next_deadline = std::min(next_deadline, c.deadline);
      }
      if (::poll(fds.data(), fds.size(), remaining_ms(next_deadline)) < 0 && errno != EINTR) break;
      if (stop) break;
      size_t k = 2;
      const auto now = Clock::now();
      for (auto it = conns.begin(); it != conns.end(); ++k) {
        Conn& c = *it;
        bool keep = true;
        if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) keep = on_readable(c);
        if (keep && !c.out.empty()) keep = send_some(c.fd, c.out);
        if (keep && c.finished && c.out.empty()) keep = false;
        if (keep && now >= c.deadline) {
          log_failure(c, "not finished within " + std::to_string(opt.timeout_s) + " s");
          keep = false;
        }
        if (keep) {
          ++it;
        } else {
          ::close(c.fd);
          it = conns.erase(it);
        }
      }
      if (fds[1].revents & POLLIN) accept_new();
    }
    for (Conn& c : conns) ::close(c.fd);
    conns.clear();
  }
};

HandshakeListener::HandshakeListener(const std::string& host, int port, ListenerOptions options, Admit admit)
    : impl_(new Impl) {
  Impl& i = *impl_;
  i.opt = std::move(options);
  i.admit = std::move(admit);
  const std::string where = host + ":" + std::to_string(port);
  socklen_t len = 0;
  sockaddr_storage addr = resolve(host, port, /*passive=*/true, &len, "listen on");
  i.listen_fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (i.listen_fd >= 0) ::setsockopt(i.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (i.listen_fd < 0 || ::bind(i.listen_fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(i.listen_fd, 128) != 0) {
    const std::string error = std::strerror(errno);
    if (i.listen_fd >= 0) ::close(i.listen_fd);
    throw TransportError("listen on " + where + ": " + error);
  }
  len = sizeof addr;
  ::getsockname(i.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  i.port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  i.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (i.wake_fd < 0) {
    ::close(i.listen_fd);
    throw TransportError("listen on " + where + ": eventfd: " + std::strerror(errno));
  }
  i.thread = std::thread([&i] { i.run(); });
  pthread_setname_np(i.thread.native_handle(), "zf-handshake");
}

HandshakeListener::~HandshakeListener() {
  Impl& i = *impl_;
  i.stop = true;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(i.wake_fd, &one, sizeof one);
  i.thread.join();
  ::close(i.listen_fd);
  ::close(i.wake_fd);
}

int HandshakeListener::port() const { return impl_->port; }

handshake::Endpoint client_handshake(const std::string& host, int port, const std::string& secret,
                                     const std::string& key, const handshake::Endpoint& local, double timeout_s,
                                     sockaddr_storage* peer_addr) {
  const std::string where = host + ":" + std::to_string(port);
  const auto deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, timeout_s) * 1e6));
  socklen_t len = 0;
  const sockaddr_storage addr = resolve(host, port, /*passive=*/false, &len, "connect to");
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw TransportError("connect to " + where + ": socket: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto wait_for = [&](short events, const char* doing) {
    for (;;) {
      const int left = remaining_ms(deadline);
      if (left == 0 && Clock::now() >= deadline)
        throw TransportError("connect to " + where + ": no answer within " + std::to_string(timeout_s) +
                             " s (" + doing + ")");
      pollfd p{fd, events, 0};
      const int r = ::poll(&p, 1, left);
      if (r > 0) return;
      if (r < 0 && errno != EINTR)
        throw TransportError("connect to " + where + ": poll: " + std::strerror(errno));
    }
  };
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    if (errno != EINPROGRESS) throw TransportError("connect to " + where + ": " + std::strerror(errno));
    wait_for(POLLOUT, "connecting");
    int err = 0;
    socklen_t elen = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) throw TransportError("connect to " + where + ": " + std::strerror(err));
  }
  if (key.size() > handshake::kMaxKeyBytes)
    throw TransportError("connect to " + where + ": key of " + std::to_string(key.size()) + " bytes (at most " +
                         std::to_string(handshake::kMaxKeyBytes) + ")");
  handshake::ClientHandshake hs(secret, key, local, handshake::random_nonce());
  std::string out = hs.start();
  while (hs.state() == State::kRunning) {
    while (!out.empty()) {
      if (!send_some(fd, out))
        throw TransportError("connect to " + where + ": the peer closed the connection");
      if (!out.empty()) wait_for(POLLOUT, "sending the handshake");
    }
    wait_for(POLLIN, "waiting for the handshake's answer");
    uint8_t buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0)
      throw TransportError(
          "connect to " + where +
          ": the peer closed the connection during the handshake (not a zenflow listener, or "
          "it refused this side)");
    out += hs.feed(buf, static_cast<size_t>(n));
  }
  if (hs.state() == State::kFailed) {
    if (hs.authentication_failed()) throw AuthenticationError("connect to " + where + ": " + hs.error());
    throw TransportError("connect to " + where + ": " + hs.error());
  }
  if (peer_addr) *peer_addr = addr;
  return hs.peer();
}

}  // namespace zenflow::transport
