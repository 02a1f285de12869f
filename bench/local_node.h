// A zenflow-optimizer node on this machine for the benchmarks: the binary beside this one,
// listening on 127.0.0.1 at a free port, with the environment (UCX_TLS ...) of the caller.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace zenflow::cli {

class LocalOptimizerNode {
 public:
  // Starts the node with `args` after --listen/--port-file (e.g. --threads 1 --cores 1) and
  // waits up to 10 s for its port. `process_cores` non-empty: every thread of the node, the
  // transport's included, may run only there (as on a machine of that many cores).
  // `scratch` holds the port file. The node's stderr is this process's. Throws
  // std::runtime_error naming the binary when it does not start. The node dies with this
  // process (PR_SET_PDEATHSIG).
  LocalOptimizerNode(const std::filesystem::path& scratch, const std::vector<std::string>& args,
                     const std::vector<int>& process_cores = {});
  ~LocalOptimizerNode();  // SIGKILL, then reaped
  LocalOptimizerNode(const LocalOptimizerNode&) = delete;
  LocalOptimizerNode& operator=(const LocalOptimizerNode&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }  // "127.0.0.1:PORT"

 private:
  void stop();
  pid_t pid_ = -1;
  std::string address_;
};

}  // namespace zenflow::cli
