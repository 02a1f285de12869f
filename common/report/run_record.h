// A run directory read back for `zenflow report`: what its training recorded, step by step.
//
// The source is checkpoint.dir/steps.jsonl (worker/rank/step_log.h writes it; its lines are
// defined in step_log_lines.h). Reading it trusts nothing: a line that is not a JSON object (a run
// killed in the middle of its last line, a damaged file) is skipped with a warning, a
// missing or null number reads as NaN, an unknown event or key is ignored, so whatever
// complete lines a file has make a record. A directory from before steps.jsonl existed is
// read from its newest checkpoint's trainer.json instead: losses only.
//
// Runs of one job append to one file; the record keeps the story that leads to the newest
// step:
//   - a start line at step S (a resume from checkpoint S) drops the recorded steps and
//     evaluations after S: the earlier process reached them, but its work past its last
//     checkpoint was lost and the resume trains those steps again. A step number repeated
//     for any other reason keeps its latest line.
//   - a start line with "fresh": true (`zenflow run --fresh`) begins a new record: what
//     came before is a superseded run's.
//   - the cost is every segment's since the last fresh start (time paid for, also steps
//     a resume redid).
// No LibTorch: the coordinator can read run directories too. Thread safety: none needed
// (plain values).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/report/step_log_lines.h"

namespace zenflow::report {

// The directory cannot be reported on: it does not exist, is not a directory, or holds
// neither steps.jsonl nor a checkpoint ("PATH: reason"). Bad input.
class RunRecordError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct StepRecord {
  int64_t step = 0;  // 1-based steps done
  double loss = kNotRecorded;
  double lr = kNotRecorded;
  int64_t tokens = 0;  // the global batch's token positions
  bool skipped = false;
  bool has_times = false;  // false: a loss from a checkpoint's history, nothing else
  double wall = 0;
  double compute = 0;
  double device_optimizer = 0;
  std::vector<double> stall;  // seconds by RunRecord::stall_causes
  int64_t bytes_d2h = 0;
  int64_t bytes_h2d = 0;
  int64_t bytes_h2d_weights = 0;
  size_t segment = 0;  // index into RunRecord::segments
};

// One process's run of the job: a start line and what followed it.
struct RunSegment {
  int64_t start_step = 0;
  int64_t total_steps = 0;
  bool fresh = false;
  int64_t world_size = 1;
  bool device_is_cuda = false;
  int64_t tokens_per_step = 0;
  double started_unix_seconds = kNotRecorded;
  std::vector<std::pair<std::string, int64_t>> host_memory;  // kind -> bytes, as recorded
  std::optional<double> usd_per_hour;                        // the job's rate; nullopt: not priced
  std::string price_instance;                                // "" for cost.usd_per_hour
  std::string price_source;
  // Over every step line of this segment, also those a later resume replaced.
  int64_t steps_run = 0;
  int64_t last_step = 0;
  double step_wall_seconds = 0;
  double step_stall_seconds = 0;
  int64_t step_bytes_d2h = 0;
  int64_t step_bytes_h2d = 0;
  int64_t step_bytes_h2d_weights = 0;
  // The finish line: the end of the run (last window's flush, final checkpoint).
  bool finished = false;
  bool interrupted = false;
  double finish_wall_seconds = 0;
  double finish_stall_seconds = 0;
  int64_t finish_bytes_d2h = 0;
  int64_t finish_bytes_h2d = 0;
  int64_t finish_bytes_h2d_weights = 0;
  std::optional<nlohmann::json> summary;  // `zenflow run --json`'s object, less "losses"
};

struct RunRecord {
  std::string dir;
  std::string job;                        // the spec's name ("" when not recorded)
  std::string source;                     // the file read: RUN_DIR/steps.jsonl or a checkpoint's trainer.json
  bool from_step_log = false;             // false: losses from a checkpoint only
  std::vector<std::string> stall_causes;  // in the order the file names them
  std::vector<StepRecord> steps;          // ascending by step, one per step
  std::vector<std::pair<int64_t, double>> evals;  // (step, validation loss), ascending
  std::vector<RunSegment> segments;               // since the last fresh start, in order
  std::vector<std::string> warnings;              // lines skipped, and why
};

// The figures a report leads with, over the whole record.
struct RunTotals {
  int64_t steps = 0;        // the last step recorded
  int64_t total_steps = 0;  // train.steps (the latest segment's)
  // "finished", "interrupted", "incomplete" (the latest segment has no end: still
  // running, or killed) or "checkpointed" (read from a checkpoint, no step log).
  std::string state;
  double final_loss = kNotRecorded;  // the last step's
  double val_loss = kNotRecorded;    // the latest evaluation's
  int64_t val_step = 0;
  int64_t tokens = 0;  // trained by every segment
  double step_seconds_median = kNotRecorded;
  double wall_seconds = 0;   // in steps and run ends, every segment
  double stall_seconds = 0;  // exposed, of those
  int64_t bytes_d2h = 0;     // moved in steps and run ends, every segment (the summaries' transfer_bytes)
  int64_t bytes_h2d = 0;
  int64_t bytes_h2d_weights = 0;  // train.offload_parameters' streamed weights
  // Priced when any segment is: its cost is the summary's (`zenflow run --json`), else
  // its rate × its step and end time; unpriced segments add nothing.
  bool priced = false;
  double usd_per_hour = 0;  // the latest priced segment's
  double cost_usd = 0;
  double usd_lost_to_stalls = 0;
  std::optional<double> usd_per_1m_tokens;  // cost over the priced segments' tokens
};

// Parses steps.jsonl text (see above); `origin` names it in warnings. Never throws for
// what the text holds.
RunRecord parse_step_log(const std::string& text, const std::string& origin);

// Reads `run_dir` (a job's checkpoint.dir). Throws RunRecordError naming the path when it
// is not a run directory; std::runtime_error when a file exists but cannot be read.
RunRecord read_run_record(const std::string& run_dir);

RunTotals run_totals(const RunRecord& record);

}  // namespace zenflow::report
