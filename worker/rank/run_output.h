// Human and machine output of training runs: progress line, summary table, JSON.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "common/job_spec.h"
#include "common/pricing.h"
#include "worker/rank/run_reporter.h"
#include "worker/rank/trainer.h"

namespace zenflow {

// A live progress line on a TTY (rewritten in place), plain periodic lines otherwise; the
// run's messages as "zenflow: LINE" (also when quiet, which silences the steps only).
class ProgressPrinter : public RunReporter {
 public:
  ProgressPrinter(std::ostream& out, bool tty, bool quiet) : out_(out), tty_(tty), quiet_(quiet) {}
  void on_start(int64_t, int64_t) noexcept override {}
  void on_step(const StepProgress& p) noexcept override;
  void on_log(const std::string& line) noexcept override;  // does not garble the progress line
  void on_checkpoint(int64_t, const std::string&) noexcept override {}
  void on_finish(int64_t, bool) noexcept override { finish(); }
  void finish();  // ends the progress line (also where a run failed)

 private:
  std::ostream& out_;
  bool tty_;
  bool quiet_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point last_print_{};
};

// What a run cost at its resolved price (common/pricing.h): its wall time (RunSummary::
// wall_seconds) at the job's rate, the instance's price × its share of the instance's GPUs
// (the ranks when the run is on CUDA; a CPU run pays the whole instance).
struct RunCost {
  std::string instance;  // cost.instance_type ("" with a spec rate only)
  std::string source;    // the catalog row's source, or "cost.usd_per_hour"
  std::string date;      // the catalog row's date
  bool verified = true;
  double instance_usd_per_hour = 0;
  double gpu_share = 1;     // of the instance
  double usd_per_hour = 0;  // the job's rate: instance_usd_per_hour × gpu_share
  double cost_usd = 0;
  int64_t tokens = 0;       // trained in this run (all ranks)
  std::optional<double> usd_per_1m_tokens;
  double stall_seconds = 0;  // exposed, this process
  double usd_lost_to_stalls = 0;
};
// Token positions this process's run trained (all ranks): tokens_per_step × its steps.
int64_t tokens_trained(const RunSummary& sum);
// nullopt when the price is not resolved (no cost section, or an unknown instance).
std::optional<RunCost> run_cost(const ResolvedPrice& price, const RunSummary& sum);

std::string format_duration(double seconds);  // "1m05s", "3.2s"
void print_summary_table(std::ostream& out, const JobSpec& spec, const RunSummary& sum,
                         const std::optional<RunCost>& cost = std::nullopt);
// "tokens" is tokens_trained(). With `cost`: cost_usd, usd_per_hour, usd_per_1m_tokens, usd_lost_to_stalls
// and pricing {instance, source, date, verified, instance_usd_per_hour, gpu_share}; null without.
nlohmann::json summary_json(const RunSummary& sum, const std::optional<RunCost>& cost = std::nullopt);

}  // namespace zenflow
