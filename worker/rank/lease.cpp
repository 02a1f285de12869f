// The worker agent's lease on a rank process (see lease.h).
#include "worker/rank/lease.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace zenflow {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Lease::Lease(int fd, std::chrono::milliseconds timeout, std::function<void(LeaseEnd)> on_end)
    : fd_(fd), timeout_(timeout), on_end_(std::move(on_end)), renewed_ns_(now_ns()) {
  if (::pipe2(wake_, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("lease: cannot create a pipe: ") + std::strerror(errno));
  try {
    thread_ = std::thread([this] { watch(); });
  } catch (const std::system_error& e) {
    ::close(wake_[0]);
    ::close(wake_[1]);
    throw std::runtime_error(std::string("lease: cannot start its thread: ") + e.what());
  }
}

Lease::~Lease() {
  const char c = 0;
  (void)!::write(wake_[1], &c, 1);
  thread_.join();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

bool Lease::held_locked() const {
  return !ended_.load() && now_ns() - renewed_ns_.load() < std::chrono::nanoseconds(timeout_).count();
}

bool Lease::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_locked();
}

bool Lease::publish_if_held(const std::function<void()>& publish) {
  std::lock_guard<std::mutex> hold(mu_);
  if (!held_locked()) return false;
  publish();
  return true;
}

void Lease::expire() { end(LeaseEnd::kExpired); }

void Lease::end(LeaseEnd why) {
  {
    std::lock_guard<std::mutex> lock(mu_);  // waits for a publish in progress
    ended_.store(true);
  }
  if (!end_reported_.exchange(true)) on_end_(why);
}

void Lease::watch() {
  const int64_t timeout_ns = std::chrono::nanoseconds(timeout_).count();
  char buf[256];
  while (!ended_.load()) {
    const int64_t left_ns = renewed_ns_.load() + timeout_ns - now_ns();
    if (left_ns <= 0) return end(LeaseEnd::kExpired);
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    const int wait_ms = static_cast<int>(std::min<int64_t>((left_ns + 999'999) / 1'000'000, 60'000));
    const int n = ::poll(fds, 2, wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return end(LeaseEnd::kLost);
    if (fds[1].revents != 0) return;    // ~Lease
    if (fds[0].revents == 0) continue;  // the deadline: checked at the top
    if (fds[0].revents & POLLNVAL) return end(LeaseEnd::kLost);
    const ssize_t r = ::read(fd_, buf, sizeof buf);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0) return end(LeaseEnd::kLost);  // EOF: the agent closed it or died
    // A byte read after the deadline renews nothing: a commit may already have been refused
    // by the clock (publish_if_held), and the end is final.
    const int64_t t = now_ns();
    if (t - renewed_ns_.load() >= timeout_ns) return end(LeaseEnd::kExpired);
    renewed_ns_.store(t);
  }
}

}  // namespace zenflow
