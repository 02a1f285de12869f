#include "worker/distributed/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "worker/distributed/rendezvous.h"

extern char** environ;

namespace zenflow::distributed {
namespace {

volatile sig_atomic_t g_pending_signal = 0;

void on_signal(int sig) { g_pending_signal = sig; }

using Clock = std::chrono::steady_clock;

std::string describe(const RankExit& e) {
  if (e.exited) return "exit status " + std::to_string(e.status);
  const char* name = strsignal(e.status);
  return "signal " + std::to_string(e.status) + (name ? std::string(" (") + name + ")" : std::string());
}

bool is_rank_variable(const char* entry) {
  static const char* const names[] = {
      kEnvRank,    kEnvWorldSize,     kEnvMasterAddr,       kEnvMasterPort,
      kEnvTimeout, kEnvStoreExternal, kEnvLocalRank, kEnvLocalWorldSize};
  for (const char* n : names) {
    const size_t len = std::strlen(n);
    if (std::strncmp(entry, n, len) == 0 && entry[len] == '=') return true;
  }
  return false;
}

// Restores the previous SIGINT/SIGTERM dispositions on scope exit.
class SignalScope {
 public:
  SignalScope() {
    g_pending_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

}  // namespace


LaunchResult launch_local_ranks_detailed(int nproc, const std::vector<std::string>& argv_of_child,
                                         const LaunchOptions& options) {
  if (nproc < 1)
    throw std::invalid_argument("launch_local_ranks: nproc must be >= 1, got " + std::to_string(nproc));
  if (argv_of_child.empty()) throw std::invalid_argument("launch_local_ranks: argv_of_child is empty");
  if (options.executable.empty()) throw std::invalid_argument("launch_local_ranks: no executable");
  auto log = options.log ? options.log : [](const std::string& m) { std::cerr << m << std::endl; };
  // The store: hosted here (bound now, before any rank starts), or by rank 0 on a port
  // held reserved until the launch ends.
  std::unique_ptr<StoreServer> store;
  std::unique_ptr<PortReservation> reservation;
  int port = options.master_port;
  if (options.host_store) {
    store =
        std::make_unique<StoreServer>(options.master_addr, options.master_port,
                                      options.timeout.count() > 0 ? options.timeout : kDefaultDistTimeout);
    port = store->port();
  } else if (port == 0) {
    reservation = std::make_unique<PortReservation>(options.master_addr);
    port = reservation->port();
  }

  // Everything the children need is built before fork(): after it, the child (a copy of
  // a possibly multithreaded process) may only call async-signal-safe functions.
  std::vector<std::string> base_env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (!is_rank_variable(*e)) base_env.emplace_back(*e);
  }
  base_env.push_back(std::string(kEnvWorldSize) + "=" + std::to_string(nproc));
  base_env.push_back(std::string(kEnvMasterAddr) + "=" + options.master_addr);
  base_env.push_back(std::string(kEnvMasterPort) + "=" + std::to_string(port));
  base_env.push_back(std::string(kEnvLocalWorldSize) + "=" + std::to_string(nproc));
  base_env.push_back(std::string(kEnvStoreExternal) + "=" + (options.host_store ? "1" : "0"));
  if (options.timeout.count() > 0) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3f", options.timeout.count() / 1000.0);
    base_env.push_back(std::string(kEnvTimeout) + "=" + buf);
  }
  for (const auto& [k, v] : options.extra_env) base_env.push_back(k + "=" + v);

  std::vector<std::vector<std::string>> envs(nproc, base_env);
  std::vector<std::vector<char*>> envps(nproc);
  for (int r = 0; r < nproc; ++r) {
    envs[r].push_back(std::string(kEnvRank) + "=" + std::to_string(r));
    envs[r].push_back(std::string(kEnvLocalRank) + "=" + std::to_string(r));
    for (auto& s : envs[r]) envps[r].push_back(s.data());
    envps[r].push_back(nullptr);
  }
  std::vector<std::string> args = argv_of_child;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const char* exe = options.executable.c_str();

  LaunchResult result;
  result.ranks.resize(nproc);
  std::vector<bool> alive(nproc, false);
  SignalScope signals;

  auto signal_alive = [&](int sig) {
    for (int r = 0; r < nproc; ++r) {
      if (alive[r]) {
        // The child's process group (its own children too); the pid alone if the group
        // is not there.
        if (::kill(-result.ranks[r].pid, sig) != 0) ::kill(result.ranks[r].pid, sig);
        result.ranks[r].stopped_by_launcher = true;
      }
    }
  };

