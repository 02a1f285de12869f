// Run reporters: the fan-out and the JSON lines of --report-fd (see run_reporter.h).
#include "worker/rank/run_reporter.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <nlohmann/json.hpp>

namespace zenflow {

void FanoutReporter::on_start(int64_t start_step, int64_t total_steps) noexcept {
  for (RunReporter* r : reporters_) r->on_start(start_step, total_steps);
}

void FanoutReporter::on_resumed(int64_t step, int64_t total_steps, double loss) noexcept {
  for (RunReporter* r : reporters_) r->on_resumed(step, total_steps, loss);
}
void FanoutReporter::on_step(const StepProgress& progress) noexcept {
  for (RunReporter* r : reporters_) r->on_step(progress);
}
void FanoutReporter::on_log(const std::string& line) noexcept {
  for (RunReporter* r : reporters_) r->on_log(line);
}
void FanoutReporter::on_checkpoint(int64_t step, const std::string& dir) noexcept {
  for (RunReporter* r : reporters_) r->on_checkpoint(step, dir);
}
void FanoutReporter::on_finish(int64_t steps, bool interrupted) noexcept {
  for (RunReporter* r : reporters_) r->on_finish(steps, interrupted);
}

void FanoutReporter::on_profile(const std::string& path) noexcept {
  for (RunReporter* r : reporters_) r->on_profile(path);
}

void FanoutReporter::on_node_lost(const std::string& node) noexcept {
  for (RunReporter* r : reporters_) r->on_node_lost(node);
}

namespace {
using Event = nlohmann::ordered_json;  // keys in the order written: "event" first

// JSON has no NaN or Inf: a diverged loss is written as null, not as an unparsable token.
Event number(double x) { return std::isfinite(x) ? Event(x) : Event(nullptr); }
}  // namespace

JsonLinesReporter::JsonLinesReporter(int fd, std::chrono::milliseconds min_step_interval)
    : fd_(fd), min_step_interval_(min_step_interval) {}

void JsonLinesReporter::on_start(int64_t start_step, int64_t total_steps) noexcept {
  emit([&] { return Event{{"event", "start"}, {"start_step", start_step}, {"total_steps", total_steps}}; });
}

void JsonLinesReporter::on_resumed(int64_t step, int64_t total_steps, double loss) noexcept {
  emit([&] {
    return Event{{"event", "resumed"}, {"step", step}, {"total_steps", total_steps}, {"loss", number(loss)}};
  });
}

void JsonLinesReporter::on_step(const StepProgress& p) noexcept {
  latest_ = p;
  latest_written_ = false;
  const auto now = std::chrono::steady_clock::now();
  if (!step_written_ || p.step >= p.total || now - last_step_written_ >= min_step_interval_) write_step(p);
}

void JsonLinesReporter::on_log(const std::string& line) noexcept {
  emit([&] { return Event{{"event", "log"}, {"line", line}}; });
}

void JsonLinesReporter::on_checkpoint(int64_t step, const std::string& dir) noexcept {
  emit([&] { return Event{{"event", "checkpoint"}, {"step", step}, {"dir", dir}}; });
}

void JsonLinesReporter::on_profile(const std::string& path) noexcept {
  emit([&] { return Event{{"event", "profile"}, {"path", path}}; });
}

void JsonLinesReporter::on_node_lost(const std::string& node) noexcept {
  emit([&] { return Event{{"event", "node_lost"}, {"node", node}}; });
}

void JsonLinesReporter::on_finish(int64_t steps, bool interrupted) noexcept {
  if (!latest_written_) write_step(latest_);  // the run's last step, held back by the rate limit
  emit([&] { return Event{{"event", "finish"}, {"steps", steps}, {"interrupted", interrupted}}; });
}

void JsonLinesReporter::write_step(const StepProgress& p) noexcept {
  latest_written_ = true;
  step_written_ = true;
  last_step_written_ = std::chrono::steady_clock::now();
  emit([&] {
    return Event{{"event", "step"},
                 {"step", p.step},
                 {"total_steps", p.total},
                 {"loss", number(p.loss)},
                 {"lr", number(p.lr)},
                 {"step_seconds", number(p.step_seconds)},
                 {"tokens_per_second", number(p.tokens_per_second)},
                 {"tokens_per_step", p.tokens_per_step},
                 {"stall_share", number(p.stall_fraction)},
                 {"eta_seconds", number(p.eta_seconds)}};
  });
}

void JsonLinesReporter::write_event(const nlohmann::ordered_json& event) {
  if (fd_ < 0) return;
  // A path or message that is not UTF-8 is written with U+FFFD, not dropped.
  const std::string line =
      event.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};  // a non-blocking fd: wait as a blocking one would
      (void)::poll(&p, 1, -1);
    } else {
      fd_ = -1;  // the reader is gone (EPIPE) or the fd unusable: report no more
      return;
    }
  }
}

}  // namespace zenflow
