// Reading a run directory back (see run_record.h).
#include "common/report/run_record.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>

#include "common/input_file.h"
#include "common/pricing.h"

namespace zenflow::report {

namespace {

namespace fs = std::filesystem;
// Ordered: the stall causes and memory kinds keep the order the file names them in.
using json = nlohmann::ordered_json;

constexpr int64_t kMaxStepLogBytes = 4ll << 30;

double or_zero(double x) { return std::isfinite(x) ? x : 0; }

// Builds the record line by line: the steps by number (the latest line of each), the
// evaluations, the segments.
class StepLogReader {
 public:
  explicit StepLogReader(const std::string& origin) {
    record_.source = origin;
    record_.from_step_log = true;
  }

  void line(const std::string& text, size_t number, bool last_without_newline) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) return;
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      record_.warnings.push_back(
          record_.source + ": line " + std::to_string(number) +
          (last_without_newline
               ? " is incomplete (the run is writing it, or was stopped while writing it); ignored"
               : " is not a JSON object; ignored"));
      return;
    }
    const std::string event = event_of(j);
    if (event == StartLine::kEvent) {
      StartLine start;
      from_json(j, start);
      this->start(start);
    } else if (segments_.empty()) {
      if (!warned_orphan_)
        record_.warnings.push_back(record_.source + ": line " + std::to_string(number) +
                                   " comes before any start line; ignored");
      warned_orphan_ = true;
    } else if (event == StepLine::kEvent) {
      StepLine step;
      from_json(j, step);
      this->step(step);
    } else if (event == EvalLine::kEvent) {
      EvalLine eval;
      from_json(j, eval);
      if (eval.step > 0 && std::isfinite(eval.val_loss)) evals_[eval.step] = eval.val_loss;
    } else if (event == FinishLine::kEvent) {
      FinishLine finish;
      from_json(j, finish);
      RunSegment& s = segments_.back();
      s.finished = true;
      s.interrupted = finish.interrupted;
      s.finish_wall_seconds = or_zero(finish.wall);
      s.finish_stall_seconds = stall_total(finish.stall);
      s.finish_bytes_d2h = finish.bytes_d2h;
      s.finish_bytes_h2d = finish.bytes_h2d;
      s.finish_bytes_h2d_weights = finish.bytes_h2d_weights;
    } else if (event == SummaryLine::kEvent) {
      SummaryLine summary;
      from_json(j, summary);
      if (summary.summary.is_object()) this->summary(std::move(summary.summary));
    }
  }

  RunRecord finish() && {
    for (auto& [n, s] : steps_) record_.steps.push_back(std::move(s));
    for (auto& [n, v] : evals_) record_.evals.emplace_back(n, v);
    record_.segments = std::move(segments_);
    return std::move(record_);
  }

 private:
  void start(const StartLine& line) {
    RunSegment s;
    s.start_step = std::max<int64_t>(0, line.start_step);
    s.total_steps = line.total_steps;
    s.fresh = line.fresh;
    s.world_size = std::max<int64_t>(1, line.world_size);
    s.device_is_cuda = line.device_is_cuda;
    s.tokens_per_step = line.tokens_per_step;
    s.started_unix_seconds = line.time;
    s.host_memory = line.host_memory;
    if (line.price) {
      const double rate = line.price->usd_per_hour;
      if (std::isfinite(rate) && rate >= 0) s.usd_per_hour = rate;
      s.price_instance = line.price->instance;
      s.price_source = line.price->source;
    }
    if (!line.job.empty()) record_.job = line.job;
    if (s.fresh) {  // a superseded run came before
      steps_.clear();
      evals_.clear();
      segments_.clear();
    } else {  // steps past the checkpoint resumed from are trained again
      steps_.erase(steps_.upper_bound(s.start_step), steps_.end());
      evals_.erase(evals_.upper_bound(s.start_step), evals_.end());
    }
    segments_.push_back(std::move(s));
  }

  void step(const StepLine& line) {
    StepRecord r;
    r.step = line.step;
    if (r.step <= 0) return;
    r.loss = line.loss;
    r.lr = line.lr;
    r.tokens = line.tokens;
    r.skipped = line.skipped;
    r.has_times = true;
    r.wall = or_zero(line.wall);
    r.compute = or_zero(line.compute);
    r.device_optimizer = or_zero(line.device_optimizer);
    r.stall.assign(record_.stall_causes.size(), 0.0);
    for (const StallSeconds& st : line.stall) {
      size_t i = std::find(record_.stall_causes.begin(), record_.stall_causes.end(), st.cause) -
                 record_.stall_causes.begin();
      if (i == record_.stall_causes.size()) {
        record_.stall_causes.push_back(st.cause);
        r.stall.push_back(0.0);
      }
      r.stall[i] = or_zero(st.seconds);
    }
    r.bytes_d2h = line.bytes_d2h;
    r.bytes_h2d = line.bytes_h2d;
    r.bytes_h2d_weights = line.bytes_h2d_weights;
    r.segment = segments_.size() - 1;
    RunSegment& s = segments_.back();
    ++s.steps_run;
    s.last_step = r.step;
    s.step_wall_seconds += r.wall;
    for (double x : r.stall) s.step_stall_seconds += x;
    s.step_bytes_d2h += r.bytes_d2h;
    s.step_bytes_h2d += r.bytes_h2d;
    s.step_bytes_h2d_weights += r.bytes_h2d_weights;
    steps_[r.step] = std::move(r);
  }

  static double stall_total(const std::vector<StallSeconds>& stall) {
    double sum = 0;
    for (const StallSeconds& st : stall) sum += or_zero(st.seconds);
    return sum;
  }

  void summary(nlohmann::json sum) {
    RunSegment& s = segments_.back();
    s.finished = true;
    s.interrupted = boolean_field(sum, "interrupted");
    // The run's final validation loss is measured after its last step line.
    const double v = number_field(sum, "val_loss");
    const int64_t at = integer_field(sum, "steps");
    if (std::isfinite(v) && at > 0) evals_[at] = v;
    s.summary = std::move(sum);
  }

  RunRecord record_;
  std::map<int64_t, StepRecord> steps_;
  std::map<int64_t, double> evals_;
  std::vector<RunSegment> segments_;
  bool warned_orphan_ = false;
};