  const pid_t parent = ::getpid();
  for (int r = 0; r < nproc; ++r) {
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) {
      signal_alive(SIGKILL);
      for (int q = 0; q < r; ++q) ::waitpid(result.ranks[q].pid, nullptr, 0);
      throw std::runtime_error(std::string("launch_local_ranks: pipe2 failed: ") + std::strerror(errno));
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(pipefd[0]);
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::execve(exe, argv.data(), envps[r].data());
      const int err = errno;
      ssize_t ignored = ::write(pipefd[1], &err, sizeof(err));
      (void)ignored;
      ::_exit(127);
    }
    ::close(pipefd[1]);
    if (pid < 0) {
      ::close(pipefd[0]);
      signal_alive(SIGKILL);
      for (int q = 0; q < r; ++q) ::waitpid(result.ranks[q].pid, nullptr, 0);
      throw std::runtime_error(std::string("launch_local_ranks: fork failed: ") + std::strerror(errno));
    }
    ::setpgid(pid, pid);  // also here, so that a signal right after fork finds the group
    result.ranks[r].pid = pid;
    alive[r] = true;
    int child_errno = 0;
    ssize_t n;
    do {
      n = ::read(pipefd[0], &child_errno, sizeof(child_errno));
    } while (n < 0 && errno == EINTR);
    ::close(pipefd[0]);
    if (n == static_cast<ssize_t>(sizeof(child_errno))) {
      ::waitpid(pid, nullptr, 0);
      alive[r] = false;
      signal_alive(SIGKILL);
      for (int q = 0; q < r; ++q) ::waitpid(result.ranks[q].pid, nullptr, 0);
      throw std::runtime_error("launch_local_ranks: cannot execute " + options.executable + " for rank " +
                               std::to_string(r) + ": " + std::strerror(child_errno));
    }
  }
  log("zenflow: started " + std::to_string(nproc) + " rank(s), rendezvous " + options.master_addr + ":" +
      std::to_string(port) + (options.host_store ? " (hosted by the launcher)" : " (hosted by rank 0)"));

  bool termed = false;
  bool killed = false;
  Clock::time_point term_at = Clock::time_point::max();
  Clock::time_point kill_at = Clock::time_point::max();
  int remaining = nproc;
  while (remaining > 0) {
    if (const int sig = g_pending_signal; sig != 0) {
      g_pending_signal = 0;
      if (result.interrupted_by == 0) {
        result.interrupted_by = sig;
        log(std::string("zenflow: received ") + strsignal(sig) + "; forwarding it to the ranks");
      }
      signal_alive(sig);
      termed = true;
      if (kill_at == Clock::time_point::max()) kill_at = Clock::now() + options.term_grace;
    }
    for (int r = 0; r < nproc; ++r) {
      if (!alive[r]) continue;
      int st = 0;
      const pid_t got = ::waitpid(result.ranks[r].pid, &st, WNOHANG);
      if (got == 0) continue;
      if (got < 0 && errno == EINTR) continue;
      alive[r] = false;
      --remaining;
      RankExit& e = result.ranks[r];
      if (got < 0) {
        e.exited = false;
        e.status = 0;
      } else if (WIFEXITED(st)) {
        e.exited = true;
        e.status = WEXITSTATUS(st);
      } else {
        e.exited = false;
        e.status = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
      }
      const bool failed = !(e.exited && e.status == 0);
      if (failed && result.failed_rank < 0 && !e.stopped_by_launcher) {
        result.failed_rank = r;
        result.exit_code = e.exited ? e.status : 128 + e.status;
        result.message = "zenflow: rank " + std::to_string(r) + " (pid " + std::to_string(e.pid) +
                         ") failed with " + describe(e);
        log(result.message + (remaining > 0 ? "; stopping the other ranks" : ""));
        term_at = Clock::now() + options.grace;
      }
    }
    if (remaining == 0) break;
    const auto now = Clock::now();
    if (!termed && now >= term_at) {
      signal_alive(SIGTERM);
      termed = true;
      kill_at = now + options.term_grace;
    }
    if (!killed && now >= kill_at) {
      signal_alive(SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  if (result.failed_rank < 0 && result.interrupted_by != 0) {
    result.exit_code = 128 + result.interrupted_by;
    result.message = std::string("zenflow: interrupted by ") + strsignal(result.interrupted_by) +
                     "; every rank was stopped";
  } else if (result.failed_rank >= 0) {
    std::string others;
    for (int r = 0; r < nproc; ++r) {
      if (r == result.failed_rank) continue;
      others += (others.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + ": " +
                describe(result.ranks[r]) + (result.ranks[r].stopped_by_launcher ? " (stopped)" : "");
    }
    result.message = "zenflow: rank " + std::to_string(result.failed_rank) + " failed with " +
                     describe(result.ranks[result.failed_rank]) + (others.empty() ? "" : "; " + others);
  }
  return result;
}

int launch_local_ranks(int nproc, const std::vector<std::string>& argv_of_child,
                       const LaunchOptions& options) {
  LaunchResult r = launch_local_ranks_detailed(nproc, argv_of_child, options);
  if (!r.message.empty()) {
    if (options.log) {
      options.log(r.message);
    } else {
      std::cerr << r.message << std::endl;
    }
  }
  return r.exit_code;
}

}  // namespace zenflow::distributed
