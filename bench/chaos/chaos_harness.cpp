// The fault-injection harness (chaos_harness.h).
#include "bench/chaos/chaos_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "bench/chaos/child_process.h"
#include "bench/chaos/proc_sampler.h"
#include "bench/chaos/tcp_proxy.h"
#include "common/rpc/auth.h"
#include "common/rpc/rpc.h"
#include "worker/distributed/ports.h"
#include "common/utf8.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "zenflow/v1/jobs.grpc.pb.h"

extern char** environ;

namespace zenflow::chaos {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tail(const std::string& text, size_t bytes) {
  return text.size() <= bytes ? text : text.substr(text.size() - bytes);
}

// Runs argv to completion (bounded), stdout into *out; returns the exit status or -1.
int run_to_completion(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      const fs::path& log, std::string* out, int64_t timeout_ms) {
  const fs::path out_file = log.string() + ".stdout";
  std::vector<std::string> args = argv, envs = env;
  std::vector<char*> a, e;
  for (std::string& s : args) a.push_back(s.data());
  a.push_back(nullptr);
  for (std::string& s : envs) e.push_back(s.data());
  e.push_back(nullptr);
  const int out_fd = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out_fd < 0 || err_fd < 0) throw std::runtime_error("cannot open " + log.string());
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    ::execve(a[0], a.data(), e.data());
    ::_exit(127);
  }
  ::close(out_fd);
  ::close(err_fd);
  if (pid < 0) return -1;
  const auto end = Clock::now() + milliseconds(timeout_ms);
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) == 0) {
    if (Clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  *out = read_text(out_file);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// The parent pid of `pid` from /proc/PID/stat (0 when gone).
int parent_of(int pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  int ppid = 0;
  char state = 0;
  std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid);
  return ppid;
}

// The final_loss of the newest "summary" record in a checkpoint directory's steps.jsonl
// (what the ranks themselves ended with), or "" when there is none.
std::string ranks_final_loss(const fs::path& ckpt) {
  std::ifstream in(ckpt / "steps.jsonl");
  std::string found;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == "summary" && j["summary"].contains("final_loss")) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", j["summary"]["final_loss"].get<double>());
      found = buf;
    }
  }
  return found;
}

bool is_terminal(v1::JobState s) { return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED; }

std::string errno_text(int e) { return std::string(std::strerror(e)); }

// One job of the stream: its spec varies with its index (steps, optimizer node).
struct StreamJob {
  int index = 0;
  std::string request_id;
  int64_t steps = 0;
  bool node = false;
  std::string spec;
  bool acknowledged = false;
  std::string job_id;  // from the acknowledged answer
};

class Run {
 public:
  Run(const ChaosOptions& o, ChaosReport& r) : o_(o), r_(r), checker_(o.lease_ms + o.running_slack_ms) {}
  ~Run() { teardown(); }
  void execute();

 private:
  void log(const std::string& line);
  int64_t now_ms() const { return std::chrono::duration_cast<milliseconds>(Clock::now() - t0_).count(); }
  void sleep_until_ms(int64_t t) {
    while (now_ms() < t) std::this_thread::sleep_for(milliseconds(std::min<int64_t>(50, t - now_ms())));
  }
  std::vector<std::string> child_env() const;
  std::string spec_text(int index, int64_t steps, bool node, const fs::path& ckpt) const;
  void mount_disks();
  void compute_references();
  void start_cluster();
  void wait_ready();
  void sample_loop();
  void poll_loop();
  void submit_loop();
  void submit(StreamJob& job);
  InjectedFault inject(const Fault& f);
  const RankProcess* pick_rank(int agent, std::vector<RankProcess>& procs);
  void restart_coordinator();
  void verify_end();
  void teardown();
  grpc::Status list_jobs(v1::ListJobsResponse* out, milliseconds deadline);

  const ChaosOptions& o_;
  ChaosReport& r_;
  Clock::time_point t0_ = Clock::now();
  fs::path dir_;
  fs::path bin_;            // the run's own copies of the binaries under test
  bool with_node_ = false;  // an optimizer node runs (asked for, and built)
  std::string admin_token_;
  int coordinator_port_ = 0;
  bool worker_has_drain_flag_ = false;
  std::map<int64_t, double> reference_loss_;  // by steps
  std::unique_ptr<ChildProcess> coordinator_, node_;
  std::vector<std::unique_ptr<ChildProcess>> agents_;
  std::vector<std::unique_ptr<TcpProxy>> proxies_;
  std::vector<fs::path> mounts_;  // tmpfs work dirs that are mounted
  std::string disk_note_;         // why disk faults are skipped ("" when they are not)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;

  std::mutex mu_;  // guards checker_, latest_, stream_
  AttemptInvariants checker_;
  std::map<std::string, v1::JobStatus> latest_;  // by job id, the newest answer
  std::vector<StreamJob> stream_;
  size_t violations_logged_ = 0;

