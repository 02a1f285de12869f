// zenflow up: the whole service on this machine — a coordinator, CPU workers, optimizer nodes
// and optionally Prometheus — on 127.0.0.1, free ports and fresh tokens, until Ctrl-C.
//
//   zenflow up [--workers N] [--optimizer-nodes M] [--prometheus] [--dir DIR] [--allowed-root D ...]
//
// The workers confine job specs to their allowed roots (zenflow-worker --allowed-root): DIR,
// the current directory, and the checkout with what its examples/tiny.yaml reads (the submit
// line printed, which checkpoints into DIR/runs/tiny-demo), plus each --allowed-root.
//
// Every process is a child in a process group of its own that dies with this one
// (PR_SET_PDEATHSIG), logs to DIR/logs/NAME.log and is stopped by PID: SIGTERM, then SIGKILL
// after --grace seconds. Once everything is ready (coordinator SERVING, every worker READY in
// the coordinator's list, every node's port file written, Prometheus /-/ready), DIR/up.json
// holds the addresses, token files and PIDs, and the ready time and the submit commands are
// printed. Exit codes: 0 stopped on a signal, 1 something did not start, 2 bad flags.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/commands.h"
#include "common/allowed_roots.h"
#include "common/job_spec.h"
#include "common/rpc/auth.h"
#include "common/rpc/rpc.h"
#include "worker/distributed/ports.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "zenflow/v1/jobs.grpc.pb.h"

namespace zenflow::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

struct UpArgs {
  int workers = 1;
  int optimizer_nodes = 0;
  bool prometheus = false;
  std::string dir;
  std::vector<std::string> allowed_roots;  // added to the workers' defaults (worker_roots)
  double ready_timeout_s = 120;
  double grace_s = 20;
};

// One started process: its role in the stack, where it logs, and its exit once reaped.
struct Child {
  Child(std::string n, std::string r) : name(std::move(n)), role(std::move(r)) {}
  std::string name;  // "coordinator", "w1", "optimizer-1", "prometheus"
  std::string role;  // coordinator | worker | optimizer | prometheus
  pid_t pid = -1;
  fs::path log;
  int metrics_port = 0;
  std::string address;  // gRPC/UCX address, or Prometheus' HTTP address
  bool reaped = false;
  int status = 0;  // exit code, or 128 + signal
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tail_lines(const std::string& text, int n) {
  size_t pos = text.size();
  for (int i = 0; i <= n && pos != std::string::npos && pos > 0; ++i) pos = text.rfind('\n', pos - 1);
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

void write_text_atomically(const fs::path& p, const std::string& text, mode_t mode) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
  }
  ::chmod(tmp.c_str(), mode);
  fs::rename(tmp, p);
}



// GET http://127.0.0.1:port/path: the status code, 0 when nothing answers within a second.
int http_status(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  timeval timeout{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int code = 0;
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
    char buf[64] = {};
    const ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
    if (n >= 12 && std::string(buf, 5) == "HTTP/") code = std::atoi(buf + 9);
  }
  ::close(fd);
  return code;
}

fs::path self_dir() { return fs::read_symlink("/proc/self/exe").parent_path(); }

