// zenflow-coordinator: the control plane (docs/design.md §2, §9).
//
//   zenflow-coordinator --listen HOST:PORT --db PATH --admin-token-file F --worker-token-file F
//                       [--tls-cert F --tls-key F] [--health-port P]
//
// Every call but grpc.health.v1 is authenticated before it reaches a handler (reflection
// included): on TLS, and in plaintext on a loopback address, through gRPC's auth hook
// (rpc::server_security). Plaintext on any other address would send the tokens in the
// clear: it needs --insecure-plaintext (behind a mesh that encrypts), and serves no
// reflection then, since nothing but the handlers would check its calls.
//
// Port 0 picks a free port; the first line on stderr is "listening on HOST:PORT". The
// health service (grpc.health.v1, no token) reports NOT_SERVING while the store is loaded
// and while draining after SIGTERM/SIGINT; --health-port adds a plaintext port that serves
// only health (Kubernetes gRPC probes send neither TLS nor tokens).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#include <thread>

#include "common/metrics/http_server.h"
#include "common/metrics/registry.h"
#include "common/pricing.h"
#include "common/storage/s3_uri.h"
#include "common/rpc/auth.h"
#include "common/rpc/rpc.h"
#include "common/version.h"
#include "server/accept_guard.h"
#include "server/coordinator.h"
#include "server/coordinator_metrics.h"
#if ZENFLOW_HAVE_REPORT
#include "server/job_report_page.h"
#endif
#include "server/service.h"
#include "server/stream_server.h"
#include "server/store.h"

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal.store(sig); }
std::string g_open_files;  // what main() did to the open-files limit, said once listening

struct Flags {
  std::string listen = "127.0.0.1:7070";
  std::string db = "zenflow-coordinator.db";
  std::string admin_token_file;
  std::string worker_token_file;
  std::string tls_cert;
  std::string tls_key;
  int health_port = -1;
  int64_t heartbeat_interval_ms = 1000;
  int64_t lease_ms = 4000;
  int64_t restart_grace_ms = 0;  // 0: 2 leases
  double preemption_min_runtime_s = 60;
  bool no_backfill = false;
  bool no_preemption = false;
  double admin_rate = 200;
  double admin_burst = 400;
  bool synchronous_normal = false;
  bool insecure_plaintext = false;
  std::vector<std::string> pricing;  // catalogs merged over the shipped deploy/pricing.yaml
  std::string checkpoint_root;        // CoordinatorOptions::checkpoint_root
  int metrics_port = 0;              // 0: no /metrics (as zenflow run and zenflow-worker)
  std::string metrics_host = "127.0.0.1";
  int64_t max_job_log_mib = 64;
  double lost_worker_retention_hours = 24;
  int max_streams = zenflow::server::StreamLimits{}.total;
  int max_streams_per_client = zenflow::server::StreamLimits{}.per_client;
};

// The shipped catalog (deploy/pricing.yaml of the source tree this binary was built from),
// with the --pricing files merged over it by instance name. Throws PricingError.
std::shared_ptr<const zenflow::PricingCatalog> load_catalog(const std::vector<std::string>& overrides,
                                                           std::vector<std::string>* notes) {
  auto catalog = std::make_shared<zenflow::PricingCatalog>();
  const std::string shipped = std::string(ZENFLOW_SOURCE_DIR) + "/deploy/pricing.yaml";
  std::error_code ec;
  if (std::filesystem::exists(shipped, ec)) {
    *catalog = zenflow::PricingCatalog::load(shipped);
    notes->push_back("pricing catalog " + shipped + " (" + std::to_string(catalog->instances().size()) + " instances)");
  } else {
    notes->push_back("pricing catalog " + shipped + " not found; cost.instance_type prices only from --pricing");
  }
  for (const std::string& f : overrides) catalog->merge(zenflow::PricingCatalog::load(f));
  return catalog;
}

