// A process the chaos harness starts and stops by PID: in a process group of its own,
// killed with the harness (PR_SET_PDEATHSIG), its output appended to a log file, and
// restartable with the same command line.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace zenflow::chaos {

// Thread-safety: none; the harness calls one ChildProcess from one thread at a time.
class ChildProcess {
 public:
  // `env` replaces the environment (KEY=VALUE each). Nothing runs until start().
  ChildProcess(std::string name, std::vector<std::string> argv, std::vector<std::string> env,
               std::filesystem::path log);
  ~ChildProcess();  // stop(0): SIGKILL if still running, and reap
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Forks and execs the command line (only async-signal-safe calls between the two, so
  // forking while other threads run is safe). Throws std::runtime_error when fork fails.
  void start();
  // Whether it runs (not yet reaped); reaps it when it has exited.
  bool running();
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  const std::filesystem::path& log() const { return log_; }
  // kill(pid, sig) when running; false otherwise.
  bool signal(int sig);
  // SIGCONT (a stopped process handles no SIGTERM), SIGTERM, then SIGKILL after
  // `grace_ms`; waits until it is reaped (bounded: SIGKILL cannot be ignored).
  void stop(int64_t grace_ms);
  // SIGKILL and reap.
  void kill_now();
  // The exit status of its last run: exit code, or 128 + signal; -1 when never reaped.
  int last_status() const { return status_; }

 private:
  std::string name_;
  std::vector<std::string> argv_, env_;
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int status_ = -1;
};

}  // namespace zenflow::chaos
