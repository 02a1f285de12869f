// Ranking, Pareto set, error-band flips and the explained output of `zenflow advise`.
#include "common/advisor/advice.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace zenflow::advisor {
namespace {

std::string fmt(double x, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}
std::string pct(double x) { return fmt(100 * x, 0) + "%"; }

std::string dominant_stall(const Prediction& p) {
  std::string cause;
  double best = 0;
  for (const auto& [c, s] : p.stall_seconds)
    if (s > best) best = s, cause = c;
  return cause;
}

std::string cause_words(const std::string& c) {
  if (c == "host_optimizer") return "host Adam";
  if (c == "transfer_d2h") return "PCIe D2H";
  if (c == "transfer_h2d") return "PCIe H2D";
  if (c == "allreduce") return "collectives";
  if (c == "weight_stream") return "streamed weights";
  return c;
}

}  // namespace

Advice rank(std::vector<Prediction> preds, int64_t steps, std::optional<double> deadline_hours,
            std::optional<double> budget_usd) {
  Advice a;
  a.predictions = std::move(preds);
  a.steps = steps;
  a.deadline_hours = deadline_hours;
  a.budget_usd = budget_usd;
  const auto& P = a.predictions;
  std::vector<int> ok;
  for (int i = 0; i < static_cast<int>(P.size()); ++i)
    if (P[i].fits && P[i].priced) ok.push_back(i);
  // Nothing priced (e.g. --instance local without a price): rank what fits by time alone.
  bool unpriced = false;
  if (ok.empty())
    for (int i = 0; i < static_cast<int>(P.size()); ++i)
      if (P[i].fits) ok.push_back(i), unpriced = true;
  std::vector<int> feasible;
  for (int i : ok) {
    if (deadline_hours && P[i].job_seconds > *deadline_hours * 3600) continue;
    if (budget_usd && P[i].job_usd > *budget_usd) continue;
    feasible.push_back(i);
  }
  const bool by_time = budget_usd.has_value() || unpriced;
  auto metric = [&](int i) { return by_time ? P[i].job_seconds : P[i].usd_per_1m_tokens; };
  std::stable_sort(feasible.begin(), feasible.end(), [&](int x, int y) { return metric(x) < metric(y); });
  a.ranking = feasible;
  if (!feasible.empty()) a.best = feasible.front();
  for (int i : ok) {
    bool dominated = false;
    for (int j : ok)
      if (j != i && P[j].job_seconds <= P[i].job_seconds && P[j].job_usd <= P[i].job_usd &&
          (P[j].job_seconds < P[i].job_seconds || P[j].job_usd < P[i].job_usd))
        dominated = true;
    if (!dominated) a.pareto.push_back(i);
  }
  if (a.best >= 0) {
    const double m0 = metric(a.best);
    for (int i : feasible)
      if (i != a.best && metric(i) * (1 - kErrorBand) <= m0 * (1 + kErrorBand)) a.flips.push_back(i);
    const Prediction& b = P[a.best];
    a.why = b.instance + " + " + b.mode + ": " + fmt(b.step_seconds, 3) + " s/step, " +
            (unpriced ? std::string("no price known (ranked by time)")
                      : "$" + fmt(b.usd_per_1m_tokens, 2) + " per 1M tokens, $" + fmt(b.job_usd, 2) +
                            " for " + std::to_string(steps) + " steps");
    // The instance cheaper per hour that lost, and what stalled it.
    int cheaper = -1;
    for (int i : ok)
      if (P[i].instance != b.instance && P[i].usd_per_hour < b.usd_per_hour &&
          (cheaper < 0 || P[i].usd_per_1m_tokens < P[cheaper].usd_per_1m_tokens))
        cheaper = i;
    if (cheaper >= 0) {
      const Prediction& c = P[cheaper];
      const std::string cause = dominant_stall(c);
      a.why += "; " + c.instance + " is cheaper per hour but its best mode (" + c.mode + ") costs $" +
               fmt(c.usd_per_1m_tokens, 2) + " per 1M tokens" +
               (cause.empty() ? ""
                              : ", " + cause_words(cause) + " stalling " +
                                    pct(c.stall_seconds.at(cause) / c.step_seconds) + " of its step");
    } else {
      // Against the other modes on the same instance.
      for (const Prediction& o : P)
        if (o.instance == b.instance && o.mode != b.mode && o.fits) {
          const std::string cause = dominant_stall(o);
          a.why += "; " + o.mode + " there: " + fmt(o.step_seconds, 3) + " s/step" +
                   (cause.empty() ? ""
                                  : " (" + cause_words(cause) + " " +
                                        pct(o.stall_seconds.at(cause) / o.step_seconds) + " of the step)");
        }
    }
    if (!a.flips.empty()) {
      a.why += "; within the ±" + pct(kErrorBand) + " error band of: ";
      for (size_t k = 0; k < a.flips.size() && k < 3; ++k)
        a.why += (k ? ", " : "") + P[a.flips[k]].instance + " + " + P[a.flips[k]].mode;
    }
  } else {
    a.why = ok.empty() ? "nothing fits: no instance x mode holds this job (see why_not)"
                       : "nothing meets the " + std::string(deadline_hours ? "deadline" : "budget") +
                             " (the Pareto set below is the best on offer)";
  }
  std::set<std::string> notes;
  for (const Prediction& p : a.predictions) {
    if (p.global_batch > 0)
      notes.insert("global batch held at " + std::to_string(p.global_batch) +
                   " sequences a step on every row (micro-batch x accumulation x GPUs): the job is the same "
                   "on every row, so its $ compare like for like");
    if (p.activation_checkpointing)
      notes.insert(
          "ckpt yes: activation checkpointing assumed (train.activation_checkpointing: true): no micro-batch "
          "fits the GPU without it, or it is faster; it recomputes one forward, compute x 4/3");
    if (p.shard != "none")
      notes.insert("shard " + p.shard + ": train.shard: " + p.shard +
                   " assumed: the GPUs do not hold the job without it, or it is faster; each rank keeps 1/GPUs of "
                   "the gradients and optimizer state" +
                   (p.shard == "parameters" ? " and of the weights, which are gathered layer by layer" : ""));
    if (p.offload_parameters)
      notes.insert("streamed: train.offload_parameters: true (the weights in host memory, each layer's copied to "
                   "the GPU as it runs; zenflow mode: only the unselected columns')");
    if (p.device_staging_mib > 0)
      notes.insert("staging " + std::to_string(p.device_staging_mib) +
                   " MiB: optimizer.host.device_staging_mib: " + std::to_string(p.device_staging_mib) +
                   " assumed: whole-gradient device staging does not fit the GPU (or is no faster); the host-owned columns' "
                   "gradients and updates cross PCIe in chunks that the compute waits for (counted as stalls)");
    for (const std::string& s : p.assumed) notes.insert("assumed: " + s);
    for (const std::string& f : p.flags) notes.insert(p.instance + ": " + f);
  }
  a.notes.assign(notes.begin(), notes.end());
  return a;
}

