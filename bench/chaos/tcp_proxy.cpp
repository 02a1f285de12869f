// The partitionable TCP proxy (tcp_proxy.h).
#include "bench/chaos/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <stdexcept>
#include <vector>

namespace zenflow::chaos {
namespace {

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Close with RST rather than FIN: what a reset link does to its peers.
void reset_close(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// One proxied connection: bytes read from one side wait in `pending` until the other side
// takes them (and nothing more is read from that side meanwhile).
struct Pair {
  int fd[2] = {-1, -1};    // 0: the client (accepted), 1: upstream
  std::string pending[2];  // pending[i]: read from fd[i], to write to fd[1 - i]
  bool closed = false;
};

}  // namespace

const char* link_mode_name(LinkMode m) {
  switch (m) {
    case LinkMode::kForward:
      return "forward";
    case LinkMode::kBlackhole:
      return "blackhole";
    case LinkMode::kReset:
      return "reset";
  }
  return "?";
}

TcpProxy::TcpProxy(int upstream_port) : upstream_port_(upstream_port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = loopback(0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw std::runtime_error(std::string("tcp proxy: cannot listen on 127.0.0.1: ") + std::strerror(errno));
  }
  socklen_t len = sizeof a;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  set_nonblocking(listen_fd_);
  if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    throw std::runtime_error("tcp proxy: pipe failed");
  }
  thread_ = std::thread([this] { loop(); });
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  wake();
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_pipe_[0]);
  ::close(wake_pipe_[1]);
}

void TcpProxy::set_mode(LinkMode mode) {
  mode_ = mode;
  wake();
}

void TcpProxy::wake() {
  const char c = 1;
  (void)!::write(wake_pipe_[1], &c, 1);
}

void TcpProxy::loop() {
  std::list<Pair> pairs;
  auto reset_all = [&] {
    for (Pair& p : pairs) {
      reset_close(p.fd[0]);
      reset_close(p.fd[1]);
      resets_ += 1;
    }
    pairs.clear();
  };
  while (!stopping_) {
    const LinkMode mode = mode_.load();
    if (mode == LinkMode::kReset && !pairs.empty()) reset_all();
    std::vector<pollfd> fds;
    std::vector<std::pair<Pair*, int>> owners;  // for fds[2..]: which pair and side
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    // Blackhole: the listener is not polled either (new connections wait in the backlog).
    fds.push_back({listen_fd_, static_cast<short>(mode == LinkMode::kBlackhole ? 0 : POLLIN), 0});
    if (mode == LinkMode::kForward) {
      for (Pair& p : pairs)
        for (int side = 0; side < 2; ++side) {
          short ev = 0;
          if (p.pending[side].empty()) ev |= POLLIN;        // room to read more from this side
          if (!p.pending[1 - side].empty()) ev |= POLLOUT;  // bytes waiting for this side
          fds.push_back({p.fd[side], ev, 0});
          owners.push_back({&p, side});
        }
    }
    if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      char buf[64];
      while (::read(wake_pipe_[0], buf, sizeof buf) > 0) {
      }
    }
    if (mode_.load() != mode) continue;  // changed while polling: re-plan
    if (fds[1].revents & POLLIN) {
      for (;;) {
        const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        accepted_ += 1;
        // The mode now, not at the top of the turn: a connection made after set_mode()
        // returned gets the new mode.
        if (mode_.load() == LinkMode::kReset) {
          reset_close(c);
          resets_ += 1;
          continue;
        }
        const int u = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const sockaddr_in ua = loopback(upstream_port_);
        if (u < 0 || ::connect(u, reinterpret_cast<const sockaddr*>(&ua), sizeof ua) != 0) {
          if (u >= 0) ::close(u);
          reset_close(c);  // nothing listens upstream: the client sees its connection refused
          continue;
        }
        const int one = 1;
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::setsockopt(u, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        set_nonblocking(u);
        Pair p;
        p.fd[0] = c;
        p.fd[1] = u;
        pairs.push_back(std::move(p));
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      Pair& p = *owners[i - 2].first;
      const int side = owners[i - 2].second;
      if (p.closed || fds[i].revents == 0) continue;
      if (fds[i].revents & POLLOUT) {
        std::string& out = p.pending[1 - side];
        const ssize_t n = ::send(p.fd[side], out.data(), out.size(), MSG_NOSIGNAL);
        if (n > 0) out.erase(0, static_cast<size_t>(n));
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) p.closed = true;
      }
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[65536];
        const ssize_t n = ::recv(p.fd[side], buf, sizeof buf, 0);
        if (n > 0) {
          std::string& out = p.pending[side];
          out.append(buf, static_cast<size_t>(n));
          const ssize_t w = ::send(p.fd[1 - side], out.data(), out.size(), MSG_NOSIGNAL);
          if (w > 0) out.erase(0, static_cast<size_t>(w));
          if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) p.closed = true;
        } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
          p.closed = true;  // one side went: close both (gRPC does not half-close)
        }
      }
    }
    for (auto it = pairs.begin(); it != pairs.end();) {
      if (it->closed) {
        ::close(it->fd[0]);
        ::close(it->fd[1]);
        it = pairs.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Pair& p : pairs) {
    ::close(p.fd[0]);
    ::close(p.fd[1]);
  }
}

}  // namespace zenflow::chaos
