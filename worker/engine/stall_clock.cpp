// Per-step time accounting (see stall_clock.h).
#include "worker/engine/stall_clock.h"

namespace zenflow::engine {

const char* stall_cause_name(StallCause cause) {
  switch (cause) {
    case StallCause::kHostOptimizer: return "host_optimizer";
    case StallCause::kTransferD2H: return "transfer_d2h";
    case StallCause::kTransferH2D: return "transfer_h2d";
    case StallCause::kNetwork: return "network";
    case StallCause::kAllreduce: return "allreduce";
    case StallCause::kData: return "data";
    case StallCause::kCheckpoint: return "checkpoint";
    case StallCause::kCheckpointUpload: return "checkpoint_upload";
    case StallCause::kWeightStream: return "weight_stream";
  }
  return "unknown";
}

const char* direction_name(Direction dir) {
  switch (dir) {
    case Direction::kD2H: return "d2h";
    case Direction::kH2D: return "h2d";
    case Direction::kH2DWeights: return "h2d_weights";
  }
  return "unknown";
}

double StepTimes::stall_total() const {
  double s = 0;
  for (double x : stall_seconds) s += x;
  return s;
}

void StallClock::begin_step() {
  current_ = StepTimes{};
  deferred_.clear();
  start_ = std::chrono::steady_clock::now();
}

void StallClock::add_deferred(TimeKind kind, StallCause cause, std::function<double()> seconds) {
  deferred_.push_back({kind, cause, std::move(seconds)});
}

const StepTimes& StallClock::end_step() {
  current_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  for (auto& d : deferred_) {
    const double s = d.seconds();
    switch (d.kind) {
      case TimeKind::kCompute: current_.compute_seconds += s; break;
      case TimeKind::kDeviceOptimizer: current_.device_optimizer_seconds += s; break;
      case TimeKind::kStall: current_.stall_seconds[static_cast<int>(d.cause)] += s; break;
      case TimeKind::kComputeStall: compute_was_stall(d.cause, s); break;
    }
  }
  deferred_.clear();
  history_.push_back(current_);
  return history_.back();
}

StepTimes StallClock::totals() const {
  StepTimes t;
  for (const auto& s : history_) {
    t.wall_seconds += s.wall_seconds;
    t.compute_seconds += s.compute_seconds;
    t.device_optimizer_seconds += s.device_optimizer_seconds;
    for (int i = 0; i < kNumStallCauses; ++i) t.stall_seconds[i] += s.stall_seconds[i];
    for (int i = 0; i < kNumDirections; ++i) t.transfer_bytes[i] += s.transfer_bytes[i];
  }
  return t;
}

}  // namespace zenflow::engine
