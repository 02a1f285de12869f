#include "worker/agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/allowed_roots.h"
#include "common/attempt_contract.h"
#include "common/rpc/heartbeat_stream.h"
#include "common/utf8.h"
#include "common/version.h"
#include "worker/agent/hang_watch.h"
#include "worker/agent/worker_metrics.h"
#include "worker/distributed/ports.h"
#include "zenflow/v1/workers.grpc.pb.h"

namespace zenflow::agent {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kRpcDeadline{2000};
constexpr milliseconds kLeaseRenewEvery{500};
constexpr milliseconds kUploadEvery{200};
constexpr milliseconds kProgressEvery{500};
constexpr size_t kMaxPendingLogBytes = 64u << 20;  // per attempt, while the coordinator is away
constexpr size_t kMaxMessageBytes = 1024;          // an exit's message (AttemptReport.message)

void log_line(const std::string& s) { std::fprintf(stderr, "zenflow-worker: %s\n", s.c_str()); }

std::string ms_text(milliseconds d) { return std::to_string(d.count()) + " ms"; }

// A string built from a process's output, fit for a proto string field: valid UTF-8 (or the
// message cannot be parsed at the coordinator) and at most `max_bytes`.
std::string proto_text(const std::string& s, size_t max_bytes) {
  return std::string(utf8_prefix(valid_utf8(s), max_bytes));
}

// A number of a report line; `fallback` when absent or not a number (a diverged loss is null).
template <class T>
T number_or(const nlohmann::json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<T>() : fallback;
}

void set_nonblocking_cloexec(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

// Writes all of `data` to `fd`; false with errno set at the first failing write.
bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Writes `path` whole (create, write, flush to the file system, close), checking each step;
// "" on success, else strerror of the step that failed.
std::string write_file_checked(const std::string& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  if (!write_all(fd, data.data(), data.size()) || ::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    return std::strerror(e);
  }
  if (::close(fd) != 0) return std::strerror(errno);
  return "";
}

std::string joined(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

// The directories the jobs' specs are confined to: each --allowed-root, absolute with its
// symlinks resolved, then the work dir (where the specs themselves are written); duplicates
// dropped. None given: the work dir alone; "/" confines nothing. Throws
// std::invalid_argument for a root that cannot be advertised (common/allowed_roots.h).
std::vector<std::string> confined_roots(const std::vector<std::string>& given, const std::string& work_dir) {
  std::vector<std::string> roots;
  auto add = [&](const std::string& root, const std::string& as_given) {
    if (!is_normal_root(root) || root.size() > kMaxAllowedRootBytes)
      throw std::invalid_argument("--allowed-root " + as_given + ": " + root +
                                  " is not an absolute path in normal form without ':', at most " +
                                  std::to_string(kMaxAllowedRootBytes) + " bytes");
    if (std::find(roots.begin(), roots.end(), root) == roots.end()) roots.push_back(root);
  };
  for (const std::string& r : given) {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(fs::absolute(r), ec);
    if (ec) p = fs::absolute(r).lexically_normal();
    std::string root = p.string();
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    add(root, r);
  }
  add(work_dir, "(the work dir)");
  if (roots.size() > kMaxAllowedRoots)
    throw std::invalid_argument("--allowed-root: at most " + std::to_string(kMaxAllowedRoots - 1) +
                                " directories");
  return roots;
}

}  // namespace

int64_t detect_physical_cores() {
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, phys = "0";
  while (std::getline(in, line)) {
    auto value = [&] { return line.substr(line.find(':') + 1); };
    if (line.rfind("physical id", 0) == 0) phys = value();
    if (line.rfind("core id", 0) == 0) cores.insert({phys, value()});
  }
  if (!cores.empty()) return static_cast<int64_t>(cores.size());
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

int64_t detect_host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemTotal:") return kb * 1024;
  return 0;
}

std::vector<std::pair<std::string, int64_t>> detect_gpus() {
  std::vector<std::pair<std::string, int64_t>> out;
  FILE* p = ::popen("nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null", "r");
  if (!p) return out;
  char line[512];
  while (std::fgets(line, sizeof(line), p)) {
    std::string s(line);
    const size_t comma = s.rfind(',');
    if (comma == std::string::npos) continue;
    std::string name = s.substr(0, comma);
    while (!name.empty() && name.back() == ' ') name.pop_back();
    for (char& c : name)
      if (c == ' ') c = '-';  // "NVIDIA H200" -> "NVIDIA-H200", as node labels spell it
    try {
      out.emplace_back(name, std::stoll(s.substr(comma + 1)) << 20);  // MiB
    } catch (const std::exception&) {
    }
  }
  if (::pclose(p) != 0) out.clear();
  return out;
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;   // stdout + stderr
  std::string partial;  // output after the last newline
  std::string last_line;
  bool exited = false;
  int status = 0;  // exit status, or 128 + signal
};

struct Attempt {
  v1::Assignment a;
  std::string dir;
  std::vector<Rank> ranks;
  std::vector<int> slots;  // local slots (GPU indices or CPU slot numbers) it uses
  int report_fd = -1;       // rank 0's progress (global rank 0 only)
  std::string report_partial;
  std::vector<int> lease_fds;  // write ends, one per rank
  Clock::time_point term_sent{};
  Clock::time_point kill_at{};
  bool term = false;
  bool killed = false;
  bool stopped_by_agent = false;
  bool exited = false;  // every rank
  int exit_code = 0;
  std::string message;
  bool exit_reported = false;  // the coordinator acknowledged it
  // The coordinator (boot Impl::acked_boot) took it as started: not reported again until it
  // exits or the coordinator restarts.
  bool start_acked = false;
  Clock::time_point first_failure{};
  // Output: every byte goes to output.log (up to AgentOptions::max_attempt_log_bytes);
  // pending holds what the coordinator lacks.
  int log_fd = -1;
  int64_t log_bytes = 0;  // in output.log
  bool log_capped = false;
  int64_t uploaded = 0;  // attempt-relative offset the coordinator holds
  std::string pending;   // bytes from `uploaded`
  int64_t dropped = 0;
  // Progress of rank 0 (latest step line).
  nlohmann::json progress;
  bool progress_dirty = false;
  int64_t start_step = 0;
  Clock::time_point progress_sent{};
  // The profile rank 0 wrote (its "profile" report line), until the coordinator holds it.
  std::string profile_yaml;
  std::string lost_optimizer_node;  // rank 0's "node_lost" report line: HOST:PORT
  // Rank 0's progress against resources.hang_timeout (only where global rank 0 runs).
  std::optional<HangWatch> hang;
  std::string hung;  // "hung at step N: …" once the agent killed it for that: its exit's message

  // Its exit may be reported: the coordinator holds all its output and its last progress
  // (it takes no progress of an ended job).
  bool exit_reportable() const { return exited && !exit_reported && pending.empty() && !progress_dirty; }
};

struct Agent::Impl {
  AgentOptions o;
  std::atomic<bool>* stopping = nullptr;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::WorkerService::Stub> stub;
  std::vector<std::unique_ptr<distributed::PortReservation>> ports;
  v1::WorkerResources resources;
  int64_t slots = 0;
  std::unique_ptr<WorkerMetrics> metrics;  // set in run(), before any thread starts

  // Registration, shared with the fetch thread.
  std::mutex mu;
  std::condition_variable cv;
  int64_t incarnation = 0;  // 0: not registered
  // The incarnation's session (RegisterWorkerResponse.session), sent with every call but
  // RegisterWorker. Under session_mu of its own: calls are made with or without mu held.
  mutable std::mutex session_mu;
  std::string session;
  std::string current_session() const {
    std::lock_guard<std::mutex> lock(session_mu);
    return session;
  }
  bool fenced = false;      // the coordinator refused this incarnation
  int64_t assignments_revision = 0;
  std::vector<v1::Assignment> desired;
  bool desired_valid = false;
  Clock::time_point desired_sent{};  // when the FetchAssignments that returned `desired` was sent

  std::map<std::pair<std::string, int64_t>, Attempt> attempts;
  // Per job, the highest attempt this process started (or ended unstarted): no attempt up to
  // it starts again, whatever an assignment set fetched before its end still lists. Kept
  // until a set fetched after that attempt's exit was acknowledged no longer lists the job
  // (the coordinator, which recorded the end, cannot list it again). Main thread.
  struct StartedJob {
    int64_t attempt = 0;
    Clock::time_point exit_acked{};  // zero: not acknowledged yet
  };
  std::map<std::string, StartedJob> started;
  // Directories of ended attempts, oldest first: removed beyond AgentOptions::keep_attempt_dirs.
  std::deque<std::string> ended_dirs;
  // Set at registration (main thread), read by the pulse thread too.
  std::atomic<int64_t> interval_ms{1000};
  std::atomic<int64_t> lease_ms{4000};
  // The rank lease that this incarnation's fence_ms counts with: no rank gets a longer one
  // (a later, longer interval must not stretch the fence the coordinator was promised).
  milliseconds fenced_rank_lease = milliseconds::max();
  // When the last heartbeat (pulse, unary, or the registration) that the coordinator accepted
  // was sent: "away" counts from there (attempt_contract.h, fence_after).
  std::atomic<int64_t> last_ok_ns{Clock::now().time_since_epoch().count()};
  void accepted(Clock::time_point sent) {
    const int64_t ns = sent.time_since_epoch().count();
    int64_t seen = last_ok_ns.load();
    while (seen < ns && !last_ok_ns.compare_exchange_weak(seen, ns)) {
    }
  }
  milliseconds away() const {
    return std::chrono::duration_cast<milliseconds>(Clock::now() -
                                                    Clock::time_point(Clock::duration(last_ok_ns.load())));
  }
  std::atomic<uint64_t> coordinator_boot{0};  // of the last accepted heartbeat (pulse or report)
  uint64_t acked_boot = 0;                    // the boot the attempts' start_acked hold for (main thread)
  // A coordinator boot other than acked_boot: it restarted, and knows of no start yet.
  void adopt_boot(uint64_t boot) {
    if (boot == acked_boot) return;
    for (auto& [key, at] : attempts) at.start_acked = false;
    acked_boot = boot;
  }
  milliseconds heartbeat_interval() const { return milliseconds(interval_ms.load()); }
  Clock::time_point next_heartbeat{};
  // The ranks' leases are renewed by a thread of their own, so that RPCs to a coordinator
  // that is away (each up to its deadline) never hold them up: the leases fence a paused
  // agent, not a slow network. The fds are added and removed under lease_mu.
  std::mutex lease_mu;
  std::set<int> lease_fds;
  // Progress for the pulse thread to send on its next beat (the latest per attempt; the
  // main thread queues it, at most every kProgressEvery per attempt, and wakes the pulse).
  std::mutex progress_mu;
  std::condition_variable progress_cv;
  std::map<std::pair<std::string, int64_t>, v1::ReportProgressRequest> progress_out;
  Clock::time_point next_upload{};
  int fence_stage = 0;  // self_fence(): 0 connected, 1 ranks asked to stop, 2 ranks killed
  std::atomic<bool> leases_withheld{false};  // renew_leases() stopped at the fence

  template <class Req, class Resp, class Fn>
  grpc::Status call(Fn fn, const Req& req, Resp* resp, milliseconds deadline = kRpcDeadline) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, o.token, deadline, current_session());
    return (stub.get()->*fn)(&ctx, req, resp);
  }

