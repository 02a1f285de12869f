// Progress line, summary table and JSON of a training run.
#include "worker/rank/run_output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

namespace zenflow {

namespace {
// Transfer buffers are page-locked on CUDA (DeviceStreams::alloc_host), plain memory otherwise.
bool transfers_pinned(const RunSummary& s) { return s.device.rfind("cuda", 0) == 0; }
}  // namespace

int64_t tokens_trained(const RunSummary& s) {
  return s.tokens_per_step * std::max<int64_t>(0, s.steps - s.start_step);
}

std::optional<RunCost> run_cost(const ResolvedPrice& price, const RunSummary& s) {
  if (!price.priced) return std::nullopt;
  RunCost c;
  c.instance = price.instance;
  c.source = price.source;
  c.date = price.date;
  c.verified = price.verified;
  const int64_t gpus_used = s.device.rfind("cuda", 0) == 0 ? s.world_size : 0;
  c.instance_usd_per_hour = price.usd_per_hour;
  c.gpu_share = instance_share(gpus_used, price.gpus_of_instance);
  c.usd_per_hour = price.usd_per_hour * c.gpu_share;
  c.cost_usd = usd_for(s.wall_seconds, price.usd_per_hour, gpus_used, price.gpus_of_instance);
  c.tokens = tokens_trained(s);
  c.usd_per_1m_tokens = usd_per_million_tokens(c.cost_usd, c.tokens);
  c.stall_seconds = std::max(0.0, s.totals.stall_total());
  c.usd_lost_to_stalls = usd_lost_to_stalls(c.stall_seconds, price.usd_per_hour, gpus_used, price.gpus_of_instance);
  return c;
}

std::string format_duration(double s) {
  char buf[64];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%dh%02dm", static_cast<int>(s) / 3600, (static_cast<int>(s) % 3600) / 60);
  }
  return buf;
}

void ProgressPrinter::on_step(const StepProgress& p) noexcept {
  if (quiet_) return;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "step %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  stall %.1f%%  ETA %s",
                static_cast<long long>(p.step), static_cast<long long>(p.total), p.loss, p.lr,
                p.tokens_per_second, 100.0 * p.stall_fraction, format_duration(p.eta_seconds).c_str());
  if (tty_) {
    out_ << "\r\033[K" << buf << std::flush;
    line_open_ = true;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  const int64_t every = std::max<int64_t>(1, p.total / 20);
  if (p.step == 1 || p.step == p.total || p.step % every == 0 ||
      now - last_print_ > std::chrono::seconds(30)) {
    out_ << buf << "\n" << std::flush;
    last_print_ = now;
  }
}

void ProgressPrinter::on_log(const std::string& line) noexcept {
  if (line_open_) out_ << "\r\033[K";
  out_ << "zenflow: " << line << "\n";
  line_open_ = false;
}

void ProgressPrinter::finish() {
  if (line_open_) out_ << "\n";
  line_open_ = false;
}