  std::atomic<bool> stop_threads_{false}, submitting_{false};
  std::thread sampler_, poller_, submitter_;
  bool torn_down_ = false;
};

void Run::log(const std::string& line) {
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "[%+9.3fs] ", double(now_ms()) / 1000);
  if (o_.log)
    o_.log(stamp + line);
  else
    std::fprintf(stderr, "chaos: %s%s\n", stamp, line.c_str());
}

std::vector<std::string> Run::child_env() const {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind("ZENFLOW_", 0) == 0 || kv.rfind("UCX_TLS=", 0) == 0 || kv.rfind("UCX_NET_DEVICES=", 0) == 0)
      continue;
    env.push_back(kv);
  }
  env.push_back("UCX_TLS=tcp");  // the optimizer node over loopback TCP, as tests/test_service.cpp
  env.push_back("UCX_NET_DEVICES=lo");
  return env;
}

std::string Run::spec_text(int index, int64_t steps, bool node, const fs::path& ckpt) const {
  return "name: chaos-" + std::to_string(index) +
         "\nmodel: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4,\n"
         "        intermediate_size: 64, max_position_embeddings: 32}}\n"
         "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
         "train: {steps: " +
         std::to_string(steps) +
         ", micro_batch: 2, seq_len: 16, lr: 1.0e-3, warmup_steps: 1, device: cpu}\n"
         "optimizer: {mode: zenflow, " +
         std::string(node ? "host: {nodes: 1}, " : "") +
         "zenflow: {update_interval: 2, full_warm_up_rounds: 0, min_split_numel: 512}}\n"
         "checkpoint: {dir: " +
         ckpt.string() +
         ", every_steps: 2, keep: 2}\n"
         "resources: {workers: 1, gpus_per_worker: 1, max_restarts: 500}\n";
}

