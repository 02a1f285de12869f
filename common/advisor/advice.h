// `zenflow advise`: every instance x mode predicted, ranked, explained.
//
// rank(): among the predictions that fit and are priced, the cheapest job under a
// deadline, the fastest under a budget, or (neither) the cheapest per token; the Pareto
// set of (job time, job $); and the rankings that flip inside the model's error band
// (two answers whose ±band intervals overlap on the ranked metric). LibTorch-free.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/advisor/step_model.h"

namespace zenflow::advisor {

// The model's error band: the validation target (docs/benchmarks.md §5, median APE <= 15%).
constexpr double kErrorBand = 0.15;

struct Advice {
  std::vector<Prediction> predictions;  // every instance x mode, in catalog order
  std::optional<double> deadline_hours, budget_usd;
  int64_t steps = 0;
  std::string model;               // "llama, 8.03e9 parameters (PATH)" with a model config; else ""
  int best = -1;                   // index into predictions; -1: nothing fits (and is priced)
  std::vector<int> ranking;        // feasible answers, best first
  std::vector<int> pareto;         // non-dominated in (job_seconds, job_usd)
  std::vector<int> flips;          // ranked answers within the error band of the best
  std::string why;                 // one line
  std::vector<std::string> notes;  // assumed constants, stale prices
};

Advice rank(std::vector<Prediction> predictions, int64_t steps, std::optional<double> deadline_hours,
            std::optional<double> budget_usd);

// The recommendation and its reason first, then the table (instance, mode, fits, GPUs,
// micro-batch x accumulation per GPU, activation checkpointing assumed, s/step, stall share
// by cause, $/1M tokens, job $, $ lost to stalls), then the notes (the global batch held,
// what checkpointing costs, the assumed constants).
void print_advice(std::ostream& out, const Advice& advice, const JobProfile& profile);
nlohmann::json advice_json(const Advice& advice, const JobProfile& profile);

}  // namespace zenflow::advisor