  bool register_worker();
  void fetch_loop();
  void heartbeat();
  void pulse_loop();
  void reconcile();
  void start_attempt(const v1::Assignment& a);
  void signal_attempt(Attempt& at, int sig);
  void kill_all(const std::string& why);
  void pump_io(milliseconds timeout);
  void append_output(Attempt& at, Rank& r, const char* data, size_t n);
  void write_log(Attempt& at, const std::string& lines);
  void on_report_line(Attempt& at, const std::string& line);
  void reap();
  void upload_logs(Attempt& at);
  void report_exit(Attempt& at);
  void report_progress(Attempt& at);
  v1::ReportProgressRequest progress_request(const Attempt& at) const;
  void upload_profile(Attempt& at);
  void renew_leases();
  void self_fence();
  void check_hangs();
  void fill_report(const Attempt& at, v1::AttemptReport* r) const;
  void exit_acknowledged(Attempt& at);
  void forget_finished();
  void remove_ended_dirs();
};

Agent::Agent(AgentOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->o = std::move(options);
  impl_->stopping = &stopping_;
}

Agent::~Agent() = default;

bool Agent::Impl::register_worker() {
  v1::RegisterWorkerRequest req;
  req.set_name(o.name);
  req.set_role(v1::TRAINER);
  *req.mutable_resources() = resources;
  req.set_address(o.address);
  for (const auto& p : ports) req.add_rendezvous_ports(p->port());
  req.set_version(kVersion);
  // The lease and interval are the last coordinator's (the defaults before any): the ranks of
  // this incarnation get no longer a lease than this fence counts with (start_attempt).
  const milliseconds rank_lease = attempt::rank_lease(milliseconds(lease_ms.load()), heartbeat_interval());
  req.set_fence_ms(attempt::fence_after(o.disconnected_grace, o.disconnect_drain, rank_lease).count());
  for (const std::string& root : o.allowed_roots) req.add_allowed_roots(root);
  v1::RegisterWorkerResponse resp;
  const auto sent = Clock::now();
  const grpc::Status s = call(&v1::WorkerService::Stub::RegisterWorker, req, &resp);
  if (!s.ok()) {
    static std::string last;
    const std::string msg = "register with " + o.coordinator + ": " + rpc::describe(s);
    if (msg != last) log_line(msg + " (retrying)");
    last = msg;
    return false;
  }
  {
    std::lock_guard<std::mutex> session_lock(session_mu);
    session = resp.session();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    incarnation = resp.incarnation();
    fenced = false;
    assignments_revision = 0;
    desired.clear();
    desired_valid = false;
  }
  cv.notify_all();
  metrics->registrations.inc();
  interval_ms.store(std::max<int64_t>(50, resp.heartbeat_interval_ms()));
  lease_ms.store(std::max<int64_t>(resp.lease_ms(), 2 * interval_ms.load()));
  fenced_rank_lease = rank_lease;
  accepted(sent);
  log_line("registered as " + o.name + " (incarnation " + std::to_string(resp.incarnation()) +
           ", heartbeat " + std::to_string(interval_ms.load()) + " ms, lease " +
           std::to_string(lease_ms.load()) + " ms, fence " + std::to_string(req.fence_ms()) + " ms)");
  return true;
}

