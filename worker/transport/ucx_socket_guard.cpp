#include "worker/transport/ucx_socket_guard.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <netinet/in.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace zenflow::transport::socket_guard {
namespace {

struct Range {
  uintptr_t begin = 0, end = 0;
};

struct State {
  std::mutex mu;
  std::map<Address, int> allowed;  // address -> Allowances held
  std::vector<Range> ucs_code;     // libucs's executable segments; written once, in enable()
  std::once_flag found;
  std::atomic<bool> on{false};
  std::atomic<int64_t> refused{0};
  std::chrono::steady_clock::time_point last_log{};
  int64_t unlogged = 0;
};

State& state() {
  static State* s = new State;  // never destroyed: accept may run during exit
  return *s;
}

// libucs's code, where UCX's own accept() calls come from (ucs_socket_accept).
std::vector<Range> find_ucs_code() {
  std::vector<Range> ranges;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        const char* name = info->dlpi_name ? std::strrchr(info->dlpi_name, '/') : nullptr;
        name = name ? name + 1 : info->dlpi_name;
        if (!name || std::strncmp(name, "libucs.so", 9) != 0) return 0;
        auto* out = static_cast<std::vector<Range>*>(arg);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X))
            out->push_back({info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz});
        }
        return 1;
      },
      &ranges);
  return ranges;
}

bool from_ucs(const void* return_address) {
  const auto a = reinterpret_cast<uintptr_t>(return_address);
  for (const Range& r : state().ucs_code)
    if (a >= r.begin && a < r.end) return true;
  return false;
}

using AcceptFn = int (*)(int, sockaddr*, socklen_t*);
using Accept4Fn = int (*)(int, sockaddr*, socklen_t*, int);

// libc's (or a sanitizer's, which then calls libc's): the next definition after ours.
int real_accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  static const auto next = reinterpret_cast<Accept4Fn>(dlsym(RTLD_NEXT, "accept4"));
  if (next) return next(fd, addr, len, flags);
  return static_cast<int>(syscall(SYS_accept4, fd, addr, len, flags));
}

int real_accept(int fd, sockaddr* addr, socklen_t* len) {
  static const auto next = reinterpret_cast<AcceptFn>(dlsym(RTLD_NEXT, "accept"));
  if (next) return next(fd, addr, len);
  return static_cast<int>(syscall(SYS_accept4, fd, addr, len, 0));
}

void log_refused(const Address& a) {
  State& s = state();
  int64_t skipped = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const auto now = std::chrono::steady_clock::now();
    if (now - s.last_log < std::chrono::seconds(1)) {
      ++s.unlogged;
      return;
    }
    s.last_log = now;
    skipped = std::exchange(s.unlogged, 0);
  }
  std::fprintf(stderr,
               "zenflow transport: closed a connection to UCX's own listening socket from %s: no "
               "authenticated session from that address%s\n",
               address_text(a).c_str(),
               skipped ? (" (and " + std::to_string(skipped) + " more not logged)").c_str() : "");
}

// UCX's accept: connections from addresses without an Allowance are closed and the next
// one is tried, so UCX sees only the allowed ones (or EAGAIN when none is left).
int guarded_accept(int listen_fd, sockaddr* addr, socklen_t* len, int flags) {
  const bool nonblocking = (fcntl(listen_fd, F_GETFL) & O_NONBLOCK) != 0;
  for (;;) {
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    const int fd = real_accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &sl, flags);
    if (fd < 0) return fd;
    Address a{};
    if (address_of(reinterpret_cast<sockaddr*>(&ss), sl, &a) && allowed(a)) {
      if (addr && len) {
        std::memcpy(addr, &ss, std::min<socklen_t>(*len, sl));
        *len = sl;
      }
      return fd;
    }
    state().refused.fetch_add(1);  // before the close: whoever sees it closed sees it counted
    ::close(fd);
    log_refused(a);
    if (!nonblocking) {  // a blocking accept would wait for the next stranger: say "try again"
      errno = EAGAIN;
      return -1;
    }
  }
}

}  // namespace

bool address_of(const sockaddr* sa, socklen_t len, Address* out) {
  Address a{};
  if (sa->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    a[10] = a[11] = 0xff;
    std::memcpy(a.data() + 12, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    std::memcpy(a.data(), &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
  } else {
    return false;
  }
  *out = a;
  return true;
}

std::string address_text(const Address& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(a.data(), kMapped, 12) == 0) {
    inet_ntop(AF_INET, a.data() + 12, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, a.data(), buf, sizeof buf);
  }
  return buf;
}

Allowance::Allowance(const Address& a) : address_(a), held_(true) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.allowed[a];
}

Allowance::Allowance(Allowance&& other) noexcept
    : address_(other.address_), held_(std::exchange(other.held_, false)) {}

Allowance& Allowance::operator=(Allowance&& other) noexcept {
  if (this != &other) {
    release();
    address_ = other.address_;
    held_ = std::exchange(other.held_, false);
  }
  return *this;
}

Allowance::~Allowance() { release(); }

void Allowance::release() {
  if (!std::exchange(held_, false)) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.allowed.find(address_);
  if (it != s.allowed.end() && --it->second == 0) s.allowed.erase(it);
}

void enable() {
  State& s = state();
  std::call_once(s.found, [&s] {
    s.ucs_code = find_ucs_code();
    if (s.ucs_code.empty())
      std::fprintf(stderr,
                   "zenflow transport: libucs is not a shared library of this process: UCX's own "
                   "listening sockets are not guarded\n");
  });
  s.on.store(true);
}

bool allowed(const Address& a) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.allowed.count(a) != 0;
}

int64_t refused() { return state().refused.load(); }

}  // namespace zenflow::transport::socket_guard

// The process's accept and accept4 (exported by the executable: the transport's CMake target
// links with --export-dynamic-symbol for both). Only calls from libucs, once enabled, are
// filtered.
extern "C" {

__attribute__((visibility("default"), noinline)) int accept(int fd, sockaddr* addr, socklen_t* len) {
  namespace g = zenflow::transport::socket_guard;
  if (g::state().on.load(std::memory_order_acquire) && g::from_ucs(__builtin_return_address(0)))
    return g::guarded_accept(fd, addr, len, 0);
  return g::real_accept(fd, addr, len);
}

__attribute__((visibility("default"), noinline)) int accept4(int fd, sockaddr* addr, socklen_t* len,
                                                             int flags) {
  namespace g = zenflow::transport::socket_guard;
  if (g::state().on.load(std::memory_order_acquire) && g::from_ucs(__builtin_return_address(0)))
    return g::guarded_accept(fd, addr, len, flags);
  return g::real_accept4(fd, addr, len, flags);
}

}  // extern "C"