void print_advice(std::ostream& out, const Advice& a, const JobProfile& profile) {
  out << "recommendation: " << a.why << "\n";
  if (!a.model.empty()) out << "model " << a.model << "\n";
  out << "job " << profile.job << " (profile of " << profile.run.mode << " on " << profile.measured_on.host
      << ", " << profile.measured_on.date << "), " << a.steps << " steps";
  if (a.deadline_hours) out << ", deadline " << fmt(*a.deadline_hours, 2) << " h";
  if (a.budget_usd) out << ", budget $" << fmt(*a.budget_usd, 2);
  out << "\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-3s %-20s %-8s %-4s %4s %-9s %-4s %-6s %9s %6s  %-28s %10s %11s %10s\n", "",
                "instance", "mode", "fits", "GPUs", "mb x acc", "ckpt", "shard", "s/step", "stall", "largest stalls",
                "$/1M tok", "job $", "$ stalls");
  out << line;
  std::set<int> pareto(a.pareto.begin(), a.pareto.end()), flips(a.flips.begin(), a.flips.end());
  for (int i = 0; i < static_cast<int>(a.predictions.size()); ++i) {
    const Prediction& p = a.predictions[i];
    std::vector<std::pair<double, std::string>> st;
    for (const auto& [c, s] : p.stall_seconds)
      if (s > 0.005 * p.step_seconds) st.emplace_back(s, c);
    std::sort(st.rbegin(), st.rend());
    std::string stalls;
    for (size_t k = 0; k < st.size() && k < 2; ++k)
      stalls += (k ? " " : "") + cause_words(st[k].second) + " " + pct(st[k].first / p.step_seconds);
    const std::string mark = i == a.best ? "=>" : (flips.count(i) ? "~" : (pareto.count(i) ? "P" : ""));
    const std::string batch = std::to_string(p.micro_batch) + " x " + std::to_string(p.grad_accum);
    const char* shard = p.shard == "parameters" ? "params" : (p.shard == "gradients" ? "grads" : "-");
    std::snprintf(line, sizeof line, "%-3s %-20s %-8s %-4s %4lld %-9s %-4s %-6s %9.4f %6s  %-28s %10s %11s %10s\n",
                  mark.c_str(), p.instance.c_str(), p.mode.c_str(), p.fits ? "yes" : "no",
                  static_cast<long long>(p.ranks), batch.c_str(), p.activation_checkpointing ? "yes" : "no", shard,
                  p.step_seconds, pct(p.stall_total / p.step_seconds).c_str(), stalls.c_str(),
                  p.priced ? fmt(p.usd_per_1m_tokens, 3).c_str() : "-",
                  p.priced ? fmt(p.job_usd, 2).c_str() : "-",
                  p.priced ? fmt(p.usd_lost_to_stalls, 2).c_str() : "-");
    out << line;
    if (!p.fits)
      for (const std::string& w : p.why_not) out << "      does not fit: " << w << "\n";
  }
  out << "\n=> recommended   ~ within the ±" << pct(kErrorBand)
      << " error band of it   P Pareto set (time, $)\n";
  for (const std::string& n : a.notes) out << "note: " << n << "\n";
}

