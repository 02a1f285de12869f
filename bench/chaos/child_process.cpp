// Child processes of the chaos harness (child_process.h).
#include "bench/chaos/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace zenflow::chaos {

ChildProcess::ChildProcess(std::string name, std::vector<std::string> argv, std::vector<std::string> env,
                           std::filesystem::path log)
    : name_(std::move(name)), argv_(std::move(argv)), env_(std::move(env)), log_(std::move(log)) {}

ChildProcess::~ChildProcess() { kill_now(); }

void ChildProcess::start() {
  if (running()) return;
  std::vector<char*> argv, envp;
  for (std::string& a : argv_) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env_) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open " + log_.string());
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGHUP}) ::signal(s, SIG_DFL);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    static const char msg[] = "chaos harness: exec failed\n";
    (void)!::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(fd);
  if (null_fd >= 0) ::close(null_fd);
  if (pid < 0) throw std::runtime_error("fork failed for " + name_);
  ::setpgid(pid, pid);
  pid_ = pid;
  status_ = -1;
}

bool ChildProcess::running() {
  if (pid_ <= 0) return false;
  int st = 0;
  const pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    pid_ = -1;
    return false;
  }
  return r == 0;
}

bool ChildProcess::signal(int sig) {
  if (!running()) return false;
  return ::kill(pid_, sig) == 0;
}

void ChildProcess::stop(int64_t grace_ms) {
  if (!running()) return;
  ::kill(pid_, SIGCONT);
  ::kill(pid_, SIGTERM);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  while (std::chrono::steady_clock::now() < end && running())
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill_now();
}

void ChildProcess::kill_now() {
  if (!running()) return;
  ::kill(pid_, SIGKILL);
  int st = 0;
  if (::waitpid(pid_, &st, 0) == pid_) status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  pid_ = -1;
}

}  // namespace zenflow::chaos
