// `zenflow run JOB.yaml`: trains a job in this process (the embedded default), or one rank
// of it for the worker agent (--report-fd, --lease-fd, --lock-wait).
#include <algorithm>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include <c10/util/Exception.h>

#include <memory>

#include "client/commands.h"
#include "client/report.h"
#include "common/input_file.h"
#include "common/job_spec.h"
#include "common/pricing.h"
#include "worker/checkpoint.h"
#include "worker/distributed/launcher.h"
#include "worker/engine/host_optimizer.h"
#include "worker/job_profiler.h"
#include "worker/distributed/rendezvous.h"
#include "worker/lease.h"
#include "worker/run_reporter.h"
#include "worker/step_log.h"
#include "worker/trainer.h"
#if ZENFLOW_HAVE_METRICS
#include "common/metrics/http_server.h"
#include "common/metrics/registry.h"
#include "common/version.h"
#include "worker/run_metrics.h"
#endif

namespace zenflow::cli {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_training{false};  // setup is done: a stop now ends with a checkpoint

void on_sigint(int) {
  if (!g_training.load()) {
    // Model construction, loading, resume: nothing is written yet that a checkpoint would
    // keep, so leave at once (a blocking read cannot hold the process either).
    const char msg[] = "\nzenflow: interrupted before training started; nothing was written\n";
    (void)!::write(2, msg, sizeof(msg) - 1);
    std::_Exit(kExitInterrupted);
  }
  if (g_stop.exchange(true)) std::_Exit(kExitInterrupted);  // second Ctrl-C: leave now
  const char msg[] = "\nzenflow: interrupt: finishing this step and writing a checkpoint (Ctrl-C again to abort)\n";
  (void)!::write(2, msg, sizeof(msg) - 1);
}

// Bytes of host RAM free for allocation now (MemAvailable), or -1 when unknown.
int64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

// Engine-state bytes of the newest checkpoint in `dir` (0 when there is none): what the
// host optimizer state of a resume from it roughly takes.
int64_t newest_engine_state_bytes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string newest;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0 && e.path().string() > newest)
      newest = e.path().string();
  int64_t bytes = 0;
  if (newest.empty()) return 0;
  for (const auto& f : fs::directory_iterator(newest, ec))
    if (f.path().filename().string().rfind("engine", 0) == 0) bytes += static_cast<int64_t>(f.file_size(ec));
  return bytes;
}

// A lost optimizer node under a coordinator that assigned it (optimizer.host.nodes, placed
// by the scheduler): the rank exits kExitOptimizerNodeLost naming the node, and the
// coordinator declares it LOST and requeues the job onto a spare.
struct NodeLostAskSpare {
  std::string node;  // HOST:PORT
  std::string what;
};

// run_training, and when an optimizer node is lost, what optimizer.host.on_node_loss says:
// "in_process" resumes from the last committed checkpoint with the host state in this
// process when the host has the RAM; "spare" needs a coordinator to assign another node
// (under a plain `zenflow run`, or with addresses written in the spec, it is skipped; a
// scheduled rank throws NodeLostAskSpare); "fail" gives up. Says on stderr what it did.
RunSummary train_with_node_loss_policy(JobSpec spec, RunOptions opts, bool rank0) {
  const char* scheduled = std::getenv("ZENFLOW_SCHEDULED");
  const bool assigned_nodes = scheduled && std::string(scheduled) == "1" && spec.optimizer.host.nodes > 0;
  for (;;) {
    try {
      return run_training(spec, opts, &g_stop);
    } catch (const engine::HostBackendLost& e) {
      // Addresses the spec names that cannot be reached when the run starts are the spec's
      // error, not a node loss (which an in-process fallback would hide). Nodes a coordinator
      // assigned are its to replace: that stays a node loss.
      if (e.unreachable_at_start() && !assigned_nodes)
        throw SpecError("optimizer.host.addresses",
                        std::string(e.what()) + " (check the address and that the node's transport is enabled, "
                                                "e.g. UCX_TLS includes tcp)");
      std::string tried;
      for (const std::string& step : spec.optimizer.host.on_node_loss) {
        if (step == "spare") {
          if (assigned_nodes) throw NodeLostAskSpare{e.node(), e.what()};
          tried += "no spare node (a plain zenflow run has no coordinator to assign one); ";
          continue;
        }
        if (step == "in_process") {
          const int64_t need = 2 * newest_engine_state_bytes(spec.checkpoint.dir);
          const int64_t have = available_host_memory();
          if (have >= 0 && need > have) {
            tried += "not in-process (the host state needs about " + std::to_string(need >> 20) + " MiB, " +
                     std::to_string(have >> 20) + " MiB available); ";
            continue;
          }
          if (rank0)
            std::cerr << "zenflow: " << e.what() << "; resuming from the last committed checkpoint with the host "
                      << "optimizer in this process (optimizer.host.on_node_loss: in_process)\n";
          spec.optimizer.host.addresses.clear();
          opts.resume = true;
          ++opts.rendezvous_generation;  // every rank retries: they join again, under new keys
          break;
        }
        throw engine::HostBackendLost(std::string(e.what()) + " (optimizer.host.on_node_loss: " + tried + "fail)");
      }
      if (!spec.optimizer.host.addresses.empty())
        throw engine::HostBackendLost(std::string(e.what()) + " (optimizer.host.on_node_loss: " + tried + "nothing left to try)");
    }
  }
}