int run(const Flags& f) {
  using namespace zenflow;
  const auto started = std::chrono::steady_clock::now();
  // "listening on HOST:PORT" is the first line (tests and scripts read the port from it):
  // what is said before the port is bound waits here.
  std::vector<std::string> early_log;
  std::mutex early_mu;
  bool listening = false;
  rpc::HostPort listen;
  rpc::TokenAuthority auth;
  try {
    listen = rpc::parse_host_port(f.listen, "--listen");
    if (f.admin_token_file.empty() != f.worker_token_file.empty())
      throw std::invalid_argument("--admin-token-file and --worker-token-file go together");
    if (f.admin_token_file.empty()) {
      if (!rpc::is_loopback_host(listen.host))
        throw std::invalid_argument("--listen " + f.listen +
                                    " is not a loopback address: refusing to serve without --admin-token-file and "
                                    "--worker-token-file (job submission runs code on the workers)");
      early_log.push_back("warning: no token files; every RPC is allowed (loopback only)");
    } else {
      auth = rpc::TokenAuthority(rpc::read_token_file(f.admin_token_file), rpc::read_token_file(f.worker_token_file));
    }
    if (f.tls_cert.empty() && !rpc::is_loopback_host(listen.host) && !f.insecure_plaintext)
      throw std::invalid_argument("--listen " + f.listen +
                                  " is not a loopback address: refusing to send bearer tokens in plaintext; give "
                                  "--tls-cert and --tls-key (README: TLS), or --insecure-plaintext behind a network "
                                  "that encrypts");
    if (f.heartbeat_interval_ms <= 0 || f.lease_ms <= f.heartbeat_interval_ms)
      throw std::invalid_argument("--lease-ms must be greater than --heartbeat-interval-ms (> 0)");
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "zenflow-coordinator: %s\n", e.what());
    return 2;
  }
  std::shared_ptr<const PricingCatalog> catalog;
  try {
    catalog = load_catalog(f.pricing, &early_log);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zenflow-coordinator: %s\n", e.what());
    return 2;
  }
  rpc::ServerSecurity security;
  try {
    security = rpc::server_security(f.tls_cert, f.tls_key, listen.host, auth);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "zenflow-coordinator: %s\n", e.what());
    return 2;
  }

  // Serve health (NOT_SERVING) before the store is loaded, so probes see "recovering".
  // Our own grpc.health.v1 (service.h says why not gRPC's default one); nothing in this
  // process uses the callback API.
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();  // keeps the library linked
  server::HealthService health;       // on --listen
  server::HealthService port_health;  // on --health-port
  std::unique_ptr<grpc::Server> health_server;
  int health_port = 0;
  if (f.health_port >= 0) {
    grpc::ServerBuilder hb;
    rpc::without_reflection(hb);  // this port checks no tokens
    hb.RegisterService(&port_health);  // every other method: UNIMPLEMENTED
    hb.AddListeningPort(listen.host + ":" + std::to_string(f.health_port), grpc::InsecureServerCredentials(),
                        &health_port);
    health_server = hb.BuildAndStart();
    if (!health_server) {
      std::fprintf(stderr, "zenflow-coordinator: cannot listen on health port %d\n", f.health_port);
      return 1;
    }
  }
  const bool reflection = security.transport != rpc::Transport::kPlaintext || !auth.has_tokens();

  // /metrics (coordinator_metrics.h), up before the store loads: scrapes then see the
  // build and, once the coordinator exists, its state.
  metrics::MetricsRegistry registry;
  server::CoordinatorMetrics cluster_metrics(registry);
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (f.metrics_port > 0) {
    try {
      metrics_server = std::make_unique<metrics::MetricsServer>(registry, f.metrics_host, f.metrics_port);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zenflow-coordinator: --metrics-port: %s\n", e.what());
      return 1;
    }
  }
  std::unique_ptr<server::Coordinator> coordinator;
  try {
    server::SqliteOptions so;
    so.synchronous_full = !f.synchronous_normal;
    server::CoordinatorOptions co;
    co.heartbeat_interval = std::chrono::milliseconds(f.heartbeat_interval_ms);
    co.lease = std::chrono::milliseconds(f.lease_ms);
    co.restart_grace = std::chrono::milliseconds(f.restart_grace_ms > 0 ? f.restart_grace_ms : 2 * f.lease_ms);
    co.preemption_min_runtime = std::chrono::milliseconds(static_cast<int64_t>(f.preemption_min_runtime_s * 1000));
    co.backfill = !f.no_backfill;
    co.preemption = !f.no_preemption;
    co.catalog = catalog;
    co.checkpoint_root = f.checkpoint_root;
    co.max_job_log_bytes = f.max_job_log_mib << 20;
    co.lost_worker_retention = std::chrono::milliseconds(static_cast<int64_t>(f.lost_worker_retention_hours * 3.6e6));
    co.issued_ids_path = f.db + ".ids";
    co.on_placed = [&cluster_metrics](double seconds) { cluster_metrics.observe_queue_wait(seconds); };
    co.log = [&](const std::string& line) {
      std::lock_guard<std::mutex> lock(early_mu);
      if (!listening) {
        early_log.push_back(line);
      } else {
        std::fprintf(stderr, "zenflow-coordinator: %s\n", line.c_str());
      }
    };
    coordinator = std::make_unique<server::Coordinator>(server::open_sqlite_store(f.db, so), co);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zenflow-coordinator: %s\n", e.what());
    return 1;
  }

  server::RateLimiter limiter(f.admin_rate, f.admin_burst);
  cluster_metrics.attach(*coordinator);