nlohmann::json advice_json(const Advice& a, const JobProfile& profile) {
  using nlohmann::json;
  json j;
  j["profile"] = {{"job", profile.job},
                  {"mode", profile.run.mode},
                  {"host", profile.measured_on.host},
                  {"date", profile.measured_on.date},
                  {"version", profile.version}};
  j["model"] = a.model.empty() ? json(nullptr) : json(a.model);
  j["steps"] = a.steps;
  j["deadline_hours"] = a.deadline_hours ? json(*a.deadline_hours) : json(nullptr);
  j["budget_usd"] = a.budget_usd ? json(*a.budget_usd) : json(nullptr);
  j["error_band"] = kErrorBand;
  json rows = json::array();
  for (const Prediction& p : a.predictions) {
    json r;
    r["instance"] = p.instance;
    r["mode"] = p.mode;
    r["ranks"] = p.ranks;
    r["fits"] = p.fits;
    r["why_not"] = p.why_not;
    r["step_seconds"] = p.step_seconds;
    r["compute_seconds"] = p.compute_seconds;
    r["device_optimizer_seconds"] = p.device_optimizer_seconds;
    r["other_seconds"] = p.other_seconds;
    r["stall_seconds"] = p.stall_seconds;
    r["stall_share"] = p.step_seconds > 0 ? p.stall_total / p.step_seconds : 0;
    r["tokens_per_step"] = p.tokens_per_step;
    r["micro_batch"] = p.micro_batch;
    r["grad_accum"] = p.grad_accum;
    r["global_batch"] = p.global_batch > 0 ? json(p.global_batch) : json(nullptr);
    r["activation_checkpointing"] = p.activation_checkpointing;
    r["shard"] = p.shard;
    r["device_staging_mib"] = p.device_staging_mib;
    r["offload_parameters"] = p.offload_parameters;
    if (p.memory) {
      constexpr double gib = 1024.0 * 1024.0 * 1024.0;
      const RankMemory& m = *p.memory;
      r["gpu_memory_parts_gib"] = {{"weights", m.weights / gib},
                                   {"gradients", m.gradients / gib},
                                   {"optimizer_state", m.optimizer_state / gib},
                                   {"transfer_staging", m.transfer_staging / gib},
                                   {"collective_buffers", m.collective_buffers / gib},
                                   {"activations", m.activations / gib}};
    }
    r["gpu_memory_gib"] = p.gpu_memory_gib;
    r["host_ram_gib"] = p.host_ram_gib;
    r["host_cores_per_rank"] = p.host_cores_per_rank;
    const json null(nullptr);
    r["usd_per_hour"] = p.priced ? json(p.usd_per_hour) : null;
    r["usd_per_1m_tokens"] = p.priced ? json(p.usd_per_1m_tokens) : null;
    r["job_seconds"] = p.job_seconds;
    r["job_usd"] = p.priced ? json(p.job_usd) : null;
    r["usd_lost_to_stalls"] = p.priced ? json(p.usd_lost_to_stalls) : null;
    r["calibrated"] = p.calibrated;
    r["assumed"] = p.assumed;
    r["flags"] = p.flags;
    json in = json::object();
    for (const auto& [k, v] : p.inputs)
      in[k] = {{"value", v.value}, {"origin", origin_name(v.origin)}, {"source", v.source}};
    r["inputs"] = in;
    rows.push_back(r);
  }
  j["predictions"] = rows;
  j["best"] = a.best >= 0 ? json(a.best) : json(nullptr);
  j["recommendation"] =
      a.best >= 0 ? json({{"instance", a.predictions[a.best].instance}, {"mode", a.predictions[a.best].mode}})
                  : json(nullptr);
  j["why"] = a.why;
  j["ranking"] = a.ranking;
  j["pareto"] = a.pareto;
  j["flips_within_error_band"] = a.flips;
  j["notes"] = a.notes;
  return j;
}

}  // namespace zenflow::advisor
