// zenflow-worker: registers this host with a coordinator and runs the jobs it assigns
// (worker/agent/agent.h).
//
//   zenflow-worker --coordinator HOST:PORT --token-file F --work-dir DIR [--name N] [--tls-ca F]
//                  [--metrics-port P [--metrics-host H]] [--disconnected-grace S] [--disconnect-drain S]
//                  [--keep-attempt-dirs N] [--max-attempt-log-bytes B] [--allowed-root DIR ...]
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "common/rpc/auth.h"
#include "common/version.h"
#include "worker/agent/agent.h"

namespace {
zenflow::agent::Agent* g_agent = nullptr;
void on_signal(int) {
  if (g_agent) g_agent->stop();
}
}  // namespace

int main(int argc, char** argv) {
  zenflow::agent::AgentOptions o;
  std::string token_file;
  double host_memory_gb = 0;
  double stop_grace_s = 60, disconnected_grace_s = 60, disconnect_drain_s = 30;
  CLI::App app("zenflow-worker: runs the fine-tuning jobs a zenflow coordinator assigns to this host");
  app.set_version_flag("--version", std::string("zenflow-worker ") + zenflow::kVersion);
  app.add_option("--coordinator", o.coordinator, "Coordinator HOST:PORT")->required();
  app.add_option("--token-file", token_file, "File holding the worker join token");
  app.add_option("--work-dir", o.work_dir, "Directory for the attempts' specs and output logs")->required();
  app.add_option("--name", o.name, "Worker name, unique in the cluster (default: the hostname)");
  app.add_option("--tls-ca", o.channel.ca_file, "PEM CA to verify the coordinator's TLS certificate (enables TLS)");
  app.add_option("--tls-server-name", o.channel.tls_server_name, "Name to check in the coordinator's certificate");
  app.add_option("--address", o.address, "Address other workers reach this one at (rendezvous of rank 0)");
  app.add_option("--cpu-slots", o.cpu_slots, "Slots offered when the host has no GPU (each runs one rank on the CPU)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--cpu-only", o.cpu_only, "Offer --cpu-slots even where nvidia-smi lists GPUs");
  app.add_flag("!--no-profile", o.profile,
               "Do not profile the jobs' rank 0 (saves ~1 s of probes per attempt; `zenflow advise JOB` then has "
               "nothing for jobs run here)");
  app.add_option("--host-memory-gb", host_memory_gb, "Host RAM to offer (default: MemTotal)")->check(CLI::PositiveNumber);
  app.add_option("--physical-cores", o.physical_cores, "Physical cores to offer (default: counted)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  std::vector<std::string> labels;
  app.add_option("--label", labels, "KEY=VALUE label for node selectors (repeatable)");
  app.add_option(
      "--allowed-root", o.allowed_roots,
      "A directory job specs may read or write (model.from, data.*, checkpoint.dir); repeatable. "
      "A spec path outside them and the work dir is refused, exit 2 naming the key, before anything "
      "is opened, and the coordinator places no such job here. Default: the work dir alone. "
      "--allowed-root / confines nothing");
  app.add_option("--trainer", o.trainer, "The zenflow binary the ranks run (default: beside this one)");
  app.add_option("--stop-grace", stop_grace_s, "Seconds a stopping job gets to checkpoint before SIGKILL");
  app.add_option("--disconnected-grace", disconnected_grace_s,
                 "Seconds the ranks keep training while the coordinator is unreachable (counted from the "
                 "sending of the last heartbeat it accepted); then they are asked to checkpoint and stop")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--disconnect-drain", disconnect_drain_s,
                 "Seconds after --disconnected-grace the ranks get to checkpoint and stop; then they are killed "
                 "and their leases end (the worker's fence, reported to the coordinator)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep-attempt-dirs", o.keep_attempt_dirs,
                 "Directories of ended attempts (spec, output.log) kept under the work dir, the newest; older "
                 "ones are removed once the coordinator holds their exit and output (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--max-attempt-log-bytes", o.max_attempt_log_bytes,
                 "Cap of each attempt's output.log; later output is only uploaded to the coordinator")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  app.add_option("--metrics-port", o.metrics_port,
                 "Serve Prometheus /metrics (this agent's series and every rank's it runs, labelled job_id and "
                 "rank) and /healthz on this port (0: off)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-host", o.metrics_host,
                 "Address the metrics port listens on (default 127.0.0.1; 0.0.0.0 for every interface)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (!token_file.empty()) o.token = zenflow::rpc::read_token_file(token_file);
    zenflow::rpc::parse_host_port(o.coordinator, "--coordinator");
    for (const std::string& l : labels) {
      const size_t eq = l.find('=');
      if (eq == std::string::npos || eq == 0) throw std::invalid_argument("--label: expected KEY=VALUE, got \"" + l + "\"");
      o.labels[l.substr(0, eq)] = l.substr(eq + 1);
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "zenflow-worker: %s\n", e.what());
    return 2;
  }
  o.channel.keepalive = true;  // idle long polls: keep the connection known alive
  o.host_memory_bytes = static_cast<int64_t>(host_memory_gb * double(1LL << 30));
  o.stop_grace = std::chrono::milliseconds(static_cast<int64_t>(stop_grace_s * 1000));
  o.disconnected_grace = std::chrono::milliseconds(static_cast<int64_t>(disconnected_grace_s * 1000));
  o.disconnect_drain = std::chrono::milliseconds(static_cast<int64_t>(disconnect_drain_s * 1000));
  zenflow::agent::Agent agent(std::move(o));
  g_agent = &agent;
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  return agent.run();
}