// Long-polls the coordinator for the set of attempts it wants here; the supervisor thread
// reconciles against the latest set.
void Agent::Impl::fetch_loop() {
  while (!stopping->load()) {
    int64_t inc = 0, after = 0;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, milliseconds(200), [&] { return stopping->load() || (incarnation != 0 && !fenced); });
      if (incarnation == 0 || fenced) continue;
      inc = incarnation;
      after = assignments_revision;
    }
    v1::FetchAssignmentsRequest req;
    req.set_name(o.name);
    req.set_incarnation(inc);
    req.set_after_revision(after);
    req.set_wait_ms(5000);
    v1::FetchAssignmentsResponse resp;
    const auto sent = Clock::now();
    const grpc::Status s = call(&v1::WorkerService::Stub::FetchAssignments, req, &resp, milliseconds(8000));
    std::lock_guard<std::mutex> lock(mu);
    if (inc != incarnation) continue;
    if (s.ok()) {
      assignments_revision = resp.revision();
      desired.assign(resp.assignments().begin(), resp.assignments().end());
      desired_valid = true;
      desired_sent = sent;
    } else if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      fenced = true;
    } else {
      mu.unlock();
      std::this_thread::sleep_for(milliseconds(200));  // unreachable: retry soon
      mu.lock();
    }
  }
}

void Agent::Impl::fill_report(const Attempt& at, v1::AttemptReport* r) const {
  r->set_job_id(at.a.job_id());
  r->set_attempt(at.a.attempt());
  r->set_exited(at.exited);
  r->set_exit_code(at.exit_code);
  r->set_message(proto_text(at.message, kMaxMessageBytes));
  r->set_stopped_by_agent(at.stopped_by_agent);
  if (at.exited) r->set_lost_optimizer_node(proto_text(at.lost_optimizer_node, kMaxMessageBytes));
  // The exit carries the attempt's last progress (rank 0's worker only): the job ends with its
  // final step and loss even if the report that sent them was lost.
  if (at.exited && at.a.first_rank() == 0 && at.progress.is_object()) {
    *r->mutable_last_progress() = progress_request(at);  // (the report's own name and incarnation count)
  }
}

// Liveness: an empty heartbeat every interval from a thread of its own, so that the lease
// never waits behind the supervisor's other RPCs (log uploads, reports, each up to its
// deadline when the coordinator is slow or away). The beats go on one HeartbeatStream: far
// cheaper for the coordinator than a call each, and if this process dies the stream breaks
// and the coordinator declares the worker LOST after one interval instead of the lease.
//
// The jobs' progress rides on the same stream: queued by the main thread (report_progress),
// it goes out at once as a beat of its own, instead of a ReportProgress call per job every
// 500 ms (at thousands of running jobs, as many calls as the heartbeats were before the
// stream). A beat that fails keeps its progress for the next, unless newer came meanwhile.
void Agent::Impl::pulse_loop() {
  rpc::HeartbeatStream pulses(*stub, o.token);
  auto next = Clock::now();
  bool progress_only = false;  // the last beat went early, for progress: the regular one is still due
  bool last_ok = true;         // after a failed beat, queued progress waits for the regular one
  while (!stopping->load()) {
    if (!progress_only) next += heartbeat_interval();
    int64_t inc;
    {
      std::lock_guard<std::mutex> lock(mu);
      inc = fenced ? 0 : incarnation;
    }
    if (inc != 0) {
      pulses.set_session(current_session());  // a new one after a registration: a new stream
      v1::HeartbeatRequest req;
      req.set_name(o.name);
      req.set_incarnation(inc);
      {
        std::lock_guard<std::mutex> lock(progress_mu);
        for (auto& [key, p] : progress_out) {
          p.set_incarnation(inc);
          *req.add_progress() = std::move(p);
        }
        progress_out.clear();
      }
      v1::HeartbeatResponse resp;
      const auto sent = Clock::now();
      const grpc::Status s = pulses.beat(req, &resp, std::min(heartbeat_interval(), kRpcDeadline));
      metrics->heartbeat_rtt.observe(std::chrono::duration<double>(Clock::now() - sent).count());
      if (!s.ok()) metrics->heartbeat_failures.inc();
      last_ok = s.ok();
      if (!s.ok() && req.progress_size() > 0) {
        std::lock_guard<std::mutex> lock(progress_mu);
        for (v1::ReportProgressRequest& p : *req.mutable_progress())  // kept unless newer came meanwhile
          progress_out.try_emplace({p.attempt().job_id(), p.attempt().attempt()}, std::move(p));
      }
      if (s.ok()) {
        accepted(sent);
        coordinator_boot.store(resp.coordinator_boot());
        interval_ms.store(std::max<int64_t>(50, resp.heartbeat_interval_ms()));
      } else if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        std::lock_guard<std::mutex> lock(mu);
        if (incarnation == inc && !fenced) {
          fenced = true;
          log_line("coordinator refused heartbeat: " + s.error_message());
        }
      }
    }
    const auto now = Clock::now();
    if (next < now) next = now;  // late (a slow call): no burst to catch up
    // Until the next beat is due, or progress is queued (then at once: the main thread
    // queues each job's at most every kProgressEvery). Queued progress that cannot go (not
    // registered, fenced, or the last beat failed) waits for the next regular beat.
    std::unique_lock<std::mutex> lock(progress_mu);
    progress_only = progress_cv.wait_until(lock, next, [&] {
      return stopping->load() || (inc != 0 && last_ok && !progress_out.empty());
    }) && !stopping->load();
  }
}

// The attempts' states, each repeated until the coordinator took it: a start until a report
// of it was accepted (again after the coordinator restarted: it may have lost a gang's
// starts), an exit until acknowledged. Only when there is something to report: the pulse
// keeps the lease, so a worker whose jobs run makes no call here.
void Agent::Impl::heartbeat() {
  int64_t inc;
  {
    std::lock_guard<std::mutex> lock(mu);
    inc = incarnation;
  }
  adopt_boot(coordinator_boot.load());
  v1::HeartbeatRequest req;
  req.set_name(o.name);
  req.set_incarnation(inc);
  for (const auto& [key, at] : attempts)
    if (at.exited ? at.exit_reportable() : !at.exit_reported && !at.start_acked)
      fill_report(at, req.add_attempts());
  grpc::Status s;
  v1::HeartbeatResponse resp;
  const auto sent = Clock::now();
  if (req.attempts_size() > 0) s = call(&v1::WorkerService::Stub::Heartbeat, req, &resp, std::min(heartbeat_interval(), kRpcDeadline));
  if (req.attempts_size() > 0 && s.ok()) {
    accepted(sent);
    adopt_boot(resp.coordinator_boot());  // restarted since: what it takes counts from now on
    coordinator_boot.store(acked_boot);
    for (const v1::AttemptReport& r : req.attempts()) {
      auto it = attempts.find({r.job_id(), r.attempt()});
      if (it != attempts.end() && !r.exited()) it->second.start_acked = true;
    }
    for (const v1::AttemptRef& ack : resp.acknowledged()) {
      auto it = attempts.find({ack.job_id(), ack.attempt()});
      if (it != attempts.end() && it->second.exited) exit_acknowledged(it->second);
    }
  }
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    std::lock_guard<std::mutex> lock(mu);
    fenced = true;
    log_line("coordinator refused heartbeat: " + s.error_message());
  }
}