struct RunArgs {
  std::string job;
  std::vector<std::string> sets;
  bool json = false;
  bool fresh = false;
  bool quiet = false;
  bool verbose = false;
  bool profile = false;  // write checkpoint.dir/profile.yaml for `zenflow advise`
  bool profile_if_possible = false;  // the same, but a run too short to profile is no error
  std::vector<std::string> allow_spec_change;
  int nproc = 0;  // 0: resources.gpus_per_worker (at least 1)
  int metrics_port = 0;  // 0: no /metrics (unless metrics_port_file)
  std::string metrics_host = "127.0.0.1";
  std::string metrics_port_file;  // every rank serves; its bound port is written here
  std::string job_id;             // the metrics' job_id label; "": the spec's name
  std::vector<std::string> pricing;  // override catalogs, merged by name over the shipped one
  int report_fd = -1;                // JSON lines of the run (run_reporter.h); -1: none
  int lease_fd = -1;                 // the agent's lease (lease.h); -1: none
  double lease_timeout = 3;          // seconds without a byte on lease_fd before the lease expires
  double lock_wait = 0;              // seconds to wait for checkpoint.dir's lock
  std::vector<std::string> argv;  // this process's argv, for the rank processes
};

// "" when `fd` is open for reading (`read`) or writing, else what is wrong, naming the flag.
std::string check_fd(const char* flag, int fd, bool read) {
  const int fl = ::fcntl(fd, F_GETFL);
  const std::string name = std::string(flag) + " " + std::to_string(fd);
  if (fl < 0)
    return name + ": not an open file descriptor (the process that starts zenflow must pass it open)";
  const int mode = fl & O_ACCMODE;
  if (read && mode == O_WRONLY) return name + ": open for writing only; the lease is read from it";
  if (!read && mode == O_RDONLY) return name + ": open for reading only; the report is written to it";
  // Nothing this process starts later may hold the agent's pipes open.
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
  return "";
}

// The lease's end: one line, then out at once (no destructor, no checkpoint, no summary).
// Built before the lease starts, so the end writes and exits without allocating.
class LeaseExit {
 public:
  explicit LeaseExit(double timeout_s) {
    char s[32];
    std::snprintf(s, sizeof s, "%g", timeout_s);
    expired_ = std::string("zenflow: lease expired (no renewal for ") + s +
               " s); another attempt may own this job; exiting without a checkpoint\n";
  }
  [[noreturn]] void operator()(LeaseEnd why) const {
    const std::string& line = why == LeaseEnd::kLost ? lost_ : expired_;
    (void)!::write(2, line.data(), line.size());
    ::_exit(kExitLeaseLost);
  }

 private:
  std::string lost_ = "zenflow: lease lost (agent gone); exiting without a checkpoint\n";
  std::string expired_;
};

