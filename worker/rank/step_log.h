// The run's own record in its directory: checkpoint.dir/steps.jsonl, appended by rank 0 as
// it trains, read by `zenflow report` (common/report/run_record.h). The lines are defined
// once, in common/report/step_log_lines.h; this is their writer.
//
// Cost: a step line is formatted into a fixed buffer and written with one write(2) on an
// O_APPEND descriptor: no allocation, no lock, no user-space buffer (every line is in the
// file when on_step returns; a killed run leaves whole lines, at worst a partial last one).
// A write that fails (disk full) turns the log off for the rest of the run: the run goes on.
// Thread safety: the training thread calls the observer methods (training_observer.h);
// write_summary after run_training has returned.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/report/step_log_lines.h"
#include "worker/rank/training_observer.h"

namespace zenflow {

// The price a job runs at, as the start line records it.
struct StepLogPrice {
  double instance_usd_per_hour = 0;
  int64_t gpus_of_instance = 0;  // 0: charged in full
  std::string instance;          // "" for a spec rate
  std::string source;            // "cost.usd_per_hour" or the catalog row's source
};

class StepLog : public TrainingObserver {
 public:
  static constexpr const char* kFileName = report::kStepLogFileName;

  // `path`: the file to append to (created when absent, in a directory that exists by
  // on_start: rank 0 holds checkpoint.dir's lock then). Opens nothing yet.
  StepLog(std::string path, std::string job, bool fresh, std::optional<StepLogPrice> price);
  ~StepLog() override;
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;

  // Opens the file and writes the start line. Throws std::runtime_error naming the path
  // when it cannot be opened.
  void on_start(const RunFacts& facts) override;
  void on_step(const TrainingStep& step) noexcept override;
  void on_eval(int64_t step, double val_loss) noexcept override;
  void on_finish(const TrainingEnd& end) noexcept override;
  // The run's summary line (`zenflow run --json`'s object); once, after the run returned.
  void write_summary(const nlohmann::json& summary) noexcept;

  bool writing() const { return fd_ >= 0; }  // false before on_start and after a failed write

 private:
  void write_line(const char* data, size_t size) noexcept;

  std::string path_;
  std::string job_;
  bool fresh_;
  std::optional<StepLogPrice> price_;
  int fd_ = -1;
  // Reused for every step and for the end, their stall causes named once here, so that
  // writing them allocates nothing.
  report::StepLine step_;
  report::FinishLine finish_;
  char line_[2048];
};

}  // namespace zenflow
