// The invariant checker (attempt_invariants.h).
#include "bench/chaos/attempt_invariants.h"

#include <algorithm>
#include <cstdio>

namespace zenflow::chaos {
namespace {

std::string ms_text(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "+%.3fs", double(ms) / 1000);
  return buf;
}

std::string describe_process(const RankProcess& p) {
  return "pid " + std::to_string(p.pid) + " (attempt " + std::to_string(p.attempt) + ", state " + p.state +
         ")";
}

}  // namespace

void AttemptInvariants::flag(const std::string& kind, int64_t t_ms, const std::string& job,
                             const std::string& evidence) {
  violations_.push_back(Violation{kind, t_ms, job, evidence});
}

void AttemptInvariants::observe_processes(int64_t t_ms, const std::vector<RankProcess>& processes) {
  std::map<std::string, std::vector<RankProcess>> by_job;
  std::set<std::pair<std::string, int64_t>> present, with_new_pid;
  for (const RankProcess& p : processes) {
    by_job[p.job_id].push_back(p);
    present.insert({p.job_id, p.attempt});
    if (pids_[{p.job_id, p.attempt}].insert(p.pid).second) with_new_pid.insert({p.job_id, p.attempt});
  }
  // Attempts that had processes and now have none have ended; one that comes back ran again.
  for (auto& [key, track] : attempts_) {
    if (present.count(key) == 0) {
      if (!track.ended) {
        track.ended = true;
        track.ended_ms = t_ms;
      }
    }
  }
  for (const auto& key : present) {
    AttemptTrack& track = attempts_[key];
    if (track.first_ms < 0) track.first_ms = t_ms;
    // Only processes it had before, back after a sample without them: the same processes, one
    // of which the sample missed (a process in execve, `zenflow` becoming zenflow-train, has
    // no cmdline for a moment). An attempt started again is a new process.
    if (track.ended && with_new_pid.count(key) == 0) track.ended = false;
    if (track.ended && !track.restart_flagged) {
      track.restart_flagged = true;
      std::string pids;
      for (const RankProcess& p : by_job[key.first])
        if (p.attempt == key.second) pids += (pids.empty() ? "" : ", ") + describe_process(p);
      flag("finished_attempt_restarted", t_ms, key.first,
           "job " + key.first + " attempt " + std::to_string(key.second) + ": its processes were seen from " +
               ms_text(track.first_ms) + " to " + ms_text(track.last_ms) + ", none at " +
               ms_text(track.ended_ms) + ", and again at " + ms_text(t_ms) + ": " + pids);
    }
    track.last_ms = t_ms;
  }
  // Two attempts of one job live in the same sample.
  for (const auto& [job, procs] : by_job) {
    std::map<int64_t, std::vector<const RankProcess*>> live;
    for (const RankProcess& p : procs)
      if (p.live()) live[p.attempt].push_back(&p);
    if (!live.empty()) last_live_ms_[job] = t_ms;
    if (live.size() < 2) continue;
    std::string key = job;
    std::string evidence = "job " + job + " at " + ms_text(t_ms) + ":";
    for (const auto& [attempt, ps] : live) {
      key += " " + std::to_string(attempt);
      for (const RankProcess* p : ps) evidence += " " + describe_process(*p) + ";";
    }
    if (two_live_flagged_.insert(key).second) flag("two_live_attempts", t_ms, job, evidence);
  }
  latest_ = std::move(by_job);
}

void AttemptInvariants::observe_running_jobs(int64_t t_ms, const std::set<std::string>& running) {
  for (auto it = running_since_ms_.begin(); it != running_since_ms_.end();) {
    if (running.count(it->first) == 0) {
      running_flagged_.erase(it->first);  // the episode ended
      it = running_since_ms_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& job : running) {
    const int64_t since = running_since_ms_.emplace(job, t_ms).first->second;
    const auto live = last_live_ms_.find(job);
    const int64_t last_live = live == last_live_ms_.end() ? -1 : live->second;
    const int64_t from = std::max(since, last_live);
    if (t_ms - from > running_limit_ms_ && running_flagged_.insert(job).second) {
      flag("running_without_rank", t_ms, job,
           "job " + job + " RUNNING in every coordinator answer since " + ms_text(since) +
               (last_live < 0 ? std::string(", no live rank process ever seen")
                              : ", last live rank process seen at " + ms_text(last_live)) +
               "; now " + ms_text(t_ms) + " (limit " + std::to_string(running_limit_ms_) + " ms)");
    }
  }
}

void AttemptInvariants::observe_coordinator_unreachable(int64_t) {
  running_since_ms_.clear();
  running_flagged_.clear();
}

std::vector<RankProcess> AttemptInvariants::latest(const std::string& job_id) const {
  const auto it = latest_.find(job_id);
  return it == latest_.end() ? std::vector<RankProcess>{} : it->second;
}

bool AttemptInvariants::has_live_rank(const std::string& job_id) const {
  for (const RankProcess& p : latest(job_id))
    if (p.live()) return true;
  return false;
}

}  // namespace zenflow::chaos