// The shipped catalog: deploy/pricing.yaml of the source tree this binary was built from.
std::string shipped_pricing_path() { return std::string(ZENFLOW_SOURCE_DIR) + "/deploy/pricing.yaml"; }

// The job's price: cost.usd_per_hour, else cost.instance_type in the shipped catalog with
// the --pricing files merged over it. The catalogs are read only when an instance is to be
// looked up or --pricing is given (then a bad file is an error, PricingError).
ResolvedPrice resolve_job_price(const JobSpec& spec, const std::vector<std::string>& overrides,
                                std::vector<std::string>* warnings) {
  const bool lookup = !spec.cost.usd_per_hour && !spec.cost.instance_type.empty();
  if (!lookup && overrides.empty()) return resolve_price(spec.cost, nullptr, warnings);
  PricingCatalog catalog;
  const std::string shipped = shipped_pricing_path();
  std::error_code ec;
  if (std::filesystem::exists(shipped, ec)) {
    catalog = PricingCatalog::load(shipped);
  } else if (lookup) {
    warnings->push_back("pricing catalog " + shipped + " not found; only --pricing files are used");
  }
  for (const std::string& f : overrides) catalog.merge(PricingCatalog::load(f));
  return resolve_price(spec.cost, &catalog, warnings);
}

// Writes "PORT\n" to `path` through a temporary and a rename: a reader sees all or nothing.
// Throws std::runtime_error naming the file.
void write_port_file(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << port << "\n";
    if (!f.flush()) throw std::runtime_error("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

int run(const RunArgs& a) {
  // From the start: a signal during spec parsing or setup ends the process cleanly (130).
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  for (const auto& [flag, fd, read] : {std::make_tuple("--report-fd", a.report_fd, false),
                                       std::make_tuple("--lease-fd", a.lease_fd, true)}) {
    if (fd < 0) continue;
    if (const std::string bad = check_fd(flag, fd, read); !bad.empty()) {
      std::cerr << "zenflow: " << bad << "\n";
      return kExitBadInput;
    }
  }
  // Run by an agent: when it is gone, a write to its pipes must fail (EPIPE), not kill this
  // process before the lease has said why.
  if (a.report_fd >= 0 || a.lease_fd >= 0) std::signal(SIGPIPE, SIG_IGN);
  // The lease is held from the start: an agent gone during setup ends the process too.
  std::unique_ptr<Lease> lease;
  if (a.lease_fd >= 0)
    lease = std::make_unique<Lease>(a.lease_fd,
                                    std::chrono::milliseconds(static_cast<int64_t>(a.lease_timeout * 1000)),
                                    LeaseExit(a.lease_timeout));
  JobSpec spec;
  try {
    spec = load_job_spec(a.job, a.sets);  // before any rank starts: one clear error, not N
  } catch (const SpecError& e) {
    std::cerr << "zenflow: invalid job spec: " << e.what() << "\n";
    return kExitBadInput;
  }
  const int nproc = a.nproc > 0 ? a.nproc : static_cast<int>(std::max<int64_t>(1, spec.resources.gpus_per_worker));
  if (nproc > 1 && !distributed::distributed_env_present() && (a.report_fd >= 0 || a.lease_fd >= 0)) {
    std::cerr << "zenflow: --report-fd and --lease-fd belong to one rank process: with " << nproc
              << " ranks the local launcher would hand every rank the same fd; start each rank with the "
                 "rendezvous variables (ZENFLOW_RANK, ...) and its own fds instead\n";
    return kExitBadInput;
  }
  if (nproc > 1 && !distributed::distributed_env_present() && !a.metrics_port_file.empty()) {
    std::cerr << "zenflow: --metrics-port-file belongs to one rank process: with " << nproc
              << " ranks the local launcher would hand every rank the same file; use --metrics-port (rank 0's "
                 "metrics) or the worker agent\n";
    return kExitBadInput;
  }
  if (nproc > 1 && !distributed::distributed_env_present()) {
    // The local launcher: N copies of this command, each one rank, minus --nproc.
    std::vector<std::string> child;
    for (size_t i = 0; i < a.argv.size(); ++i) {
      if (a.argv[i] == "--nproc") {
        ++i;
        continue;
      }
      if (a.argv[i].rfind("--nproc=", 0) == 0) continue;
      child.push_back(a.argv[i]);
    }
    return distributed::launch_local_ranks(nproc, child);
  }
  const bool rank0 = !distributed::distributed_env_present() || distributed::rank_info_from_env().rank == 0;
  ResolvedPrice price;
  {
    std::vector<std::string> warnings;
    try {
      price = resolve_job_price(spec, a.pricing, &warnings);
    } catch (const PricingError& e) {
      if (rank0) std::cerr << "zenflow: invalid pricing catalog: " << e.what() << "\n";
      return kExitBadInput;
    }
    if (rank0)
      for (const std::string& w : warnings) std::cerr << "zenflow: warning: " << w << "\n";
  }
  ProgressPrinter progress(std::cerr, isatty(2) != 0 && !a.quiet && rank0, a.quiet || !rank0);
  FanoutReporter reporters;
  reporters.add(&progress);
  std::unique_ptr<JsonLinesReporter> json_lines;
  if (a.report_fd >= 0) {
    json_lines = std::make_unique<JsonLinesReporter>(a.report_fd);
    reporters.add(json_lines.get());
  }
  RunOptions opts;
  opts.reporter = &reporters;
  if (lease)
    opts.commit_fence = [&](const std::function<void()>& publish) { return lease->publish_if_held(publish); };
  opts.lock_wait = std::chrono::milliseconds(static_cast<int64_t>(a.lock_wait * 1000));
  opts.resume = !a.fresh;
  for (const std::string& list : a.allow_spec_change) {
    std::stringstream keys(list);
    for (std::string k; std::getline(keys, k, ',');)
      if (!k.empty()) opts.allow_spec_change.push_back(k);
  }
  opts.on_training_start = [] { g_training.store(true); };
  // Rank 0 records the run in its directory (checkpoint.dir/steps.jsonl) for `zenflow report`.
  FanoutObserver observers;
  opts.observer = &observers;
  std::unique_ptr<StepLog> step_log;
  if (rank0) {
    std::optional<StepLogPrice> log_price;
    if (price.priced)
      log_price = StepLogPrice{price.usd_per_hour, price.gpus_of_instance, price.instance, price.source};
    step_log =
        std::make_unique<StepLog>((std::filesystem::path(spec.checkpoint.dir) / StepLog::kFileName).string(),
                                  spec.name, a.fresh, log_price);
    observers.add(step_log.get());
  }
  std::unique_ptr<ProfileObserver> profiler;
  if (rank0 && (a.profile || a.profile_if_possible)) {
    profiler = std::make_unique<ProfileObserver>();
    observers.add(profiler.get());
  }
  if (rank0) std::cerr << "zenflow: job " << spec.name << " (" << spec.optimizer.mode << " mode), " << spec.train.steps
            << " steps, checkpoints in " << spec.checkpoint.dir << "\n";
  // /metrics and /healthz while it trains. With --nproc and a fixed port only rank 0 serves
  // (its own rank's series: the others would collide on the port). With --metrics-port-file
  // (the worker agent) every rank serves, on a port of its own, and writes the port there.
#if ZENFLOW_HAVE_METRICS
  metrics::MetricsRegistry registry;
  std::unique_ptr<RunMetrics> run_metrics;
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  const bool port_file = !a.metrics_port_file.empty();
  if ((a.metrics_port > 0 && rank0) || port_file) {
    try {
      metrics::register_build_info(registry, kVersion);
      run_metrics = std::make_unique<RunMetrics>(registry, a.job_id.empty() ? spec.name : a.job_id);
      if (price.priced) run_metrics->set_price(price.usd_per_hour, price.gpus_of_instance);
      metrics_server = std::make_unique<metrics::MetricsServer>(registry, a.metrics_host, a.metrics_port);
      if (port_file) write_port_file(a.metrics_port_file, metrics_server->port());
    } catch (const std::invalid_argument& e) {
      std::cerr << "zenflow: invalid --metrics-host/--metrics-port: " << e.what() << "\n";
      return kExitBadInput;
    } catch (const std::exception& e) {
      if (!port_file) {
        std::cerr << "zenflow: error: " << e.what() << "\n";
        return kExitFailure;
      }
      // Under the agent, metrics are not worth a failed job: train without them.
      std::cerr << "zenflow: warning: no metrics for this rank: " << e.what() << "\n";
      metrics_server.reset();
      run_metrics.reset();
    }
    if (metrics_server) {
      observers.add(run_metrics.get());
      std::cerr << "zenflow: metrics on http://" << metrics_server->host() << ":" << metrics_server->port()
                << "/metrics\n";
    }
    if (!port_file && distributed::distributed_env_present() && distributed::rank_info_from_env().world_size > 1)
      std::cerr << "zenflow: warning: --metrics-port exports rank 0's metrics only (--metrics-port-file: every "
                   "rank's, each on its own port)\n";
  }
#else
  if (a.metrics_port > 0 || !a.metrics_port_file.empty()) {
    std::cerr << "zenflow: --metrics-port: this build has no metrics server (civetweb was not found)\n";
    return kExitBadInput;
  }
#endif
  RunSummary sum;
  // One line per failure, naming the file or key; LibTorch's stack trace only with --verbose.
  auto fail = [&](int code, const std::string& kind, const std::string& what) {
    progress.finish();
    std::cerr << "zenflow: " << kind << ": " << what << "\n";
    return code;
  };
  try {
    sum = train_with_node_loss_policy(spec, opts, rank0);
  } catch (const CommitFenced& e) {
    if (lease) lease->expire();  // the commit saw it first: the lease's line, then out
    return fail(kExitLeaseLost, "error", e.what());
  } catch (const NodeLostAskSpare& e) {
    reporters.on_node_lost(e.node);
    return fail(kExitOptimizerNodeLost, "error",
                e.what + "; the coordinator moves the job to a spare node and it resumes from its last checkpoint "
                         "(optimizer.host.on_node_loss: spare)");
  } catch (const SpecError& e) {
    return fail(kExitBadInput, "invalid job spec", e.what());
  } catch (const InputError& e) {
    return fail(kExitBadInput, "invalid input", e.what());
  } catch (const std::invalid_argument& e) {
    return fail(kExitBadInput, "invalid job", e.what());
  } catch (const CheckpointDirBusy& e) {
    // Under an agent: the lock of a predecessor that has not stopped yet (the worker's
    // problem, requeued); alone: another run of the same directory.
    return fail(kExitWorkerFault, "error", e.what());
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    if (msg.find("can't allocate memory") != std::string::npos || msg.find("out of memory") != std::string::npos)
      return fail(kExitBadInput, "out of memory",
                  msg.substr(0, msg.find('\n')) + " (reduce train.micro_batch, train.seq_len or the model size in model.config)");
    return fail(kExitFailure, "error", error_text(e, a.verbose));
  } catch (const std::bad_alloc&) {
    return fail(kExitBadInput, "out of memory",
                "the job does not fit in this machine's memory (reduce train.micro_batch, train.seq_len or the model size)");
  } catch (const std::exception& e) {
    return fail(kExitFailure, "error", e.what());
  }
  lease.reset();  // nothing more is written to checkpoint.dir: an agent gone now changes nothing
  progress.finish();
  if (rank0) {
    const std::optional<RunCost> cost = run_cost(price, sum);
    print_summary_table(a.json ? std::cerr : std::cout, spec, sum, cost);
    const nlohmann::json summary = summary_json(sum, cost);
    if (step_log) step_log->write_summary(summary);
    if (profiler && !sum.interrupted) {
      try {
        const std::string path = write_job_profile(spec, build_job_profile(spec, sum, *profiler));
        std::cerr << "zenflow: profile " << path << " (zenflow advise " << path << ")\n";
        reporters.on_profile(path);
      } catch (const std::exception& e) {
        if (!a.profile) {
          std::cerr << "zenflow: no profile: " << e.what() << "\n";
        } else {
          std::cerr << "zenflow: error: " << e.what() << "\n";
          if (a.json) std::cout << summary.dump() << std::endl;
          return kExitFailure;
        }
      }
    }
    if (a.json) std::cout << summary.dump() << std::endl;
  }
  return sum.interrupted ? kExitInterrupted : kExitOk;
}

CommandRegistrar reg(10, [](CommandContext& ctx) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = ctx.root->add_subcommand("run", "Train a job locally, in this process");
  cmd->add_option("job", args->job, "Job spec (YAML)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", args->sets, "Override a spec key: --set train.steps=50 (repeatable)");
  cmd->add_flag("--json", args->json, "Print one JSON object with the results at the end (stdout)");
  cmd->add_flag("--fresh,--no-resume", args->fresh,
                "Start from step 0 even if checkpoint.dir holds checkpoints (they are moved into "
                "checkpoint.dir/superseded-*/, never deleted); also the way past a directory whose every "
                "checkpoint is damaged");
  cmd->add_option("--allow-spec-change", args->allow_spec_change,
                  "Resume although these keys changed since the checkpoint (comma-separated, e.g. "
                  "optimizer.mode,train.seq_len)");
  cmd->add_option("--pricing", args->pricing,
                  "Pricing catalog merged by instance name over the shipped deploy/pricing.yaml (its rows "
                  "replace or add; repeatable); cost.instance_type is looked up there")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--profile", args->profile,
                "After training, write checkpoint.dir/profile.yaml: the steady step by cause, bytes, and probes of "
                "this host on the job's cores (GEMM, AdamW, copies, host AdamW by core count), for zenflow advise");
  cmd->add_flag("--profile-if-possible", args->profile_if_possible,
                "Like --profile, but a run too short to profile only says so (the worker agent asks this of every "
                "attempt: the coordinator keeps the profile for zenflow advise JOB_ID)");
  cmd->add_flag("--quiet", args->quiet, "No progress lines");
  cmd->add_flag("--verbose", args->verbose, "Show LibTorch's stack trace with an error");
  cmd->add_option("--nproc", args->nproc, "Data-parallel rank processes on this machine (Gloo on CPU, NCCL on GPU); "
                  "default: resources.gpus_per_worker")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--metrics-port", args->metrics_port,
                  "Serve Prometheus /metrics and /healthz on this port while training (0: off, unless "
                  "--metrics-port-file; with --nproc, rank 0's metrics only)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--metrics-host", args->metrics_host,
                  "Address the metrics port listens on (default 127.0.0.1; 0.0.0.0 for every interface)");
  cmd->add_option("--metrics-port-file", args->metrics_port_file,
                  "Serve /metrics from every rank, on --metrics-port or (0) a free port the kernel picks, and "
                  "write the port to this file once it listens; for the worker agent, which merges its ranks' "
                  "metrics into its own /metrics. A rank that cannot serve trains without metrics");
  cmd->add_option("--job-id", args->job_id,
                  "The job_id label of the metrics (default: the spec's name); the worker agent passes the "
                  "coordinator's job id");
  cmd->add_option("--report-fd", args->report_fd,
                  "Write the run's events to this open file descriptor, one JSON object per line (start, "
                  "step at most 4 a second and the last one, checkpoint, log, finish); for the worker agent")
      ->check(CLI::NonNegativeNumber);
  CLI::Option* lease_fd =
      cmd->add_option(
             "--lease-fd", args->lease_fd,
             "Run under the worker agent's lease: every byte read from this open file descriptor renews "
             "it; at EOF, or after --lease-timeout without a byte, exit 75 at once without writing a "
             "checkpoint")
          ->check(CLI::NonNegativeNumber);
  cmd->add_option("--lease-timeout", args->lease_timeout,
                  "Seconds without a byte on --lease-fd before the lease expires (default 3)")
      ->needs(lease_fd)
      ->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--lock-wait", args->lock_wait,
                  "Seconds to wait for another process to release checkpoint.dir's lock before failing "
                  "(default 0: fail at once)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->callback([args, &ctx] {
    args->argv = ctx.argv;
    ctx.exit_code = run(*args);
  });
});

}  // namespace
}  // namespace zenflow::cli
