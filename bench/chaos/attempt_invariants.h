// The chaos harness's invariant checker: fed samples of the rank processes that exist (from
// /proc) and the coordinator's view of the jobs, it flags what must never happen. Pure: no
// processes, no clock (every input carries its time), so synthetic samples test it.
//
// Not thread-safe: one thread feeds it, or the caller serialises the calls.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace zenflow::chaos {

// One process of a rank as /proc showed it: ZENFLOW_JOB_ID / ZENFLOW_ATTEMPT from its
// environment and the state letter of /proc/PID/stat.
struct RankProcess {
  int pid = 0;
  std::string job_id;
  int64_t attempt = 0;
  char state = 'R';  // R S D Z T t ...
  // Live: running or able to run. A zombie has ended; a stopped process (T, t) runs no code
  // and commits nothing until continued.
  bool live() const { return state != 'Z' && state != 'T' && state != 't' && state != 'X'; }
};

struct Violation {
  std::string kind;  // two_live_attempts, finished_attempt_restarted, running_without_rank, ...
  int64_t t_ms = 0;  // when it was seen (the run's clock)
  std::string job_id;
  std::string evidence;  // pids, attempts, timestamps: what a reader needs to believe it
};

// Invariants judged from the processes themselves:
//  - never two live attempts of one job in one sample;
//  - an attempt whose every process has gone never has a process again;
//  - a job the coordinator reports RUNNING has a live rank within lease + slack.
class AttemptInvariants {
 public:
  // `running_limit_ms`: how long a job may be RUNNING in the coordinator's view with no live
  // rank process (the lease plus the slack the harness states).
  explicit AttemptInvariants(int64_t running_limit_ms) : running_limit_ms_(running_limit_ms) {}

  // Every rank process that exists at `t_ms` (a whole /proc scan). Samples come in time order.
  void observe_processes(int64_t t_ms, const std::vector<RankProcess>& processes);

  // The coordinator answered at `t_ms` with these RUNNING jobs (all of them).
  void observe_running_jobs(int64_t t_ms, const std::set<std::string>& running);
  // The coordinator did not answer at `t_ms` (killed, stopped, or the harness's call timed
  // out): RUNNING is not judged until it answers again, and then from that answer on.
  void observe_coordinator_unreachable(int64_t t_ms);

  // Processes of (job, attempt) seen in the latest sample (live or not).
  std::vector<RankProcess> latest(const std::string& job_id) const;
  // Whether any process of `job_id` is live in the latest sample.
  bool has_live_rank(const std::string& job_id) const;
  // Every (job, attempt) ever seen, with its pids.
  const std::map<std::pair<std::string, int64_t>, std::set<int>>& attempts_seen() const { return pids_; }

  const std::vector<Violation>& violations() const { return violations_; }

 private:
  struct AttemptTrack {
    int64_t first_ms = -1, last_ms = -1;
    bool ended = false;  // a sample after it had processes showed none
    int64_t ended_ms = -1;
    bool restart_flagged = false;
  };
  void flag(const std::string& kind, int64_t t_ms, const std::string& job, const std::string& evidence);

  int64_t running_limit_ms_;
  std::map<std::pair<std::string, int64_t>, AttemptTrack> attempts_;
  std::map<std::pair<std::string, int64_t>, std::set<int>> pids_;
  std::map<std::string, std::vector<RankProcess>> latest_;  // by job
  std::map<std::string, int64_t> last_live_ms_;             // by job
  std::map<std::string, int64_t> running_since_ms_;         // by job: first reachable RUNNING answer
  std::set<std::string> running_flagged_;                   // one report per episode
  std::set<std::string> two_live_flagged_;                  // "job a1 a2" already reported
  std::vector<Violation> violations_;
};

}  // namespace zenflow::chaos