// The agent's side of the fence (attempt_contract.h): away for disconnected_grace, the ranks
// checkpoint and stop; away for disconnect_drain more, they are killed (and renew_leases
// stops, on its own thread). Every attempt running at a stage gets it, also one started
// after the stage was reached.
void Agent::Impl::self_fence() {
  const milliseconds gone = away();
  const milliseconds fence = o.disconnected_grace + o.disconnect_drain;
  const int stage = gone >= fence ? 2 : gone >= o.disconnected_grace ? 1 : 0;
  if (stage == 0) {
    fence_stage = 0;
    return;
  }
  bool acted = false;
  for (auto& [key, at] : attempts) {
    if (at.exited) continue;
    if (!at.term) {
      at.stopped_by_agent = true;
      signal_attempt(at, SIGTERM);
      acted = true;
    }
    if (stage == 2 && !at.killed) {
      at.stopped_by_agent = true;
      signal_attempt(at, SIGKILL);
      acted = true;
    }
  }
  if (!acted || stage <= fence_stage) return;
  fence_stage = stage;
  if (stage == 1) {
    log_line("no heartbeat accepted for " + ms_text(gone) +
             " (since the last accepted one was sent; --disconnected-grace " + ms_text(o.disconnected_grace) +
             "): asking every job's ranks to checkpoint and stop");
  } else {
    log_line("no heartbeat accepted for " + ms_text(gone) + " (--disconnected-grace + --disconnect-drain " +
             ms_text(fence) + "): killing every rank and ending their leases");
  }
}

void Agent::Impl::signal_attempt(Attempt& at, int sig) {
  for (Rank& r : at.ranks)
    if (!r.exited && r.pid > 0) ::kill(-r.pid, sig);  // its process group
  if (sig == SIGTERM && !at.term) {
    at.term = true;
    at.term_sent = Clock::now();
    at.kill_at = at.term_sent + o.stop_grace;
  }
  if (sig == SIGKILL) at.killed = true;
}

void Agent::Impl::kill_all(const std::string& why) {
  bool any = false;
  for (auto& [key, at] : attempts) {
    if (at.exited) continue;
    any = true;
    at.stopped_by_agent = true;
    signal_attempt(at, SIGKILL);
  }
  if (any) log_line("killing every rank: " + why);
}

void Agent::Impl::start_attempt(const v1::Assignment& a) {
  const auto key = std::make_pair(a.job_id(), a.attempt());
  started[a.job_id()] = StartedJob{a.attempt(), {}};
  Attempt at;
  at.a = a;
  at.dir = o.work_dir + "/jobs/" + a.job_id() + "/attempt-" + std::to_string(a.attempt());
  // The attempt's files. A work dir that cannot take them (full, read-only, gone) is this
  // worker's fault, not the job's: nothing starts, and the attempt ends with
  // kExitWorkerFault, which the coordinator requeues.
  std::error_code ec;
  const std::string spec = at.dir + "/job.yaml";
  std::string cannot;
  fs::create_directories(at.dir, ec);
  if (ec) cannot = ec.message();
  if (cannot.empty()) cannot = write_file_checked(spec, a.spec_yaml());
  if (cannot.empty()) {
    at.log_fd = ::open((at.dir + "/output.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat st {};
    if (at.log_fd < 0) {
      cannot = std::strerror(errno);
    } else if (::fstat(at.log_fd, &st) == 0) {
      at.log_bytes = st.st_size;  // an earlier incarnation's output of this attempt
    }
  }
  if (!cannot.empty()) {
    at.exited = true;
    at.exit_code = attempt::kExitWorkerFault;
    at.message = "the agent cannot write its work dir " + at.dir + ": " + cannot;
    log_line("job " + a.job_id() + " attempt " + std::to_string(a.attempt()) + ": " + at.message +
             "; not started (" + attempt::exit_text(at.exit_code) + ")");
    auto [it, fresh] = attempts.emplace(key, std::move(at));
    report_exit(it->second);
    return;
  }
  // Local slots: the lowest ones no live attempt holds.
  std::set<int> used;
  for (const auto& [key, other] : attempts)
    if (!other.exited) used.insert(other.slots.begin(), other.slots.end());
  for (int s = 0; s < slots && static_cast<int>(at.slots.size()) < a.local_ranks(); ++s)
    if (!used.count(s)) at.slots.push_back(s);
  for (int s = 0; static_cast<int>(at.slots.size()) < a.local_ranks(); ++s) at.slots.push_back(s % std::max<int64_t>(1, slots));

  const milliseconds child_lease =
      std::min(attempt::rank_lease(milliseconds(lease_ms.load()), heartbeat_interval()), fenced_rank_lease);
  const std::string lease_timeout = std::to_string(double(child_lease.count()) / 1000.0);
  std::string failure;
  for (int i = 0; i < a.local_ranks(); ++i) {
    const int rank = a.first_rank() + i;
    int out[2] = {-1, -1}, lease_pipe[2] = {-1, -1}, report[2] = {-1, -1};
    if (::pipe(out) != 0 || ::pipe(lease_pipe) != 0 || (rank == 0 && ::pipe(report) != 0)) {
      failure = std::string("pipe: ") + std::strerror(errno);
      for (int fd : {out[0], out[1], lease_pipe[0], lease_pipe[1]})
        if (fd >= 0) ::close(fd);
      break;
    }
    // Everything the child needs, built before fork (only async-signal-safe calls after).
    // checkpoint.dir: s3:// is staged in this worker's work dir, shared by its attempts of a
    // job (a requeued attempt here reuses what is staged; elsewhere it comes from the bucket).
    std::vector<std::string> args = {o.trainer, "run", spec, "--quiet", "--lock-wait", "60",
                                     "--lease-fd", "4", "--lease-timeout", lease_timeout,
                                     "--staging-dir", o.work_dir + "/staging", "--cache-dir", o.work_dir + "/cache"};
    if (rank == 0) {
      args.push_back("--report-fd");
      args.push_back("3");
      // Its profile, when the attempt trains long enough: the coordinator keeps it for
      // `zenflow advise JOB_ID` (on_report_line reads it, upload_profile sends it).
      if (o.profile) args.push_back("--profile-if-possible");
    }
    // The optimizer nodes the scheduler gave the job (optimizer.host.nodes).
    if (a.optimizer_addresses_size() > 0) {
      std::string list;
      for (const std::string& addr : a.optimizer_addresses()) list += (list.empty() ? "" : ",") + addr;
      args.push_back("--set");
      args.push_back("optimizer.host.addresses=[" + list + "]");
    }
    // Its own metrics on a loopback port the kernel picks (none can be taken from it),
    // announced in a file the agent's scrapes read.
    const std::string port_file = at.dir + "/rank-" + std::to_string(rank) + ".metrics-port";
    if (metrics->serving()) {
      fs::remove(port_file, ec);  // a previous incarnation's: that port is not this rank's
      for (const char* arg : {"--job-id", a.job_id().c_str(), "--metrics-host", "127.0.0.1", "--metrics-port", "0",
                              "--metrics-port-file", port_file.c_str()})
        args.emplace_back(arg);
    }
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "ZENFLOW_", 8) != 0) env.emplace_back(*e);
    const bool gpus = resources.gpus_size() > 0;
    env.push_back("ZENFLOW_SCHEDULED=1");  // placed by a coordinator (preflight warnings)
    // The rank refuses a spec path outside them before it opens anything (job_spec.h).
    env.push_back("ZENFLOW_ALLOWED_ROOTS=" + joined(o.allowed_roots, ":"));
    // Which attempt this process belongs to: for the rank's own records, and for anyone
    // sampling the processes of a host (tests/chaos checks "never two live attempts").
    env.push_back("ZENFLOW_JOB_ID=" + a.job_id());
    env.push_back("ZENFLOW_ATTEMPT=" + std::to_string(a.attempt()));
    env.push_back("ZENFLOW_RANK=" + std::to_string(rank));
    env.push_back("ZENFLOW_WORLD_SIZE=" + std::to_string(a.world_size()));
    env.push_back("ZENFLOW_MASTER_ADDR=" + a.master_addr());
    env.push_back("ZENFLOW_MASTER_PORT=" + std::to_string(a.master_port()));
    env.push_back("ZENFLOW_LOCAL_ADDR=" + o.address);
    if (!a.node_secret().empty()) {  // its nodes' credential for this attempt (attempt_contract.h)
      env.push_back(std::string(attempt::kNodeKeyEnv) + "=" + attempt::node_key(a.job_id(), a.attempt()));
      env.push_back(std::string(attempt::kNodeSecretEnv) + "=" + a.node_secret());
    }
    // The slot picks the GPU and this rank's slice of the host's cores.
    env.push_back("ZENFLOW_LOCAL_RANK=" + std::to_string(at.slots[static_cast<size_t>(i)]));
    env.push_back("ZENFLOW_LOCAL_WORLD_SIZE=" + std::to_string(std::max<int64_t>(1, slots)));
    // The job's ranks on this worker (they share its work dir: staging, cache).
    env.push_back("ZENFLOW_WORKER_FIRST_RANK=" + std::to_string(a.first_rank()));
    env.push_back("ZENFLOW_WORKER_RANKS=" + std::to_string(a.local_ranks()));
    (void)gpus;
    std::vector<char*> argv, envp;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the agent died before prctl
      const int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0);
      ::dup2(out[1], 1);
      ::dup2(out[1], 2);
      if (report[1] >= 0) ::dup2(report[1], 3);
      ::dup2(lease_pipe[0], 4);
      ::syscall(SYS_close_range, 5u, ~0u, 0u);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      ::execve(argv[0], argv.data(), envp.data());
      const char msg[] = "zenflow-worker: cannot exec the trainer\n";
      (void)!::write(2, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(lease_pipe[0]);
    if (report[1] >= 0) ::close(report[1]);
    if (pid < 0) {
      failure = std::string("fork: ") + std::strerror(errno);
      ::close(out[0]);
      ::close(lease_pipe[1]);
      if (report[0] >= 0) ::close(report[0]);
      break;
    }
    ::setpgid(pid, pid);  // also from here: no window in which a group signal misses it
    set_nonblocking_cloexec(out[0]);
    set_nonblocking_cloexec(lease_pipe[1]);
    if (report[0] >= 0) {
      set_nonblocking_cloexec(report[0]);
      at.report_fd = report[0];
      at.hang.emplace(std::chrono::seconds(a.hang_timeout_seconds()), Clock::now());
    }
    if (metrics->serving()) metrics->add_rank(a.job_id(), a.attempt(), rank, port_file);
    Rank r;
    r.rank = rank;
    r.pid = pid;
    r.out_fd = out[0];
    at.ranks.push_back(std::move(r));
    at.lease_fds.push_back(lease_pipe[1]);
    {
      std::lock_guard<std::mutex> lock(lease_mu);
      lease_fds.insert(lease_pipe[1]);
    }
  }
  log_line("job " + a.job_id() + " attempt " + std::to_string(a.attempt()) + ": started ranks " +
           std::to_string(a.first_rank()) + ".." + std::to_string(a.first_rank() + a.local_ranks() - 1) + " of " +
           std::to_string(a.world_size()) + (failure.empty() ? "" : " (failed: " + failure + ")"));
  auto [it, fresh] = attempts.emplace(key, std::move(at));
  Attempt& placed = it->second;
  if (!failure.empty()) {
    // The host's fault (out of fds or processes), not the job's: requeued. Ranks already
    // started are killed; with none, the attempt has ended here.
    placed.message = "the agent could not start the ranks: " + failure;
    placed.exit_code = attempt::kExitWorkerFault;
    signal_attempt(placed, SIGKILL);
    if (placed.ranks.empty()) {
      ::close(placed.log_fd);
      placed.log_fd = -1;
      placed.exited = true;
      report_exit(placed);
      return;
    }
  }
  // Tell the coordinator the ranks are up (best effort; the heartbeat repeats it).
  v1::ReportEventRequest ev;
  ev.set_name(o.name);
  {
    std::lock_guard<std::mutex> lock(mu);
    ev.set_incarnation(incarnation);
  }
  fill_report(placed, ev.mutable_attempt());
  v1::ReportEventResponse ignored;
  placed.start_acked =
      call(&v1::WorkerService::Stub::ReportEvent, ev, &ignored).ok();  // (a restart since resets it)
}

