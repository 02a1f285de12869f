// zenflow-optimizer: a dedicated CPU optimizer node (worker/optimizer_node/optimizer_node.h).
//
//   zenflow-optimizer --listen HOST:PORT [--threads N] [--cores LIST] [--memory-limit SIZE]
//                     [--token-file F] [--port-file F] [--metrics-port P [--metrics-host H]]
//                     [--coordinator HOST:PORT --worker-token-file F [--name N] [--advertise HOST:PORT]]
//
// Prints "zenflow-optimizer: listening on HOST:PORT" once it accepts sessions (PORT 0 in
// --listen picks a free one); SIGTERM or SIGINT stops it.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/metrics/http_server.h"
#include "common/metrics/registry.h"
#include "common/rpc/auth.h"
#include "common/version.h"
#if ZENFLOW_HAVE_SERVICES
#include "worker/optimizer_node/coordinator_link.h"
#endif
#include "worker/optimizer_node/optimizer_node.h"
#include "worker/transport/transport.h"

namespace {

std::vector<int> parse_cores(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(at, comma - at);
    const size_t dash = item.find('-');
    try {
      if (dash == std::string::npos) {
        out.push_back(std::stoi(item));
      } else {
        const int lo = std::stoi(item.substr(0, dash)), hi = std::stoi(item.substr(dash + 1));
        if (hi < lo) throw std::invalid_argument("");
        for (int c = lo; c <= hi; ++c) out.push_back(c);
      }
    } catch (const std::exception&) {
      throw std::invalid_argument("--cores: '" + item + "' is not a core or a range (examples: 2,3 or 4-7)");
    }
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  zenflow::optimizer_node::NodeOptions o;
  std::string listen = "127.0.0.1:0", cores, memory_limit, token_file, port_file;
  CLI::App app("zenflow-optimizer: holds shards of workers' host optimizer state and runs their AdamW windows");
  app.set_version_flag("--version", std::string("zenflow-optimizer ") + zenflow::kVersion);
  app.add_option("--listen", listen, "HOST:PORT to accept workers on (port 0: a free one, printed)");
  app.add_option("--threads", o.threads, "Compute threads per session")->check(CLI::Range(1, 4096));
  app.add_option("--cores", cores, "Cores to pin the compute threads to (e.g. 2,3 or 4-7)");
  app.add_option("--memory-limit", memory_limit, "Most host state to hold, all sessions together (e.g. 64G)");
  app.add_option("--token-file", token_file, "File holding the token every session must present");
  app.add_option("--port-file", port_file, "Write the bound port here once listening");
  std::string coordinator, worker_token_file, tls_ca, name, advertise;
  app.add_option("--coordinator", coordinator, "Register with this coordinator (HOST:PORT) as an optimizer node and heartbeat");
  app.add_option("--worker-token-file", worker_token_file, "The coordinator's worker join token (with --coordinator)");
  app.add_option("--tls-ca", tls_ca, "PEM CA to verify the coordinator's TLS certificate (enables TLS)");
  app.add_option("--name", name, "Name to register under (default: HOSTNAME-PORT)");
  std::string die_at;
  app.add_option("--die-at", die_at,
                 "Failure tests only: SIGKILL this node at the N-th event of KIND (grad, step, save, between), "
                 "e.g. step:3")
      ->group("Testing");
  app.add_option("--advertise", advertise, "HOST:PORT workers reach this node at (default: --listen with its port)");
  int metrics_port = 0;
  std::string metrics_host = "127.0.0.1";
  app.add_option("--metrics-port", metrics_port, "Serve Prometheus /metrics and /healthz on this port (0: off)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-host", metrics_host,
                 "Address the metrics port listens on (default 127.0.0.1; 0.0.0.0 for every interface)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    const zenflow::rpc::HostPort hp = zenflow::rpc::parse_host_port(listen, "--listen");
    o.host = hp.host;
    o.port = hp.port;
    if (!cores.empty()) o.cores = parse_cores(cores);
    if (!memory_limit.empty()) o.memory_limit = zenflow::optimizer_node::parse_bytes(memory_limit);
    if (!die_at.empty()) std::tie(o.die_at_kind, o.die_at_count) = zenflow::optimizer_node::parse_die_at(die_at);
    if (!token_file.empty()) o.token = zenflow::rpc::read_token_file(token_file);
#if !ZENFLOW_HAVE_SERVICES
    if (!coordinator.empty())
      throw std::invalid_argument(
          "--coordinator: this build has no gRPC services (ZENFLOW_SERVICES=OFF); give workers this node's "
          "address in optimizer.host.addresses instead");
#endif
    // Beyond loopback, a secret is what the handshake proves: without one, anyone who reaches
    // the port could open a session. Registered with a coordinator, the node holds a secret
    // per job attempt placed on it (its grants) and, without --token-file, serves only those.
    o.tokenless_sessions = coordinator.empty();
    if (o.token.empty() && coordinator.empty() && !zenflow::rpc::is_loopback_host(o.host))
      throw std::invalid_argument("--token-file (or --coordinator) is required when listening beyond loopback (--listen " +
                                  listen + ")");
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "zenflow-optimizer: %s\n", e.what());
    return 2;
  }
  // Signals go to sigwait below, not to the transport's or sessions' threads.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // §7 optimizer-node metrics: sessions, window step durations, network bytes.
  namespace metrics = zenflow::metrics;
  metrics::MetricsRegistry registry;
  metrics::register_build_info(registry, zenflow::kVersion);
  metrics::Histogram& steps =
      registry
          .histogram("zenflow_optimizer_step_duration_seconds", "Seconds a session's AdamW window step ran on this node",
                     {}, metrics::exponential_buckets(1e-4, 4, 10))
          .with({});
  o.on_step = [&steps](double s) { steps.observe(s); };
  registry.gauge("zenflow_optimizer_sessions", "Worker sessions (one slice of one rank's host state each)");
  registry.gauge("zenflow_optimizer_memory_bytes", "Bytes of host optimizer state the sessions hold");
  registry.gauge("zenflow_optimizer_memory_limit_bytes", "--memory-limit (0: unlimited)");
  registry.counter("zenflow_optimizer_sessions_refused_total", "Sessions refused (token, epoch, memory)");
  registry.counter("zenflow_optimizer_ops_total", "Jobs and state transfers run");
  registry.counter("zenflow_network_bytes_total", "Bytes this node moved over UCX", {"direction", "transport"});
  // The job attempts' secrets a coordinator placed on this node (its heartbeats bring them).
  std::mutex grants_mu;
  std::map<std::string, std::string> grants;
  o.grant_for = [&](const std::string& key) -> std::optional<std::string> {
    std::lock_guard<std::mutex> lock(grants_mu);
    const auto it = grants.find(key);
    if (it == grants.end()) return std::nullopt;
    return it->second;
  };
  zenflow::optimizer_node::OptimizerNode node(o);
  int port = 0;
  try {
    port = node.start();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zenflow-optimizer: cannot listen on %s: %s\n", listen.c_str(), e.what());
    return 1;
  }
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  const std::string transport = std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "ucx";
  registry.add_collector([&node, &o, transport](metrics::SampleSink& sink) {
    const auto st = node.stats();
    sink.add("zenflow_optimizer_sessions", {}, st.sessions);
    sink.add("zenflow_optimizer_memory_bytes", {}, static_cast<double>(st.memory_used));
    sink.add("zenflow_optimizer_memory_limit_bytes", {}, static_cast<double>(o.memory_limit));
    sink.add("zenflow_optimizer_sessions_refused_total", {}, static_cast<double>(st.sessions_refused));
    sink.add("zenflow_optimizer_ops_total", {}, static_cast<double>(st.ops));
    sink.add("zenflow_network_bytes_total", {"received", transport}, static_cast<double>(st.bytes_received));
    sink.add("zenflow_network_bytes_total", {"sent", transport}, static_cast<double>(st.bytes_sent));
  });
  if (metrics_port > 0) {
    try {
      metrics_server = std::make_unique<metrics::MetricsServer>(registry, metrics_host, metrics_port);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zenflow-optimizer: %s\n", e.what());
      return 1;
    }
    std::fprintf(stderr, "zenflow-optimizer: metrics on http://%s:%d/metrics\n", metrics_host.c_str(),
                 metrics_server->port());
  }
#if ZENFLOW_HAVE_SERVICES
  std::unique_ptr<zenflow::optimizer_node::CoordinatorLink> link;
  if (!coordinator.empty()) {
    zenflow::optimizer_node::CoordinatorLinkOptions lo;
    lo.coordinator = coordinator;
    lo.ca_file = tls_ca;
    try {
      if (!worker_token_file.empty()) lo.token = zenflow::rpc::read_token_file(worker_token_file);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "zenflow-optimizer: %s\n", e.what());
      return 2;
    }
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    lo.name = name.empty() ? std::string(host) + "-" + std::to_string(port) : name;
    lo.address = advertise.empty() ? o.host + ":" + std::to_string(port) : advertise;
    lo.cores = o.cores.empty() ? o.threads : static_cast<int64_t>(o.cores.size());
    lo.memory_bytes = o.memory_limit > 0 ? o.memory_limit : static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    lo.on_fenced = [&node](const std::string& why) {
      const int n = node.drop_all_sessions(why);
      if (n > 0) std::fprintf(stderr, "zenflow-optimizer: dropped %d sessions: %s\n", n, why.c_str());
    };
    lo.on_grants = [&](std::map<std::string, std::string> now) {
      std::lock_guard<std::mutex> lock(grants_mu);
      grants = std::move(now);
    };
    link = std::make_unique<zenflow::optimizer_node::CoordinatorLink>(lo);
  }
#endif
  std::printf("zenflow-optimizer: listening on %s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
#if ZENFLOW_HAVE_SERVICES
  link.reset();
#endif
  metrics_server.reset();
  const auto st = node.stats();
  std::fprintf(stderr, "zenflow-optimizer: stopping on signal %d (%d sessions, %lld ops run)\n", sig, st.sessions,
               static_cast<long long>(st.ops));
  node.stop();
  return 0;
}
