// checkpoint.dir/steps.jsonl, rank 0's record of a run (see step_log.h).
#include "worker/rank/step_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/pricing.h"

namespace zenflow {

namespace {

// The engine's stall causes in its order, their seconds filled in per line.
std::vector<report::StallSeconds> engine_stall_causes() {
  std::vector<report::StallSeconds> causes;
  for (int c = 0; c < engine::kNumStallCauses; ++c)
    causes.push_back({engine::stall_cause_name(static_cast<engine::StallCause>(c)), 0.0});
  return causes;
}

// `t`'s stalls and bytes into a line whose causes engine_stall_causes() named.
template <typename Line>
void copy_stalls_and_bytes(const engine::StepTimes& t, Line& line) noexcept {
  for (int c = 0; c < engine::kNumStallCauses; ++c)
    line.stall[static_cast<size_t>(c)].seconds = t.stall_seconds[c];
  line.bytes_d2h = t.transfer_bytes[static_cast<int>(engine::Direction::kD2H)];
  line.bytes_h2d = t.transfer_bytes[static_cast<int>(engine::Direction::kH2D)];
  line.bytes_h2d_weights = t.transfer_bytes[static_cast<int>(engine::Direction::kH2DWeights)];
}

}  // namespace

StepLog::StepLog(std::string path, std::string job, bool fresh, std::optional<StepLogPrice> price)
    : path_(std::move(path)), job_(std::move(job)), fresh_(fresh), price_(std::move(price)) {
  step_.stall = engine_stall_causes();
  finish_.stall = engine_stall_causes();
}

StepLog::~StepLog() {
  if (fd_ >= 0) ::close(fd_);
}

void StepLog::on_start(const RunFacts& f) {
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw std::runtime_error(path_ + ": cannot open the run's step log: " + std::strerror(errno));
  }
  step_.tokens = f.tokens_per_step;
  report::StartLine start;
  start.job = job_;
  start.start_step = f.start_step;
  start.total_steps = f.total_steps;
  start.fresh = fresh_;
  start.world_size = f.world_size;
  start.device_is_cuda = f.device_is_cuda;
  start.tokens_per_step = f.tokens_per_step;
  start.time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  namespace kind = report::host_memory_kind;
  start.host_memory = {{kind::kMaster, f.host_master_bytes},
                       {kind::kMoments, f.host_moments_bytes},
                       {kind::kAccumulators, f.host_accumulator_bytes},
                       {kind::kPinned, f.pinned_host_bytes},
                       {kind::kStaging, f.host_staging_bytes},
                       {kind::kHostTotal, f.host_total_memory_bytes}};
  if (price_) {
    const int64_t gpus_used = f.device_is_cuda ? f.world_size : 0;
    report::StartPrice price;
    price.usd_per_hour = price_->instance_usd_per_hour * instance_share(gpus_used, price_->gpus_of_instance);
    price.instance_usd_per_hour = price_->instance_usd_per_hour;
    price.gpus_of_instance = price_->gpus_of_instance;
    price.instance = price_->instance;
    price.source = price_->source;
    start.price = std::move(price);
  }
  const std::string text = report::format_line(start);
  write_line(text.data(), text.size());
}

void StepLog::on_step(const TrainingStep& s) noexcept {
  if (fd_ < 0) return;
  step_.step = s.step;
  step_.loss = s.loss;
  step_.lr = s.lr;
  step_.skipped = s.skipped;
  step_.staleness_steps = s.staleness_steps;
  step_.selected_ratio = s.selected_ratio;
  step_.wall = s.times.wall_seconds;
  step_.compute = s.times.compute_seconds;
  step_.device_optimizer = s.times.device_optimizer_seconds;
  copy_stalls_and_bytes(s.times, step_);
  const int n = report::format_line(step_, line_, static_cast<int>(sizeof line_));
  if (n > 0) write_line(line_, static_cast<size_t>(n));
}

void StepLog::on_eval(int64_t step, double val_loss) noexcept {
  if (fd_ < 0 || !(val_loss >= 0)) return;  // < 0: no validation set
  report::EvalLine eval;
  eval.step = step;
  eval.val_loss = val_loss;
  const int n = report::format_line(eval, line_, static_cast<int>(sizeof line_));
  if (n > 0) write_line(line_, static_cast<size_t>(n));
}

void StepLog::on_finish(const TrainingEnd& end) noexcept {
  if (fd_ < 0) return;
  finish_.steps = end.steps;
  finish_.interrupted = end.interrupted;
  finish_.wall = end.finish.wall_seconds;
  copy_stalls_and_bytes(end.finish, finish_);
  const int n = report::format_line(finish_, line_, static_cast<int>(sizeof line_));
  if (n > 0) write_line(line_, static_cast<size_t>(n));
}

void StepLog::write_summary(const nlohmann::json& summary) noexcept {
  if (fd_ < 0) return;
  try {
    report::SummaryLine line;
    line.summary = summary;
    line.summary.erase("losses");  // the step lines hold them
    const std::string text = report::format_line(line);
    write_line(text.data(), text.size());
  } catch (...) {  // out of memory: the summary is lost, the run is not
  }
}

void StepLog::write_line(const char* data, size_t size) noexcept {
  size_t done = 0;
  while (fd_ >= 0 && done < size) {
    const ssize_t n = ::write(fd_, data + done, size - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      ::close(fd_);  // disk full, ...: the log stops, the run goes on
      fd_ = -1;
    }
  }
}

}  // namespace zenflow