// Each agent's work dir on a tmpfs of its own, so that a disk fault fills one agent's disk.
void Run::mount_disks() {
  for (int i = 0; i < o_.agents; ++i) {
    const fs::path work = dir_ / ("work-w" + std::to_string(i + 1));
    fs::create_directories(work);
    if (!disk_note_.empty()) continue;
    if (::mount("tmpfs", work.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=24m,mode=0755") != 0) {
      disk_note_ =
          "disk_full faults skipped: mount -t tmpfs at " + work.string() + " failed: " + errno_text(errno);
      continue;
    }
    mounts_.push_back(work);
  }
  if (!disk_note_.empty()) {
    log(disk_note_);
    r_.notes["disk_full"] = disk_note_;
  }
}

// The final loss of each step count, from one uninterrupted `zenflow run` (CPU runs resume
// bit-exactly, and a remote optimizer node is bitwise the in-process one).
void Run::compute_references() {
  for (int64_t steps : {40, 60, 80}) {
    const fs::path spec = dir_ / ("reference-" + std::to_string(steps) + ".yaml");
    std::ofstream(spec) << spec_text(-1, steps, false, dir_ / ("reference-ckpt-" + std::to_string(steps)));
    std::string out;
    const int rc = run_to_completion(
        {(bin_ / "zenflow").string(), "run", spec.string(), "--quiet", "--json"}, child_env(),
        dir_ / "logs" / ("reference-" + std::to_string(steps) + ".log"), &out, 300'000);
    const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
    if (rc != 0 || !j.is_object() || !j.contains("final_loss"))
      throw std::runtime_error(
          "the reference run of " + spec.string() + " exited " + std::to_string(rc) +
          " without a final_loss; stdout: " + tail(out, 400) +
          "\nlog: " + tail(read_text(dir_ / "logs" / ("reference-" + std::to_string(steps) + ".log")), 800));
    reference_loss_[steps] = j["final_loss"].get<double>();
    char buf[96];
    std::snprintf(buf, sizeof buf, "reference: %lld steps -> final loss %.17g", static_cast<long long>(steps),
                  reference_loss_[steps]);
    log(buf);
  }
}

void Run::start_cluster() {
  const fs::path bin = bin_;
  const fs::path admin_token = dir_ / "admin.token", worker_token = dir_ / "worker.token";
  admin_token_ = rpc::random_token(24);
  std::ofstream(admin_token) << admin_token_ << "\n";
  std::ofstream(worker_token) << rpc::random_token(24) << "\n";
  ::chmod(admin_token.c_str(), 0600);
  ::chmod(worker_token.c_str(), 0600);
  {
    std::string help;
    run_to_completion({(bin / "zenflow-worker").string(), "--help"}, child_env(),
                      dir_ / "logs" / "worker-help.log", &help, 10'000);
    worker_has_drain_flag_ = help.find("--disconnect-drain") != std::string::npos;
    if (!worker_has_drain_flag_)
      r_.notes["disconnect_drain"] = "zenflow-worker has no --disconnect-drain yet: not passed";
  }
  coordinator_port_ = distributed::find_free_port();
  const std::string coordinator = "127.0.0.1:" + std::to_string(coordinator_port_);
  coordinator_ = std::make_unique<ChildProcess>(
      "coordinator",
      std::vector<std::string>{(bin / "zenflow-coordinator").string(), "--listen", coordinator, "--db",
                               (dir_ / "coordinator.db").string(), "--admin-token-file", admin_token.string(),
                               "--worker-token-file", worker_token.string(), "--heartbeat-interval-ms",
                               std::to_string(o_.heartbeat_interval_ms), "--lease-ms",
                               std::to_string(o_.lease_ms)},
      child_env(), dir_ / "logs" / "coordinator.log");
  coordinator_->start();
  for (int i = 0; i < o_.agents; ++i) {
    proxies_.push_back(std::make_unique<TcpProxy>(coordinator_port_));
    const std::string name = "w" + std::to_string(i + 1);
    std::vector<std::string> argv = {(bin / "zenflow-worker").string(),
                                     "--coordinator",
                                     "127.0.0.1:" + std::to_string(proxies_.back()->port()),
                                     "--token-file",
                                     worker_token.string(),
                                     "--work-dir",
                                     (dir_ / ("work-" + name)).string(),
                                     "--name",
                                     name,
                                     "--cpu-slots",
                                     "1",
                                     "--cpu-only",
                                     "--no-profile",
                                     "--trainer",
                                     (bin / "zenflow").string(),
                                     "--stop-grace",
                                     "3",
                                     "--disconnected-grace",
                                     std::to_string(o_.agent_disconnected_grace_s)};
    // What the jobs read and write: checkpoints under the run's directory, the license texts.
    argv.insert(argv.end(),
                {"--allowed-root", (dir_ / "ckpt").string(), "--allowed-root", "/usr/share/common-licenses"});
    if (worker_has_drain_flag_) {
      argv.push_back("--disconnect-drain");
      argv.push_back("2");
    }
    agents_.push_back(
        std::make_unique<ChildProcess>(name, std::move(argv), child_env(), dir_ / "logs" / (name + ".log")));
    agents_.back()->start();
  }
  if (with_node_) {
    node_ = std::make_unique<ChildProcess>(
        "node-1",
        std::vector<std::string>{(bin / "zenflow-optimizer").string(), "--listen", "127.0.0.1:0",
                                 "--coordinator", coordinator, "--worker-token-file", worker_token.string(),
                                 "--name", "node-1", "--threads", "1", "--memory-limit", "1G"},
        child_env(), dir_ / "logs" / "node-1.log");
    node_->start();
  }
  // The ranks reach the node at the address it registers: a TCP proxy cannot carry UCX
  // (its tcp lanes connect to the addresses exchanged at wire-up, not to the listener).
  r_.notes["node_link"] =
      "ranks -> optimizer node is not proxied: UCX's tcp data lanes connect to the addresses exchanged at "
      "wire-up, "
      "past any TCP proxy on the listener; the node is killed and stopped instead";
  channel_ = rpc::make_channel(coordinator);
  jobs_ = v1::JobService::NewStub(channel_);
}

void Run::wait_ready() {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  std::string missing = "the coordinator";
  while (Clock::now() < deadline) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, admin_token_, milliseconds(2000));
    v1::ListWorkersResponse resp;
    if (jobs_->ListWorkers(&ctx, v1::ListWorkersRequest{}, &resp).ok()) {
      missing.clear();
      std::vector<std::string> names;
      for (int i = 0; i < o_.agents; ++i) names.push_back("w" + std::to_string(i + 1));
      if (node_) names.push_back("node-1");
      for (const std::string& n : names) {
        bool ready = false;
        for (const v1::WorkerStatus& w : resp.workers()) ready |= w.name() == n && w.state() == v1::READY;
        if (!ready) missing += " " + n;
      }
      if (missing.empty()) return;
    }
    for (auto* c : std::vector<ChildProcess*>{coordinator_.get(), node_.get()})
      if (c && !c->running())
        throw std::runtime_error(c->name() + " exited (" + std::to_string(c->last_status()) +
                                 ") while starting:\n" + tail(read_text(c->log()), 1500));
    for (auto& a : agents_)
      if (!a->running())
        throw std::runtime_error(a->name() + " exited (" + std::to_string(a->last_status()) +
                                 ") while starting:\n" + tail(read_text(a->log()), 1500));
    std::this_thread::sleep_for(milliseconds(100));
  }
  throw std::runtime_error("not ready after 90 s: " + missing + "\ncoordinator log:\n" +
                           tail(read_text(coordinator_->log()), 1500));
}

void Run::sample_loop() {
  const std::string marker = dir_.string() + "/";
  while (!stop_threads_) {
    const auto next = Clock::now() + milliseconds(50);
    const std::vector<RankProcess> procs = sample_rank_processes(marker);
    {
      std::lock_guard<std::mutex> lock(mu_);
      checker_.observe_processes(now_ms(), procs);
      for (; violations_logged_ < checker_.violations().size(); ++violations_logged_) {
        const Violation& v = checker_.violations()[violations_logged_];
        log("VIOLATION " + v.kind + ": " + v.evidence);
      }
    }
    std::this_thread::sleep_until(next);
  }
}

grpc::Status Run::list_jobs(v1::ListJobsResponse* out, milliseconds deadline) {
  grpc::ClientContext ctx;
  rpc::prepare_call(ctx, admin_token_, deadline);
  v1::ListJobsRequest req;
  req.set_page_size(1000);
  return jobs_->ListJobs(&ctx, req, out);
}

void Run::poll_loop() {
  while (!stop_threads_) {
    const auto next = Clock::now() + milliseconds(250);
    v1::ListJobsResponse resp;
    const grpc::Status s = list_jobs(&resp, milliseconds(1000));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (s.ok()) {
        std::set<std::string> running;
        for (const v1::JobStatus& j : resp.jobs()) {
          latest_[j.id()] = j;
          if (j.state() == v1::RUNNING) running.insert(j.id());
        }
        checker_.observe_running_jobs(now_ms(), running);
        for (; violations_logged_ < checker_.violations().size(); ++violations_logged_) {
          const Violation& v = checker_.violations()[violations_logged_];
          log("VIOLATION " + v.kind + ": " + v.evidence);
        }
      } else {
        checker_.observe_coordinator_unreachable(now_ms());
      }
    }
    std::this_thread::sleep_until(next);
  }
}

