#include "worker/agent/hang_watch.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/job_spec.h"

namespace zenflow::agent {

using std::chrono::milliseconds;
using std::chrono::seconds;

HangWatch::HangWatch(seconds configured_timeout, Clock::time_point started)
    : configured_(configured_timeout), last_progress_(started) {}

void HangWatch::on_step(int64_t step, double step_seconds, Clock::time_point at) {
  if (std::isfinite(step_seconds) && step_seconds > 0) {
    step_seconds_.push_back(step_seconds);
    if (step_seconds_.size() > kStepSecondsWindow) step_seconds_.pop_front();
  }
  if (stepped_ && step <= step_) return;
  stepped_ = true;
  step_ = step;
  last_progress_ = std::max(last_progress_, at);
}

void HangWatch::on_checkpoint(Clock::time_point at) { last_progress_ = std::max(last_progress_, at); }

double HangWatch::median_step_seconds() const {
  if (step_seconds_.empty()) return 0;
  std::vector<double> v(step_seconds_.begin(), step_seconds_.end());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + upper) / 2;
}

seconds HangWatch::timeout() const {
  if (configured_.count() > 0) return configured_;
  const double ten_steps = std::ceil(10 * median_step_seconds());
  return seconds(std::max(ResourcesSpec::kAutoHangTimeoutSeconds, static_cast<int64_t>(ten_steps)));
}

milliseconds HangWatch::bound() const {
  const milliseconds t = timeout();
  return stepped_ ? t : ResourcesSpec::kFirstStepHangFactor * t;
}

std::optional<HangWatch::Hang> HangWatch::check(Clock::time_point now) const {
  const auto silent = std::chrono::duration_cast<milliseconds>(now - last_progress_);
  if (silent <= bound()) return std::nullopt;
  Hang h;
  h.step = step_;
  h.since = last_progress_;
  h.silent = silent;
  h.timeout = timeout();
  return h;
}

}  // namespace zenflow::agent
