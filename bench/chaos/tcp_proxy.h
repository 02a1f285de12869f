// A TCP proxy on 127.0.0.1 that the chaos harness puts on a link (an agent's connection to
// the coordinator) to partition and heal it.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace zenflow::chaos {

// What the link does.
enum class LinkMode {
  kForward,    // bytes flow both ways
  kBlackhole,  // nothing flows and nothing is closed: open connections stay open and silent,
               // new ones wait in the listen backlog; a heal resumes them where they stopped
               // (as TCP retransmission would after a real partition)
  kReset,      // every open connection is reset (RST both ways), and every new one at once
};
const char* link_mode_name(LinkMode mode);

// Listens on 127.0.0.1 (a free port) and forwards each accepted connection to
// 127.0.0.1:upstream_port over a connection of its own. One thread (poll) does everything.
//
// Thread-safety: set_mode(), port() and the destructor may be called from any thread.
class TcpProxy {
 public:
  // Throws std::runtime_error when it cannot listen.
  explicit TcpProxy(int upstream_port);
  ~TcpProxy();  // closes every connection and the listener, joins the thread
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  // Takes effect within the poll loop's next turn (it is woken at once).
  void set_mode(LinkMode mode);
  LinkMode mode() const { return mode_.load(); }
  // Connections accepted so far and connections reset by kReset (for the report).
  int64_t accepted() const { return accepted_.load(); }
  int64_t resets() const { return resets_.load(); }

 private:
  void loop();
  void wake();

  int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<LinkMode> mode_{LinkMode::kForward};
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> accepted_{0}, resets_{0};
  std::thread thread_;
};

}  // namespace zenflow::chaos
