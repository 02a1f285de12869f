// steps.jsonl, a run's own record in its checkpoint.dir: the one definition of its lines,
// shared by the writer (worker/rank/step_log.h: rank 0, as it trains) and the reader
// (common/report/run_record.h: `zenflow report`), so that neither spells a key alone.
//
// One JSON object per line, "event" first, keys in this order; each process that runs the
// job appends its lines (a resumed run continues the file):
//   {"event":"start","job":J,"start_step":S,"total_steps":T,"fresh":B,"world_size":W,
//    "device_is_cuda":B,"tokens_per_step":N,"time":UNIX_SECONDS,
//    "host_memory":{"master":..,"moments":..,"accumulators":..,"pinned":..,"staging":..,
//                   "host_total":..},
//    "price":{"usd_per_hour":..,"instance_usd_per_hour":..,"gpus_of_instance":..,
//             "instance":..,"source":..} | null}
//   {"event":"step","step":N,"loss":..,"lr":..,"tokens":..,"skipped":B,"staleness_steps":..,
//    "selected_ratio":..,"wall":..,"compute":..,"device_optimizer":..,
//    "stall":{"host_optimizer":..,...every stall cause of docs/design.md},
//    "bytes":{"d2h":..,"h2d":..,"h2d_weights":..}}  (h2d_weights: absent before it was written; 0)
//   {"event":"eval","step":N,"val_loss":..}
//   {"event":"finish","steps":N,"interrupted":B,"wall":..,"stall":{...},"bytes":{...}}
//   {"event":"summary","summary":{what `zenflow run --json` prints, less "losses"}}
// Times are rank 0's seconds, bytes rank 0's, "tokens" the step's global batch positions
// (tokens_per_step); a non-finite number is written as null. "fresh": the run was started
// with --fresh (earlier lines belong to a superseded run). price.usd_per_hour is the job's
// rate (the instance's × its share, common/pricing.h); price is null when the job is not
// priced, price.instance null for a spec rate.
//
// Writing: format_line gives a line's text, '\n' included. Step, eval and finish lines are
// formatted into the caller's buffer without allocating, because the training thread
// writes one per step; start and summary lines, one per process, go through nlohmann::json,
// which escapes their strings (invalid UTF-8 replaced).
// Reading: from_json takes what a parsed line holds and trusts nothing, because files come
// from killed runs, older versions and hand edits: a missing, null or mistyped number reads
// as kNotRecorded (NaN), an integer as its default, a flag as false, a text as "", and an
// unknown key is ignored. What the values mean together (a resume, a fresh start, the cost)
// is the reader's business (run_record.h).
// No LibTorch and no engine types: the coordinator reads run directories too. Thread
// safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zenflow::report {

// The record's name in checkpoint.dir.
constexpr const char* kStepLogFileName = "steps.jsonl";

constexpr double kNotRecorded = std::numeric_limits<double>::quiet_NaN();

// The host memory kinds of a start line, in the order the writer records them: the host
// optimizer's state, its transfer buffers, and the machine's RAM (0 = unknown).
namespace host_memory_kind {
constexpr const char* kMaster = "master";
constexpr const char* kMoments = "moments";
constexpr const char* kAccumulators = "accumulators";
constexpr const char* kPinned = "pinned";    // page-locked transfer buffers (CUDA)
constexpr const char* kStaging = "staging";  // transfer buffers in plain memory (CPU device)
constexpr const char* kHostTotal = "host_total";
}  // namespace host_memory_kind

// The price a job ran at, as its start line records it.
struct StartPrice {
  double usd_per_hour = kNotRecorded;  // the job's rate: the instance's × its share
  double instance_usd_per_hour = kNotRecorded;
  int64_t gpus_of_instance = 0;  // 0: charged in full
  std::string instance;          // "" for a spec rate (written as null)
  std::string source;            // "cost.usd_per_hour" or the catalog row's source
};