void Agent::Impl::reconcile() {
  std::vector<v1::Assignment> want;
  Clock::time_point sent;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!desired_valid) return;
    want = desired;
    sent = desired_sent;
  }
  std::set<std::pair<std::string, int64_t>> wanted;
  std::set<std::string> listed;
  for (const v1::Assignment& a : want) {
    const auto key = std::make_pair(a.job_id(), a.attempt());
    wanted.insert(key);
    listed.insert(a.job_id());
    auto it = attempts.find(key);
    if (it == attempts.end()) {
      // Ended here already (and forgotten), or superseded by a later attempt: a set fetched
      // before the coordinator recorded that end still lists it.
      const auto done = started.find(a.job_id());
      if (done != started.end() && a.attempt() <= done->second.attempt) continue;
      if (a.action() == v1::Assignment::STOP) {
        // Asked to stop before it started here: nothing to checkpoint.
        started[a.job_id()] = StartedJob{a.attempt(), {}};
        Attempt at;
        at.a = a;
        at.exited = true;
        at.exit_code = attempt::kExitInterrupted;
        at.stopped_by_agent = true;
        at.message = "stopped before it started";
        auto [placed, fresh] = attempts.emplace(key, std::move(at));
        report_exit(placed->second);
      } else if (!stopping->load()) {
        start_attempt(a);
      }
      continue;
    }
    Attempt& at = it->second;
    if (a.action() == v1::Assignment::STOP && !at.exited && !at.term) {
      log_line("job " + a.job_id() + ": " + a.stop_reason());
      at.stopped_by_agent = true;
      signal_attempt(at, SIGTERM);
    }
  }
  // Anything running that the coordinator no longer wants is stale: kill it now.
  for (auto& [key, at] : attempts) {
    if (at.exited || wanted.count(key) || at.killed) continue;
    log_line("job " + key.first + " attempt " + std::to_string(key.second) +
             " is no longer assigned here: killing its ranks");
    at.stopped_by_agent = true;
    signal_attempt(at, SIGKILL);
  }
  // A job the coordinator recorded as ended here and no longer lists, in a set it answered
  // after that: it cannot be listed again with that attempt.
  for (auto it = started.begin(); it != started.end();) {
    const StartedJob& j = it->second;
    if (j.exit_acked != Clock::time_point{} && j.exit_acked < sent && !listed.count(it->first)) {
      it = started.erase(it);
    } else {
      ++it;
    }
  }
}