// The newest checkpoint's trainer.json (step-NNNNNNNN/, no suffix), or "" when none parses.
RunRecord read_checkpoint_losses(const std::string& dir, bool* found) {
  static const std::regex step_dir("step-([0-9]{8})");
  std::vector<std::pair<int64_t, fs::path>> candidates;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, m, step_dir) && it->is_directory(ec))
      candidates.emplace_back(std::stoll(m[1].str()), it->path());
  }
  std::sort(candidates.rbegin(), candidates.rend());
  RunRecord r;
  *found = !candidates.empty();
  for (const auto& [step, path] : candidates) {
    const fs::path trainer = path / "trainer.json";
    json t;
    try {
      t = json::parse(read_regular_file(trainer.string(), kMaxTrainerStateBytes, "trainer.json"));
    } catch (const std::exception& e) {
      r.warnings.push_back(trainer.string() + ": " + e.what() + "; trying the previous checkpoint");
      continue;
    }
    const auto losses = t.find("losses");
    if (!t.is_object() || losses == t.end() || !losses->is_array()) {
      r.warnings.push_back(trainer.string() + ": no loss history; trying the previous checkpoint");
      continue;
    }
    r.source = trainer.string();
    r.job = text_field(t, "job");
    RunSegment s;
    s.last_step = step;
    r.segments.push_back(s);
    int64_t n = 0;
    for (const json& l : *losses) {
      StepRecord sr;
      sr.step = ++n;
      sr.loss = l.is_number() ? l.get<double>() : kNotRecorded;
      r.steps.push_back(sr);
    }
    r.warnings.push_back(std::string("no ") + kStepLogFileName +
                         " in this directory (a run from before zenflow recorded one): the losses of " +
                         trainer.string() + " only");
    return r;
  }
  return r;
}

}  // namespace

RunRecord parse_step_log(const std::string& text, const std::string& origin) {
  StepLogReader reader(origin);
  size_t at = 0, number = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    const bool complete = nl != std::string::npos;
    reader.line(text.substr(at, complete ? nl - at : std::string::npos), ++number, !complete);
    at = complete ? nl + 1 : text.size();
  }
  return std::move(reader).finish();
}

