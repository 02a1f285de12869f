// The worker agent's /metrics: its own series and, merged in, those of every rank it runs.
//
// Each rank is a `zenflow run ... --metrics-port 0 --metrics-port-file F` process: it serves
// its own registry on a loopback port the kernel picks (so no port can be taken between a
// choice and a bind, and a rank that cannot serve still trains) and writes the port to F.
// A scrape of the agent fetches every live rank's exposition over loopback, all at once,
// within one deadline; gives each series the job_id and rank labels it lacks; and merges
// the families so that each appears once, with one HELP and TYPE (the text format forbids
// a family split across the output). The values are the ranks' own, read at the scrape:
// nothing is copied or cached between scrapes, and the training threads only do what
// `zenflow run --metrics-port` does (relaxed atomics). A rank that is not serving yet is
// absent; one that is gone, slow or malformed is absent and counted in
// zenflow_worker_scrape_errors_total{reason}.
//
// The agent's own series (docs/design.md §7 style):
//   zenflow_build_info{version}                    1
//   zenflow_worker_slots                           slots offered (GPUs, or CPU slots)
//   zenflow_worker_ranks                           rank processes running
//   zenflow_worker_registrations_total             incarnations registered with the coordinator
//   zenflow_worker_heartbeat_failures_total        liveness heartbeats that failed
//   zenflow_worker_heartbeat_rtt_seconds           histogram: liveness heartbeat round trips
//   zenflow_worker_lease_renewals_total            renewals written to the ranks' leases
//   zenflow_worker_scrape_errors_total{reason}     a rank left out: unreachable | timeout |
//                                                  bad_response | malformed (one per rank); a
//                                                  family or series dropped: conflict
//   zenflow_worker_rank_scrape_duration_seconds    how long the last scrape's rank fetches took
//
// Thread-safety: every member function may be called from any thread; scrape() runs on the
// metrics server's threads, add_rank()/remove_rank() on the agent's supervisor thread. The
// Counter/Histogram members are lock-free to update (registry.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common/metrics/http_server.h"
#include "common/metrics/registry.h"

namespace zenflow::agent {

// What fetching one rank's /metrics gave.
struct RankFetch {
  enum class Outcome { kOk, kUnreachable, kTimeout, kBadResponse };
  Outcome outcome = Outcome::kUnreachable;
  std::string body;  // kOk: the exposition
};

// GETs /metrics from each of `ports` on 127.0.0.1, concurrently, and waits at most `timeout`
// for all of them; a response must be 200 and at most `max_bytes` of body (else
// kBadResponse). Results are in the order of `ports`.
std::vector<RankFetch> fetch_rank_metrics(const std::vector<int>& ports, std::chrono::milliseconds timeout,
                                          size_t max_bytes = 16u << 20);

class WorkerMetrics {
  metrics::MetricsRegistry registry_;  // first: the series below are its

 public:
  // How long one scrape waits for the ranks' expositions, all together.
  static constexpr std::chrono::milliseconds kRankTimeout{2000};

  explicit WorkerMetrics(int64_t slots);
  ~WorkerMetrics();
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // Serves /metrics (scrape()) and /healthz on host:port. Throws as MetricsServer's
  // constructor does (std::invalid_argument, std::runtime_error naming the address).
  void serve(const std::string& host, int port);
  bool serving() const { return server_ != nullptr; }
  int port() const { return server_ ? server_->port() : 0; }

  // A rank process that will write its metrics port to `port_file` (once it listens).
  // Replaces an entry with the same job, attempt and rank.
  void add_rank(const std::string& job_id, int64_t attempt, int rank, const std::string& port_file);
  // The rank has exited: its series leave the scrape. Unknown ranks are ignored.
  void remove_rank(const std::string& job_id, int64_t attempt, int rank);

  // One /metrics body: the agent's series and every reachable rank's, merged.
  std::string scrape();

  metrics::Counter& registrations;
  metrics::Counter& heartbeat_failures;
  metrics::Histogram& heartbeat_rtt;
  metrics::Counter& lease_renewals;

 private:
  struct Target {
    std::string port_file;
    int port = 0;  // 0: not read yet
  };
  // (job_id, -attempt, rank): the newest attempt of a job first (its series win a clash).
  using Key = std::tuple<std::string, int64_t, int>;

  metrics::Gauge& ranks_;
  metrics::Gauge& rank_scrape_duration_;
  metrics::Family<metrics::Counter>& scrape_errors_;
  std::mutex mu_;  // targets_
  std::map<Key, Target> targets_;
  std::unique_ptr<metrics::MetricsServer> server_;  // last: stopped before the rest goes
};

}  // namespace zenflow::agent
