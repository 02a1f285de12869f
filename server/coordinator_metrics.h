// The coordinator's /metrics (docs/design.md §7; `zenflow-coordinator --metrics-port P`):
//
//   zenflow_jobs{state}                      jobs in each state (zeros included)
//   zenflow_workers{role,state}              registered workers
//   zenflow_workers_lost_total               leases that expired (since this process started)
//   zenflow_slots{kind,state}                trainer slots (kind gpu|cpu): total, allocated
//                                            (STARTING or RUNNING attempts), busy (RUNNING)
//   zenflow_queue_wait_seconds               histogram: submit or requeue -> placement
//   zenflow_job_restarts_total{job_id}       restarts after a failure or a lost worker
//   zenflow_job_preemptions_total{job_id}
//   zenflow_job_cost_usd_total{job_id}       held time at the job's rate, across attempts
//   zenflow_job_lost_usd{job_id,cause}       part of it lost: cause stalls | restarts
//   zenflow_job_usd_per_hour{job_id}         the job's rate while it holds workers
//   zenflow_rpc_duration_seconds{method}     histogram: a unary call's work in the handler
//   zenflow_build_info{version}
//
// Job series cover live jobs and jobs that ended in the last hour (so that a scrape sees
// each job's final figures), read from Coordinator::snapshot() at every scrape.
#pragma once

#include <string_view>
#include <unordered_map>

#include "common/metrics/registry.h"
#include "server/coordinator.h"

namespace zenflow::server {

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(metrics::MetricsRegistry& registry);
  ~CoordinatorMetrics();  // stops reading the coordinator (detach)
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // For CoordinatorOptions::on_placed.
  void observe_queue_wait(double seconds) { queue_wait_.observe(seconds); }
  // A unary method's handler time (service.h); unknown methods are ignored. Lock-free.
  void observe_rpc(std::string_view method, double seconds) const;

  // Scrapes read `coordinator` from now on, until detach() (before it is destroyed).
  void attach(const Coordinator& coordinator);
  void detach();

 private:
  metrics::MetricsRegistry& registry_;
  metrics::Histogram& queue_wait_;
  std::unordered_map<std::string_view, metrics::Histogram*> rpc_;
  metrics::MetricsRegistry::CollectorId collector_ = 0;
};

}  // namespace zenflow::server
