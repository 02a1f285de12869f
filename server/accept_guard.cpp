#include "server/accept_guard.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

namespace zenflow::server::accept_guard {
namespace {

std::mutex g_reserve_mu;
int g_reserve = -1;  // /dev/null, given up for a moment to accept and close one pending connection
std::atomic<int64_t> g_shed{0};
std::atomic<int64_t> g_exhausted{0};
std::atomic<int64_t> g_last_exhausted_ns{0};  // steady clock; 0: never

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int raw_accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return static_cast<int>(::syscall(SYS_accept4, fd, addr, len, flags));
}

// Out of descriptors: accepts and closes what waits on `fd`, one at a time, on the reserve
// descriptor. Returns when the backlog is empty or no descriptor can be had even so.
void shed_pending(int fd) {
  std::lock_guard<std::mutex> lock(g_reserve_mu);
  for (int i = 0; i < 4096 && g_reserve >= 0; ++i) {
    ::close(g_reserve);
    g_reserve = -1;
    const int c = raw_accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    const int accept_errno = errno;
    if (c >= 0) {
      ::close(c);
      g_shed.fetch_add(1);
    }
    g_reserve = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // the descriptor just freed
    if (c < 0 && accept_errno != EINTR && accept_errno != ECONNABORTED) return;  // empty (EAGAIN) or worse
  }
}

}  // namespace

void install() {
  std::lock_guard<std::mutex> lock(g_reserve_mu);
  if (g_reserve < 0) g_reserve = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

Stats stats() { return {g_shed.load(), g_exhausted.load()}; }

bool exhausted_within(std::chrono::milliseconds window) {
  const int64_t last = g_last_exhausted_ns.load();
  return last != 0 && steady_ns() - last < std::chrono::duration_cast<std::chrono::nanoseconds>(window).count();
}

}  // namespace zenflow::server::accept_guard

// Bound by the dynamic linker in place of glibc's for every caller in the process (gRPC's
// listeners included); see accept_guard.h.
extern "C" int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  namespace g = zenflow::server::accept_guard;
  const int c = g::raw_accept4(fd, addr, len, flags);
  if (c >= 0 || (errno != EMFILE && errno != ENFILE)) return c;
  g::g_exhausted.fetch_add(1);
  g::g_last_exhausted_ns.store(g::steady_ns());
  g::shed_pending(fd);
  errno = EAGAIN;  // gRPC waits for the next connection instead of closing the port for good
  return -1;
}
