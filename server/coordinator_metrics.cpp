#include "server/coordinator_metrics.h"

#include <string>
#include <vector>

#include "common/version.h"

namespace zenflow::server {

namespace {

// The unary methods the services time (the long poll and the streams would time their waits).
constexpr std::string_view kTimedMethods[] = {
    "SubmitJob",     "GetJob",         "ListJobs",       "CancelJob",      "ListWorkers",
    "GetJobProfile", "RegisterWorker", "Heartbeat",      "ReportProgress", "ReportEvent",
    "UploadLogs",    "UploadProfile",  "HeartbeatStream"};

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(metrics::MetricsRegistry& registry)
    : registry_(registry),
      queue_wait_(registry
                      .histogram("zenflow_queue_wait_seconds",
                                 "Time a job waited in the queue before an attempt was placed (submit or requeue "
                                 "to placement)",
                                 {}, metrics::exponential_buckets(0.01, 4, 10))
                      .with({})) {
  metrics::register_build_info(registry, kVersion);
  auto& rpc = registry.histogram(
      "zenflow_rpc_duration_seconds",
      "Time a unary RPC, or one beat on a HeartbeatStream, spent in the coordinator's handler "
      "(token check to answer)",
      {"method"}, metrics::exponential_buckets(1e-5, 4, 10));
  for (std::string_view m : kTimedMethods) rpc_[m] = &rpc.with({std::string(m)});
  registry.gauge("zenflow_jobs", "Jobs in each state", {"state"});
  registry.gauge("zenflow_workers", "Registered workers by role and state", {"role", "state"});
  registry.counter("zenflow_workers_lost_total", "Workers declared LOST (lease expired) since the coordinator started");
  registry.gauge("zenflow_slots",
                 "Trainer slots by kind (gpu, cpu): total on workers not LOST, allocated to STARTING or RUNNING "
                 "attempts, busy in RUNNING ones",
                 {"kind", "state"});
  registry.counter("zenflow_job_restarts_total", "Restarts of a job after a failed attempt or a lost worker",
                   {"job_id"});
  registry.counter("zenflow_job_preemptions_total", "Times a job was preempted by a higher-priority one",
                   {"job_id"});
  registry.counter("zenflow_job_cost_usd_total",
                   "Dollars a job has cost: the time it held workers, across attempts, at its rate", {"job_id"});
  registry.gauge("zenflow_job_lost_usd",
                 "Part of a job's cost lost: to exposed stalls (cost x stall share) or to restarts and "
                 "preemptions (repeated steps and start-up)",
                 {"job_id", "cause"});
  registry.gauge("zenflow_job_usd_per_hour", "A job's rate while it holds workers (0: not priced)", {"job_id"});
}

CoordinatorMetrics::~CoordinatorMetrics() { detach(); }

void CoordinatorMetrics::observe_rpc(std::string_view method, double seconds) const {
  auto it = rpc_.find(method);
  if (it != rpc_.end()) it->second->observe(seconds);
}

void CoordinatorMetrics::attach(const Coordinator& coordinator) {
  detach();
  collector_ = registry_.add_collector([&coordinator](metrics::SampleSink& sink) {
    const ClusterSnapshot s = coordinator.snapshot();
    sink.add("zenflow_workers_lost_total", {}, static_cast<double>(s.workers_lost));
    for (const auto& [state, n] : s.jobs_by_state) sink.add("zenflow_jobs", {state}, static_cast<double>(n));
    for (const auto& [key, n] : s.workers) sink.add("zenflow_workers", {key.first, key.second}, static_cast<double>(n));
    for (const auto& [kind, n] : s.slots_total) sink.add("zenflow_slots", {kind, "total"}, static_cast<double>(n));
    for (const auto& [kind, n] : s.slots_allocated)
      sink.add("zenflow_slots", {kind, "allocated"}, static_cast<double>(n));
    for (const auto& [kind, n] : s.slots_busy) sink.add("zenflow_slots", {kind, "busy"}, static_cast<double>(n));
    for (const ClusterSnapshot::JobFigures& j : s.jobs) {
      sink.add("zenflow_job_restarts_total", {j.id}, static_cast<double>(j.restarts));
      sink.add("zenflow_job_preemptions_total", {j.id}, static_cast<double>(j.preemptions));
      sink.add("zenflow_job_cost_usd_total", {j.id}, j.cost_usd);
      sink.add("zenflow_job_lost_usd", {j.id, "stalls"}, j.usd_lost_to_stalls);
      sink.add("zenflow_job_lost_usd", {j.id, "restarts"}, j.usd_lost_to_restarts);
      sink.add("zenflow_job_usd_per_hour", {j.id}, j.usd_per_hour);
    }
  });
}

void CoordinatorMetrics::detach() {
  if (collector_) registry_.remove_collector(collector_);
  collector_ = 0;
}

}  // namespace zenflow::server
