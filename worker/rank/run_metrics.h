// The worker metrics of docs/design.md for one rank of a run, fed by the training loop.
//
// RunMetrics is a TrainingObserver: on_start() registers the families on the registry and
// takes every series handle once (labels job_id, rank); on_step() only adds to counters,
// sets gauges and observes the step histogram — a few dozen relaxed atomics, no lock, no
// allocation. The registry is scraped on other threads (MetricsServer) meanwhile.
//
// Exported (per rank): zenflow_steps_total, zenflow_tokens_total,
// zenflow_step_duration_seconds (histogram), zenflow_compute_seconds_total,
// zenflow_stall_seconds_total{cause} (every StallClock cause, zero included),
// zenflow_exposed_stall_ratio (stall / wall of the last step),
// zenflow_device_optimizer_seconds_total, zenflow_transfer_bytes_total{direction=d2h|h2d|h2d_weights},
// zenflow_network_bytes_total{direction=sent|received,transport=ucx} (optimizer nodes),
// zenflow_staleness_steps, zenflow_selected_ratio, zenflow_loss, zenflow_skipped_steps_total,
// zenflow_pinned_host_bytes, zenflow_host_memory_bytes{kind=master|moments|accumulators|
// pinned|staging|host_total}, zenflow_device_memory_bytes{kind=parameters|gradients|
// optimizer_state|communication_buffers|activations_peak|total_peak}; with set_price(), zenflow_cost_usd_total on rank 0 only: the
// whole job's cost so far (common/pricing.h: the price × the job's share of the instance,
// gpus = world_size on CUDA, the whole instance on the CPU), metered by the wall time of
// the steps and of the run's end: setup before the first step is not in it (the run
// summary's cost_usd, from RunSummary::wall_seconds, is). The time and bytes of the run's end (TrainingEnd::finish) are
// added to the counters by on_finish(), so they match the run summary's totals.
//
// Thread safety: the observer methods are called by the training thread; the registry may
// be read from any thread at any time.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "common/metrics/registry.h"
#include "worker/rank/training_observer.h"

namespace zenflow {

class RunMetrics final : public TrainingObserver {
 public:
  // `registry` must outlive this object. `job_id` labels every series (the spec's name for
  // `zenflow run`).
  RunMetrics(metrics::MetricsRegistry& registry, std::string job_id);
  RunMetrics(const RunMetrics&) = delete;
  RunMetrics& operator=(const RunMetrics&) = delete;

  // Registers the families (idempotent on one registry) and takes the series of rank
  // facts.rank; sets the memory gauges. Throws std::invalid_argument (registry.h) if a
  // family is already registered differently.
  void on_start(const RunFacts& facts) override;
  // Before on_start: the instance's price and GPU count (0: usd_per_hour is the job's own
  // rate, charged in full). Without it zenflow_cost_usd_total is not exported.
  void set_price(double usd_per_hour, int64_t gpus_of_instance);
  void on_step(const TrainingStep& step) noexcept override;
  void on_finish(const TrainingEnd& end) override;

  // Bucket bounds of zenflow_step_duration_seconds: 1 ms to 100 s.
  static const std::vector<double>& step_duration_buckets();

 private:
  void add_times(const engine::StepTimes& times) noexcept;

  metrics::MetricsRegistry& registry_;
  std::string job_id_;
  bool started_ = false;
  metrics::Counter* steps_ = nullptr;
  metrics::Counter* tokens_ = nullptr;
  metrics::Histogram* step_duration_ = nullptr;
  metrics::Counter* compute_ = nullptr;
  std::array<metrics::Counter*, engine::kNumStallCauses> stall_{};
  metrics::Gauge* exposed_stall_ratio_ = nullptr;
  metrics::Counter* device_optimizer_ = nullptr;
  std::array<metrics::Counter*, engine::kNumDirections> transfer_bytes_{};  // by engine::Direction
  metrics::Counter* network_sent_ = nullptr;      // zenflow_network_bytes_total{direction=sent,transport=ucx}
  metrics::Counter* network_received_ = nullptr;
  int64_t network_seen_[2] = {0, 0};  // cumulative bytes already counted (sent, received)
  metrics::Gauge* staleness_ = nullptr;
  metrics::Histogram* host_step_duration_ = nullptr;
  metrics::Gauge* selected_ratio_ = nullptr;
  metrics::Gauge* loss_ = nullptr;
  metrics::Gauge* activations_peak_ = nullptr;  // zenflow_device_memory_bytes{kind=activations_peak}
  metrics::Gauge* total_peak_ = nullptr;        // {kind=total_peak}
  metrics::Counter* skipped_ = nullptr;
  double usd_per_hour_ = -1;  // < 0: not priced
  int64_t gpus_of_instance_ = 0;
  double usd_per_second_ = 0;  // the job's rate, set by on_start
  metrics::Counter* cost_ = nullptr;  // rank 0 only
};

}  // namespace zenflow