void Agent::Impl::append_output(Attempt& at, Rank& r, const char* data, size_t n) {
  // Whole lines, each prefixed with the rank, so the members' output interleaves readably.
  r.partial.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = r.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string line = r.partial.substr(start, nl - start);
    if (!line.empty()) r.last_line = line;
    const std::string out = "[rank " + std::to_string(r.rank) + "] " + line + "\n";
    write_log(at, out);
    if (at.pending.size() + out.size() > kMaxPendingLogBytes) {
      at.dropped += static_cast<int64_t>(out.size());
      continue;
    }
    at.pending += out;
  }
  r.partial.erase(0, start);
}

// output.log up to its cap, then one line saying so: the disk holds a bounded share of a
// chatty rank's output; the coordinator still gets all of it (pending). A failed write
// (a full disk) loses only this copy.
void Agent::Impl::write_log(Attempt& at, const std::string& lines) {
  if (at.log_fd < 0 || at.log_capped) return;
  if (at.log_bytes + static_cast<int64_t>(lines.size()) <= o.max_attempt_log_bytes) {
    if (write_all(at.log_fd, lines.data(), lines.size())) at.log_bytes += static_cast<int64_t>(lines.size());
    return;
  }
  at.log_capped = true;
  const std::string marker = "[zenflow-worker] output.log reached its cap of " +
                             std::to_string(o.max_attempt_log_bytes) +
                             " bytes; later output is only uploaded\n";
  if (write_all(at.log_fd, marker.data(), marker.size())) at.log_bytes += static_cast<int64_t>(marker.size());
}

void Agent::Impl::on_report_line(Attempt& at, const std::string& line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return;
  const auto event = j.find("event");
  const std::string ev = event != j.end() && event->is_string() ? event->get<std::string>() : "";
  if (ev == "start") {
    at.start_step = number_or(j, "start_step", int64_t{0});
  } else if (ev == "resumed") {
    // Where the attempt stands before its first step (or for good, when it resumed at the
    // last step): reported like a step with no rates, unless a step came already.
    if (!at.progress.is_object()) {
      at.progress = nlohmann::json{{"event", "step"},
                                   {"step", number_or(j, "step", int64_t{0})},
                                   {"total_steps", number_or(j, "total_steps", int64_t{0})},
                                   {"loss", number_or(j, "loss", 0.0)},
                                   {"eta_seconds", -1.0}};
      at.progress_dirty = true;
    }
  } else if (ev == "step") {
    if (at.hang)
      at.hang->on_step(number_or(j, "step", int64_t{0}), number_or(j, "step_seconds", 0.0), Clock::now());
    at.progress = std::move(j);
    at.progress_dirty = true;
  } else if (ev == "checkpoint") {
    if (at.hang) at.hang->on_checkpoint(Clock::now());
  } else if (ev == "node_lost") {
    const auto node = j.find("node");
    if (node != j.end() && node->is_string()) at.lost_optimizer_node = node->get<std::string>();
  } else if (ev == "profile") {
    // Read now, while the file is this attempt's (a later attempt writes the same path).
    const auto field = j.find("path");
    const std::string path = field != j.end() && field->is_string() ? field->get<std::string>() : "";
    std::ifstream f(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) {
      log_line("job " + at.a.job_id() + ": cannot read its profile " + path);
    } else if (text.size() > rpc::kMaxProfileBytes) {
      log_line("job " + at.a.job_id() + ": its profile " + path + " is over " +
               std::to_string(rpc::kMaxProfileBytes) + " bytes; not uploaded");
    } else {
      at.profile_yaml = valid_utf8(text);  // a proto string; a profile is YAML text
    }
  }
}

void Agent::Impl::pump_io(milliseconds timeout) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Attempt*, int>> owners;  // rank index, -1 = report fd
  for (auto& [key, at] : attempts) {
    for (size_t i = 0; i < at.ranks.size(); ++i)
      if (at.ranks[i].out_fd >= 0) {
        fds.push_back({at.ranks[i].out_fd, POLLIN, 0});
        owners.emplace_back(&at, static_cast<int>(i));
      }
    if (at.report_fd >= 0) {
      fds.push_back({at.report_fd, POLLIN, 0});
      owners.emplace_back(&at, -1);
    }
  }
  if (fds.empty()) {
    std::this_thread::sleep_for(timeout);
    return;
  }
  if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return;
  char buf[65536];
  for (size_t k = 0; k < fds.size(); ++k) {
    if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    auto [at, idx] = owners[k];
    for (;;) {
      const ssize_t n = ::read(fds[k].fd, buf, sizeof(buf));
      if (n > 0) {
        if (idx >= 0) {
          append_output(*at, at->ranks[static_cast<size_t>(idx)], buf, static_cast<size_t>(n));
        } else {
          at->report_partial.append(buf, static_cast<size_t>(n));
          size_t start = 0;
          for (size_t nl; (nl = at->report_partial.find('\n', start)) != std::string::npos; start = nl + 1)
            on_report_line(*at, at->report_partial.substr(start, nl - start));
          at->report_partial.erase(0, start);
        }
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      // EOF: the process closed it (exited).
      ::close(fds[k].fd);
      if (idx >= 0) {
        Rank& r = at->ranks[static_cast<size_t>(idx)];
        if (!r.partial.empty()) append_output(*at, r, "\n", 1);
        r.out_fd = -1;
      } else {
        at->report_fd = -1;
      }
      break;
    }
  }
}

void Agent::Impl::reap() {
  for (auto& [key, at] : attempts) {
    if (at.exited) continue;
    bool all = true;
    const Rank* first_failed = nullptr;
    for (Rank& r : at.ranks) {
      if (!r.exited) {
        int st = 0;
        const pid_t p = ::waitpid(r.pid, &st, WNOHANG);
        if (p == r.pid) {
          r.exited = true;
          metrics->remove_rank(at.a.job_id(), at.a.attempt(), r.rank);
          r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          // The rest of its process group (anything it started) goes with it.
          ::kill(-r.pid, SIGKILL);
          if (r.status != 0 && at.first_failure == Clock::time_point{}) at.first_failure = Clock::now();
        }
      }
      all &= r.exited && r.out_fd < 0;
      if (r.exited && r.status != 0 && !first_failed) first_failed = &r;
    }
    const auto now = Clock::now();
    // One rank failed: give the others rank_failure_grace to notice, then stop them.
    if (first_failed && !all && !at.term && now - at.first_failure > o.rank_failure_grace) signal_attempt(at, SIGTERM);
    if (at.term && !at.killed && now > at.kill_at) signal_attempt(at, SIGKILL);
    // Rank 0's last report lines (the final step) are read before the exit is reported.
    if (!all || at.ranks.empty() || at.report_fd >= 0) continue;
    {
      std::lock_guard<std::mutex> lock(lease_mu);
      for (int fd : at.lease_fds) {
        lease_fds.erase(fd);
        ::close(fd);
      }
    }
    at.lease_fds.clear();
    if (at.report_fd >= 0) {
      ::close(at.report_fd);
      at.report_fd = -1;
    }
    at.exited = true;
    if (at.exit_code != attempt::kExitWorkerFault) {  // else the start failed: that is its end
      at.exit_code = 0;
      for (const Rank& r : at.ranks)
        if (r.status != 0) {
          at.exit_code = r.status;
          at.message = "rank " + std::to_string(r.rank) + " " + attempt::exit_text(r.status) +
                       (r.last_line.empty() ? "" : ": " + r.last_line);
          break;
        }
    }
    if (!at.hung.empty() && at.exit_code != 0) at.message = at.hung;  // killed by check_hangs()
    if (at.exit_code == attempt::kExitLeaseLost) at.message += " (its lease from the agent ran out)";
    if (at.dropped > 0) at.pending += "[zenflow-worker] " + std::to_string(at.dropped) + " bytes of output were "
                                      "dropped while the coordinator was unreachable; see " + at.dir + "/output.log\n";
    if (at.log_fd >= 0) ::close(at.log_fd);
    at.log_fd = -1;
    log_line("job " + key.first + " attempt " + std::to_string(key.second) + ": " +
             (at.exit_code == 0 ? "ranks exited 0" : at.message));
    if (at.progress_dirty) report_progress(at);
    upload_logs(at);
    upload_profile(at);  // before the exit: the attempt is still the job's current one
    report_exit(at);
  }
}