struct StartLine {
  static constexpr const char* kEvent = "start";
  std::string job;
  int64_t start_step = 0;  // resumed from (0 = from the beginning)
  int64_t total_steps = 0;
  bool fresh = false;
  int64_t world_size = 1;
  bool device_is_cuda = false;
  int64_t tokens_per_step = 0;
  double time = kNotRecorded;  // when the process started training, Unix seconds
  // Kind -> bytes in the line's order; reading keeps the entries that are integers.
  std::vector<std::pair<std::string, int64_t>> host_memory;
  std::optional<StartPrice> price;  // nullopt: not priced (or not an object)
};

// Seconds lost to one stall cause; a line names the causes in the engine's order.
struct StallSeconds {
  std::string cause;  // written as is: letters, digits and '_' only
  double seconds = kNotRecorded;
};

struct StepLine {
  static constexpr const char* kEvent = "step";
  int64_t step = 0;  // 1-based steps done
  double loss = kNotRecorded;
  double lr = kNotRecorded;
  int64_t tokens = 0;  // the global batch's token positions
  bool skipped = false;
  int64_t staleness_steps = 0;
  double selected_ratio = kNotRecorded;
  double wall = kNotRecorded;
  double compute = kNotRecorded;
  double device_optimizer = kNotRecorded;
  std::vector<StallSeconds> stall;  // in the line's order
  int64_t bytes_d2h = 0;
  int64_t bytes_h2d = 0;
  int64_t bytes_h2d_weights = 0;  // train.offload_parameters' streamed weights (absent: 0)
};

struct EvalLine {
  static constexpr const char* kEvent = "eval";
  int64_t step = 0;
  double val_loss = kNotRecorded;
};

// The end of a process's run: the last window's flush and the final checkpoint.
struct FinishLine {
  static constexpr const char* kEvent = "finish";
  int64_t steps = 0;  // the last step reached
  bool interrupted = false;
  double wall = kNotRecorded;
  std::vector<StallSeconds> stall;
  int64_t bytes_d2h = 0;
  int64_t bytes_h2d = 0;
  int64_t bytes_h2d_weights = 0;  // train.offload_parameters' streamed weights (absent: 0)
};

struct SummaryLine {
  static constexpr const char* kEvent = "summary";
  nlohmann::json summary;  // `zenflow run --json`'s object less "losses"; null when the line has none
};

// The line's text, '\n' included, written at buf[0..cap): its length, or -1 when it does
// not fit or a stall cause holds other characters than letters, digits and '_' (then buf
// holds no usable line). Allocates nothing.
int format_line(const StepLine& line, char* buf, int cap) noexcept;
int format_line(const EvalLine& line, char* buf, int cap) noexcept;
int format_line(const FinishLine& line, char* buf, int cap) noexcept;
// The line's text, '\n' included. Throws only what allocation throws.
std::string format_line(const StartLine& line);
std::string format_line(const SummaryLine& line);

// A parsed line's "event" ("" when it has none): the kEvent of the struct to read it as.
std::string event_of(const nlohmann::ordered_json& line);
// `line`: a parsed line (a JSON object; anything else reads as all defaults). Never throw
// for what the line holds.
void from_json(const nlohmann::ordered_json& line, StartLine& out);
void from_json(const nlohmann::ordered_json& line, StepLine& out);
void from_json(const nlohmann::ordered_json& line, EvalLine& out);
void from_json(const nlohmann::ordered_json& line, FinishLine& out);
void from_json(const nlohmann::ordered_json& line, SummaryLine& out);

// The reading rules of one field, also for the objects a line carries (the summary, which
// is `zenflow run --json`'s): the value at `key`, or the fallback when it is absent or of
// another type. An integer written as a floating-point number is truncated.
template <typename Json>
double number_field(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->template get<double>() : kNotRecorded;
}
template <typename Json>
int64_t integer_field(const Json& j, const char* key, int64_t otherwise = 0) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return otherwise;
  return it->is_number_integer() ? it->template get<int64_t>()
                                 : static_cast<int64_t>(it->template get<double>());
}
template <typename Json>
bool boolean_field(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->template get<bool>();
}
template <typename Json>
std::string text_field(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->template get<std::string>() : "";
}

}  // namespace zenflow::report
