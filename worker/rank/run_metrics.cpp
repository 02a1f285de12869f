// The worker metrics of one rank (see run_metrics.h).
#include "worker/rank/run_metrics.h"

#include <cmath>
#include <stdexcept>
#include <utility>

#include "common/pricing.h"

namespace zenflow {

RunMetrics::RunMetrics(metrics::MetricsRegistry& registry, std::string job_id)
    : registry_(registry), job_id_(std::move(job_id)) {}

const std::vector<double>& RunMetrics::step_duration_buckets() {
  // 1 ms .. 100 s, about three buckets per decade (factor 10^(1/3) ~ 2.154).
  static const std::vector<double> buckets = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2,
                                              0.5,   1,     2,     5,    10,   20,   50,  100};
  return buckets;
}

void RunMetrics::on_start(const RunFacts& facts) {
  using metrics::MetricsRegistry;
  MetricsRegistry& r = registry_;
  const std::vector<std::string> labels = {"job_id", "rank"};
  const std::vector<std::string> mine = {job_id_, std::to_string(facts.rank)};
  auto with = [&](const std::string& extra) {
    std::vector<std::string> v = mine;
    v.push_back(extra);
    return v;
  };
  std::vector<std::string> labels_cause = labels, labels_direction = labels, labels_kind = labels;
  labels_cause.push_back("cause");
  labels_direction.push_back("direction");
  labels_kind.push_back("kind");

  steps_ =
      &r.counter("zenflow_steps_total", "Training steps done (skipped ones included)", labels).with(mine);
  tokens_ = &r.counter("zenflow_tokens_total", "Tokens trained on by this rank", labels).with(mine);
  step_duration_ = &r.histogram("zenflow_step_duration_seconds", "Wall time of a training step", labels,
                                step_duration_buckets())
                        .with(mine);
  compute_ = &r.counter("zenflow_compute_seconds_total", "Forward and backward time", labels).with(mine);
  auto& stall = r.counter("zenflow_stall_seconds_total", "Time the device waited, by cause", labels_cause);
  for (int c = 0; c < engine::kNumStallCauses; ++c)
    stall_[static_cast<size_t>(c)] =
        &stall.with(with(engine::stall_cause_name(static_cast<engine::StallCause>(c))));
  exposed_stall_ratio_ =
      &r.gauge("zenflow_exposed_stall_ratio", "Stall time over wall time of the last step", labels)
           .with(mine);
  device_optimizer_ = &r.counter("zenflow_device_optimizer_seconds_total",
                                 "Device optimizer time: device AdamW, selection, clipping", labels)
                           .with(mine);
  auto& bytes =
      r.counter("zenflow_transfer_bytes_total", "Bytes copied between device and host", labels_direction);
  for (int d = 0; d < engine::kNumDirections; ++d)
    transfer_bytes_[static_cast<size_t>(d)] = &bytes.with(with(engine::direction_name(static_cast<engine::Direction>(d))));
  {
    std::vector<std::string> net_labels = labels;
    net_labels.push_back("direction");
    net_labels.push_back("transport");
    auto& net = r.counter("zenflow_network_bytes_total", "Bytes moved to and from remote optimizer nodes", net_labels);
    std::vector<std::string> sent = mine, received = mine;
    sent.insert(sent.end(), {"sent", "ucx"});
    received.insert(received.end(), {"received", "ucx"});
    network_sent_ = &net.with(sent);
    network_received_ = &net.with(received);
  }
  host_step_duration_ = &r.histogram("zenflow_host_optimizer_step_duration_seconds",
                                     "Time a host AdamW window step ran on the host (offload, zenflow)", labels,
                                     step_duration_buckets())
                             .with(mine);
  staleness_ = &r.gauge("zenflow_staleness_steps",
                        "Steps of host updates missing from the weights of the last step's gradient", labels)
                    .with(mine);
  selected_ratio_ =
      &r.gauge("zenflow_selected_ratio", "Selected (device-updated) share of the split parameters", labels)
           .with(mine);
  loss_ = &r.gauge("zenflow_loss", "Training loss of the last step", labels).with(mine);
  r.gauge("zenflow_train_steps", "The job's train.steps (progress: zenflow_steps_total over it)", labels)
      .with(mine)
      .set(static_cast<double>(facts.total_steps));
  skipped_ =
      &r.counter("zenflow_skipped_steps_total", "Steps skipped for non-finite loss or gradients", labels)
           .with(mine);
  r.gauge("zenflow_pinned_host_bytes", "Page-locked host memory of the transfer buffers", labels)
      .with(mine)
      .set(static_cast<double>(facts.pinned_host_bytes));
  auto& memory =
      r.gauge("zenflow_host_memory_bytes",
              "Host memory of the optimizer state by kind; host_total is the machine's RAM", labels_kind);
  memory.with(with("master")).set(static_cast<double>(facts.host_master_bytes));
  memory.with(with("moments")).set(static_cast<double>(facts.host_moments_bytes));
  memory.with(with("accumulators")).set(static_cast<double>(facts.host_accumulator_bytes));
  memory.with(with("pinned")).set(static_cast<double>(facts.pinned_host_bytes));
  memory.with(with("staging")).set(static_cast<double>(facts.host_staging_bytes));
  if (facts.host_total_memory_bytes > 0)
    memory.with(with("host_total")).set(static_cast<double>(facts.host_total_memory_bytes));
  auto& device = r.gauge("zenflow_device_memory_bytes",
                         "Training-device memory of this rank by what it holds; the peaks follow the steps "
                         "(on a CPU run the host is the device)",
                         labels_kind);
  device.with(with("parameters")).set(static_cast<double>(facts.device_memory.parameters));
  device.with(with("gradients")).set(static_cast<double>(facts.device_memory.gradients));
  device.with(with("optimizer_state")).set(static_cast<double>(facts.device_memory.optimizer_state));
  device.with(with("communication_buffers")).set(static_cast<double>(facts.device_memory.communication_buffers));
  activations_peak_ = &device.with(with("activations_peak"));
  total_peak_ = &device.with(with("total_peak"));
  if (usd_per_hour_ >= 0 && facts.rank == 0) {
    usd_per_second_ =
        usd_per_hour_ * instance_share(facts.device_is_cuda ? facts.world_size : 0, gpus_of_instance_) / 3600.0;
    cost_ = &r.counter("zenflow_cost_usd_total",
                       "The job's cost so far (its share of the instance's price, times step wall time)", labels)
                 .with(mine);
  }
  started_ = true;
}