void Agent::Impl::upload_logs(Attempt& at) {
  int64_t inc;
  {
    std::lock_guard<std::mutex> lock(mu);
    inc = incarnation;
  }
  while (!at.pending.empty()) {
    v1::UploadLogsRequest req;
    req.set_name(o.name);
    req.set_incarnation(inc);
    req.mutable_attempt()->set_job_id(at.a.job_id());
    req.mutable_attempt()->set_attempt(at.a.attempt());
    req.set_offset(at.uploaded);
    // A chunk ends at a line boundary when it can.
    size_t n = std::min(at.pending.size(), rpc::kMaxLogChunkBytes);
    if (n < at.pending.size()) {
      const size_t nl = at.pending.rfind('\n', n - 1);
      if (nl != std::string::npos) n = nl + 1;
    }
    req.set_data(at.pending.substr(0, n));
    v1::UploadLogsResponse resp;
    const grpc::Status s = call(&v1::WorkerService::Stub::UploadLogs, req, &resp);
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      at.pending.clear();  // stale: the coordinator will never take these bytes
      return;
    }
    if (!s.ok()) return;  // retried at the next upload tick
    const int64_t held = resp.next_offset();
    const int64_t end = at.uploaded + static_cast<int64_t>(at.pending.size());
    if (held <= at.uploaded || held > end) {
      // The coordinator holds less than we sent before (it lost nothing acknowledged, so
      // this is a restart with the same bytes): resend from what it has if we still can.
      if (held < at.uploaded) return;
      at.pending.clear();
      at.uploaded = held;
      return;
    }
    at.pending.erase(0, static_cast<size_t>(held - at.uploaded));
    at.uploaded = held;
  }
}

void Agent::Impl::report_exit(Attempt& at) {
  v1::ReportEventRequest ev;
  ev.set_name(o.name);
  {
    std::lock_guard<std::mutex> lock(mu);
    ev.set_incarnation(incarnation);
  }
  fill_report(at, ev.mutable_attempt());
  v1::ReportEventResponse ignored;
  const grpc::Status s = call(&v1::WorkerService::Stub::ReportEvent, ev, &ignored);
  // FAILED_PRECONDITION: the attempt is no longer current; nothing to record.
  if (s.ok() || s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) exit_acknowledged(at);
}

void Agent::Impl::exit_acknowledged(Attempt& at) {
  at.exit_reported = true;
  auto it = started.find(at.a.job_id());
  if (it != started.end() && it->second.attempt == at.a.attempt() && it->second.exit_acked == Clock::time_point{})
    it->second.exit_acked = Clock::now();
}

// Queues the attempt's latest progress for the pulse thread's next beat (pulse_loop). An
// attempt that has exited sends its last progress here, by ReportProgress, before its exit
// is reported (the coordinator takes no progress of an ended job): what the job ends with.
// The attempt's latest progress (its last step line, or the step it resumed at) as a report.
v1::ReportProgressRequest Agent::Impl::progress_request(const Attempt& at) const {
  const nlohmann::json& p = at.progress;
  v1::ReportProgressRequest req;
  req.set_name(o.name);  // the incarnation is the beat's (or the call's)
  req.mutable_attempt()->set_job_id(at.a.job_id());
  req.mutable_attempt()->set_attempt(at.a.attempt());
  req.set_step(number_or(p, "step", int64_t{0}));
  req.set_total_steps(number_or(p, "total_steps", int64_t{0}));
  req.set_loss(number_or(p, "loss", 0.0));
  req.set_tokens_per_second(number_or(p, "tokens_per_second", 0.0));
  req.set_stall_share(number_or(p, "stall_share", 0.0));
  req.set_eta_seconds(number_or(p, "eta_seconds", -1.0));
  req.set_step_seconds(number_or(p, "step_seconds", 0.0));
  req.set_tokens_per_step(number_or(p, "tokens_per_step", int64_t{0}));
  req.set_start_step(at.start_step);
  return req;
}

void Agent::Impl::report_progress(Attempt& at) {
  v1::ReportProgressRequest req = progress_request(at);
  at.progress_sent = Clock::now();
  if (at.exited) {
    {
      std::lock_guard<std::mutex> lock(progress_mu);  // superseded (one in flight is older: ignored)
      progress_out.erase({at.a.job_id(), at.a.attempt()});
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      req.set_incarnation(incarnation);
    }
    v1::ReportProgressResponse ignored;
    const grpc::Status s = call(&v1::WorkerService::Stub::ReportProgress, req, &ignored);
    // Refused (a stale attempt, a bad report): retrying would not help, and the exit waits for it.
    if (s.ok() || s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        s.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
      at.progress_dirty = false;
    return;
  }
  at.progress_dirty = false;
  {
    std::lock_guard<std::mutex> lock(progress_mu);
    progress_out[{at.a.job_id(), at.a.attempt()}] = std::move(req);
  }
  progress_cv.notify_one();
}

void Agent::Impl::upload_profile(Attempt& at) {
  if (at.profile_yaml.empty()) return;
  v1::UploadProfileRequest req;
  req.set_name(o.name);
  {
    std::lock_guard<std::mutex> lock(mu);
    req.set_incarnation(incarnation);
  }
  req.mutable_attempt()->set_job_id(at.a.job_id());
  req.mutable_attempt()->set_attempt(at.a.attempt());
  req.set_profile_yaml(at.profile_yaml);
  v1::UploadProfileResponse ignored;
  const grpc::Status s = call(&v1::WorkerService::Stub::UploadProfile, req, &ignored);
  if (s.ok()) {
    at.profile_yaml.clear();
  } else if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
             s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    // Stale, or refused as it is: retrying cannot change the answer.
    log_line("job " + at.a.job_id() + ": profile not kept: " + rpc::describe(s));
    at.profile_yaml.clear();
  }  // otherwise retried at the next upload tick
}

// On the lease thread. Past the fence (grace + drain without an accepted heartbeat) it
// renews nothing, whatever the supervisor thread is doing: a rank it could not kill ends
// itself within its lease (the last term of fence_after).
void Agent::Impl::renew_leases() {
  const milliseconds gone = away();
  std::lock_guard<std::mutex> lock(lease_mu);
  if (gone >= o.disconnected_grace + o.disconnect_drain) {
    if (!lease_fds.empty() && !leases_withheld.exchange(true))
      log_line("no heartbeat accepted for " + ms_text(gone) + ": no longer renewing the ranks' leases");
    return;
  }
  leases_withheld.store(false);
  for (int fd : lease_fds)  // nonblocking; a full pipe is still a live lease
    if (::write(fd, "r", 1) == 1) metrics->lease_renewals.inc();
}