// `name` on PATH, or "" when it is nowhere.
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string d; std::getline(dirs, d, ':');) {
    const fs::path p = fs::path(d.empty() ? "." : d) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

// The stack: starts, watches and stops its children.
class Stack {
 public:
  explicit Stack(fs::path dir) : dir_(std::move(dir)) {}
  ~Stack() { stop(std::chrono::milliseconds(0)); }

  // Forks `argv` in a process group of its own, stdout and stderr to DIR/logs/NAME.log; the
  // child gets SIGKILL when this process dies (no orphans even on our SIGKILL).
  Child& start(Child c, const std::vector<std::string>& argv) {
    c.log = dir_ / "logs" / (c.name + ".log");
    std::vector<std::string> args = argv;
    std::vector<char*> cargv;
    for (std::string& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const int fd = ::open(c.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + c.log.string());
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t pid = ::fork();
    if (pid == 0) {  // async-signal-safe calls only until exec
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // we died before the prctl
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      if (null_fd >= 0) ::dup2(null_fd, 0);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(cargv[0], cargv.data());
      static const char msg[] = "zenflow up: exec failed\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    ::close(fd);
    if (null_fd >= 0) ::close(null_fd);
    if (pid < 0) throw std::runtime_error("fork failed for " + c.name);
    ::setpgid(pid, pid);  // also here: a group signal right after fork finds the group
    c.pid = pid;
    children_.push_back(std::make_unique<Child>(std::move(c)));
    return *children_.back();
  }

  // Reaps whichever children exited; returns those that exited in this call.
  std::vector<Child*> reap() {
    std::vector<Child*> exited;
    for (auto& c : children_) {
      if (c->reaped) continue;
      int st = 0;
      if (::waitpid(c->pid, &st, WNOHANG) == c->pid) {
        c->reaped = true;
        c->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        exited.push_back(c.get());
      }
    }
    return exited;
  }

  // SIGTERM to every child still running, then SIGKILL to the groups of those that remain
  // after `grace`; waits for every one. Returns how many were running.
  int stop(std::chrono::milliseconds grace) {
    reap();
    int running = 0;
    for (auto& c : children_)
      if (!c->reaped) {
        ::kill(c->pid, SIGTERM);
        ++running;
      }
    const auto end = Clock::now() + grace;
    while (Clock::now() < end && !all_reaped()) {
      reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (auto& c : children_)
      if (!c->reaped) {
        std::fprintf(stderr, "zenflow up: %s (pid %d) still running after %.0f s: SIGKILL\n", c->name.c_str(),
                     static_cast<int>(c->pid), double(grace.count()) / 1000);
        ::kill(-c->pid, SIGKILL);
        ::kill(c->pid, SIGKILL);
      }
    while (!all_reaped()) {
      reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return running;
  }

  const std::vector<std::unique_ptr<Child>>& children() const { return children_; }

 private:
  bool all_reaped() const {
    for (const auto& c : children_)
      if (!c->reaped) return false;
    return true;
  }
  fs::path dir_;
  std::vector<std::unique_ptr<Child>> children_;
};

// Thrown while starting: what did not come up, with the tail of its log.
struct NotReady : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Polls `done` every 50 ms until it is true; throws NotReady when `child` exits first, when
// the deadline passes, or when a stop signal arrives.
void wait_for(const std::string& what, Stack& stack, const Child* child, Clock::time_point deadline,
              const std::function<bool()>& done) {
  for (;;) {
    if (done()) return;
    for (Child* c : stack.reap())
      throw NotReady(c->name + " exited with status " + std::to_string(c->status) + " before " + what + "; " +
                     c->log.string() + ":\n" + tail_lines(read_text(c->log), 15));
    if (g_stop_signal) throw NotReady("interrupted while waiting for " + what);
    if (Clock::now() > deadline) {
      std::string msg = "timed out waiting for " + what;
      if (child) msg += "; " + child->log.string() + ":\n" + tail_lines(read_text(child->log), 15);
      throw NotReady(msg);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The shipped deploy/prometheus (rules, scrape jobs): beside the sources this binary was built
// from, as the pricing catalog (/opt/zenflow in the container image).
fs::path prometheus_dir() { return fs::path(ZENFLOW_SOURCE_DIR) / "deploy" / "prometheus"; }

// deploy/prometheus/prometheus.yml for this stack: its rule files by absolute path, its
// zenflow-coordinator and zenflow-worker jobs (settings kept) with static targets on the
// stack's metrics ports, every 5 s (the shipped 15 s makes a local stack slow to show data).
std::string prometheus_config(int coordinator_port, const std::vector<int>& worker_ports,
                              const std::vector<int>& node_ports) {
  const fs::path src = prometheus_dir();
  YAML::Node config = YAML::LoadFile((src / "prometheus.yml").string());
  config["global"]["scrape_interval"] = "5s";
  config["global"]["evaluation_interval"] = "5s";
  config["global"]["scrape_timeout"] = "4s";
  YAML::Node rules(YAML::NodeType::Sequence);
  for (const YAML::Node& r : config["rule_files"]) rules.push_back((src / r.as<std::string>()).string());
  config["rule_files"] = rules;
  YAML::Node jobs(YAML::NodeType::Sequence);
  for (const YAML::Node& job : config["scrape_configs"]) {
    const std::string name = job["job_name"].as<std::string>();
    std::vector<int> ports;
    if (name == "zenflow-coordinator")
      ports = {coordinator_port};
    else if (name == "zenflow-worker")
      ports = worker_ports;
    else if (name == "zenflow-optimizer")
      ports = node_ports;
    if (ports.empty()) continue;  // zenflow-run: no local runs here
    YAML::Node j = YAML::Clone(job);
    j.remove("file_sd_configs");
    j.remove("static_configs");
    YAML::Node targets;
    for (int p : ports) targets["targets"].push_back("127.0.0.1:" + std::to_string(p));
    j["static_configs"].push_back(targets);
    jobs.push_back(j);
  }
  config["scrape_configs"] = jobs;
  YAML::Emitter out;
  out << config;
  return std::string(out.c_str()) + "\n";
}

fs::path default_dir() {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  return fs::current_path() / ("zenflow-up-" + std::string(stamp));
}

// The --set of the printed submit lines: the example trains into DIR/runs/<name>, the
// stack's own directory, not the runs/ of the directory `zenflow submit` is typed in (often
// the checkout, where a finished `zenflow run` of the same example would leave the job
// nothing to do). "" when the example cannot be read.
std::string example_checkpoint_set(const fs::path& dir, const fs::path& example) {
  try {
    const JobSpec spec = parse_job_spec(read_text(example), {}, example.parent_path().string());
    return "checkpoint.dir=" + (dir / "runs" / spec.name).string();
  } catch (const std::exception&) {
    return "";
  }
}

// What the workers' job specs may read and write: the stack's directory, the current one,
// the checkout with every path its example names (when `example` exists, the job printed as
// the submit line, with `example_set`), then `extra`.
std::vector<std::string> worker_roots(const fs::path& dir, const fs::path& example, const std::string& example_set,
                                      const std::vector<std::string>& extra) {
  std::vector<std::string> roots = {dir.string(), fs::current_path().string()};
  auto covered = [&](const std::string& p) {
    return std::any_of(roots.begin(), roots.end(), [&](const std::string& r) { return path_within(p, r); });
  };
  if (fs::exists(example)) {
    roots.push_back(fs::path(ZENFLOW_SOURCE_DIR).lexically_normal().string());
    try {
      std::vector<std::string> sets;
      if (!example_set.empty()) sets.push_back(example_set);
      const JobSpec spec = parse_job_spec(read_text(example), sets, example.parent_path().string());
      for (const auto& [key, path] : confined_paths(spec))
        if (!covered(path)) roots.push_back(fs::path(path).lexically_normal().string());
    } catch (const std::exception&) {
      // An example this build cannot read: the checkout alone.
    }
  }
  for (const std::string& r : extra) roots.push_back(fs::absolute(r).lexically_normal().string());
  return roots;
}

int up(const UpArgs& a) {
  const auto t0 = Clock::now();
  const fs::path bin = self_dir();
  const fs::path coordinator_bin = bin / "zenflow-coordinator", worker_bin = bin / "zenflow-worker",
                 optimizer_bin = bin / "zenflow-optimizer", zenflow_bin = bin / "zenflow";
  for (const fs::path& b : {coordinator_bin, worker_bin}) {
    if (::access(b.c_str(), X_OK) != 0) {
      std::cerr << "zenflow up: " << b.string() << " is not an executable (it is built beside zenflow)\n";
      return kExitBadInput;
    }
  }
  if (a.optimizer_nodes > 0 && ::access(optimizer_bin.c_str(), X_OK) != 0) {
    std::cerr << "zenflow up: --optimizer-nodes " << a.optimizer_nodes << ": " << optimizer_bin.string()
              << " is not an executable (build the zenflow-optimizer target)\n";
    return kExitBadInput;
  }
  std::string prometheus_bin;
  if (a.prometheus) {
    prometheus_bin = on_path("prometheus");
    if (prometheus_bin.empty()) {
      std::cerr << "zenflow up: --prometheus: no prometheus on PATH (Debian: apt-get install prometheus, or "
                   "bash scripts/install-deps.sh --test-tools)\n";
      return kExitBadInput;
    }
    if (!fs::exists(prometheus_dir() / "prometheus.yml")) {
      std::cerr << "zenflow up: --prometheus: " << (prometheus_dir() / "prometheus.yml").string()
                << " not found\n";
      return kExitBadInput;
    }
  }

  const fs::path dir = fs::absolute(a.dir.empty() ? default_dir() : fs::path(a.dir));
  std::error_code ec;
  fs::create_directories(dir / "logs", ec);
  if (ec) {
    std::cerr << "zenflow up: cannot create " << (dir / "logs").string() << ": " << ec.message() << "\n";
    return kExitBadInput;
  }
  if (fs::exists(dir / "up.json")) {
    std::cerr << "zenflow up: " << dir.string() << " already holds a stack (up.json); pass a new --dir\n";
    return kExitBadInput;
  }
  const fs::path example = fs::path(ZENFLOW_SOURCE_DIR) / "examples" / "tiny.yaml";
  const std::string example_set = fs::exists(example) ? example_checkpoint_set(dir, example) : "";
  const std::vector<std::string> roots = worker_roots(dir, example, example_set, a.allowed_roots);
  const fs::path admin_token = dir / "admin.token", worker_token = dir / "worker.token",
                 optimizer_token = dir / "optimizer.token";
  write_text_atomically(admin_token, rpc::random_token() + "\n", 0600);
  write_text_atomically(worker_token, rpc::random_token() + "\n", 0600);
  if (a.optimizer_nodes > 0) write_text_atomically(optimizer_token, rpc::random_token() + "\n", 0600);

  // Ctrl-C and SIGTERM stop the stack; the children restore the defaults before exec.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(a.grace_s * 1000));
  const auto deadline = t0 + std::chrono::milliseconds(static_cast<int64_t>(a.ready_timeout_s * 1000));
  Stack stack(dir);
  Child* coordinator = nullptr;
  std::vector<Child*> workers, nodes;
  Child* prometheus = nullptr;
  try {
    // Every fork happens before the first gRPC call (no gRPC threads exist at fork time).
    Child cc{"coordinator", "coordinator"};
    cc.metrics_port = distributed::find_free_port();
    coordinator = &stack.start(
        cc, {coordinator_bin.string(), "--listen", "127.0.0.1:0", "--db", (dir / "coordinator.db").string(),
             "--admin-token-file", admin_token.string(), "--worker-token-file", worker_token.string(),
             "--metrics-port", std::to_string(cc.metrics_port)});
    const std::regex listening("listening on (127\\.0\\.0\\.1:[0-9]+)");
    wait_for("the coordinator's address", stack, coordinator, deadline, [&] {
      std::smatch m;
      const std::string log = read_text(coordinator->log);
      if (!std::regex_search(log, m, listening)) return false;
      coordinator->address = m[1].str();
      return true;
    });
    // Workers get a shorter stop grace than ours, so that a job checkpoints before our SIGKILL.
    const std::string worker_grace = std::to_string(std::max(1.0, a.grace_s / 2));
    for (int i = 1; i <= a.workers; ++i) {
      Child wc{"w" + std::to_string(i), "worker"};
      wc.metrics_port = distributed::find_free_port();
      const fs::path work = dir / ("work-" + wc.name);
      std::vector<std::string> argv = {worker_bin.string(),
                                       "--coordinator",
                                       coordinator->address,
                                       "--token-file",
                                       worker_token.string(),
                                       "--work-dir",
                                       work.string(),
                                       "--name",
                                       wc.name,
                                       "--cpu-only",
                                       "--cpu-slots",
                                       "1",
                                       "--metrics-port",
                                       std::to_string(wc.metrics_port),
                                       "--trainer",
                                       zenflow_bin.string(),
                                       "--stop-grace",
                                       worker_grace};
      for (const std::string& root : roots) argv.insert(argv.end(), {"--allowed-root", root});
      workers.push_back(&stack.start(wc, argv));
    }
    for (int i = 1; i <= a.optimizer_nodes; ++i) {
      Child nc{"optimizer-" + std::to_string(i), "optimizer"};
      nc.metrics_port = distributed::find_free_port();
      const fs::path port_file = dir / (nc.name + ".port");
      // Registered with the coordinator (role optimizer), so `zenflow workers` lists them.
      nodes.push_back(&stack.start(
          nc, {optimizer_bin.string(), "--listen", "127.0.0.1:0", "--port-file", port_file.string(), "--token-file",
               optimizer_token.string(), "--metrics-port", std::to_string(nc.metrics_port), "--coordinator",
               coordinator->address, "--worker-token-file", worker_token.string(), "--name", nc.name}));
    }
    if (a.prometheus) {
      std::vector<int> worker_ports;
      for (const Child* w : workers) worker_ports.push_back(w->metrics_port);
      std::vector<int> node_ports;
      for (const Child* n : nodes) node_ports.push_back(n->metrics_port);
      fs::create_directories(dir / "prometheus");
      const fs::path config = dir / "prometheus" / "prometheus.yml";
      write_text_atomically(config, prometheus_config(coordinator->metrics_port, worker_ports, node_ports), 0644);
      Child pc{"prometheus", "prometheus"};
      pc.metrics_port = distributed::find_free_port();
      pc.address = "127.0.0.1:" + std::to_string(pc.metrics_port);
      prometheus = &stack.start(pc, {prometheus_bin, "--config.file=" + config.string(),
                                     "--storage.tsdb.path=" + (dir / "prometheus" / "data").string(),
                                     "--web.listen-address=" + pc.address, "--web.enable-lifecycle"});
    }

    // Readiness.
    auto channel = rpc::make_channel(coordinator->address);
    auto health = grpc::health::v1::Health::NewStub(channel);
    wait_for("the coordinator to be SERVING", stack, coordinator, deadline, [&] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      grpc::health::v1::HealthCheckResponse resp;
      return health->Check(&ctx, grpc::health::v1::HealthCheckRequest{}, &resp).ok() &&
             resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    });
    const std::string token = rpc::read_token_file(admin_token.string());
    auto jobs = v1::JobService::NewStub(channel);
    std::string missing;
    std::vector<Child*> registering = workers;  // trainers and optimizer nodes
    registering.insert(registering.end(), nodes.begin(), nodes.end());
    wait_for("the workers and nodes to register", stack, registering.empty() ? nullptr : registering.front(), deadline, [&] {
      grpc::ClientContext ctx;
      rpc::prepare_call(ctx, token, std::chrono::seconds(2));
      v1::ListWorkersResponse resp;
      if (!jobs->ListWorkers(&ctx, v1::ListWorkersRequest{}, &resp).ok()) return false;
      missing.clear();
      for (const Child* w : registering) {
        bool ready = false;
        for (const v1::WorkerStatus& s : resp.workers())
          ready |= s.name() == w->name && s.state() == v1::READY;
        if (!ready) missing += " " + w->name;
      }
      return missing.empty();
    });
    for (Child* n : nodes) {
      const fs::path port_file = dir / (n->name + ".port");
      // A port number, the same in two reads 50 ms apart (a write in progress is not taken).
      std::string previous;
      wait_for(n->name + "'s port file", stack, n, deadline, [&] {
        const std::string text = read_text(port_file);
        const int port = std::atoi(text.c_str());
        const bool stable = !text.empty() && text == previous;
        previous = text;
        if (!stable || port <= 0 || port > 65535) return false;
        n->address = "127.0.0.1:" + std::to_string(port);
        return true;
      });
    }
    if (prometheus)
      wait_for("Prometheus /-/ready", stack, prometheus, deadline,
               [&] { return http_status(prometheus->metrics_port, "/-/ready") == 200; });
  } catch (const NotReady& e) {
    std::cerr << "zenflow up: " << e.what() << "\n";
    stack.stop(grace);
    std::cerr << "zenflow up: stopped; logs in " << (dir / "logs").string() << "\n";
    return g_stop_signal ? kExitOk : kExitFailure;
  }
  const double ready_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // up.json: what tests and scripts need, written whole once everything is ready.
  nlohmann::json j;
  j["dir"] = dir.string();
  j["pid"] = ::getpid();
  j["ready_seconds"] = ready_s;
  j["admin_token_file"] = admin_token.string();
  j["worker_token_file"] = worker_token.string();
  j["coordinator"] = {{"address", coordinator->address},
                      {"pid", coordinator->pid},
                      {"metrics_port", coordinator->metrics_port},
                      {"log", coordinator->log.string()}};
  j["workers"] = nlohmann::json::array();
  for (const Child* w : workers)
    j["workers"].push_back({{"name", w->name},
                            {"pid", w->pid},
                            {"metrics_port", w->metrics_port},
                            {"work_dir", (dir / ("work-" + w->name)).string()},
                            {"log", w->log.string()}});
  j["optimizer_nodes"] = nlohmann::json::array();
  for (const Child* n : nodes)
    j["optimizer_nodes"].push_back(
        {{"name", n->name}, {"pid", n->pid}, {"address", n->address}, {"metrics_port", n->metrics_port},
         {"log", n->log.string()}});
  j["optimizer_token_file"] = nodes.empty() ? "" : optimizer_token.string();
  j["allowed_roots"] = roots;
  j["prometheus"] = prometheus ? nlohmann::json{{"url", "http://" + prometheus->address},
                                                {"pid", prometheus->pid},
                                                {"config", (dir / "prometheus" / "prometheus.yml").string()},
                                                {"log", prometheus->log.string()}}
                               : nlohmann::json(nullptr);
  write_text_atomically(dir / "up.json", j.dump(2) + "\n", 0644);

  const std::string remote =
      " --coordinator " + coordinator->address + " --token-file " + admin_token.string();
  const std::string job = !fs::exists(example) ? "JOB.yaml"
                          : example.string() + (example_set.empty() ? "" : " --set " + example_set);
  std::printf("zenflow up: ready in %.1f s: coordinator, %d worker%s, %d optimizer node%s%s (%s/up.json)\n",
              ready_s, a.workers, a.workers == 1 ? "" : "s", a.optimizer_nodes,
              a.optimizer_nodes == 1 ? "" : "s", prometheus ? ", prometheus" : "", dir.string().c_str());
  std::printf("  %-12s %-21s pid %-7d metrics http://127.0.0.1:%d/metrics\n", "coordinator",
              coordinator->address.c_str(), static_cast<int>(coordinator->pid), coordinator->metrics_port);
  for (const Child* w : workers)
    std::printf("  %-12s %-21s pid %-7d metrics http://127.0.0.1:%d/metrics\n", ("worker " + w->name).c_str(),
                "1 cpu slot", static_cast<int>(w->pid), w->metrics_port);
  for (const Child* n : nodes)
    std::printf("  %-12s %-21s pid %d\n", n->name.c_str(), n->address.c_str(), static_cast<int>(n->pid));
  if (prometheus)
    std::printf("  %-12s %-21s pid %-7d http://%s (targets: /targets)\n", "prometheus",
                prometheus->address.c_str(), static_cast<int>(prometheus->pid), prometheus->address.c_str());
  std::string listed;
  for (const std::string& r : roots) listed += (listed.empty() ? "" : ", ") + r;
  std::printf(
      "Job specs may read and write under %s (the workers' --allowed-root; add with --allowed-root)\n",
      listed.c_str());
  std::printf("Submit a job:\n  %s submit %s --wait%s\n", zenflow_bin.c_str(), job.c_str(), remote.c_str());
  std::printf(
      "or, for every verb (jobs, status, logs, workers, cancel):\n  export ZENFLOW_COORDINATOR=%s "
      "ZENFLOW_TOKEN_FILE=%s\n",
      coordinator->address.c_str(), admin_token.c_str());
  if (!nodes.empty()) {
    std::string addresses;
    for (const Child* n : nodes) addresses += (addresses.empty() ? "" : ",") + n->address;
    std::printf(
        "On the optimizer nodes:\n  %s submit %s --wait%s \\\n    --set 'optimizer.host.addresses=[%s]' "
        "--set optimizer.host.token_file=%s\n",
        zenflow_bin.c_str(), job.c_str(), remote.c_str(), addresses.c_str(), optimizer_token.c_str());
  }
  std::printf("Logs: %s/logs/. Ctrl-C stops everything.\n", dir.string().c_str());
  std::fflush(stdout);

  while (!g_stop_signal) {
    for (Child* c : stack.reap())
      std::fprintf(stderr, "zenflow up: %s (pid %d) exited with status %d; see %s\n", c->name.c_str(),
                   static_cast<int>(c->pid), c->status, c->log.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const auto stop_t0 = Clock::now();
  std::fprintf(stderr, "zenflow up: %s: stopping\n", g_stop_signal == SIGINT ? "interrupted" : "terminated");
  const int stopped = stack.stop(grace);
  std::fprintf(stderr, "zenflow up: stopped %d process%s in %.1f s; logs and the database stay in %s\n",
               stopped, stopped == 1 ? "" : "es",
               std::chrono::duration<double>(Clock::now() - stop_t0).count(), dir.string().c_str());
  return kExitOk;
}

CommandRegistrar reg(25, [](CommandContext& ctx) {
  auto a = std::make_shared<UpArgs>();
  CLI::App* cmd = ctx.root->add_subcommand(
      "up", "Run a coordinator, CPU workers, optimizer nodes and Prometheus on this machine until Ctrl-C");
  cmd->add_option("--workers", a->workers, "CPU workers (1 slot each)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--optimizer-nodes", a->optimizer_nodes, "zenflow-optimizer nodes")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_flag("--prometheus", a->prometheus,
                "Also run Prometheus (on PATH) scraping every process, with zenflow's rules");
  cmd->add_option("--dir", a->dir,
                  "Directory for tokens, logs, the database and up.json (default ./zenflow-up-TIMESTAMP)");
  cmd->add_option(
      "--allowed-root", a->allowed_roots,
      "Another directory the workers' job specs may read or write (repeatable; they always may use "
      "--dir, the current directory and the checkout with its example's data; / confines nothing)");
  cmd->add_option("--ready-timeout", a->ready_timeout_s, "Seconds to wait for everything to be ready")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--grace", a->grace_s, "Seconds between SIGTERM and SIGKILL when stopping")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->callback([a, &ctx] {
    try {
      ctx.exit_code = up(*a);
    } catch (const std::exception& e) {
      std::cerr << "zenflow up: " << e.what() << "\n";
      ctx.exit_code = kExitFailure;
    }
  });
});

}  // namespace
}  // namespace zenflow::cli
