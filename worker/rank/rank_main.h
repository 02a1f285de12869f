// The rank's entry point: one rank of a training run (or, with --nproc and no rendezvous
// variables, the local launcher of N of them). `zenflow run` parses its flags into RankArgs
// and calls run_rank; the worker agent starts ranks as `zenflow run ... --report-fd
// --lease-fd` (common/attempt_contract.h is the contract between them).
#pragma once

#include <string>
#include <vector>

namespace zenflow {

// `zenflow run`'s flags (client/run_command.cpp documents each for --help).
struct RankArgs {
  std::string job;                // the job spec (YAML)
  std::vector<std::string> sets;  // --set KEY=VALUE overrides
  bool json = false;
  bool fresh = false;
  bool quiet = false;
  bool verbose = false;
  bool profile = false;              // write checkpoint.dir/profile.yaml for `zenflow advise`
  bool profile_if_possible = false;  // the same, but a run too short to profile is no error
  std::vector<std::string> allow_spec_change;
  int nproc = 0;         // 0: resources.gpus_per_worker (at least 1)
  int metrics_port = 0;  // 0: no /metrics (unless metrics_port_file)
  std::string metrics_host = "127.0.0.1";
  std::string metrics_port_file;     // every rank serves; its bound port is written here
  std::string job_id;                // the metrics' job_id label; "": the spec's name
  std::vector<std::string> pricing;  // override catalogs, merged by name over the shipped one
  int report_fd = -1;                // JSON lines of the run (run_reporter.h); -1: none
  int lease_fd = -1;                 // the agent's lease (lease.h); -1: none
  double lease_timeout = 3;          // seconds without a byte on lease_fd before the lease expires
  double lock_wait = 0;              // seconds to wait for checkpoint.dir's lock
  std::string staging_dir;           // checkpoint.dir: s3:// is staged under it (checkpoint_mirror.h)
  std::string cache_dir;             // s3:// inputs are cached there (object_cache.h)
  std::vector<std::string> argv;     // this process's argv, for the rank processes
};

// Trains the job of `a` in this process and returns the process's exit code, one of the
// attempt contract's (common/attempt_contract.h says what each means); says why on stderr,
// one line. When an optimizer node is lost it follows optimizer.host.on_node_loss (resume in
// this process, leave for a spare the coordinator assigns, or fail). Installs SIGINT and
// SIGTERM (under an agent also SIGPIPE) handlers and may _exit (a lost lease, a second
// Ctrl-C): call it once, from the main thread, as what the process does.
int run_rank(const RankArgs& a);

}  // namespace zenflow
