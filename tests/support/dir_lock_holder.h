// Test helper: another process that owns a checkpoint.dir (CheckpointDirLock) until released.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "worker/rank/checkpoint.h"

namespace zenflow::test_support {

// Forks a child that takes CheckpointDirLock on `dir` and waits; the constructor returns
// once the child holds the lock (pid() > 0), or with pid() -1 when the child could not
// take it. release() kills the child (the kernel drops its lock) and reaps it; the
// destructor releases too.
class DirLockHolder {
 public:
  explicit DirLockHolder(const std::string& dir) {
    int ready[2];
    if (::pipe(ready) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      try {
        CheckpointDirLock lock(dir);
        (void)!::write(ready[1], "1", 1);
        ::pause();
      } catch (...) {
        _exit(3);
      }
      _exit(0);
    }
    ::close(ready[1]);
    char c = 0;
    if (pid_ > 0 && ::read(ready[0], &c, 1) != 1) release();  // it failed to lock
    ::close(ready[0]);
  }
  ~DirLockHolder() { release(); }
  DirLockHolder(const DirLockHolder&) = delete;
  DirLockHolder& operator=(const DirLockHolder&) = delete;

  pid_t pid() const { return pid_; }
  void release() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace zenflow::test_support
