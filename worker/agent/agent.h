// zenflow-worker: the agent on a GPU (or CPU) host. It registers its resources with the
// coordinator, heartbeats, runs each assigned job's ranks as child processes and reports
// their progress, output and exit.
//
// The ranks are `zenflow run SPEC --quiet --report-fd 3 --lease-fd 4` processes with the
// rendezvous variables (worker/distributed/rendezvous.h): the same training loop as a
// local run. Each child
//   - runs in its own process group (a crash in training cannot take the agent down, and
//     the agent signals a job's ranks as one group);
//   - dies with the agent (PR_SET_PDEATHSIG SIGKILL, set from the agent's supervisor
//     thread, which lives as long as the agent), so a lost worker never keeps writing a
//     job's checkpoints while the job resumes elsewhere;
//   - holds a lease from the agent (fd 4; a thread of the agent writes a byte every 500 ms,
//     whatever its RPCs are doing, so a coordinator that is away never lets it lapse until
//     the agent fences itself, below). A paused agent (SIGSTOP) stops renewing it, and the
//     child exits without committing a checkpoint before the coordinator's lease on the
//     worker runs out (--lease-timeout is at most attempt::rank_lease: lease - 2
//     heartbeat intervals), so a stale attempt never commits;
//   - reports progress as JSON lines on fd 3 (rank 0 only) and its output on stdout/stderr,
//     which the agent keeps in work-dir/jobs/JOB/attempt-N/output.log (up to
//     --max-attempt-log-bytes) and uploads;
//   - with --metrics-port, serves its metrics on a loopback port of its own, which the
//     agent's /metrics merges with its own series (worker_metrics.h).
//
// Assignments are level-triggered: the agent long-polls the full set the coordinator wants
// running on it and reconciles (start what is new, SIGTERM what is to STOP — the Ctrl-C
// path: checkpoint and exit — and SIGKILL what is no longer wanted). Exits are reported
// at once and repeated in every heartbeat until acknowledged, so a result reached while
// the coordinator is away is recorded when it returns. An attempt this process started
// is never started again, whatever a stale assignment set still lists (its number only
// grows per job). A heartbeat refused with FAILED_PRECONDITION (the coordinator declared
// this incarnation LOST) kills every rank at once and registers again.
//
// Self-fencing (common/attempt_contract.h): "away" is the time since the agent *sent* the
// last heartbeat the coordinator accepted. While away the ranks keep training; at
// --disconnected-grace they are asked to checkpoint and stop; at grace + --disconnect-drain
// every rank's process group is killed and the lease thread stops renewing (it checks the
// bound itself, so a stuck supervisor cannot keep a lease alive). The agent reports the
// resulting bound (attempt::fence_after) as RegisterWorkerRequest.fence_ms.
//
// The worker's own failures are not the job's: an attempt whose work dir cannot be written
// starts nothing and ends with attempt::kExitWorkerFault (requeued). Rank 0's progress feeds
// a HangWatch (hang_watch.h); a hung attempt's ranks are killed and it ends "hung at step
// N" (requeued). Ended attempts' directories are removed, keeping the newest
// --keep-attempt-dirs.
//
// Thread safety: run() once, from the thread that constructed the Agent; stop() from any
// thread or a signal handler (it only sets a flag).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/rpc/rpc.h"

namespace zenflow::agent {

struct AgentOptions {
  std::string coordinator;  // HOST:PORT
  rpc::ChannelOptions channel;
  std::string token;        // worker join token ("" with a tokenless loopback coordinator)
  std::string name;         // unique per worker; default: the hostname
  std::string work_dir;     // attempts' specs and output logs
  std::string address = "127.0.0.1";  // where other workers reach this one's rendezvous ports
  int64_t cpu_slots = 1;              // slots offered when there is no GPU
  bool cpu_only = false;              // offer CPU slots even where nvidia-smi lists GPUs
  bool profile = true;                // rank 0 profiles each attempt (~1 s of probes at its end)
  int64_t host_memory_bytes = 0;      // 0: MemTotal of /proc/meminfo
  int64_t physical_cores = 0;         // 0: counted from /proc/cpuinfo
  std::map<std::string, std::string> labels;
  // The directories a job's spec may read or write (model.from, data.*, checkpoint.dir;
  // job_spec.h, check_allowed_roots), advertised to the coordinator at registration. run()
  // makes them absolute and adds the work dir: none given, the work dir alone; "/" confines
  // nothing.
  std::vector<std::string> allowed_roots;
  std::string trainer;                // the zenflow binary; default: beside this executable
  std::chrono::milliseconds stop_grace{60'000};          // STOP: SIGTERM, then SIGKILL after this
  std::chrono::milliseconds disconnected_grace{60'000};  // coordinator unreachable: keep training this long,
  std::chrono::milliseconds disconnect_drain{30'000};    // then checkpoint and stop this long, then SIGKILL
  std::chrono::milliseconds rank_failure_grace{10'000};  // one rank failed: the others get this long
  int64_t keep_attempt_dirs = 5;  // ended attempts' directories kept (the newest); 0: none
  int64_t max_attempt_log_bytes = int64_t{64} << 20;  // each output.log; later output is only uploaded
  int metrics_port = 0;                 // /metrics and /healthz (worker_metrics.h); 0: off
  std::string metrics_host = "127.0.0.1";
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Serves until stop(); then asks the ranks to checkpoint and stop, reports their exits
  // (best effort) and returns 0. Returns 1 for a fatal setup error (logged).
  int run();
  void stop() { stopping_.store(true); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stopping_{false};
};

// What the agent offers, as detected on this host (overridable through AgentOptions).
int64_t detect_physical_cores();
int64_t detect_host_memory_bytes();
// The GPUs `nvidia-smi --query-gpu=name,memory.total` lists (model, bytes), in index order;
// none when nvidia-smi is absent or fails (then the worker offers CPU slots).
std::vector<std::pair<std::string, int64_t>> detect_gpus();

}  // namespace zenflow::agent
