#include "bench/local_node.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace zenflow::cli {

namespace fs = std::filesystem;

LocalOptimizerNode::LocalOptimizerNode(const fs::path& scratch, const std::vector<std::string>& args,
                                       const std::vector<int>& process_cores) {
  const fs::path exe = fs::read_symlink("/proc/self/exe").parent_path() / "zenflow-optimizer";
  const fs::path port_file = scratch / ("node-" + std::to_string(::getpid()) + ".port");
  fs::remove(port_file);
  std::vector<std::string> argv = {exe.string(), "--listen", "127.0.0.1:0", "--port-file",
                                   port_file.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : process_cores)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("cannot start " + exe.string() + ": fork failed");
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!process_cores.empty()) ::sched_setaffinity(0, sizeof(set), &set);
    const int null = ::open("/dev/null", O_WRONLY);  // its stderr stays the caller's
    if (null >= 0) ::dup2(null, 1);
    ::execv(cargv[0], cargv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int port = 0;
  while (port == 0 && std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(port_file);
    if (!(in >> port)) port = 0;
    if (port == 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  fs::remove(port_file);
  if (port == 0) {
    stop();
    throw std::runtime_error(exe.string() + " did not start within 10 s (what it said is above)");
  }
  address_ = "127.0.0.1:" + std::to_string(port);
}

LocalOptimizerNode::~LocalOptimizerNode() { stop(); }

void LocalOptimizerNode::stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

}  // namespace zenflow::cli
