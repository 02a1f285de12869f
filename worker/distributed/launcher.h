// Local multi-rank launcher: what `zenflow run JOB.yaml --nproc N` calls.
//
// Starts N copies of an executable (by default this one, /proc/self/exe) as rank
// processes of one job on this machine, each with the rendezvous variables of
// rendezvous.h (ZENFLOW_RANK, ZENFLOW_WORLD_SIZE, ZENFLOW_MASTER_ADDR,
// ZENFLOW_MASTER_PORT, ZENFLOW_DIST_TIMEOUT_S when a timeout is given,
// ZENFLOW_STORE_EXTERNAL) plus ZENFLOW_LOCAL_RANK / ZENFLOW_LOCAL_WORLD_SIZE (this
// machine's share, for picking a GPU). By default the launcher itself hosts the
// rendezvous store (a StoreServer on a port the kernel picks, bound before any rank
// starts, and alive when rank 0 dies); with host_store off rank 0 hosts it, on a port
// the launcher holds reserved (PortReservation) while the ranks run. Children inherit stdout/stderr, run in
// their own process groups (so a terminal's Ctrl-C reaches them once, through the launcher) and die with the
// launcher (PR_SET_PDEATHSIG).
//
// Supervision: SIGINT/SIGTERM received by the launcher are forwarded to every rank.
// When a rank exits non-zero (or is killed by a signal), the others get `grace` to
// exit on their own (they notice the lost peer through their collectives), then
// SIGTERM, then SIGKILL after `term_grace`. The result names the first failed rank and
// its exit status; the exit code is that rank's status (128 + signal number for a
// signal; 128 + the forwarded signal when the launcher was interrupted).
//
// Threads: call from one thread at a time (it installs process-wide SIGINT/SIGTERM
// handlers while it runs and restores the previous ones before returning); it blocks
// until every child has exited. Errors: std::invalid_argument for bad options;
// std::runtime_error when a child cannot be started (the started ones are killed).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "worker/distributed/ports.h"

namespace zenflow::distributed {

struct LaunchOptions {
  std::string executable = "/proc/self/exe";
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                                         // 0 = a free port found at run time
  bool host_store = true;                                      // the launcher hosts the store (see above)
  std::chrono::milliseconds timeout{0};                        // > 0: sets ZENFLOW_DIST_TIMEOUT_S
  std::chrono::milliseconds grace{10'000};                     // after the first failure, before SIGTERM
  std::chrono::milliseconds term_grace{3'000};                 // after SIGTERM, before SIGKILL
  std::vector<std::pair<std::string, std::string>> extra_env;  // set in every child
  // Receives the launcher's messages (one line each, no newline); default: stderr.
  std::function<void(const std::string&)> log;
};

struct RankExit {
  int pid = -1;
  bool exited = false;               // false: killed by a signal
  int status = 0;                    // exit status, or the signal number
  bool stopped_by_launcher = false;  // the launcher signalled it after a failure/interrupt
};

struct LaunchResult {
  int exit_code = 0;       // 0 when every rank exited 0
  int failed_rank = -1;    // first rank that failed on its own; -1 if none
  int interrupted_by = 0;  // signal forwarded from the launcher, 0 if none
  std::string message;     // "" on success; else names the failed rank and its status
  std::vector<RankExit> ranks;
};

// argv_of_child is each rank's full argv (argv[0] included; it is what the child sees
// as its name); the program run is options.executable.
LaunchResult launch_local_ranks_detailed(int nproc, const std::vector<std::string>& argv_of_child,
                                         const LaunchOptions& options = {});

// Same; returns the exit code (0 on success) after logging result.message.
int launch_local_ranks(int nproc, const std::vector<std::string>& argv_of_child,
                       const LaunchOptions& options = {});

}  // namespace zenflow::distributed