// SubmitJob with the job's request_id until it is answered OK, retried while the
// coordinator is unreachable (bounded: 60 s).
void Run::submit(StreamJob& job) {
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  int tries = 0;
  while (Clock::now() < give_up && !stop_threads_) {
    ++tries;
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, admin_token_, milliseconds(3000));
    v1::SubmitJobRequest req;
    req.set_spec_yaml(job.spec);
    req.set_request_id(job.request_id);
    v1::SubmitJobResponse resp;
    const grpc::Status s = jobs_->SubmitJob(&ctx, req, &resp);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      job.acknowledged = true;
      job.job_id = resp.job().id();
      log("submitted " + job.request_id + " -> " + job.job_id + " (" + std::to_string(job.steps) + " steps" +
          (job.node ? ", optimizer node" : "") + ", try " + std::to_string(tries) + ")");
      return;
    }
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
        s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
      log("submit " + job.request_id + " refused: " + rpc::describe(s));
      std::lock_guard<std::mutex> lock(mu_);
      r_.notes["submit_refused_" + job.request_id] = rpc::describe(s);
      return;
    }
    std::this_thread::sleep_for(milliseconds(300));
  }
  log("submit " + job.request_id + " not acknowledged after " + std::to_string(tries) + " tries");
}

void Run::submit_loop() {
  int next_index = 0;
  while (submitting_ && !stop_threads_) {
    int in_flight = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const StreamJob& j : stream_) {
        if (!j.acknowledged) continue;
        const auto it = latest_.find(j.job_id);
        if (it == latest_.end() || !is_terminal(it->second.state())) ++in_flight;
      }
    }
    if (in_flight < o_.max_jobs_in_flight) {
      StreamJob job;
      job.index = next_index++;
      job.request_id = "chaos-" + std::to_string(o_.seed) + "-" + std::to_string(job.index);
      job.steps = 40 + 20 * (job.index % 3);
      job.node = node_ && job.index % 4 == 1;
      job.spec = spec_text(job.index, job.steps, job.node, dir_ / "ckpt" / job.request_id);
      size_t slot;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stream_.push_back(job);
        slot = stream_.size() - 1;
      }
      StreamJob copy = job;
      submit(copy);
      std::lock_guard<std::mutex> lock(mu_);
      stream_[slot] = copy;
    }
    std::this_thread::sleep_for(milliseconds(500));
  }
}

const RankProcess* Run::pick_rank(int agent, std::vector<RankProcess>& procs) {
  std::sort(procs.begin(), procs.end(), [](const RankProcess& a, const RankProcess& b) {
    return std::tie(a.job_id, a.attempt, a.pid) < std::tie(b.job_id, b.attempt, b.pid);
  });
  const pid_t agent_pid = agents_[size_t(agent)]->pid();
  for (const RankProcess& p : procs)
    if (p.live() && parent_of(p.pid) == agent_pid) return &p;
  for (const RankProcess& p : procs)
    if (p.live()) return &p;
  return nullptr;
}

void Run::restart_coordinator() {
  coordinator_->start();  // same database, same port
}