void RunMetrics::set_price(double usd_per_hour, int64_t gpus_of_instance) {
  if (!(usd_per_hour >= 0) || !std::isfinite(usd_per_hour) || gpus_of_instance < 0)
    throw std::invalid_argument("RunMetrics::set_price: the price and GPU count must be >= 0");
  usd_per_hour_ = usd_per_hour;
  gpus_of_instance_ = gpus_of_instance;
}

void RunMetrics::add_times(const engine::StepTimes& times) noexcept {
  compute_->inc(times.compute_seconds);
  device_optimizer_->inc(times.device_optimizer_seconds);
  for (size_t c = 0; c < stall_.size(); ++c) stall_[c]->inc(times.stall_seconds[c]);
  for (size_t d = 0; d < transfer_bytes_.size(); ++d)
    transfer_bytes_[d]->inc(static_cast<double>(times.transfer_bytes[d]));
}

void RunMetrics::on_step(const TrainingStep& step) noexcept {
  if (!started_) return;
  steps_->inc();
  tokens_->inc(static_cast<double>(step.tokens));
  step_duration_->observe(step.times.wall_seconds);
  if (cost_) cost_->inc(usd_per_second_ * step.times.wall_seconds);
  add_times(step.times);
  exposed_stall_ratio_->set(step.times.wall_seconds > 0 ? step.times.stall_total() / step.times.wall_seconds
                                                        : 0);
  staleness_->set(static_cast<double>(step.staleness_steps));
  if (step.host_step_seconds >= 0) host_step_duration_->observe(step.host_step_seconds);
  selected_ratio_->set(step.selected_ratio);
  loss_->set(step.loss);
  if (step.activations_peak_bytes >= 0) activations_peak_->set(static_cast<double>(step.activations_peak_bytes));
  if (step.total_peak_bytes >= 0) total_peak_->set(static_cast<double>(step.total_peak_bytes));
  if (step.skipped) skipped_->inc();
  if (step.network_bytes_sent > network_seen_[0]) {
    network_sent_->inc(static_cast<double>(step.network_bytes_sent - network_seen_[0]));
    network_seen_[0] = step.network_bytes_sent;
  }
  if (step.network_bytes_received > network_seen_[1]) {
    network_received_->inc(static_cast<double>(step.network_bytes_received - network_seen_[1]));
    network_seen_[1] = step.network_bytes_received;
  }
}

void RunMetrics::on_finish(const TrainingEnd& end) {
  if (!started_) return;
  add_times(end.finish);
  if (cost_) cost_->inc(usd_per_second_ * end.finish.wall_seconds);
}

}  // namespace zenflow
