// Per-step time accounting: compute, device-optimizer time, stalls by cause, bytes moved.
//
// The training loop and the engine report into one StallClock; the totals feed the run
// summary, the benchmarks and (later) the Prometheus counters of docs/design.md §7, whose
// cause names these are. Thread safety: one thread (the training loop's) calls
// everything; totals() may be read by it between steps.
//
// On a GPU, what matters is what the compute stream did: compute time and stalls are
// measured with CUDA events (ComputeTimer, device_streams.h) around the work or the wait,
// and are known only once the GPU has passed the events. Such durations are added as
// deferred values (add_deferred) and resolved by end_step(). On the CPU they are wall
// clock seconds, added at once.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zenflow::engine {

enum class StallCause {
  kHostOptimizer = 0,  // waiting for the host updater's window step
  kTransferD2H,
  kTransferH2D,
  kNetwork,
  kAllreduce,
  kData,
  kCheckpoint,
  kCheckpointUpload,  // a checkpoint waiting for the previous one's upload (checkpoint.dir: s3://)
  kWeightStream,      // the compute waiting for a unit's weights from the host (train.offload_parameters)
};
constexpr int kNumStallCauses = 9;
const char* stall_cause_name(StallCause cause);  // "host_optimizer", "transfer_d2h", ...

// kH2DWeights: the weights streamed host to device before each unit runs
// (train.offload_parameters), apart from the engine's H2D of host-step results.
enum class Direction { kD2H = 0, kH2D = 1, kH2DWeights = 2 };
constexpr int kNumDirections = 3;
const char* direction_name(Direction dir);  // "d2h", "h2d", "h2d_weights"

struct StepTimes {
  double wall_seconds = 0;
  double compute_seconds = 0;           // forward + backward (+ loss)
  double device_optimizer_seconds = 0;  // device updater, selection, clipping
  std::array<double, kNumStallCauses> stall_seconds{};
  std::array<int64_t, kNumDirections> transfer_bytes{};  // indexed by Direction
  double stall_total() const;
};

// What a duration counts as (add_deferred). kComputeStall: a stall inside a compute region,
// moved from compute to its cause (compute_was_stall).
enum class TimeKind { kCompute, kDeviceOptimizer, kStall, kComputeStall };

class StallClock {
 public:
  void begin_step();
  // Closes the step: wall time since begin_step(); appends to history().
  const StepTimes& end_step();

  void add_compute(double seconds) { current_.compute_seconds += seconds; }
  void add_device_optimizer(double seconds) { current_.device_optimizer_seconds += seconds; }
  void add_stall(StallCause cause, double seconds) {
    current_.stall_seconds[static_cast<int>(cause)] += seconds;
  }
  void add_bytes(Direction dir, int64_t bytes) { current_.transfer_bytes[static_cast<int>(dir)] += bytes; }
  // Time inside a compute region that was in fact a stall: moved from compute to `cause`
  // (the compute region around it counts it as compute when it ends).
  void compute_was_stall(StallCause cause, double seconds) {
    current_.compute_seconds -= seconds;
    add_stall(cause, seconds);
  }
  // `seconds` is called (and may block until the GPU reached its events) by end_step();
  // `cause` matters for TimeKind::kStall only.
  void add_deferred(TimeKind kind, StallCause cause, std::function<double()> seconds);

  const StepTimes& current() const { return current_; }
  const std::vector<StepTimes>& history() const { return history_; }
  StepTimes totals() const;  // sum over history()

 private:
  std::chrono::steady_clock::time_point start_;
  StepTimes current_;
  std::vector<StepTimes> history_;
  struct Deferred {
    TimeKind kind;
    StallCause cause;
    std::function<double()> seconds;
  };
  std::vector<Deferred> deferred_;
};

// Seconds elapsed on a steady clock; Stopwatch().seconds() after some work.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace zenflow::engine
