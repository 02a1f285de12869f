// checkpoint.dir/steps.jsonl, rank 0's record of a run (see step_log.h).
#include "worker/rank/step_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/pricing.h"

namespace zenflow {

namespace {

using Line = nlohmann::ordered_json;  // keys in the order written: "event" first

Line number(double x) { return std::isfinite(x) ? Line(x) : Line(nullptr); }

// printf into buf + at (of `cap`); the new length, or -1 when it does not fit (or at < 0).
int put(char* buf, int cap, int at, const char* fmt, ...) noexcept __attribute__((format(printf, 4, 5)));
int put(char* buf, int cap, int at, const char* fmt, ...) noexcept {
  if (at < 0 || at >= cap) return -1;
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf + at, static_cast<size_t>(cap - at), fmt, ap);
  va_end(ap);
  return n < 0 || n >= cap - at ? -1 : at + n;
}

// A double as JSON: shortest text that reads back as the same double is not available to
// printf, so 17 significant digits (exact round trip); null when not finite.
int put_number(char* buf, int cap, int at, double x) noexcept {
  return std::isfinite(x) ? put(buf, cap, at, "%.17g", x) : put(buf, cap, at, "null");
}

}  // namespace

StepLog::StepLog(std::string path, std::string job, bool fresh, std::optional<StepLogPrice> price)
    : path_(std::move(path)), job_(std::move(job)), fresh_(fresh), price_(std::move(price)) {}

StepLog::~StepLog() {
  if (fd_ >= 0) ::close(fd_);
}

void StepLog::on_start(const RunFacts& f) {
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw std::runtime_error(path_ + ": cannot open the run's step log: " + std::strerror(errno));
  }
  tokens_per_step_ = f.tokens_per_step;
  Line price(nullptr);
  if (price_) {
    const int64_t gpus_used = f.device_is_cuda ? f.world_size : 0;
    price = Line{
        {"usd_per_hour", price_->instance_usd_per_hour * instance_share(gpus_used, price_->gpus_of_instance)},
        {"instance_usd_per_hour", price_->instance_usd_per_hour},
        {"gpus_of_instance", price_->gpus_of_instance},
        {"instance", price_->instance.empty() ? Line(nullptr) : Line(price_->instance)},
        {"source", price_->source}};
  }
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const Line start{{"event", "start"},
                   {"job", job_},
                   {"start_step", f.start_step},
                   {"total_steps", f.total_steps},
                   {"fresh", fresh_},
                   {"world_size", f.world_size},
                   {"device_is_cuda", f.device_is_cuda},
                   {"tokens_per_step", f.tokens_per_step},
                   {"time", number(now)},
                   {"host_memory",
                    {{"master", f.host_master_bytes},
                     {"moments", f.host_moments_bytes},
                     {"accumulators", f.host_accumulator_bytes},
                     {"pinned", f.pinned_host_bytes},
                     {"staging", f.host_staging_bytes},
                     {"host_total", f.host_total_memory_bytes}}},
                   {"price", price}};
  const std::string text = start.dump(-1, ' ', false, Line::error_handler_t::replace) + "\n";
  write_line(text.data(), text.size());
}

int StepLog::append_times(int at, const engine::StepTimes& t) noexcept {
  const int cap = static_cast<int>(sizeof line_);
  at = put(line_, cap, at, "\"stall\":{");
  for (int c = 0; c < engine::kNumStallCauses; ++c) {
    at = put(line_, cap, at, "%s\"%s\":", c ? "," : "",
             engine::stall_cause_name(static_cast<engine::StallCause>(c)));
    at = put_number(line_, cap, at, t.stall_seconds[c]);
  }
  return put(line_, cap, at, "},\"bytes\":{\"d2h\":%lld,\"h2d\":%lld}",
             static_cast<long long>(t.transfer_bytes[static_cast<int>(engine::Direction::kD2H)]),
             static_cast<long long>(t.transfer_bytes[static_cast<int>(engine::Direction::kH2D)]));
}

void StepLog::on_step(const TrainingStep& s) noexcept {
  if (fd_ < 0) return;
  const int cap = static_cast<int>(sizeof line_);
  int at = put(line_, cap, 0, "{\"event\":\"step\",\"step\":%lld,\"loss\":", static_cast<long long>(s.step));
  at = put_number(line_, cap, at, s.loss);
  at = put(line_, cap, at, ",\"lr\":");
  at = put_number(line_, cap, at, s.lr);
  at = put(line_, cap, at, ",\"tokens\":%lld,\"skipped\":%s,\"staleness_steps\":%lld,\"selected_ratio\":",
           static_cast<long long>(tokens_per_step_), s.skipped ? "true" : "false",
           static_cast<long long>(s.staleness_steps));
  at = put_number(line_, cap, at, s.selected_ratio);
  at = put(line_, cap, at, ",\"wall\":");
  at = put_number(line_, cap, at, s.times.wall_seconds);
  at = put(line_, cap, at, ",\"compute\":");
  at = put_number(line_, cap, at, s.times.compute_seconds);
  at = put(line_, cap, at, ",\"device_optimizer\":");
  at = put_number(line_, cap, at, s.times.device_optimizer_seconds);
  at = put(line_, cap, at, ",");
  at = append_times(at, s.times);
  at = put(line_, cap, at, "}\n");
  if (at > 0) write_line(line_, static_cast<size_t>(at));
}

void StepLog::on_eval(int64_t step, double val_loss) noexcept {
  if (fd_ < 0 || !(val_loss >= 0)) return;  // < 0: no validation set
  const int cap = static_cast<int>(sizeof line_);
  int at =
      put(line_, cap, 0, "{\"event\":\"eval\",\"step\":%lld,\"val_loss\":", static_cast<long long>(step));
  at = put_number(line_, cap, at, val_loss);
  at = put(line_, cap, at, "}\n");
  if (at > 0) write_line(line_, static_cast<size_t>(at));
}

void StepLog::on_finish(const TrainingEnd& end) noexcept {
  if (fd_ < 0) return;
  const int cap = static_cast<int>(sizeof line_);
  int at = put(line_, cap, 0, "{\"event\":\"finish\",\"steps\":%lld,\"interrupted\":%s,\"wall\":",
               static_cast<long long>(end.steps), end.interrupted ? "true" : "false");
  at = put_number(line_, cap, at, end.finish.wall_seconds);
  at = put(line_, cap, at, ",");
  at = append_times(at, end.finish);
  at = put(line_, cap, at, "}\n");
  if (at > 0) write_line(line_, static_cast<size_t>(at));
}

void StepLog::write_summary(const nlohmann::json& summary) noexcept {
  if (fd_ < 0) return;
  try {
    nlohmann::json kept = summary;
    kept.erase("losses");  // the step lines hold them
    const std::string text =
        Line{{"event", "summary"}, {"summary", kept}}.dump(-1, ' ', false, Line::error_handler_t::replace) +
        "\n";
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
