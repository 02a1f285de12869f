// Who is told how a run goes: the terminal's progress line, the worker agent's JSON lines.
//
// run_training() (trainer.h) tells its RunOptions::reporter, on the training thread and one
// call at a time: on_start() once, when setup is done and the first step starts (setup's
// log lines, e.g. the resume's, come before it);
// on_step() after every step; on_checkpoint() after every checkpoint this process committed
// (rank 0 commits them); on_log() for the job's info and warning lines (rank 0's only: rank
// 0 speaks for the job); on_finish() once, last, when the run returns a summary (not when it
// throws). With data-parallel ranks every rank's reporter gets start, steps and finish: the
// step's loss and tokens are the global batch's, its times this process's.
//
// Reporting never fails a run: every method is noexcept, and an implementation that cannot
// deliver (its reader gone) drops what it cannot say. on_step() is on the hot path: it may
// format and write a line, but must not wait on anything but its own output.
// Light on purpose (no LibTorch): the CLI and the agent include it.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace zenflow {

struct StepProgress {
  int64_t step = 0;  // 1-based steps done
  int64_t total = 0;
  double loss = 0;
  double lr = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;  // over the last steps
  int64_t tokens_per_step = 0;   // the global batch's token positions (cost per 1M tokens)
  double stall_fraction = 0;     // stall share of wall time so far
  double eta_seconds = 0;
};

class RunReporter {
 public:
  virtual ~RunReporter() = default;
  // start_step: the step resumed from (0 = fresh); total_steps: train.steps.
  virtual void on_start(int64_t start_step, int64_t total_steps) noexcept = 0;
  // Right after on_start when the run resumed from a checkpoint: the step it resumed at and
  // the loss that step had, so a reader knows where the job stands even if it trains no
  // further step (a resume at train.steps, after an attempt that finished but was not
  // recorded as finished).
  virtual void on_resumed(int64_t step, int64_t total_steps, double loss) noexcept {
    (void)step;
    (void)total_steps;
    (void)loss;
  }
  virtual void on_step(const StepProgress& progress) noexcept = 0;
  virtual void on_log(const std::string& line) noexcept = 0;  // without the "zenflow: " prefix
  // `dir` is the committed step directory (checkpoint.dir/step-NNNNNNNN).
  virtual void on_checkpoint(int64_t step, const std::string& dir) noexcept = 0;
  // steps: the last step reached; interrupted: stopped before train.steps (RunSummary).
  virtual void on_finish(int64_t steps, bool interrupted) noexcept = 0;
  // After on_finish, from `zenflow run --profile`: the job's profile was written at `path`.
  virtual void on_profile(const std::string& path) noexcept { (void)path; }
  // Instead of on_finish: the run ends because the optimizer node at `node` (HOST:PORT) is
  // lost and a coordinator is to assign a spare.
  virtual void on_node_lost(const std::string& node) noexcept { (void)node; }
};

// Passes every event to each of its reporters, in the order they were added (not owned;
// they must outlive it).
class FanoutReporter : public RunReporter {
 public:
  void add(RunReporter* reporter) { reporters_.push_back(reporter); }

  void on_start(int64_t start_step, int64_t total_steps) noexcept override;
  void on_resumed(int64_t step, int64_t total_steps, double loss) noexcept override;
  void on_step(const StepProgress& progress) noexcept override;
  void on_log(const std::string& line) noexcept override;
  void on_checkpoint(int64_t step, const std::string& dir) noexcept override;
  void on_finish(int64_t steps, bool interrupted) noexcept override;
  void on_profile(const std::string& path) noexcept override;
  void on_node_lost(const std::string& node) noexcept override;

 private:
  std::vector<RunReporter*> reporters_;
};

// One JSON object per line on a file descriptor (`zenflow run --report-fd N`), for the worker
// agent that runs this process:
//   {"event":"start","start_step":S,"total_steps":T}
//   {"event":"step","step":N,"total_steps":T,"loss":..,"lr":..,"step_seconds":..,
//    "tokens_per_second":..,"stall_share":..,"eta_seconds":..}
//   {"event":"checkpoint","step":N,"dir":"..."}
//   {"event":"log","line":"..."}
//   {"event":"finish","steps":N,"interrupted":false}
//   {"event":"profile","path":"..."}   (after finish, when the run wrote its profile)
//   {"event":"node_lost","node":"HOST:PORT"}   (the run ends for a spare optimizer node)
// Step lines are at most one per `min_step_interval` (the first step's is always written),
// and the run's last step always has one, before the finish line: the step lines of a run
// rise strictly and end with its last step. A non-finite number is written as null.
//
// Each line is one write(2) of the whole line, retried on EINTR and continued after a
// partial write, so the stream holds whole lines only, and on a pipe a line of up to
// PIPE_BUF bytes arrives at once, never mixed with another writer's output. The writes
// block while the reader lags a full pipe buffer behind (on a non-blocking fd too: it
// polls). The first write that fails (EPIPE: the reader is gone; EBADF, ...) turns the
// reporter off for good: the run goes on unreported. The fd is not owned (never closed).
// A reader gone raises SIGPIPE on a pipe: the process must ignore SIGPIPE (`zenflow run`
// does when given --report-fd or --lease-fd), or it dies of it.
class JsonLinesReporter : public RunReporter {
 public:
  explicit JsonLinesReporter(int fd,
                             std::chrono::milliseconds min_step_interval = std::chrono::milliseconds(250));

  void on_start(int64_t start_step, int64_t total_steps) noexcept override;
  // {"event":"resumed","step":S,"total_steps":T,"loss":L}
  void on_resumed(int64_t step, int64_t total_steps, double loss) noexcept override;
  void on_step(const StepProgress& progress) noexcept override;
  void on_log(const std::string& line) noexcept override;
  void on_checkpoint(int64_t step, const std::string& dir) noexcept override;
  void on_finish(int64_t steps, bool interrupted) noexcept override;
  void on_profile(const std::string& path) noexcept override;
  void on_node_lost(const std::string& node) noexcept override;

  // false once a write failed (then nothing more is written).
  bool writing() const { return fd_ >= 0; }

 private:
  void write_step(const StepProgress& progress) noexcept;
  // Writes the event `build()` returns; one that cannot be built or formatted (out of
  // memory) is lost, the run goes on.
  template <typename Build>
  void emit(Build build) noexcept {
    try {
      write_event(build());
    } catch (...) {
    }
  }
  // One line, keys in the order given. Throws std::bad_alloc only.
  void write_event(const nlohmann::ordered_json& event);

  int fd_;
  std::chrono::milliseconds min_step_interval_;
  std::chrono::steady_clock::time_point last_step_written_{};
  bool step_written_ = false;   // any step line yet
  StepProgress latest_;         // the last step seen
  bool latest_written_ = true;  // ... and whether its line was written
};

}  // namespace zenflow
