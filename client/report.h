// Human and machine output of training runs: progress line, summary table, JSON.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "common/job_spec.h"
#include "worker/trainer.h"

namespace zenflow::cli {

// A live progress line on a TTY (rewritten in place), plain periodic lines otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter(std::ostream& out, bool tty, bool quiet) : out_(out), tty_(tty), quiet_(quiet) {}
  void step(const StepProgress& p);
  void log(const std::string& line);  // a message line that does not garble the progress line
  void finish();                      // ends the progress line

 private:
  std::ostream& out_;
  bool tty_;
  bool quiet_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point last_print_{};
};

std::string format_duration(double seconds);  // "1m05s", "3.2s"
void print_summary_table(std::ostream& out, const JobSpec& spec, const RunSummary& sum);
nlohmann::json summary_json(const RunSummary& sum);

}  // namespace zenflow::cli