// Kills the ranks of an attempt whose rank 0 made no progress for its hang bound
// (hang_watch.h); its exit then carries why (reap). One that is already stopping has its
// own deadline (stop_grace).
void Agent::Impl::check_hangs() {
  const auto now = Clock::now();
  for (auto& [key, at] : attempts) {
    if (at.exited || !at.hang || at.term || at.killed) continue;
    const std::optional<HangWatch::Hang> h = at.hang->check(now);
    if (!h) continue;
    at.hung = "hung at step " + std::to_string(h->step) + ": no progress for " +
              std::to_string(std::chrono::duration_cast<std::chrono::seconds>(h->silent).count()) +
              " s (resources.hang_timeout " + std::to_string(h->timeout.count()) + " s)";
    log_line("job " + key.first + " attempt " + std::to_string(key.second) + " " + at.hung +
             ": killing its ranks");
    signal_attempt(at, SIGKILL);
  }
}

void Agent::Impl::forget_finished() {
  for (auto it = attempts.begin(); it != attempts.end();) {
    const Attempt& at = it->second;
    if (at.exited && at.exit_reported && at.pending.empty() && at.profile_yaml.empty()) {
      if (!at.dir.empty()) ended_dirs.push_back(at.dir);
      it = attempts.erase(it);
    } else {
      ++it;
    }
  }
  remove_ended_dirs();
}

// Keeps the newest keep_attempt_dirs ended attempts' directories (for a look at a recent
// failure); the coordinator holds everything else of them. A job's directory goes with its
// last attempt's.
void Agent::Impl::remove_ended_dirs() {
  while (ended_dirs.size() > static_cast<size_t>(std::max<int64_t>(0, o.keep_attempt_dirs))) {
    const fs::path dir = ended_dirs.front();
    ended_dirs.pop_front();
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) log_line("cannot remove " + dir.string() + ": " + ec.message());
    fs::remove(dir.parent_path(), ec);  // fails while the job has another attempt's directory
  }
}

int Agent::run() {
  Impl& m = *impl_;
  AgentOptions& o = m.o;
  try {
    if (o.name.empty()) {
      char host[256] = {};
      ::gethostname(host, sizeof(host) - 1);
      o.name = host;
    }
    if (o.trainer.empty()) o.trainer = (fs::read_symlink("/proc/self/exe").parent_path() / "zenflow").string();
    if (::access(o.trainer.c_str(), X_OK) != 0)
      throw std::invalid_argument("trainer " + o.trainer + " is not an executable (--trainer)");
    if (o.work_dir.empty()) throw std::invalid_argument("--work-dir is required");
    fs::create_directories(o.work_dir);
    o.work_dir = fs::canonical(o.work_dir).string();
    o.allowed_roots = confined_roots(o.allowed_roots, o.work_dir);
    log_line("job specs may read and write only under " + joined(o.allowed_roots, ", "));
    m.resources.set_hostname(o.name);
    m.resources.set_host_memory_bytes(o.host_memory_bytes > 0 ? o.host_memory_bytes : detect_host_memory_bytes());
    m.resources.set_physical_cores(o.physical_cores > 0 ? o.physical_cores : detect_physical_cores());
    m.resources.set_cpu_slots(o.cpu_slots);
    if (!o.cpu_only)
      for (const auto& [model, bytes] : detect_gpus()) {
        v1::GpuInfo* g = m.resources.add_gpus();
        g->set_model(model);
        g->set_memory_bytes(bytes);
      }
    for (const auto& [k, v] : o.labels) (*m.resources.mutable_labels())[k] = v;
    m.slots = m.resources.gpus_size() > 0 ? m.resources.gpus_size() : o.cpu_slots;
    for (int64_t i = 0; i < m.slots; ++i) m.ports.push_back(std::make_unique<distributed::PortReservation>(o.address));
    m.metrics = std::make_unique<WorkerMetrics>(m.slots);
    if (o.metrics_port > 0) {
      m.metrics->serve(o.metrics_host, o.metrics_port);
      log_line("metrics on http://" + o.metrics_host + ":" + std::to_string(m.metrics->port()) + "/metrics");
    }
    m.channel = rpc::make_channel(o.coordinator, o.channel);
    m.stub = v1::WorkerService::NewStub(m.channel);
  } catch (const std::exception& e) {
    log_line(e.what());
    return 1;
  }
  ::signal(SIGPIPE, SIG_IGN);
  log_line("worker " + o.name + ": " + std::to_string(m.slots) + " slot(s), " +
           std::to_string(m.resources.host_memory_bytes() >> 20) + " MiB host RAM, " +
           std::to_string(m.resources.physical_cores()) + " physical cores; coordinator " + o.coordinator);
  std::thread fetcher([&] { m.fetch_loop(); });
  std::thread pulse([&] { m.pulse_loop(); });
  std::atomic<bool> renewing{true};
  std::thread renewer([&] {
    while (renewing.load()) {
      m.renew_leases();
      std::this_thread::sleep_for(kLeaseRenewEvery);
    }
  });
  Clock::time_point next_register{};
  bool drained = false;
  while (true) {
    const auto now = Clock::now();
    bool fenced, registered;
    int64_t incarnation;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      fenced = m.fenced;
      incarnation = m.incarnation;
      registered = incarnation != 0;
    }
    if (fenced) {
      log_line("the coordinator refused incarnation " + std::to_string(incarnation) +
               " (declared LOST or replaced); registering again");
      m.kill_all("the coordinator no longer leases this incarnation (it was declared LOST)");
      for (auto& [key, at] : m.attempts) m.exit_acknowledged(at);  // stale: nothing to report
      std::lock_guard<std::mutex> lock(m.mu);
      m.incarnation = 0;
      m.fenced = false;
      registered = false;
    }
    if (stopping_.load() && !drained) {
      drained = true;
      for (auto& [key, at] : m.attempts)
        if (!at.exited) {
          at.stopped_by_agent = true;
          at.message = "the agent is shutting down";
          m.signal_attempt(at, SIGTERM);
        }
    }
    if (!registered && !stopping_.load() && now >= next_register) {
      // Attempts of the previous incarnation died with it (or were killed above).
      if (std::any_of(m.attempts.begin(), m.attempts.end(), [](const auto& kv) { return !kv.second.exited; })) {
        m.kill_all("registering again");
      } else if (!m.register_worker()) {
        next_register = now + milliseconds(500);
      }
    }
    m.pump_io(milliseconds(50));
    m.check_hangs();
    m.reap();
    m.self_fence();
    if (registered) {
      if (now >= m.next_heartbeat) {
        m.next_heartbeat = now + m.heartbeat_interval();
        m.heartbeat();
      }
      m.reconcile();
      if (now >= m.next_upload) {
        m.next_upload = now + kUploadEvery;
        for (auto& [key, at] : m.attempts) {
          m.upload_logs(at);
          m.upload_profile(at);
          if (at.progress_dirty && (at.exited || now - at.progress_sent > kProgressEvery))
            m.report_progress(at);
          if (at.exit_reportable()) m.report_exit(at);
        }
      }
    }
    m.forget_finished();
    if (stopping_.load() && std::all_of(m.attempts.begin(), m.attempts.end(),
                                        [](const auto& kv) { return kv.second.exited; })) {
      break;
    }
  }
  m.cv.notify_all();
  renewing.store(false);
  renewer.join();
  pulse.join();
  fetcher.join();
  log_line("stopped");
  return 0;
}

}  // namespace zenflow::agent