InjectedFault Run::inject(const Fault& f) {
  InjectedFault done;
  done.fault = f;
  done.started_ms = now_ms();
  const int64_t end = done.started_ms + f.duration_ms;
  ChildProcess* agent =
      f.agent >= 0 && f.agent < int(agents_.size()) ? agents_[size_t(f.agent)].get() : nullptr;
  auto pid_text = [](ChildProcess* c) { return c->name() + " pid " + std::to_string(c->pid()); };
  switch (f.kind) {
    case FaultKind::kCoordinatorKill:
      done.detail = pid_text(coordinator_.get());
      coordinator_->kill_now();
      sleep_until_ms(end);
      restart_coordinator();
      done.detail += ", restarted as pid " + std::to_string(coordinator_->pid());
      break;
    case FaultKind::kCoordinatorStop:
      done.detail = pid_text(coordinator_.get());
      coordinator_->signal(SIGSTOP);
      sleep_until_ms(end);
      coordinator_->signal(SIGCONT);
      break;
    case FaultKind::kAgentKill:
      done.detail = pid_text(agent);
      agent->kill_now();
      sleep_until_ms(end);
      agent->start();
      done.detail += ", restarted as pid " + std::to_string(agent->pid());
      break;
    case FaultKind::kAgentStop:
      done.detail = pid_text(agent);
      agent->signal(SIGSTOP);
      sleep_until_ms(end);
      agent->signal(SIGCONT);
      break;
    case FaultKind::kRankKill:
    case FaultKind::kRankStop: {
      std::vector<RankProcess> procs = sample_rank_processes(dir_.string() + "/");
      const RankProcess* p = pick_rank(f.agent, procs);
      if (!p) {
        done.skipped = true;
        done.detail = "no live rank at the time";
        break;
      }
      done.detail =
          "pid " + std::to_string(p->pid) + " job " + p->job_id + " attempt " + std::to_string(p->attempt);
      const int pid = p->pid;
      if (f.kind == FaultKind::kRankKill) {
        ::kill(pid, SIGKILL);
      } else {
        ::kill(pid, SIGSTOP);
        sleep_until_ms(end);
        ::kill(pid, SIGCONT);
      }
      break;
    }
    case FaultKind::kNodeKill:
    case FaultKind::kNodeStop:
      if (!node_) {
        done.skipped = true;
        done.detail = "no optimizer node in this run";
        break;
      }
      done.detail = pid_text(node_.get());
      if (f.kind == FaultKind::kNodeKill) {
        node_->kill_now();
        sleep_until_ms(end);
        node_->start();
        done.detail += ", restarted as pid " + std::to_string(node_->pid());
      } else {
        node_->signal(SIGSTOP);
        sleep_until_ms(end);
        node_->signal(SIGCONT);
      }
      break;
    case FaultKind::kPartitionBlackhole:
    case FaultKind::kPartitionReset: {
      TcpProxy& link = *proxies_[size_t(f.agent)];
      done.detail = agent->name() + " <-> coordinator (proxy port " + std::to_string(link.port()) + ")";
      link.set_mode(f.kind == FaultKind::kPartitionBlackhole ? LinkMode::kBlackhole : LinkMode::kReset);
      sleep_until_ms(end);
      link.set_mode(LinkMode::kForward);
      break;
    }
    case FaultKind::kDiskFull: {
      const fs::path work = dir_ / ("work-" + agent->name());
      if (std::find(mounts_.begin(), mounts_.end(), work) == mounts_.end()) {
        done.skipped = true;
        done.detail = disk_note_;
        break;
      }
      const fs::path fill = work / "chaos-fill";
      const int fd = ::open(fill.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      int64_t written = 0;
      if (fd >= 0) {
        std::vector<char> block(1 << 20, 0);
        for (int i = 0; i < 1024; ++i) {  // at most 1 GiB; the tmpfs holds 24 MiB
          const ssize_t n = ::write(fd, block.data(), block.size());
          if (n <= 0) break;
          written += n;
        }
        ::close(fd);
      }
      done.detail = work.string() + " filled with " + std::to_string(written >> 10) + " KiB";
      sleep_until_ms(end);
      std::error_code ec;
      fs::remove(fill, ec);
      break;
    }
    case FaultKind::kCoordinatorRestartInPartition: {
      TcpProxy& link = *proxies_[size_t(f.agent)];
      link.set_mode(LinkMode::kBlackhole);
      sleep_until_ms(done.started_ms + f.duration_ms / 3);
      done.detail = agent->name() + " partitioned (blackhole); " + pid_text(coordinator_.get()) +
                    " killed at " + std::to_string(now_ms()) + " ms";
      coordinator_->kill_now();
      sleep_until_ms(now_ms() + 1000);
      restart_coordinator();
      done.detail += ", restarted as pid " + std::to_string(coordinator_->pid());
      sleep_until_ms(end);
      link.set_mode(LinkMode::kForward);
      break;
    }
  }
  log(std::string(done.skipped ? "skipped " : "injected ") + describe(f) + ": " + done.detail);
  return done;
}

void Run::execute() {
  const auto wall0 = Clock::now();
  dir_ = fs::absolute(o_.dir);
  if (fs::exists(dir_)) throw std::runtime_error(dir_.string() + " already exists");
  fs::create_directories(dir_ / "logs");
  fs::create_directories(dir_ / "ckpt");
  r_.dir = dir_;
  r_.seed = o_.seed;
  r_.minutes = o_.minutes;
  ScheduleOptions so;
  so.agents = o_.agents;
  r_.schedule = make_schedule(o_.seed, o_.minutes, so);
  {
    std::string text =
        "seed " + std::to_string(o_.seed) + ", " + std::to_string(o_.minutes) + " min, schedule:";
    for (const Fault& f : r_.schedule) text += "\n  " + describe(f);
    log(text);
  }
  // The binaries are copied first: a rebuild of the tree while the run goes on (a relink
  // makes the file vanish for a moment) must not become "cannot exec" faults of its own.
  with_node_ = o_.optimizer_node && fs::exists(o_.bin_dir / "zenflow-optimizer");
  if (o_.optimizer_node && !with_node_)
    r_.notes["optimizer_node"] = "no zenflow-optimizer in " + o_.bin_dir.string() +
                                 " (a build without ZENFLOW_UCX): no node, no node jobs, node faults skipped";
  bin_ = dir_ / "bin";
  fs::create_directories(bin_);
  // zenflow-train too: zenflow runs it for `zenflow run` (client/verbs.h), from beside itself.
  for (const char* b : {"zenflow", "zenflow-train", "zenflow-coordinator", "zenflow-worker", "zenflow-optimizer"}) {
    if (!with_node_ && std::string(b) == "zenflow-optimizer") continue;
    fs::copy_file(o_.bin_dir / b, bin_ / b, fs::copy_options::overwrite_existing);
    fs::permissions(bin_ / b, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  }
  mount_disks();
  compute_references();
  start_cluster();
  wait_ready();
  log("cluster ready: coordinator 127.0.0.1:" + std::to_string(coordinator_port_) + " pid " +
      std::to_string(coordinator_->pid()));
  t0_ = Clock::now();  // the fault phase starts: the schedule's clock
  sampler_ = std::thread([this] { sample_loop(); });
  poller_ = std::thread([this] { poll_loop(); });
  submitting_ = true;
  submitter_ = std::thread([this] { submit_loop(); });
  for (const Fault& f : r_.schedule) {
    sleep_until_ms(f.at_ms);
    r_.injected.push_back(inject(f));
  }
  sleep_until_ms(static_cast<int64_t>(o_.minutes * 60'000));
  submitting_ = false;
  submitter_.join();
  log("fault phase over; draining");
  // Drain: every acknowledged job ends (bounded).
  const auto drain_end = Clock::now() + milliseconds(static_cast<int64_t>(o_.drain_timeout_s * 1000));
  while (Clock::now() < drain_end) {
    bool all_done = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const StreamJob& j : stream_) {
        if (!j.acknowledged) continue;
        const auto it = latest_.find(j.job_id);
        all_done &= it != latest_.end() && is_terminal(it->second.state());
      }
    }
    if (all_done) break;
    std::this_thread::sleep_for(milliseconds(250));
  }
  verify_end();
  r_.wall_seconds = std::chrono::duration<double>(Clock::now() - wall0).count();
}

void Run::verify_end() {
  // Nothing left running: the ranks of ended jobs exit within a few seconds.
  const auto quiet_end = Clock::now() + std::chrono::seconds(10);
  std::vector<RankProcess> left;
  while (Clock::now() < quiet_end) {
    left.clear();
    for (const RankProcess& p : sample_rank_processes(dir_.string() + "/")) {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = latest_.find(p.job_id);
      if (it != latest_.end() && is_terminal(it->second.state())) left.push_back(p);
    }
    if (left.empty()) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  std::vector<Violation> found;
  for (const RankProcess& p : left)
    found.push_back({"left_running", now_ms(), p.job_id,
                     "pid " + std::to_string(p.pid) + " of job " + p.job_id + " attempt " +
                         std::to_string(p.attempt) + " (state " + p.state +
                         ") still exists 10 s after its job ended"});
  // The final answer, straight from the coordinator (retried while it restarts).
  v1::ListJobsResponse resp;
  bool answered = false;
  for (int i = 0; i < 60 && !answered; ++i) {
    answered = list_jobs(&resp, milliseconds(2000)).ok();
    if (!answered) std::this_thread::sleep_for(milliseconds(500));
  }
  stop_threads_ = true;
  if (sampler_.joinable()) sampler_.join();
  if (poller_.joinable()) poller_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (!answered) {
    found.push_back(
        {"coordinator_unreachable_at_end", now_ms(), "", "ListJobs failed for 30 s after the drain"});
  } else {
    std::map<std::string, std::vector<const v1::JobStatus*>> by_request;
    for (const v1::JobStatus& j : resp.jobs()) by_request[j.request_id()].push_back(&j);
    for (const StreamJob& s : stream_) {
      const auto& jobs = by_request[s.request_id];
      std::string ids;
      for (const v1::JobStatus* j : jobs) ids += " " + j->id();
      if (s.acknowledged) {
        ++r_.jobs_submitted;
        if (jobs.empty())
          found.push_back({"lost_submit", now_ms(), s.job_id,
                           "SubmitJob " + s.request_id + " was answered OK with job " + s.job_id +
                               " but no job with that request_id exists at the end"});
        else if (jobs.size() > 1)
          found.push_back({"duplicate_submit", now_ms(), s.job_id,
                           "SubmitJob " + s.request_id + " (answered " + s.job_id + ") made " +
                               std::to_string(jobs.size()) + " jobs:" + ids});
        else if (jobs[0]->id() != s.job_id)
          found.push_back({"lost_submit", now_ms(), s.job_id,
                           "SubmitJob " + s.request_id + " was answered with job " + s.job_id +
                               " but the job with that request_id is" + ids});
      } else {
        ++r_.submits_unacknowledged;
        if (jobs.size() > 1)
          found.push_back({"duplicate_submit", now_ms(), "",
                           "unacknowledged SubmitJob " + s.request_id + " made " +
                               std::to_string(jobs.size()) + " jobs:" + ids});
      }
      for (const v1::JobStatus* j : jobs) {
        char loss[160];
        switch (j->state()) {
          case v1::SUCCEEDED: {
            ++r_.jobs_succeeded;
            const double want = reference_loss_.at(s.steps);
            if (j->last_loss() != want) {
              std::snprintf(loss, sizeof loss, "last_loss %.17g, an uninterrupted run's %.17g",
                            j->last_loss(), want);
              const std::string own = ranks_final_loss(dir_ / "ckpt" / s.request_id);
              found.push_back({"wrong_final_loss", now_ms(), j->id(),
                               "job " + j->id() + " (" + s.request_id + ", " + std::to_string(s.steps) +
                                   " steps, attempt " + std::to_string(j->attempt()) +
                                   ", resumed from step " + std::to_string(j->resumed_from_step()) +
                                   ") SUCCEEDED with " + loss +
                                   "; its ranks' own final_loss (steps.jsonl summaries): " +
                                   (own.empty() ? "none" : own)});
            }
            break;
          }
          case v1::FAILED:
          case v1::CANCELLED: {
            (j->state() == v1::FAILED ? r_.jobs_failed : r_.jobs_cancelled) += 1;
            r_.failure_reasons[j->id()] = j->last_error();
            if (!reason_is_actionable(j->last_error()))
              found.push_back({"unexplained_end", now_ms(), j->id(),
                               "job " + j->id() + " ended " + v1::JobState_Name(j->state()) +
                                   " with the reason \"" + valid_utf8(j->last_error()) +
                                   "\" (empty, not UTF-8, or only an exit status)"});
            break;
          }
          default:
            ++r_.jobs_unfinished;
            found.push_back({"not_finished", now_ms(), j->id(),
                             "job " + j->id() + " still " + v1::JobState_Name(j->state()) + " (attempt " +
                                 std::to_string(j->attempt()) + ", step " + std::to_string(j->step()) + "/" +
                                 std::to_string(j->total_steps()) + ", waiting: " + j->waiting_reason() +
                                 ") " + std::to_string(o_.drain_timeout_s) + " s after the fault phase"});
        }
      }
    }
  }
  r_.violations = checker_.violations();
  r_.violations.insert(r_.violations.end(), found.begin(), found.end());
  for (const Violation& v : found) log("VIOLATION " + v.kind + ": " + v.evidence);
}

void Run::teardown() {
  if (torn_down_) return;
  torn_down_ = true;
  stop_threads_ = true;
  submitting_ = false;
  for (std::thread* t : {&submitter_, &sampler_, &poller_})
    if (t->joinable()) t->join();
  for (auto& p : proxies_) p->set_mode(LinkMode::kForward);
  // Agents first (they stop their ranks), then the node and the coordinator; SIGCONT first
  // in ChildProcess::stop, since a stopped process handles no SIGTERM.
  for (auto& a : agents_) {
    a->signal(SIGCONT);
    a->signal(SIGTERM);
  }
  for (auto& a : agents_) a->stop(8000);
  if (node_) node_->stop(3000);
  if (coordinator_) coordinator_->stop(5000);
  // Ranks that outlived their agent (none should: PR_SET_PDEATHSIG) are killed by PID.
  if (!dir_.empty()) {
    for (const RankProcess& p : sample_rank_processes(dir_.string() + "/")) {
      log("teardown: rank pid " + std::to_string(p.pid) + " (job " + p.job_id +
          ") outlived its agent: SIGKILL");
      ::kill(p.pid, SIGCONT);
      ::kill(p.pid, SIGKILL);
      r_.violations.push_back({"left_running", now_ms(), p.job_id,
                               "rank pid " + std::to_string(p.pid) + " of job " + p.job_id + " attempt " +
                                   std::to_string(p.attempt) + " outlived every agent's stop"});
    }
  }
  proxies_.clear();
  for (const fs::path& m : mounts_) {
    std::error_code ec;  // the attempts' specs and logs outlive the tmpfs, for the report's reader
    fs::copy(m, m.string() + "-saved", fs::copy_options::recursive, ec);
    if (::umount2(m.c_str(), 0) != 0 && ::umount2(m.c_str(), MNT_DETACH) != 0)
      r_.notes["umount_" + m.filename().string()] = "umount " + m.string() + " failed: " + errno_text(errno);
  }
  mounts_.clear();
}

}  // namespace

bool reason_is_actionable(const std::string& reason) {
  static const std::regex bare_status(
      R"(\s*(ranks? (on \S+ )?)?(exited with status -?[0-9]+|killed by signal [0-9]+)\.?\s*)");
  return !reason.empty() && is_valid_utf8(reason) && !std::regex_match(reason, bare_status);
}

nlohmann::json ChaosReport::to_json() const {
  nlohmann::json j;
  j["seed"] = seed;
  j["minutes"] = minutes;
  j["wall_seconds"] = wall_seconds;
  j["dir"] = dir.string();
  nlohmann::json faults = nlohmann::json::object(), skipped = nlohmann::json::object();
  for (int k = 0; k < kFaultKinds; ++k) faults[fault_kind_name(static_cast<FaultKind>(k))] = 0;
  for (const InjectedFault& f : injected) {
    const char* name = fault_kind_name(f.fault.kind);
    if (f.skipped)
      skipped[name] = skipped.value(name, 0) + 1;
    else
      faults[name] = faults[name].get<int>() + 1;
  }
  j["faults"] = faults;
  j["faults_skipped"] = skipped;
  nlohmann::json by_kind = nlohmann::json::object();
  for (const char* k :
       {"two_live_attempts", "finished_attempt_restarted", "running_without_rank", "lost_submit",
        "duplicate_submit", "wrong_final_loss", "unexplained_end", "not_finished", "left_running"})
    by_kind[k] = 0;
  nlohmann::json details = nlohmann::json::array();
  for (const Violation& v : violations) {
    by_kind[v.kind] = by_kind.value(v.kind, 0) + 1;
    details.push_back({{"kind", v.kind}, {"t_ms", v.t_ms}, {"job", v.job_id}, {"evidence", v.evidence}});
  }
  j["violations"] = by_kind;
  j["violation_details"] = details;
  j["jobs"] = {{"submitted", jobs_submitted}, {"unacknowledged", submits_unacknowledged},
               {"succeeded", jobs_succeeded}, {"failed", jobs_failed},
               {"cancelled", jobs_cancelled}, {"unfinished", jobs_unfinished}};
  j["failure_reasons"] = failure_reasons;
  j["notes"] = notes;
  nlohmann::json sched = nlohmann::json::array();
  for (const Fault& f : schedule) sched.push_back(describe(f));
  j["schedule"] = sched;
  return j;
}

std::string ChaosReport::reproduction() const {
  std::ostringstream s;
  s << "chaos run: seed " << seed << ", " << minutes << " min (zenflow bench chaos --seed " << seed
    << " --minutes " << minutes << "); logs in " << dir.string() << "\nschedule:\n";
  for (const Fault& f : schedule) s << "  " << describe(f) << "\n";
  s << "as injected:\n";
  for (const InjectedFault& f : injected) {
    char at[32];
    std::snprintf(at, sizeof at, "+%.3fs", double(f.started_ms) / 1000);
    s << "  " << at << " " << (f.skipped ? "skipped " : "") << describe(f.fault) << ": " << f.detail << "\n";
  }
  s << violations.size() << " violation(s):\n";
  for (const Violation& v : violations) {
    char at[32];
    std::snprintf(at, sizeof at, "+%.3fs", double(v.t_ms) / 1000);
    s << "  " << at << " " << v.kind << ": " << v.evidence << "\n";
  }
  return s.str();
}

ChaosReport run_chaos(const ChaosOptions& options) {
  ChaosReport report;
  {
    Run run(options, report);
    run.execute();
  }  // ~Run: everything stopped, tmpfs unmounted
  return report;
}

}  // namespace zenflow::chaos
