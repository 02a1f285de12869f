// The rank's entry point (rank_main.h): one rank of a training run, or the local launcher of
// N; its exit codes are the attempt contract's (common/attempt_contract.h).
#include "worker/rank/rank_main.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include <c10/util/Exception.h>

#include "common/attempt_contract.h"
#include "common/input_file.h"
#include "common/job_spec.h"
#include "common/pricing.h"
#include "common/storage/s3_uri.h"
#include "worker/distributed/launcher.h"
#include "worker/distributed/rendezvous.h"
#include "worker/engine/host_optimizer.h"
#include "worker/rank/checkpoint.h"
#include "worker/rank/error_text.h"
#include "worker/rank/job_profiler.h"
#include "worker/rank/lease.h"
#include "worker/rank/run_output.h"
#include "worker/rank/run_reporter.h"
#include "worker/rank/step_log.h"
#include "worker/rank/trainer.h"
#if ZENFLOW_HAVE_S3
#include "common/storage/checkpoint_mirror.h"
#include "common/storage/object_cache.h"
#include "common/storage/s3.h"
#endif
#if ZENFLOW_HAVE_METRICS
#include "common/metrics/http_server.h"
#include "common/metrics/registry.h"
#include "common/version.h"
#include "worker/rank/run_metrics.h"
#endif