#if ZENFLOW_HAVE_REPORT
  if (metrics_server)
    metrics_server->add_page("/jobs/", [&coordinator](const std::string& rest) { return server::job_page(*coordinator, rest); });
#endif
  server::StreamLimits stream_limits;
  stream_limits.total = f.max_streams;
  stream_limits.per_client = f.max_streams_per_client;
  server::JobServiceImpl jobs(*coordinator, auth, limiter, &cluster_metrics, stream_limits);
  server::WorkerServiceImpl workers(*coordinator, auth, &cluster_metrics);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen.str(), security.credentials, &port);
  rpc::configure_server(builder);
  if (!reflection) rpc::without_reflection(builder);
  builder.RegisterService(&jobs);
  builder.RegisterService(&workers);
  builder.RegisterService(&health);
  server::HotPathServer hot_path(builder, jobs, workers);
  server::StreamServer streams(builder, jobs);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "zenflow-coordinator: cannot listen on %s\n", listen.str().c_str());
    return 1;
  }
  listen.port = port;
  hot_path.start();
  streams.start();
  {
    std::lock_guard<std::mutex> lock(early_mu);
    std::fprintf(stderr, "listening on %s\n", listen.str().c_str());
    for (const std::string& line : early_log) std::fprintf(stderr, "zenflow-coordinator: %s\n", line.c_str());
    listening = true;
  }
  std::fprintf(stderr, "zenflow-coordinator: %s\n", g_open_files.c_str());
  if (health_server) std::fprintf(stderr, "zenflow-coordinator: health on %s:%d (plaintext)\n", listen.host.c_str(), health_port);
  if (metrics_server)
    std::fprintf(stderr, "zenflow-coordinator: metrics on http://%s:%d/metrics\n", metrics_server->host().c_str(),
                 metrics_server->port());
  std::fprintf(stderr, "zenflow-coordinator: %s, store %s (WAL, synchronous=%s), %s%s%s\n", kVersion, f.db.c_str(),
               f.synchronous_normal ? "NORMAL" : "FULL", rpc::transport_name(security.transport),
               security.every_call_checked ? ", every call authenticated" : "",
               reflection ? ", reflection" : ", no reflection (plaintext: only the handlers check tokens)");
  health.set_serving(true);
  port_health.set_serving(true);
  std::fprintf(stderr, "zenflow-coordinator: SERVING %lld ms after start\n",
               static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - started)
                                          .count()));

  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  // Out of file descriptors, the listeners shed new connections (server/accept_guard.h):
  // NOT_SERVING meanwhile, so that a probe sees it, and SERVING again once they accept.
  bool shedding = false;
  while (g_signal.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const bool now_shedding = server::accept_guard::exhausted_within(std::chrono::seconds(2));
    if (now_shedding == shedding) continue;
    shedding = now_shedding;
    health.set_serving(!shedding);
    port_health.set_serving(!shedding);
    const server::accept_guard::Stats st = server::accept_guard::stats();
    rlimit lim{};
    const std::string limit =
        ::getrlimit(RLIMIT_NOFILE, &lim) == 0 ? "limit " + std::to_string(lim.rlim_cur) : "limit unknown";
    std::fprintf(stderr, "zenflow-coordinator: %s\n",
                 shedding ? ("out of file descriptors (" + limit +
                             "): closing new connections at once, NOT_SERVING until descriptors are free")
                                .c_str()
                          : ("file descriptors free again: accepting connections, SERVING (" +
                             std::to_string(st.shed) + " connections closed for want of descriptors so far)")
                                .c_str());
  }
  std::fprintf(stderr, "zenflow-coordinator: signal %d: draining\n", g_signal.load());
  health.set_serving(false);
  port_health.set_serving(false);
  coordinator->shutdown();  // streams and long polls return within a slice
  health.shutdown();
  port_health.shutdown();
  streams.drain();  // every WatchJob / StreamLogs stream ends now (UNAVAILABLE), not at the deadline
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  hot_path.stop();
  streams.stop();
  if (health_server) health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  metrics_server.reset();  // its pages and collector read the coordinator
  cluster_metrics.detach();
  coordinator.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Under a file-size limit (ulimit -f) a write past it would kill the process with SIGXFSZ,
  // saying nothing; ignored, the write fails with EFBIG, which the store reports and the
  // coordinator logs before it stops.
  std::signal(SIGXFSZ, SIG_IGN);
  zenflow::rpc::raise_open_files_limit(&g_open_files);
  zenflow::server::accept_guard::install();
  Flags f;
  CLI::App app("zenflow-coordinator: schedules fine-tuning jobs on zenflow workers");
  app.set_version_flag("--version", std::string("zenflow-coordinator ") + zenflow::kVersion);
  app.add_option("--listen", f.listen, "HOST:PORT to serve gRPC on (port 0: a free one)");
  app.add_option("--db", f.db, "SQLite database (created when absent)");
  app.add_option("--admin-token-file", f.admin_token_file, "File holding the admin token (JobService)");
  app.add_option("--worker-token-file", f.worker_token_file, "File holding the worker join token (WorkerService)");
  app.add_option("--tls-cert", f.tls_cert, "PEM certificate: serve TLS");
  app.add_option("--tls-key", f.tls_key, "PEM private key of --tls-cert");
  app.add_option("--health-port", f.health_port, "Also serve grpc.health.v1 alone, plaintext, on this port (0: free)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--heartbeat-interval-ms", f.heartbeat_interval_ms, "Worker heartbeat interval");
  app.add_option("--lease-ms", f.lease_ms, "A worker without a heartbeat for this long is LOST");
  app.add_option("--restart-grace-ms", f.restart_grace_ms, "Fresh lease for known workers after a restart (0: 2 leases)");
  app.add_option("--max-job-log-mib", f.max_job_log_mib,
                 "Keep at most this much of each job's log; later output is dropped and counted")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--lost-worker-retention-hours", f.lost_worker_retention_hours,
                 "Forget a worker LOST for this long (its row, its line in `zenflow workers`)")
      ->check(CLI::Range(0.0, 24.0 * 365));
  app.add_option("--preemption-min-runtime", f.preemption_min_runtime_s,
                 "Seconds a job runs before it may be preempted (preemption.min_runtime)");
  app.add_flag("--no-backfill", f.no_backfill, "Start nothing behind a waiting head job");
  app.add_flag("--no-preemption", f.no_preemption, "Never preempt lower-priority jobs");
  app.add_option("--admin-rate-limit", f.admin_rate, "Admin requests per second per caller (a connection; 0: unlimited)");
  app.add_option("--admin-burst", f.admin_burst, "Admin request burst per caller (a connection)");
  app.add_option("--max-streams", f.max_streams, "WatchJob + StreamLogs streams served at once, in all")
      ->check(CLI::Range(1, 1'000'000));
  app.add_option("--max-streams-per-client", f.max_streams_per_client,
                 "WatchJob + StreamLogs streams served at once per client address")
      ->check(CLI::Range(1, 1'000'000));
  app.add_flag("--synchronous-normal", f.synchronous_normal,
               "SQLite synchronous=NORMAL: survives a coordinator crash, not power loss (benchmarks only)");
  app.add_option("--metrics-port", f.metrics_port, "Serve /metrics and /healthz over HTTP on this port (0: off)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-host", f.metrics_host, "Address for --metrics-port (default 127.0.0.1)");
  app.add_option("--pricing", f.pricing,
                 "Pricing catalog merged by instance name over the shipped deploy/pricing.yaml (repeatable)")
      ->check(CLI::ExistingFile);
  app.add_flag("--insecure-plaintext", f.insecure_plaintext,
               "Serve plaintext on a non-loopback address (tokens in the clear: only behind a network that encrypts)");
  app.add_option("--checkpoint-root", f.checkpoint_root,
                 "Where jobs whose spec names no checkpoint.dir keep their checkpoints: ROOT/<job name>; "
                 "s3://BUCKET/PREFIX (the chart's storage.s3.bucket) or an absolute path every worker mounts")
      ->check([](const std::string& v) -> std::string {
        if (zenflow::storage::is_s3_uri(v)) {
          try {
            const zenflow::storage::S3Uri u = zenflow::storage::parse_s3_uri(v);
            (void)u;
            return "";
          } catch (const std::exception& e) {
            return e.what();
          }
        }
        if (v.empty() || v[0] != '/') return "not an s3://BUCKET/PREFIX URI or an absolute path: '" + v + "'";
        return "";
      });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  while (f.checkpoint_root.size() > 1 && f.checkpoint_root.back() == '/') f.checkpoint_root.pop_back();
  return run(f);
}
