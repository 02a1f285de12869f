// A coordinator and worker agents as real processes on 127.0.0.1, for the multi-process
// service tests: free ports (port 0, read back from "listening on HOST:PORT"), a temporary
// directory, token files, and every process stopped by PID when the cluster goes away.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "common/rpc/rpc.h"
#include "tests/support/process.h"
#include "tests/support/shell.h"
#include "zenflow/v1/jobs.grpc.pb.h"

namespace zenflow::test_support {

namespace fs = std::filesystem;

inline std::vector<pid_t> pids_with_cmdline(const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_file(e.path() / "cmdline");
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    // A zombie has an empty cmdline; count only live processes.
    if (cmd.find(needle) != std::string::npos) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

struct ClusterOptions {
  bool tokens = true;
  std::vector<std::string> coordinator_flags;  // extra
  std::string tls_cert, tls_key, tls_ca;       // TLS when set
};

class Cluster {
 public:
  explicit Cluster(const std::string& name, ClusterOptions options = {}) : options_(std::move(options)) {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("zenflow-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(dir_);
    admin_token_ = dir_ / "admin.token";
    worker_token_ = dir_ / "worker.token";
    write_file(admin_token_, "admin-" + random_hex() + "\n");
    write_file(worker_token_, "worker-" + random_hex() + "\n");
    ::chmod(admin_token_.c_str(), 0600);
    ::chmod(worker_token_.c_str(), 0600);
    worker_roots_ = {dir_.string(), "/usr/share/common-licenses"};
  }
  ~Cluster() {
    workers_.clear();
    coordinator_.reset();
    std::error_code ec;
    if (std::getenv("ZENFLOW_KEEP_TEST_DIRS") == nullptr) fs::remove_all(dir_, ec);
  }

  static std::string bin(const std::string& name) { return std::string(ZENFLOW_BINARY_DIR) + "/bin/" + name; }
  const fs::path& dir() const { return dir_; }
  const std::string& address() const { return address_; }
  std::string admin_token() const { return trim(read_file(admin_token_)); }
  std::string worker_token() const { return trim(read_file(worker_token_)); }
  fs::path admin_token_file() const { return admin_token_; }
  Process& coordinator() { return *coordinator_; }
  Process& worker(const std::string& name) { return *workers_.at(name); }

  // Starts the coordinator on a free port, or restarts it on the same database and port
  // (the workers know only that address); returns once it printed its address.
  void start_coordinator() {
    const std::string listen = address_.empty() ? "127.0.0.1:0" : address_;
    std::vector<std::string> argv = {bin("zenflow-coordinator"), "--listen", listen, "--db",
                                     (dir_ / "coordinator.db").string(), "--heartbeat-interval-ms", "500",
                                     "--lease-ms", "4000", "--preemption-min-runtime", "0"};
    if (options_.tokens) {
      argv.insert(argv.end(), {"--admin-token-file", admin_token_.string(), "--worker-token-file", worker_token_.string()});
    }
    if (!options_.tls_cert.empty()) argv.insert(argv.end(), {"--tls-cert", options_.tls_cert, "--tls-key", options_.tls_key});
    argv.insert(argv.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
    coordinator_.reset();
    const fs::path log = dir_ / ("coordinator-" + std::to_string(++coordinator_starts_) + ".log");
    coordinator_ = std::make_unique<Process>(argv, log);
    std::smatch m;
    const std::regex re("listening on 127\\.0\\.0\\.1:([0-9]+)");
    std::string out;
    if (!wait_until([&] { out = read_file(log); return std::regex_search(out, m, re) || !coordinator_->running(); },
                    std::chrono::seconds(20)) || !std::regex_search(out, m, re))
      throw std::runtime_error("coordinator did not start:\n" + out);
    address_ = "127.0.0.1:" + m[1].str();
  }

  // The directories the workers started from now on let job specs use (zenflow-worker
  // --allowed-root): by default the cluster's directory, where the tests write their specs
  // and checkpoints, and the license texts the tiny jobs train on. None: the agent's default
  // (its work dir alone).
  void set_worker_roots(std::vector<std::string> roots) { worker_roots_ = std::move(roots); }
  std::vector<std::string> worker_root_flags() const {
    std::vector<std::string> flags;
    for (const std::string& root : worker_roots_) flags.insert(flags.end(), {"--allowed-root", root});
    return flags;
  }

  // A worker agent with `slots` CPU slots and 8 GiB of host RAM on offer.
  Process& start_worker(const std::string& name, int slots = 1, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {bin("zenflow-worker"), "--coordinator", address_, "--work-dir",
                                     (dir_ / ("work-" + name)).string(), "--name", name, "--cpu-only", "--cpu-slots",
                                     std::to_string(slots), "--host-memory-gb", "8", "--physical-cores", "2",
                                     "--trainer", bin("zenflow"), "--stop-grace", "20"};
    const std::vector<std::string> roots = worker_root_flags();
    argv.insert(argv.end(), roots.begin(), roots.end());
    if (options_.tokens) argv.insert(argv.end(), {"--token-file", worker_token_.string()});
    if (!options_.tls_ca.empty()) argv.insert(argv.end(), {"--tls-ca", options_.tls_ca});
    argv.insert(argv.end(), extra.begin(), extra.end());
    workers_.erase(name);
    auto p = std::make_unique<Process>(argv, dir_ / ("worker-" + name + ".log"));
    return *workers_.emplace(name, std::move(p)).first->second;
  }
  void drop_worker(const std::string& name) { workers_.erase(name); }

  // `zenflow VERB ARGS --coordinator A --token-file F`, stdout into *out; the exit status.
  int cli(const std::string& args, std::string* out = nullptr, const std::string& token_file = "") const {
    std::string cmd = bin("zenflow") + " " + args + " --coordinator " + address_;
    const std::string tf = token_file.empty() ? (options_.tokens ? admin_token_.string() : "") : token_file;
    if (!tf.empty()) cmd += " --token-file " + tf;
    if (!options_.tls_ca.empty()) cmd += " --tls-ca " + options_.tls_ca;
    cmd += " 2>>" + (dir_ / "cli.log").string();
    return run(cmd, out);
  }
  // The job's status as the CLI's --json prints it (the proto's JSON mapping: int64 fields
  // are strings), fetched over gRPC directly: polling through the CLI would cost a process
  // start per poll. An empty object when the call fails.
  nlohmann::json status(const std::string& id) const {
    v1::GetJobRequest req;
    req.set_id(id);
    v1::JobStatus st;
    grpc::Status s;
    // A call on a connection the killed coordinator left fails once (UNAVAILABLE, broken
    // pipe); the retry reconnects, waiting for the new one (wait_for_ready).
    for (int attempt = 0; attempt < 3; ++attempt) {
      grpc::ClientContext ctx;
      rpc::prepare_call(ctx, options_.tokens ? admin_token() : "", std::chrono::seconds(5));
      ctx.set_wait_for_ready(true);
      s = stub()->GetJob(&ctx, req, &st);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    }
    if (!s.ok()) return {{"error", rpc::describe(s)}};
    return to_json(st);
  }
  nlohmann::json workers() const {
    v1::ListWorkersResponse resp;
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, options_.tokens ? admin_token() : "", std::chrono::seconds(5));
    ctx.set_wait_for_ready(true);
    if (!stub()->ListWorkers(&ctx, v1::ListWorkersRequest{}, &resp).ok()) return nlohmann::json::object();
    return to_json(resp);
  }
  std::string state(const std::string& id) const {
    const nlohmann::json j = status(id);
    return j.is_object() ? j.value("state", "") : "";
  }
  // Submits a spec file; returns the job id ("" on failure).
  std::string submit(const fs::path& spec, const std::string& extra = "") const {
    std::string out;
    if (cli("submit " + spec.string() + " --json " + extra, &out) != 0) return "";
    const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
    return j.is_object() && j.contains("job") ? j["job"].value("id", "") : "";
  }
  bool wait_state(const std::string& id, const std::string& want, std::chrono::milliseconds timeout) const {
    return wait_until([&] { return state(id) == want; }, timeout);
  }

 private:
  static nlohmann::json to_json(const google::protobuf::Message& m) {
    std::string out;
    google::protobuf::util::JsonPrintOptions o;
    o.always_print_primitive_fields = true;
    o.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(m, &out, o);
    return nlohmann::json::parse(out, nullptr, false);
  }
  v1::JobService::Stub* stub() const {
    if (!stub_ || stub_address_ != address_) {
      rpc::ChannelOptions co;
      co.ca_file = options_.tls_ca;
      stub_ = v1::JobService::NewStub(rpc::make_channel(address_, co));
      stub_address_ = address_;
    }
    return stub_.get();
  }
  static std::string random_hex() {
    std::random_device rd;
    std::ostringstream s;
    for (int i = 0; i < 4; ++i) s << std::hex << rd();
    return s.str();
  }
  static std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }

  ClusterOptions options_;
  fs::path dir_;
  fs::path admin_token_, worker_token_;
  std::string address_;
  std::vector<std::string> worker_roots_;
  int coordinator_starts_ = 0;
  std::unique_ptr<Process> coordinator_;
  std::map<std::string, std::unique_ptr<Process>> workers_;
  mutable std::unique_ptr<v1::JobService::Stub> stub_;
  mutable std::string stub_address_;
};

}  // namespace zenflow::test_support
