// `zenflow bench cli`: how long the `zenflow` command takes to answer, measured as a user
// meets it (a fresh process each time, the wall clock from spawn to exit), printing JSON:
//   version          `zenflow --version` (no LibTorch: the front half, client/verbs.h)
//   train_version    `zenflow-train --version` (the LibTorch half's start-up, for comparison)
//   jobs             `zenflow jobs` against a zenflow-coordinator started here (127.0.0.1, free port)
//   unreachable      `zenflow jobs` against a port where nothing listens (its exit code too)
// Each row: p50, p90, min, max seconds over --runs.
//
//   zenflow bench cli [--runs N] [--dir D]
#if ZENFLOW_HAVE_SERVICES
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/chaos/child_process.h"
#include "client/commands.h"
#include "worker/distributed/ports.h"

extern char** environ;

namespace zenflow::cli {
namespace {

namespace fs = std::filesystem;

struct CliBenchArgs {
  int runs = 20;
  std::string dir;
};

// Runs `argv` with its output discarded; returns {seconds, exit status} (128 + signal when
// killed, -1 when it could not start).
std::pair<double, int> timed_run(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return {0.0, -1};
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {seconds, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

// `runs` timed runs of `argv`: the row's figures, and every exit status seen.
nlohmann::json row(const std::vector<std::string>& argv, int runs) {
  std::vector<double> s;
  std::vector<int> codes;
  for (int i = 0; i < runs; ++i) {
    const auto [seconds, code] = timed_run(argv);
    s.push_back(seconds);
    if (std::find(codes.begin(), codes.end(), code) == codes.end()) codes.push_back(code);
  }
  std::sort(s.begin(), s.end());
  auto at = [&](double q) { return s[static_cast<size_t>(q * static_cast<double>(s.size() - 1) + 0.5)]; };
  nlohmann::json out;
  std::string command;
  for (size_t i = 0; i < argv.size(); ++i) command += (i ? " " : "") + (i ? argv[i] : fs::path(argv[i]).filename().string());
  out["command"] = command;
  out["runs"] = runs;
  out["p50_s"] = at(0.5);
  out["p90_s"] = at(0.9);
  out["min_s"] = s.front();
  out["max_s"] = s.back();
  out["exit_codes"] = codes;
  return out;
}

// A zenflow-coordinator on 127.0.0.1 (a free port), for `zenflow jobs` to ask; its address
// once it says it listens ("" when it did not within 20 s).
std::string start_coordinator(chaos::ChildProcess& c) {
  c.start();
  const std::regex re("listening on ([0-9.]+:[0-9]+)");
  for (int i = 0; i < 400 && c.running(); ++i) {
    std::ifstream in(c.log());
    std::stringstream text;
    text << in.rdbuf();
    std::smatch m;
    const std::string s = text.str();
    if (std::regex_search(s, m, re) && s.find("SERVING") != std::string::npos) return m[1];
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

int run_bench_cli(const CliBenchArgs& a) {
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  const fs::path dir = fs::absolute(a.dir.empty() ? fs::temp_directory_path() : fs::path(a.dir)) /
                       ("zenflow-bench-cli-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string zenflow = (bin / "zenflow").string();
  nlohmann::json out;
  out["version"] = row({zenflow, "--version"}, a.runs);
  out["train_version"] = row({(bin / "zenflow-train").string(), "--version"}, a.runs);
  {
    chaos::ChildProcess coordinator(
        "coordinator",
        {(bin / "zenflow-coordinator").string(), "--listen", "127.0.0.1:0", "--db", (dir / "bench.db").string()},
        {"PATH=/usr/bin:/bin"}, dir / "coordinator.log");
    const std::string address = start_coordinator(coordinator);
    if (address.empty()) {
      std::cerr << "zenflow bench cli: the coordinator did not start; its log: " << coordinator.log() << "\n";
      return kExitFailure;
    }
    out["jobs"] = row({zenflow, "jobs", "--coordinator", address}, a.runs);
    coordinator.stop(5000);
  }
  // A port nothing listens on: one just found free, not bound by anyone.
  const std::string nowhere = "127.0.0.1:" + std::to_string(distributed::find_free_port());
  out["unreachable"] = row({zenflow, "jobs", "--coordinator", nowhere}, std::min(a.runs, 3));
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::cout << out.dump(2) << std::endl;
  return kExitOk;
}

CommandRegistrar reg(130, [](CommandContext& ctx) {
  auto args = std::make_shared<CliBenchArgs>();
  CLI::App* cmd = ctx.bench->add_subcommand(
      "cli", "How long the zenflow command takes to answer: --version, jobs, an unreachable coordinator (JSON)");
  cmd->add_option("--runs", args->runs, "Timed runs per row (medians are reported)")->check(CLI::Range(1, 10000));
  cmd->add_option("--dir", args->dir, "Scratch directory (default: the system's temporary directory)");
  cmd->callback([args, &ctx] { ctx.exit_code = run_bench_cli(*args); });
});

}  // namespace
}  // namespace zenflow::cli
#endif  // ZENFLOW_HAVE_SERVICES
