// A child process for multi-process tests: output to a file, its own process group,
// killed (SIGKILL to the group) and reaped when destroyed; and a bounded poll.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/shell.h"

namespace zenflow::test_support {
namespace fs = std::filesystem;

// Polls `done` every 50 ms until it returns true or `timeout` passes.
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

// One child process, output to a file, in its own process group; killed (SIGKILL to the
// group) and reaped when destroyed, and killed by the kernel when the test process dies
// first (a ctest timeout, a crash: PR_SET_PDEATHSIG), so no server outlives its test.
// Create it on a thread that lives as long as it (the death signal follows the thread).
class Process {
 public:
  Process(const std::vector<std::string>& argv, const fs::path& log) : log_(log) {
    std::vector<std::string> args = argv;
    std::vector<char*> cargv;
    for (std::string& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the test died before the line above
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    if (pid_ < 0) throw std::runtime_error("fork failed");
    ::setpgid(pid_, pid_);
  }
  ~Process() { kill(SIGKILL); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  std::string output() const { return read_file(log_); }
  // Signals the process only (not its group: a worker's ranks have groups of their own).
  void signal(int sig) const {
    if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
  }
  void kill(int sig) {
    if (pid_ <= 0 || reaped_) return;
    ::kill(-pid_, sig);
    ::kill(pid_, sig);
    if (sig == SIGKILL) wait_exit(std::chrono::seconds(10));
  }
  // Waits for the exit; returns the status (128 + signal), or -1 on timeout.
  int wait_exit(std::chrono::milliseconds timeout) {
    if (reaped_) return status_;
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped_ = true;
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return status_;
      }
      if (std::chrono::steady_clock::now() > end) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  bool running() {
    if (reaped_) return false;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      reaped_ = true;
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return !reaped_;
  }

 private:
  fs::path log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = -1;
};

// PIDs of processes whose command line contains `needle` (e.g. an attempt's directory).

}  // namespace zenflow::test_support