void print_summary_table(std::ostream& out, const JobSpec& spec, const RunSummary& s,
                         const std::optional<RunCost>& cost) {
  const auto& t = s.totals;
  auto row = [&](const std::string& k, const std::string& v) {
    out << "  " << std::left << std::setw(26) << k << v << "\n";
  };
  auto fmt = [](double x, int prec = 4) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(prec) << x;
    return o.str();
  };
  auto share = [&](double x) {
    return fmt(x, 2) + " s  (" + fmt(t.wall_seconds > 0 ? 100.0 * x / t.wall_seconds : 0, 1) + "%)";
  };
  out << "\n" << spec.name << " — " << (s.interrupted ? "interrupted" : "finished") << "\n";
  row("mode / device", s.mode + " / " + s.device);
  row("parameters", std::to_string(s.params) + " (" + std::to_string(s.split_params) + " in split matrices)");
  row("steps", std::to_string(s.steps) + " of " + std::to_string(spec.train.steps) +
                   (s.start_step > 0 ? " (resumed at " + std::to_string(s.start_step) + ")" : "") +
                   (s.skipped_steps > 0 ? ", " + std::to_string(s.skipped_steps) + " skipped" : ""));
  row("final train loss", fmt(s.final_loss));
  row("val loss / perplexity", s.val_loss >= 0 ? fmt(s.val_loss) + " / " + fmt(std::exp(s.val_loss), 2) : "-");
  row("median step time", fmt(s.step_seconds_median, 4) + " s (p90 " + fmt(s.step_seconds_p90, 4) + " s)");
  row("tokens / step", std::to_string(s.tokens_per_step));
  out << "  time breakdown (this process, " << fmt(t.wall_seconds, 2) << " s in steps):\n";
  row("  compute", share(t.compute_seconds));
  row("  device optimizer", share(t.device_optimizer_seconds));
  for (int c = 0; c < engine::kNumStallCauses; ++c) {
    if (t.stall_seconds[c] <= 0) continue;
    row(std::string("  stall ") + engine::stall_cause_name(static_cast<engine::StallCause>(c)),
        share(t.stall_seconds[c]));
  }
  const int64_t steps = static_cast<int64_t>(s.step_seconds.size());
  if (steps > 0) {
    const auto& f = s.finish_times.transfer_bytes;  // the end-of-run flush is not a step
    row("bytes / step d2h, h2d", std::to_string((t.transfer_bytes[0] - f[0]) / steps) + ", " +
                                     std::to_string((t.transfer_bytes[1] - f[1]) / steps));
    if (t.transfer_bytes[2] > 0)  // train.offload_parameters
      row("bytes / step h2d weights", std::to_string((t.transfer_bytes[2] - f[2]) / steps));
  }
  if (s.host_state_bytes > 0) {
    auto mib = [&](int64_t b) { return fmt(static_cast<double>(b) / 1048576.0, 1) + " MiB"; };
    const bool pinned = transfers_pinned(s);
    row(s.world_size > 1 ? "host state / rank" : "host state",
        mib(s.host_state_bytes) + " (transfer buffers " + mib(s.transfer_buffer_bytes) +
            (pinned ? ", pinned)" : ")"));
  }
  {
    const DeviceMemoryBytes& m = s.device_memory;
    auto mib = [&](int64_t b) { return b < 0 ? std::string("-") : fmt(static_cast<double>(b) / 1048576.0, 1); };
    row(s.world_size > 1 ? "device memory / rank" : "device memory",
        "params " + mib(m.parameters) + ", grads " + mib(m.gradients) + ", optimizer " + mib(m.optimizer_state) +
            ", comm " + mib(m.communication_buffers) + ", activations peak " + mib(m.activations_peak) +
            (s.activation_checkpointing ? " (checkpointed layers)" : "") + ", total peak " + mib(m.total_peak) +
            " MiB");
  }
  if (s.offload_parameters) {
    auto mib = [&](int64_t b) { return fmt(static_cast<double>(b) / 1048576.0, 1) + " MiB"; };
    row("offload parameters", "weights " + mib(s.streamed_weight_bytes) + " and their gradients on the host, " +
                                  "staging " + mib(s.streamed_staging_bytes) + "; on the device " +
                                  mib(s.device_memory.parameters) + " of weights");
  }
  if (s.world_size > 1 && steps > 0) {
    auto kib = [&](int64_t b) { return fmt(static_cast<double>(b) / static_cast<double>(steps) / 1024.0, 1) + " KiB"; };
    row("ranks", std::to_string(s.world_size) + (s.ranks_identical ? " (weights bit-identical)" : " (WEIGHTS DIFFER)"));
    if (s.shard != "none")
      row("shard", s.shard + ": gathered weights peak " + fmt(static_cast<double>(s.shard_gathered_peak_bytes) / 1048576.0, 1) +
                       " MiB, blocked in gathers and reduce-scatters " + fmt(s.shard_comm_seconds, 2) + " s");
    row("collectives / step", "gradients " + kib(s.comm_gradient_bytes) + ", selection " +
                                  kib(s.comm_selection_bytes) + ", parameters " + kib(s.comm_parameter_bytes));
  }
  if (!s.optimizer_nodes.empty()) {
    auto mib = [&](int64_t b) { return fmt(static_cast<double>(b) / 1048576.0, 1) + " MiB"; };
    row("optimizer nodes", s.host_backend);
    row("  network sent, received", mib(s.network_bytes_sent) + ", " + mib(s.network_bytes_received));
  }
  row("host threads / compute", std::to_string(s.host_threads) + " / " + std::to_string(s.compute_threads));
  if (!s.last_checkpoint.empty()) row("checkpoint", s.last_checkpoint);
  if (cost) {
    const RunCost& c = *cost;
    const bool catalog = c.source != "cost.usd_per_hour";
    row("cost", "$" + fmt(c.cost_usd, 6) + " at $" + fmt(c.usd_per_hour, 4) + "/h" +
                    (catalog ? " (" + fmt(c.gpu_share, 4) + " of " + c.instance + " at $" +
                                   fmt(c.instance_usd_per_hour, 4) + "/h)"
                             : " (cost.usd_per_hour)"));
    if (catalog) row("  price from", c.source + ", " + c.date + (c.verified ? "" : " (unverified)"));
    row("  per 1M tokens", c.usd_per_1m_tokens ? "$" + fmt(*c.usd_per_1m_tokens, 6) : "-");
    row("  lost to stalls", "$" + fmt(c.usd_lost_to_stalls, 6) + " (" + fmt(c.stall_seconds, 2) + " s exposed)");
  }
}

