// The worker agent's lease on a rank process: `zenflow run --lease-fd N --lease-timeout S`.
//
// The agent that runs a rank keeps the write end of a pipe (or socket) whose read end is
// this process's fd N, and writes a byte (any byte) at least every S/3 seconds or so. Every
// byte renews the lease. The lease is held from construction (the agent's first byte may
// come up to S seconds after the process starts) and ends in one of two ways:
//   lost     the fd reached EOF or failed: the agent is gone (died, or closed it on purpose);
//   expired  no byte for S seconds while the fd stays open: the agent is stopped or cut off,
//            its coordinator may have given the job to another attempt already.
// Either way the process no longer owns the job: it must not commit another checkpoint and
// must end at once. The lease's thread calls `on_end` once, when it sees the end; `zenflow
// run` prints one line and _exit(75)s there (no destructor, no final checkpoint).
//
// An _exit from the lease's thread can race a checkpoint that the training thread is
// committing, so the commit asks the lease itself: publish_if_held() is the CommitFence
// (checkpoint.h) of the run. It publishes only while the lease is held *by the clock* (the
// last byte is less than S old at that instant, whether or not the thread has woken up
// yet), and the thread waits for a publish in progress before it declares the end. So a
// checkpoint is committed only if its rename started within S of the last renewal, and
// nothing is committed after on_end ran. A coordinator that waits S plus the time of one
// rename after its last renewal before it gives the job away never sees two writers.
//
// Thread safety: publish_if_held(), held() and expire() may be called from any thread.
// The fd is not owned (never closed); it is read only by the lease's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace zenflow {

enum class LeaseEnd { kLost, kExpired };

class Lease {
 public:
  // Starts the thread that reads `fd`. `on_end` runs on that thread (or in expire()), once.
  // Throws std::runtime_error when the thread or its wake-up pipe cannot be made.
  Lease(int fd, std::chrono::milliseconds timeout, std::function<void(LeaseEnd)> on_end);
  // Stops the thread (without calling on_end).
  ~Lease();
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  // The CommitFence: runs `publish` and returns true when the lease is held now; false
  // (without running it) once the lease was lost or expired. Holds off the end's
  // declaration while `publish` runs; an exception from it passes through.
  bool publish_if_held(const std::function<void()>& publish);

  // Not lost, and renewed less than `timeout` ago.
  bool held() const;

  // Declares the lease expired now unless it already ended, then runs on_end (once in all).
  // For a caller that found the lease gone first (a refused commit).
  void expire();

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  void watch();              // the thread: reads the fd until the lease ends or ~Lease
  void end(LeaseEnd why);    // marks the end (waiting for a publish in progress), runs on_end once
  bool held_locked() const;  // held(), with mu_ held

  const int fd_;
  const std::chrono::milliseconds timeout_;
  const std::function<void(LeaseEnd)> on_end_;
  std::atomic<int64_t> renewed_ns_;  // steady_clock of the last byte (or of construction)
  mutable std::mutex mu_;            // held by a publish, and to mark the end
  // Lost or expired: set with mu_ held (so after any publish in progress), read without it
  // (the thread never waits for mu_ to read a renewal).
  std::atomic<bool> ended_{false};
  std::atomic<bool> end_reported_{false};
  int wake_[2] = {-1, -1};  // ~Lease writes to wake_[1] to stop the thread
  std::thread thread_;
};

}  // namespace zenflow