namespace zenflow {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_training{false};  // setup is done: a stop now ends with a checkpoint

void on_sigint(int) {
  if (!g_training.load()) {
    // Model construction, loading, resume: nothing is written yet that a checkpoint would
    // keep, so leave at once (a blocking read cannot hold the process either).
    const char msg[] = "\nzenflow: interrupted before training started; nothing was written\n";
    (void)!::write(2, msg, sizeof(msg) - 1);
    std::_Exit(attempt::kExitInterrupted);
  }
  if (g_stop.exchange(true)) std::_Exit(attempt::kExitInterrupted);  // second Ctrl-C: leave now
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
// by the scheduler): the rank exits attempt::kExitNodeLost naming the node, and the
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
    ::_exit(attempt::kExitLeaseLost);
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

}  // namespace

int run_rank(const RankArgs& a) {
  // From the start: a signal during spec parsing or setup ends the process cleanly (130).
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  for (const auto& [flag, fd, read] : {std::make_tuple("--report-fd", a.report_fd, false),
                                       std::make_tuple("--lease-fd", a.lease_fd, true)}) {
    if (fd < 0) continue;
    if (const std::string bad = check_fd(flag, fd, read); !bad.empty()) {
      std::cerr << "zenflow: " << bad << "\n";
      return attempt::kExitBadInput;
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
    return attempt::kExitBadInput;
  }
  const int nproc = a.nproc > 0 ? a.nproc : static_cast<int>(std::max<int64_t>(1, spec.resources.gpus_per_worker));
  if (nproc > 1 && !distributed::distributed_env_present() && (a.report_fd >= 0 || a.lease_fd >= 0)) {
    std::cerr << "zenflow: --report-fd and --lease-fd belong to one rank process: with " << nproc
              << " ranks the local launcher would hand every rank the same fd; start each rank with the "
                 "rendezvous variables (ZENFLOW_RANK, ...) and its own fds instead\n";
    return attempt::kExitBadInput;
  }
  if (nproc > 1 && !distributed::distributed_env_present() && !a.metrics_port_file.empty()) {
    std::cerr << "zenflow: --metrics-port-file belongs to one rank process: with " << nproc
              << " ranks the local launcher would hand every rank the same file; use --metrics-port (rank 0's "
                 "metrics) or the worker agent\n";
    return attempt::kExitBadInput;
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
      return attempt::kExitBadInput;
    }
    if (rank0)
      for (const std::string& w : warnings) std::cerr << "zenflow: warning: " << w << "\n";
  }
  // s3:// URIs in the spec. The inputs (model.from, data.*) are fetched into the worker's
  // object cache (object_cache.h) and read from there; the job's identity keeps the URIs, so
  // a resume on another worker (another cache) is the same job. checkpoint.dir: the run works
  // in a local staging directory that the mirror keeps the bucket in step with
  // (checkpoint_mirror.h); one rank per host brings the newest checkpoint down first (the
  // others wait for it at the rendezvous).
  const std::string checkpoint_uri = storage::is_s3_uri(spec.checkpoint.dir) ? spec.checkpoint.dir : "";
  std::map<std::string, std::string> opts_input_uris;  // key -> its URI, for the job's identity
  int64_t opts_ranks_beside_rank0 = 0;                   // RunOptions::ranks_beside_rank0
  std::vector<std::pair<const char*, std::string*>> inputs;
  for (auto [key, field] : {std::pair<const char*, std::string*>{"model.from", &spec.model.from},
                            {"data.train", &spec.data.train},
                            {"data.val", &spec.data.val},
                            {"data.tokenizer", &spec.data.tokenizer}})
    if (storage::is_s3_uri(*field)) inputs.emplace_back(key, field);
#if ZENFLOW_HAVE_S3
  std::unique_ptr<CheckpointMirror> mirror;
  std::vector<storage::ObjectCache::Entry> cached;  // held (against eviction) for the whole run
  std::shared_ptr<storage::S3Client> client;
  if (!checkpoint_uri.empty() || !inputs.empty()) {
    try {
      client = std::make_shared<storage::S3Client>(storage::s3_settings_from_environment());
    } catch (const std::runtime_error& e) {
      std::cerr << "zenflow: invalid job spec: " << (checkpoint_uri.empty() ? inputs[0].first : "checkpoint.dir")
                << ": " << e.what() << "\n";
      return attempt::kExitBadInput;
    }
  }
  auto log0 = [rank0](const std::string& line) {
    if (rank0) std::cerr << "zenflow: " << line << "\n";
  };
  if (!inputs.empty()) {
    const char* max_gb = std::getenv("ZENFLOW_CACHE_MAX_GB");
    const int64_t max_bytes = static_cast<int64_t>((max_gb && *max_gb ? std::atof(max_gb) : 200.0) * (1LL << 30));
    const char* key = "";
    try {
      storage::ObjectCache cache(storage::object_cache_dir(a.cache_dir), max_bytes, client, log0);
      for (auto& [k, field] : inputs) {
        key = k;
        opts_input_uris[k] = *field;
        cached.push_back(cache.fetch(storage::parse_s3_uri(*field)));
        if (cached.back().downloaded && rank0)
          std::cerr << "zenflow: " << k << " " << *field << ": " << storage::size_text(cached.back().bytes)
                    << " downloaded into the cache\n";
        *field = cached.back().path;
      }
      check_spec_paths(spec);  // the local copies, as a local spec's paths are checked
    } catch (const SpecError& e) {
      std::cerr << "zenflow: invalid job spec: " << e.what() << "\n";
      return attempt::kExitBadInput;
    } catch (const storage::S3Error& e) {
      const bool refused = e.http_status >= 400 && e.http_status < 500;
      std::cerr << "zenflow: " << (refused ? "invalid job spec" : "error") << ": " << key << ": "
                << opts_input_uris[key] << ": " << (e.code.empty() ? std::string("no answer") : e.code) << " ("
                << e.what() << ")\n";
      return refused ? attempt::kExitBadInput : attempt::kExitFailed;
    } catch (const std::exception& e) {
      std::cerr << "zenflow: error: " << key << ": " << e.what() << "\n";
      return attempt::kExitBadInput;
    }
  }
  if (!checkpoint_uri.empty()) {
    const storage::S3Uri remote = storage::parse_s3_uri(checkpoint_uri);  // the spec checked it
    MirrorOptions mo;
    mo.keep = spec.checkpoint.keep;
    mo.upload.max_bytes_per_second = spec.checkpoint.upload_mib_per_s << 20;
    mo.log = log0;
    // Each worker stages its own copy, pulled by the first of its ranks; the pull brings only
    // its ranks' shards unless the ranks changed.
    bool first_on_host = true;
    if (distributed::distributed_env_present()) {
      const distributed::WorkerRanks mine = distributed::worker_ranks_from_env();
      const int64_t rank = distributed::rank_info_from_env().rank;
      const int64_t world = distributed::rank_info_from_env().world_size;
      first_on_host = rank == mine.first;
      if (mine.count < world) {
        mo.shard_wanted = [world, mine](int64_t checkpoint_world, int r) {
          return checkpoint_world != world || mine.holds(r);
        };
        // Rank 0's worker holds ranks [0, count) (the agent's numbering: worker m has
        // [m * count, (m + 1) * count)).
        opts_ranks_beside_rank0 = mine.count;
      }
    }
    try {
      mirror = std::make_unique<CheckpointMirror>(client, remote, staging_dir_for(remote, a.staging_dir), mo);
      if (a.fresh && rank0) {
        if (const int64_t newest = mirror->newest_remote_step(); newest >= 0) {
          std::cerr << "zenflow: --fresh: " << checkpoint_uri << " already holds checkpoints (the newest is step "
                    << newest << "); a bucket's checkpoints are never overwritten: give the job another "
                    << "checkpoint.dir to start over\n";
          return attempt::kExitBadInput;
        }
      } else if (!a.fresh && first_on_host) {
        const auto started = std::chrono::steady_clock::now();
        const CheckpointMirror::Pulled p = mirror->pull_for_run(/*clean_uncommitted=*/rank0);
        if (p.step >= 0 && rank0)
          std::cerr << "zenflow: step " << p.step << " from " << checkpoint_uri << ": " << (p.bytes_downloaded >> 20)
                    << " MiB downloaded, " << (p.bytes_reused >> 20) << " MiB already staged, in "
                    << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s\n";
      }
      if (rank0) mirror->check_writable();
    } catch (const storage::S3Error& e) {
      // The bucket answered no (credentials, a missing bucket, a denied prefix): the spec's
      // problem, before training; no answer at all: perhaps passing, a failure.
      const bool refused = e.http_status >= 400 && e.http_status < 500;
      std::cerr << "zenflow: " << (refused ? "invalid job spec" : "error") << ": checkpoint.dir: " << checkpoint_uri
                << ": " << (e.code.empty() ? std::string("no answer") : e.code) << " (" << e.what() << ")\n";
      return refused ? attempt::kExitBadInput : attempt::kExitFailed;
    } catch (const std::exception& e) {
      std::cerr << "zenflow: error: checkpoint.dir " << checkpoint_uri << ": " << e.what() << "\n";
      return attempt::kExitFailed;
    }
    spec.checkpoint.dir = mirror->local_dir();
  }
#else
  if (!checkpoint_uri.empty() || !inputs.empty()) {
    std::cerr << "zenflow: invalid job spec: " << (checkpoint_uri.empty() ? inputs[0].first : "checkpoint.dir")
              << ": this build has no s3:// support (libcurl4-openssl-dev and libexpat1-dev were not found when it "
                 "was built)\n";
    return attempt::kExitBadInput;
  }
#endif
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
  // Under the worker agent the job's spec decides, not a flag of this command.
  if (a.report_fd >= 0 || a.lease_fd >= 0) opts.start_over_hint = "submit it with another checkpoint.dir to start over";
  for (const std::string& list : a.allow_spec_change) {
    std::stringstream keys(list);
    for (std::string k; std::getline(keys, k, ',');)
      if (!k.empty()) opts.allow_spec_change.push_back(k);
  }
  opts.on_training_start = [] { g_training.store(true); };
  opts.input_uris = opts_input_uris;
  opts.checkpoint_uri = checkpoint_uri;
#if ZENFLOW_HAVE_S3
  if (mirror && rank0)
    opts.on_checkpoint_committed = [&](int64_t step, const std::string& dir) { return mirror->push(dir, step); };
  if (mirror && opts_ranks_beside_rank0 > 0) {
    opts.ranks_beside_rank0 = opts_ranks_beside_rank0;
    opts.on_shard_written = [&](int64_t step, const std::string& file, uint32_t crc) {
      return mirror->push_shard(file, step, crc);
    };
  }
#endif
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
            << " steps, checkpoints in "
            << (checkpoint_uri.empty() ? spec.checkpoint.dir : checkpoint_uri + " (staged in " + spec.checkpoint.dir + ")")
            << "\n";
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
      return attempt::kExitBadInput;
    } catch (const std::exception& e) {
      if (!port_file) {
        std::cerr << "zenflow: error: " << e.what() << "\n";
        return attempt::kExitFailed;
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
    return attempt::kExitBadInput;
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
    return fail(attempt::kExitLeaseLost, "error", e.what());
  } catch (const NodeLostAskSpare& e) {
    reporters.on_node_lost(e.node);
    return fail(attempt::kExitNodeLost, "error",
                e.what + "; the coordinator moves the job to a spare node and it resumes from its last checkpoint "
                         "(optimizer.host.on_node_loss: spare)");
  } catch (const SpecError& e) {
    return fail(attempt::kExitBadInput, "invalid job spec", e.what());
  } catch (const InputError& e) {
    return fail(attempt::kExitBadInput, "invalid input", e.what());
  } catch (const std::invalid_argument& e) {
    return fail(attempt::kExitBadInput, "invalid job", e.what());
  } catch (const CheckpointDirBusy& e) {
    // Under an agent: the lock of a predecessor that has not stopped yet (the worker's
    // problem, requeued); alone: another run of the same directory.
    return fail(attempt::kExitWorkerFault, "error", e.what());
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    if (msg.find("can't allocate memory") != std::string::npos || msg.find("out of memory") != std::string::npos)
      return fail(attempt::kExitBadInput, "out of memory",
                  msg.substr(0, msg.find('\n')) + " (reduce train.micro_batch, train.seq_len or the model size in model.config)");
    return fail(attempt::kExitFailed, "error", error_text(e, a.verbose));
  } catch (const std::bad_alloc&) {
    return fail(attempt::kExitBadInput, "out of memory",
                "the job does not fit in this machine's memory (reduce train.micro_batch, train.seq_len or the model size)");
  } catch (const std::exception& e) {
    return fail(attempt::kExitFailed, "error", e.what());
  }
#if ZENFLOW_HAVE_S3
  // The last checkpoint is durable only once its manifest is in the bucket: wait for it (a
  // SIGTERM's checkpoint too) before the run reports its end.
  // A rank on another worker waits for its last shard's upload (rank 0's manifest waits for it).
  if (mirror && !rank0 && opts.ranks_beside_rank0 > 0) {
    try {
      mirror->flush();
    } catch (const std::exception& e) {
      return fail(attempt::kExitFailed, "error", std::string("checkpoint upload to ") + checkpoint_uri + ": " + e.what());
    }
  }
  if (mirror && rank0) {
    try {
      const CheckpointMirror::Durable d = mirror->flush();
      if (d.step >= 0)
        std::cerr << "zenflow: checkpoint step " << d.step << " durable in " << mirror->remote().text() << "/step-"
                  << std::setw(8) << std::setfill('0') << d.step << std::setfill(' ') << " ("
                  << d.seconds_to_durable << " s after it was written)\n";
    } catch (const std::exception& e) {
      return fail(attempt::kExitFailed, "error", std::string("checkpoint upload to ") + checkpoint_uri + ": " + e.what());
    }
  }
#endif
  lease.reset();  // nothing more is written to checkpoint.dir: an agent gone now changes nothing
  progress.finish();
  if (sum.already_complete) {
    // The run said so (its log line); nothing was trained, so no table, record or profile.
    if (rank0 && a.profile) std::cerr << "zenflow: no profile: nothing was trained\n";
    if (rank0 && a.json) {
      nlohmann::ordered_json j = {{"already_complete", true},
                          {"step", sum.steps},
                          {"train_steps", spec.train.steps},
                          {"checkpoint", sum.last_checkpoint},
                          {"final_loss", std::isfinite(sum.final_loss) ? nlohmann::ordered_json(sum.final_loss) : nlohmann::ordered_json(nullptr)},
                          {"message", already_complete_message(sum.steps, spec.train.steps, opts.start_over_hint)}};
      std::cout << j.dump() << std::endl;
    }
    return attempt::kExitOk;
  }
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
          return attempt::kExitFailed;
        }
      }
    }
    if (a.json) std::cout << summary.dump() << std::endl;
  }
  return sum.interrupted ? attempt::kExitInterrupted : attempt::kExitOk;
}

}  // namespace zenflow