nlohmann::json summary_json(const RunSummary& s, const std::optional<RunCost>& cost) {
  nlohmann::json j;
  j["mode"] = s.mode;
  j["device"] = s.device;
  j["world_size"] = s.world_size;
  j["params"] = s.params;
  j["split_params"] = s.split_params;
  j["steps"] = s.steps;
  j["start_step"] = s.start_step;
  j["skipped_steps"] = s.skipped_steps;
  j["interrupted"] = s.interrupted;
  j["tokens_per_step"] = s.tokens_per_step;
  j["tokens"] = tokens_trained(s);
  j["final_loss"] = s.final_loss;
  j["val_loss"] = s.val_loss >= 0 ? nlohmann::json(s.val_loss) : nlohmann::json(nullptr);
  j["val_perplexity"] = s.val_loss >= 0 ? nlohmann::json(std::exp(s.val_loss)) : nlohmann::json(nullptr);
  j["losses"] = s.losses;
  j["step_seconds_median"] = s.step_seconds_median;
  j["step_seconds_p90"] = s.step_seconds_p90;
  j["compute_seconds"] = s.totals.compute_seconds;
  j["device_optimizer_seconds"] = s.totals.device_optimizer_seconds;
  nlohmann::json stall = nlohmann::json::object();
  for (int c = 0; c < engine::kNumStallCauses; ++c)
    stall[engine::stall_cause_name(static_cast<engine::StallCause>(c))] = s.totals.stall_seconds[c];
  j["stall_seconds"] = stall;
  nlohmann::json bytes = nlohmann::json::object();
  for (int d = 0; d < engine::kNumDirections; ++d)
    bytes[engine::direction_name(static_cast<engine::Direction>(d))] = s.totals.transfer_bytes[d];
  j["transfer_bytes"] = bytes;
  j["wall_seconds"] = s.wall_seconds;
  j["host_state_bytes"] = s.host_state_bytes;
  j["pinned_host_bytes"] = transfers_pinned(s) ? s.transfer_buffer_bytes : 0;
  j["transfer_buffer_bytes"] = s.transfer_buffer_bytes;
  j["activation_checkpointing"] = s.activation_checkpointing;
  {
    const DeviceMemoryBytes& m = s.device_memory;
    j["device_memory_bytes"] = {{"parameters", m.parameters},
                                {"gradients", m.gradients},
                                {"optimizer_state", m.optimizer_state},
                                {"activations_peak", m.activations_peak},
                                {"communication_buffers", m.communication_buffers},
                                {"total_peak", m.total_peak}};
  }
  j["ranks_identical"] = s.ranks_identical;
  j["shard"] = s.shard;
  j["shard_gathered_peak_bytes"] = s.shard_gathered_peak_bytes;
  j["shard_comm_seconds"] = s.shard_comm_seconds;
  j["offload_parameters"] = s.offload_parameters;
  j["streamed_weight_bytes"] = s.streamed_weight_bytes;
  j["streamed_staging_bytes"] = s.streamed_staging_bytes;
  j["comm_bytes"] = {{"gradients", s.comm_gradient_bytes},
                     {"selection", s.comm_selection_bytes},
                     {"parameters", s.comm_parameter_bytes}};
  j["host_threads"] = s.host_threads;
  j["compute_threads"] = s.compute_threads;
  j["host_backend"] = s.host_backend;
  j["optimizer_nodes"] = s.optimizer_nodes;
  j["network_bytes"] = {{"sent", s.network_bytes_sent}, {"received", s.network_bytes_received}};
  j["reselections"] = s.reselections;
  j["max_staleness_windows"] = s.max_staleness_windows;
  if (!s.last_checkpoint.empty()) j["checkpoint"] = s.last_checkpoint;
  const nlohmann::json null(nullptr);
  j["cost_usd"] = cost ? nlohmann::json(cost->cost_usd) : null;
  j["usd_per_hour"] = cost ? nlohmann::json(cost->usd_per_hour) : null;
  j["usd_per_1m_tokens"] = cost && cost->usd_per_1m_tokens ? nlohmann::json(*cost->usd_per_1m_tokens) : null;
  j["usd_lost_to_stalls"] = cost ? nlohmann::json(cost->usd_lost_to_stalls) : null;
  if (cost) {
    j["pricing"] = {{"instance", cost->instance.empty() ? null : nlohmann::json(cost->instance)},
                    {"source", cost->source},
                    {"date", cost->date.empty() ? null : nlohmann::json(cost->date)},
                    {"verified", cost->verified},
                    {"instance_usd_per_hour", cost->instance_usd_per_hour},
                    {"gpu_share", cost->gpu_share}};
  } else {
    j["pricing"] = null;
  }
  return j;
}

}  // namespace zenflow
