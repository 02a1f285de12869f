// `zenflow bench chaos`: the fault-injection harness (bench/chaos/chaos_harness.h) for
// seeds x minutes, printing JSON: faults injected by kind, invariant violations by kind
// (the target is 0) and jobs submitted/succeeded/failed. A run with violations also prints
// (stderr) its seed, its fault schedule and each violation's evidence, and exits 1.
//
//   zenflow bench chaos --seed S [--seed S2 ...] --minutes M [--dir D]
#if ZENFLOW_HAVE_SERVICES
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/chaos/chaos_harness.h"
#include "client/commands.h"

namespace zenflow::cli {
namespace {

namespace fs = std::filesystem;

struct ChaosArgs {
  std::vector<uint64_t> seeds;
  double minutes = 2;
  std::string dir;
  std::string bin_dir;  // the service binaries under test ("": beside this zenflow)
  double drain_s = 180;
  bool keep = false;
  bool schedule_only = false;
};

int run_bench_chaos(const ChaosArgs& a) {
  const fs::path bin =
      a.bin_dir.empty() ? fs::read_symlink("/proc/self/exe").parent_path() : fs::absolute(a.bin_dir);
  const fs::path base = fs::absolute(a.dir.empty() ? fs::current_path() : fs::path(a.dir));
  nlohmann::json out;
  out["seeds"] = a.seeds;
  out["minutes"] = a.minutes;
  nlohmann::json faults = nlohmann::json::object(), violations = nlohmann::json::object(),
                 jobs = nlohmann::json::object(), runs = nlohmann::json::array();
  bool clean = true;
  if (a.schedule_only) {  // what each seed would inject, without running anything
    for (uint64_t seed : a.seeds) {
      nlohmann::json lines = nlohmann::json::array();
      for (const chaos::Fault& f : chaos::make_schedule(seed, a.minutes)) lines.push_back(chaos::describe(f));
      out["schedules"][std::to_string(seed)] = lines;
    }
    std::cout << out.dump(2) << std::endl;
    return kExitOk;
  }
  for (uint64_t seed : a.seeds) {
    chaos::ChaosOptions o;
    o.seed = seed;
    o.minutes = a.minutes;
    o.bin_dir = bin;
    o.drain_timeout_s = a.drain_s;
    o.dir = base / ("zenflow-chaos-" + std::to_string(seed) + "-" + std::to_string(::getpid()));
    const chaos::ChaosReport report = chaos::run_chaos(o);
    const nlohmann::json r = report.to_json();
    for (auto& [k, v] : r["faults"].items()) faults[k] = faults.value(k, 0) + v.get<int>();
    for (auto& [k, v] : r["violations"].items()) violations[k] = violations.value(k, 0) + v.get<int>();
    for (auto& [k, v] : r["jobs"].items()) jobs[k] = jobs.value(k, int64_t{0}) + v.get<int64_t>();
    runs.push_back(r);
    if (!report.ok()) {
      clean = false;
      std::cerr << report.reproduction();
    } else if (!a.keep) {
      std::error_code ec;
      fs::remove_all(report.dir, ec);
    }
  }
  out["faults"] = faults;
  out["violations"] = violations;
  out["jobs"] = jobs;
  out["runs"] = runs;
  std::cout << out.dump(2) << std::endl;
  return clean ? kExitOk : kExitFailure;
}

CommandRegistrar reg(125, [](CommandContext& ctx) {
  auto a = std::make_shared<ChaosArgs>();
  CLI::App* cmd = ctx.bench->add_subcommand(
      "chaos", "Kill, stop, partition and fill a local service under a job stream; check its invariants");
  cmd->add_option("--seed", a->seeds, "Schedule seed (repeat for several runs)")->required();
  cmd->add_option("--minutes", a->minutes, "Minutes of faults per seed (a drain follows)")
      ->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
  cmd->add_option("--dir", a->dir,
                  "Where each run's directory goes (default: the current directory); kept when a run fails");
  cmd->add_option(
      "--bin-dir", a->bin_dir,
      "Directory of the zenflow, zenflow-coordinator, zenflow-worker and zenflow-optimizer to test "
      "(default: beside this zenflow; another build's, to bisect a violation)");
  cmd->add_option("--drain", a->drain_s, "Seconds after the faults for every job to end")
      ->check(CLI::Range(10.0, 3600.0))
      ->capture_default_str();
  cmd->add_flag("--keep", a->keep, "Keep the run directories of clean runs too");
  cmd->add_flag("--schedule-only", a->schedule_only, "Print each seed's fault schedule and run nothing");
  cmd->callback([a, &ctx] {
    try {
      ctx.exit_code = run_bench_chaos(*a);
    } catch (const std::exception& e) {
      std::cerr << "zenflow: bench chaos: " << e.what() << "\n";
      ctx.exit_code = kExitFailure;
    }
  });
});

}  // namespace
}  // namespace zenflow::cli
#endif  // ZENFLOW_HAVE_SERVICES