RunRecord read_run_record(const std::string& run_dir) {
  struct stat st {};
  if (::stat(run_dir.c_str(), &st) != 0) throw RunRecordError(run_dir + ": no such directory");
  if (!S_ISDIR(st.st_mode))
    throw RunRecordError(run_dir + ": not a directory (a run directory is a job's checkpoint.dir)");
  const std::string log = (fs::path(run_dir) / kStepLogFileName).string();
  RunRecord r;
  std::error_code ec;
  if (fs::exists(log, ec)) {
    r = parse_step_log(read_regular_file(log, kMaxStepLogBytes, "a step log"), log);
  } else {
    bool has_checkpoints = false;
    r = read_checkpoint_losses(run_dir, &has_checkpoints);
    if (r.source.empty())
      throw RunRecordError(run_dir + ": not a zenflow run directory (no " + kStepLogFileName +
                           (has_checkpoints ? ", and no readable trainer.json in its step-* checkpoints)"
                                            : " and no step-* checkpoints)"));
  }
  r.dir = run_dir;
  return r;
}

RunTotals run_totals(const RunRecord& r) {
  RunTotals t;
  if (!r.steps.empty()) {
    t.steps = r.steps.back().step;
    t.final_loss = r.steps.back().loss;
  }
  if (!r.evals.empty()) std::tie(t.val_step, t.val_loss) = r.evals.back();
  std::vector<double> walls;
  for (const StepRecord& s : r.steps) {
    if (!s.has_times) continue;
    walls.push_back(s.wall);
  }
  if (!walls.empty()) {
    // The median of zenflow run's summary (trainer.cpp percentile): interpolated.
    std::sort(walls.begin(), walls.end());
    const double pos = 0.5 * static_cast<double>(walls.size() - 1);
    const size_t lo = static_cast<size_t>(pos), hi = std::min(walls.size() - 1, lo + 1);
    t.step_seconds_median = walls[lo] + (walls[hi] - walls[lo]) * (pos - static_cast<double>(lo));
  }
  int64_t priced_tokens = 0;
  for (const RunSegment& s : r.segments) {
    t.total_steps = s.total_steps;
    const int64_t tokens = s.summary ? integer_field(*s.summary, "tokens", s.tokens_per_step * s.steps_run)
                                     : s.tokens_per_step * s.steps_run;
    t.tokens += tokens;
    t.wall_seconds += s.step_wall_seconds + s.finish_wall_seconds;
    t.stall_seconds += s.step_stall_seconds + s.finish_stall_seconds;
    t.bytes_d2h += s.step_bytes_d2h + s.finish_bytes_d2h;
    t.bytes_h2d += s.step_bytes_h2d + s.finish_bytes_h2d;
    t.bytes_h2d_weights += s.step_bytes_h2d_weights + s.finish_bytes_h2d_weights;
    const double summary_cost = s.summary ? number_field(*s.summary, "cost_usd") : kNotRecorded;
    if (std::isfinite(summary_cost)) {
      t.priced = true;
      t.cost_usd += summary_cost;
      t.usd_lost_to_stalls += or_zero(number_field(*s.summary, "usd_lost_to_stalls"));
      t.usd_per_hour = or_zero(number_field(*s.summary, "usd_per_hour"));
      priced_tokens += tokens;
    } else if (s.usd_per_hour) {
      t.priced = true;
      // The job's rate already holds its share of the instance: charged in full here.
      t.cost_usd += usd_for(s.step_wall_seconds + s.finish_wall_seconds, *s.usd_per_hour, 0, 0);
      t.usd_lost_to_stalls +=
          usd_lost_to_stalls(s.step_stall_seconds + s.finish_stall_seconds, *s.usd_per_hour, 0, 0);
      t.usd_per_hour = *s.usd_per_hour;
      priced_tokens += tokens;
    }
  }
  if (t.priced) t.usd_per_1m_tokens = usd_per_million_tokens(t.cost_usd, priced_tokens);
  if (!r.from_step_log)
    t.state = "checkpointed";
  else if (r.segments.empty() || !r.segments.back().finished)
    t.state = "incomplete";
  else
    t.state = r.segments.back().interrupted ? "interrupted" : "finished";
  return t;
}

}  // namespace zenflow::report
