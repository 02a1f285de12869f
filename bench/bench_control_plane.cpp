// `zenflow bench control-plane`: what the coordinator sustains on this machine, next to
// the baselines measured in the same run (docs/operations.md, "how to measure
// honestly").
//
// One run: the coordinator is a separate process pinned to core 0 (taskset), with TLS,
// tokens and synchronous=FULL; this process is the load generator, pinned to the last
// core. Load is open loop: every request has a scheduled send time and its latency is
// measured from that time, so a stalled server cannot hide its queue. Rows:
//   baselines     fdatasync of a 4 KiB write on the database's filesystem, a one-job
//                 SQLite FULL commit (the store), a null RPC (GetJob of an unknown id:
//                 TLS, token check, one lock) at one in flight
//   heartbeats    N simulated workers (role OPTIMIZER: leased like trainers, never placed)
//                 at 2 Hz each over 64 channels, for --seconds; false LOST counted at the end;
//                 the generator's own send lag beside them
//   submit / get  100 submits/s and 1,000 gets/s during the heartbeat load, each with the
//                 generator's send lag beside it
//   cpu           the coordinator's CPU time per heartbeat (beyond idle), and per submit and
//                 get (beyond the heartbeat load), 5 s each: stable where latencies are not
//   schedule      one scheduling pass over 1,000 queued jobs x 500 workers (the pure
//                 function, in this process, one thread)
//   detection     20 simulated workers stop heartbeating at random moments: time from their
//                 last acknowledged heartbeat to LOST in ListWorkers (lease 4 s)
//   restart       20 trials of SIGKILL + restart on the same database: exec to SERVING, and
//                 to every simulated worker's heartbeat accepted again; invariants after each
//                 (every acknowledged submit present, a retried request_id returns the same job,
//                 no worker declared LOST because of the coordinator's downtime)
// Prints one JSON object (stdout) and a table (stderr). Figures, never assertions.
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "client/commands.h"
#include "common/job_spec.h"
#include "common/remove_tree.h"
#include "common/rpc/rpc.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/scheduler.h"
#include "server/store.h"
#include "zenflow/v1/jobs.grpc.pb.h"
#include "zenflow/v1/workers.grpc.pb.h"

namespace zenflow::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The coordinator's lease in every phase (--lease-ms): detection is timed against it, and a
// simulated worker the generator left this long without a send may rightly be LOST.
constexpr milliseconds kLease{4000};
// The simulated workers' heartbeat period (2 Hz), which the coordinator is told too.
constexpr milliseconds kBeatPeriod{500};

struct Args {
  std::string dir;  // default: a directory under the current one (a real disk, not tmpfs)
  int workers = 5000;
  double seconds = 20;
  int channels = 64;
  int trials = 20;
  int stored_jobs = 10000;  // the database the coordinator starts on (T5)
  int stored_queued = 1000;
  bool tls = true;
  std::string heartbeat_rpc =
      "stream";               // how the simulated workers beat: "stream" (as zenflow-worker) or "unary"
  std::string latency_trace;  // when set: every measured call's (kind, scheduled ms, latency ms)
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Quantiles {
  double p50 = 0, p99 = 0, max = 0;
  size_t n = 0;
};
Quantiles quantiles(std::vector<double> v) {
  Quantiles q;
  q.n = v.size();
  if (v.empty()) return q;
  std::sort(v.begin(), v.end());
  q.p50 = v[v.size() / 2];
  q.p99 = v[std::min(v.size() - 1, static_cast<size_t>(0.99 * double(v.size())))];
  q.max = v.back();
  return q;
}
// a[i] - b[i]: a latency less the generator's send lag.
std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] - b[i];
  return out;
}
json to_json(const Quantiles& q) { return {{"p50_ms", q.p50}, {"p99_ms", q.p99}, {"max_ms", q.max}, {"n", q.n}}; }
// What to_json wrote, back (the table prints the figures as the JSON has them).
Quantiles quantiles_of(const json& j) {
  return Quantiles{j.value("p50_ms", 0.0), j.value("p99_ms", 0.0), j.value("max_ms", 0.0)};
}

void pin_to(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  ::sched_setaffinity(0, sizeof(set), &set);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// How an idle CPU of this machine waits: the cpuidle driver and, under haltpoll, how long
// it polls before halting. In a VM a halted vCPU wakes through the hypervisor, so without
// polling (no driver, or guest_halt_poll_ns 0) every wake-up of an idle core costs a VM
// exit: the unloaded rows (the null RPC, fdatasync) carry it and the loaded ones mostly do not.
json cpu_idle() {
  std::string driver = slurp("/sys/devices/system/cpu/cpuidle/current_driver");
  driver = driver.substr(0, driver.find('\n'));
  json out = {{"driver", driver.empty() ? "none" : driver}};
  const std::string poll = slurp("/sys/module/haltpoll/parameters/guest_halt_poll_ns");
  if (driver == "haltpoll" && !poll.empty()) out["guest_halt_poll_ns"] = std::strtoll(poll.c_str(), nullptr, 10);
  return out;
}

std::string cpu_idle_note(const json& idle) {
  std::string note = "cpuidle " + idle.value("driver", "none");
  if (idle.contains("guest_halt_poll_ns"))
    note += ", halt poll " + std::to_string(idle["guest_halt_poll_ns"].get<int64_t>()) + " ns";
  return note;
}

std::string filesystem_of(const fs::path& p) {
  // The longest mount point that prefixes the path.
  std::ifstream in("/proc/mounts");
  const std::string path = fs::weakly_canonical(p).string();
  std::string best, type = "unknown";
  for (std::string dev, mnt, t, rest; in >> dev >> mnt >> t && std::getline(in, rest);)
    if (path.rfind(mnt, 0) == 0 && mnt.size() >= best.size()) best = mnt, type = t;
  return type + " (" + best + ")";
}

// --- baselines ---

Quantiles fdatasync_latency(const fs::path& dir) {
  const fs::path f = dir / "fsync.probe";
  const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  std::vector<double> v;
  char block[4096] = {};
  for (int i = 0; i < 300 && fd >= 0; ++i) {
    block[0] = static_cast<char>(i);
    const auto t0 = Clock::now();
    (void)!::pwrite(fd, block, sizeof(block), 0);
    ::fdatasync(fd);
    v.push_back(ms_between(t0, Clock::now()));
  }
  if (fd >= 0) ::close(fd);
  fs::remove(f);
  return quantiles(v);
}

Quantiles store_commit_latency(const fs::path& dir) {
  const fs::path db = dir / "commit-probe.db";
  std::vector<double> v;
  {
    auto store = server::open_sqlite_store(db.string());
    for (int i = 0; i < 300; ++i) {
      server::StoreBatch b;
      server::JobRecord r;
      r.id = "probe-" + std::to_string(i);
      r.spec_yaml = "name: probe\n";
      b.jobs.push_back(r);
      const auto t0 = Clock::now();
      store->commit(b);
      v.push_back(ms_between(t0, Clock::now()));
    }
  }
  for (const char* suffix : {"", "-wal", "-shm", ".lock"}) fs::remove(db.string() + suffix);
  return quantiles(v);
}

// --- the coordinator process ---

struct Coordinator {
  pid_t pid = -1;
  std::string address;
  ~Coordinator() { kill(); }
  void kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    pid = -1;
  }
};

// Starts it (taskset -c 0) and returns once it printed its address; Clock time of exec in *exec_at.
void start_coordinator(Coordinator& c, const fs::path& dir, const std::string& listen, bool tls, int log_index,
                       Clock::time_point* exec_at) {
  const std::string bin = (fs::read_symlink("/proc/self/exe").parent_path() / "zenflow-coordinator").string();
  std::vector<std::string> args = {"taskset",
                                   "-c",
                                   "0",
                                   bin,
                                   "--listen",
                                   listen,
                                   "--db",
                                   (dir / "coordinator.db").string(),
                                   "--admin-token-file",
                                   (dir / "admin.token").string(),
                                   "--worker-token-file",
                                   (dir / "worker.token").string(),
                                   "--admin-rate-limit",
                                   "0",
                                   "--heartbeat-interval-ms",
                                   std::to_string(kBeatPeriod.count()),
                                   "--lease-ms",
                                   std::to_string(kLease.count()),
                                   "--restart-grace-ms",
                                   "8000"};
  if (tls) args.insert(args.end(), {"--tls-cert", (dir / "server.pem").string(), "--tls-key", (dir / "server.key").string()});
  const fs::path log = dir / ("coordinator-" + std::to_string(log_index) + ".log");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  *exec_at = Clock::now();
  c.pid = ::fork();
  if (c.pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a bench that is killed takes its coordinator along
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  const std::regex re("listening on ([0-9.]+:[0-9]+)");
  for (int i = 0; i < 2000; ++i) {
    std::smatch m;
    const std::string out = slurp(log);
    if (std::regex_search(out, m, re)) {
      c.address = m[1].str();
      return;
    }
    if (::waitpid(c.pid, nullptr, WNOHANG) == c.pid) throw std::runtime_error("coordinator exited:\n" + out);
    std::this_thread::sleep_for(milliseconds(5));
  }
  throw std::runtime_error("coordinator did not print its address");
}

struct Clients {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::string admin, worker;
  rpc::ChannelOptions co;
  bool unary_heartbeats = false;  // simulated workers beat by Heartbeat calls, not HeartbeatStream
  std::shared_ptr<grpc::Channel> channel(size_t i) const { return channels[i % channels.size()]; }
};

Clients connect_clients(const std::string& address, const fs::path& dir, int n, bool tls) {
  Clients c;
  if (tls) {
    c.co.ca_file = (dir / "ca.pem").string();
    c.co.tls_server_name = "localhost";
  }
  c.co.own_connection = true;  // one TCP connection per channel, as separate workers have
  for (int i = 0; i < n; ++i) c.channels.push_back(rpc::make_channel(address, c.co));
  c.admin = rpc::read_token_file((dir / "admin.token").string());
  c.worker = rpc::read_token_file((dir / "worker.token").string());
  return c;
}

grpc::Status call_get(const Clients& c, size_t i, const std::string& id) {
  auto stub = v1::JobService::NewStub(c.channel(i));
  grpc::ClientContext ctx;
  rpc::prepare_call(ctx, c.admin, milliseconds(5000));
  v1::GetJobRequest req;
  req.set_id(id);
  v1::JobStatus st;
  return stub->GetJob(&ctx, req, &st);
}

// --- simulated workers ---

struct SimWorker {
  std::string name;
  size_t channel = 0;  // its connection: index % channels
  int64_t incarnation = 0;
  std::string session;  // RegisterWorker's: every later call carries it
  std::atomic<bool> stopped{false};
  // Set: its stream is to break (cancelled, as a dead process's closed connection breaks it),
  // at its next beat; broken_ns says when it did (streams only).
  std::atomic<bool> drop{false};
  std::atomic<int64_t> broken_ns{0};
  std::atomic<int64_t> last_ok_ns{0};
  // When the generator last sent for it (its registration, then each beat), and the longest
  // it went without sending: a gap of a lease less one beat period or more is the
  // generator's, not a false LOST.
  std::atomic<int64_t> last_sent_ns{0};
  std::atomic<int64_t> max_gap_ns{0};
  void sent(Clock::time_point t) {
    const int64_t now = t.time_since_epoch().count();
    const int64_t before = last_sent_ns.exchange(now);
    if (before > 0 && now - before > max_gap_ns.load()) max_gap_ns.store(now - before);
  }
};

bool register_sim(const Clients& c, size_t channel, SimWorker& w) {
  auto stub = v1::WorkerService::NewStub(c.channel(channel));
  v1::RegisterWorkerRequest req;
  req.set_name(w.name);
  req.set_role(v1::OPTIMIZER);
  req.mutable_resources()->set_host_memory_bytes(int64_t{64} << 30);
  req.mutable_resources()->set_physical_cores(16);
  for (int attempt = 0; attempt < 50; ++attempt) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker, milliseconds(5000));
    v1::RegisterWorkerResponse resp;
    const Clock::time_point sent = Clock::now();  // its lease starts after this
    const grpc::Status s = stub->RegisterWorker(&ctx, req, &resp);
    if (s.ok()) {
      w.incarnation = resp.incarnation();
      w.session = resp.session();
      w.sent(sent);
      return true;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  return false;
}

// The open-loop load. run_load is one loop on one thread and one completion queue: the
// heartbeats of its simulated workers, each every `period` at a fixed phase on the worker's
// channel. It starts each call at its scheduled time (PrepareAsync, StartCall, Finish with the
// call as its tag) and, until the next one is due, collects the answers (AsyncNext). A send
// and its answer never cross threads: gRPC's callback API hands every call between its own
// threads, which at 11,000 calls/s took all of the generator's core and put the generator's
// own queueing into the latencies it measured. run_heartbeats splits the workers over two
// loops, so that one loop's backlog does not delay the other's sends (with one loop for
// everything, and before late sends stopped waiting for a rounded deadline, the send lag's
// p50 was 4 ms). Latency is from the scheduled time to the answer: a late send still counts
// against its call, and the send lag is reported beside it.
struct HeartbeatLoad {
  std::vector<double> latencies_ms;  // measured window only
  std::vector<Clock::time_point> due;  // the scheduled send of each, same order
  int64_t sent = 0, failed = 0;
  std::string first_error;  // of the failed ones
  std::vector<double> send_lag_ms;  // how late the generator sent each (its own share), same order
};

struct LoadPlan {
  milliseconds period{500};
  Clock::time_point start, measure_from, end;  // sent in [start, end), measured from measure_from
};

// Takes the events of `cq` (on_event(tag, ok)) until `until`. gRPC rounds a wait's deadline
// up to a whole millisecond, so a wait is started only while `until` is ahead. Once it has
// passed, at most one event already there is taken, with a poll that does not block, and the
// caller's send goes out: a blocking wait there would hold every late send up to another
// millisecond, and draining every answer first would starve the sends while answers keep
// arriving.
template <class OnEvent>
void collect_until(grpc::CompletionQueue& cq, Clock::time_point until, OnEvent&& on_event) {
  for (;;) {
    void* tag = nullptr;
    bool ok = false;
    const Clock::duration left = until - Clock::now();
    if (left <= Clock::duration::zero()) {
      if (cq.AsyncNext(&tag, &ok, gpr_inf_past(GPR_CLOCK_MONOTONIC)) == grpc::CompletionQueue::GOT_EVENT)
        on_event(tag, ok);
      return;
    }
    if (cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + left) != grpc::CompletionQueue::GOT_EVENT)
      return;
    on_event(tag, ok);
  }
}

HeartbeatLoad run_load(const Clients& c, const std::vector<SimWorker*>& workers, const LoadPlan& plan) {
  HeartbeatLoad out;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
  for (const auto& ch : c.channels) stubs.push_back(v1::WorkerService::NewStub(ch));
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext ctx;
    grpc::Status status;
    Clock::time_point due;
    double lag_ms = 0;  // how late it was sent
    bool measured = false;
    SimWorker* worker = nullptr;
    v1::HeartbeatRequest beat;
    v1::HeartbeatResponse beat_resp;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::HeartbeatResponse>> reader;
  };
  int64_t in_flight = 0;
  auto answered = [&](Call* call) {
    const auto done = Clock::now();
    --in_flight;
    if (call->status.ok()) call->worker->last_ok_ns.store(done.time_since_epoch().count());
    if (!call->status.ok() && out.first_error.empty()) out.first_error = rpc::describe(call->status);
    if (call->measured) {
      ++out.sent;
      out.failed += !call->status.ok();
      out.latencies_ms.push_back(ms_between(call->due, done));
      out.due.push_back(call->due);
      out.send_lag_ms.push_back(call->lag_ms);
    }
    delete call;
  };
  const int64_t n = static_cast<int64_t>(workers.size());
  if (n == 0) return out;
  const auto slot = std::chrono::duration_cast<Clock::duration>(plan.period) / n;
  for (int64_t k = 0;; ++k) {  // the k-th beat: worker k % n, round k / n
    const Clock::time_point due = plan.start + plan.period * (k / n) + slot * (k % n);
    if (due >= plan.end) break;
    collect_until(cq, due, [&](void* tag, bool) { answered(static_cast<Call*>(tag)); });
    const double lag = ms_between(due, Clock::now());
    SimWorker& w = *workers[static_cast<size_t>(k % n)];
    if (w.stopped.load()) continue;
    w.sent(Clock::now());
    auto* call = new Call;
    rpc::prepare_call(call->ctx, c.worker, milliseconds(2000), w.session);
    call->beat.set_name(w.name);
    call->beat.set_incarnation(w.incarnation);
    call->due = due;
    call->worker = &w;
    call->measured = due >= plan.measure_from;
    call->lag_ms = lag;
    call->reader = stubs[w.channel % stubs.size()]->PrepareAsyncHeartbeat(&call->ctx, call->beat, &cq);
    call->reader->StartCall();
    call->reader->Finish(&call->beat_resp, &call->status, call);
    ++in_flight;
  }
  while (in_flight > 0) {  // every answer, then the queue may go (each call has a deadline)
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    answered(static_cast<Call*>(tag));
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) answered(static_cast<Call*>(tag));
  return out;
}

// The same load as run_load, on HeartbeatStream as zenflow-worker sends it: each worker
// opens its stream first (all before the first beat), then sends each beat at its time as a
// Write with the Read of its answer, both tagged with the stream. A beat whose predecessor
// is still unanswered waits for it (a stream has one write and one read in flight), and its
// latency still counts from its own scheduled time. At the end each stream is closed the
// way an agent that stops closes it (WritesDone, Finish): a broken stream would cut the
// worker's lease.
HeartbeatLoad run_stream_load(const Clients& c, const std::vector<SimWorker*>& workers,
                              const LoadPlan& plan) {
  HeartbeatLoad out;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
  for (const auto& ch : c.channels) stubs.push_back(v1::WorkerService::NewStub(ch));
  grpc::CompletionQueue cq;
  struct Stream;
  enum Kind { kStart, kWrite, kRead, kWritesDone, kFinish };
  struct Op {
    Stream* stream;
    Kind kind;
  };
  struct Beat {
    Clock::time_point due;
    double lag_ms = 0;
    bool measured = false;
  };
  struct Stream {
    SimWorker* worker = nullptr;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>> rw;
    Op ops[5];
    v1::HeartbeatRequest beat;
    v1::HeartbeatResponse answer;
    grpc::Status status;
    bool open = false, broken = false, busy = false;
    bool cancelled = false, finishing = false;  // at the end: cancelled, Finish called
    int outstanding = 0;                        // operations in flight
    Beat current;
    std::deque<Beat> waiting;  // due while the previous beat was unanswered
  };
  const size_t n = workers.size();
  if (n == 0) return out;
  std::vector<std::unique_ptr<Stream>> streams;
  int64_t outstanding = 0;
  auto start_op = [&](Stream& st, Kind k) {
    ++st.outstanding;
    ++outstanding;
    return static_cast<void*>(&st.ops[k]);
  };
  for (SimWorker* w : workers) {
    auto st = std::make_unique<Stream>();
    st->worker = w;
    for (int k = 0; k < 5; ++k) st->ops[k] = {st.get(), static_cast<Kind>(k)};
    st->ctx.AddMetadata("authorization", "Bearer " + c.worker);
    st->ctx.AddMetadata(rpc::kSessionMetadata, w->session);
    st->beat.set_name(w->name);
    st->beat.set_incarnation(w->incarnation);
    st->rw = stubs[w->channel % stubs.size()]->PrepareAsyncHeartbeatStream(&st->ctx, &cq);
    st->rw->StartCall(start_op(*st, kStart));
    streams.push_back(std::move(st));
  }
  auto finish_if_idle = [&](Stream& st) {
    if (!st.cancelled || st.finishing || st.outstanding > 0) return;
    st.finishing = true;
    st.rw->Finish(&st.status, start_op(st, kFinish));
  };
  auto fail = [&](Stream& st, const std::string& why) {
    if (!st.broken && out.first_error.empty()) out.first_error = why;
    st.broken = true;
  };
  auto send = [&](Stream& st, const Beat& b) {
    st.current = b;
    st.busy = true;
    st.worker->sent(Clock::now());
    st.rw->Write(st.beat, start_op(st, kWrite));
    st.rw->Read(&st.answer, start_op(st, kRead));
  };
  auto count = [&](const Beat& b, bool ok, Clock::time_point done) {
    if (!b.measured) return;
    ++out.sent;
    out.failed += !ok;
    out.latencies_ms.push_back(ms_between(b.due, done));
    out.due.push_back(b.due);
    out.send_lag_ms.push_back(b.lag_ms);
  };
  auto completed = [&](void* tag, bool ok) {
    const auto done = Clock::now();
    Op& op = *static_cast<Op*>(tag);
    Stream& st = *op.stream;
    --st.outstanding;
    --outstanding;
    switch (op.kind) {
      case kStart:
        if (ok) {
          st.open = true;
        } else {
          fail(st, "heartbeat stream did not start");
        }
        break;
      case kWrite:
        if (!ok) fail(st, "heartbeat stream broke (write)");
        break;
      case kRead:
        st.busy = false;
        if (ok) {
          st.worker->last_ok_ns.store(done.time_since_epoch().count());
        } else {
          fail(st, "heartbeat stream broke (read)");
        }
        count(st.current, ok, done);
        if (!st.broken && !st.waiting.empty()) {
          Beat b = st.waiting.front();
          st.waiting.pop_front();
          send(st, b);
        }
        break;
      case kWritesDone:
        st.finishing = true;
        st.rw->Finish(&st.status, start_op(st, kFinish));
        break;
      case kFinish:
        break;
    }
    finish_if_idle(st);
  };
  const auto slot = std::chrono::duration_cast<Clock::duration>(plan.period) / static_cast<int64_t>(n);
  for (int64_t k = 0;; ++k) {  // the k-th beat: worker k % n, round k / n
    const int64_t nn = static_cast<int64_t>(n);
    const Clock::time_point due = plan.start + plan.period * (k / nn) + slot * (k % nn);
    if (due >= plan.end) break;
    collect_until(cq, due, completed);
    Stream& st = *streams[static_cast<size_t>(k % nn)];
    if (st.worker->drop.load() && !st.cancelled) {  // the worker "dies": its stream breaks
      st.ctx.TryCancel();
      st.cancelled = true;
      st.broken = true;
      st.worker->broken_ns.store(Clock::now().time_since_epoch().count());
      finish_if_idle(st);
    }
    if (st.worker->stopped.load() || st.cancelled) continue;
    Beat b;
    b.due = due;
    b.lag_ms = ms_between(due, Clock::now());
    b.measured = due >= plan.measure_from;
    if (st.broken) {
      count(b, false, Clock::now());
    } else if (!st.open || st.busy) {
      st.waiting.push_back(b);
    } else {
      send(st, b);
    }
  }
  // Every answer (bounded: a beat unanswered after 5 s ends its stream), then close.
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  auto busy = [&] {
    return std::any_of(streams.begin(), streams.end(),
                       [](const auto& st) { return !st->broken && (st->busy || !st->waiting.empty()); });
  };
  while (busy() && Clock::now() < give_up) collect_until(cq, Clock::now() + milliseconds(5), completed);
  // A stream that is broken or stuck is cancelled and finished once its operations are back;
  // a healthy one is closed from its side first (kWritesDone, then kFinish).
  for (auto& st : streams) {
    for (const Beat& b : st->waiting) count(b, false, Clock::now());
    st->waiting.clear();
    if (st->open && !st->broken && !st->busy) {
      st->rw->WritesDone(start_op(*st, kWritesDone));
      continue;
    }
    if (!st->broken) fail(*st, "heartbeat unanswered for 5 s");
    st->ctx.TryCancel();
    st->cancelled = true;
    finish_if_idle(*st);
  }
  while (outstanding > 0) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    completed(tag, ok);
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return out;
}

// GetJob calls of `id` at `per_second` in [from, to), on channels 2..9: one thread sends each
// at its time, another takes the answers as they arrive (CompletionQueue::Next, which waits
// without a deadline). A loop doing both, as run_load does, waits in AsyncNext until the next
// send, and gRPC rounds that deadline up to a whole millisecond: at one get a millisecond,
// which leaves the loop idle between sends, it sent them 0.58 ms late at the median (p99
// 1.45 ms), and the Get row carried that. The sender's timer slack is 1 us (Linux's default
// is 50 us), so that its sleep ends when asked.
struct GetLoad {
  std::vector<double> ms;              // each get's latency from its scheduled send
  std::vector<double> send_lag_ms;     // how late the generator sent it, same order
  std::vector<Clock::time_point> due;  // its scheduled send, same order
  int64_t ok = 0;
};

GetLoad run_gets(const Clients& c, double per_second, Clock::time_point from, Clock::time_point to,
                 const std::string& id) {
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
  for (const auto& ch : c.channels) stubs.push_back(v1::JobService::NewStub(ch));
  const auto every = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / per_second));
  int64_t total = 0;  // how many fall in [from, to)
  while (from + every * total < to) ++total;
  struct Call {
    grpc::ClientContext ctx;
    grpc::Status status;
    Clock::time_point due;
    double lag_ms = 0;
    v1::GetJobRequest req;
    v1::JobStatus resp;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::JobStatus>> reader;
  };
  grpc::CompletionQueue cq;
  std::thread sender([&] {
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    for (int64_t k = 0; k < total; ++k) {
      const Clock::time_point due = from + every * k;
      std::this_thread::sleep_until(due);
      auto* call = new Call;
      call->lag_ms = ms_between(due, Clock::now());
      call->due = due;
      rpc::prepare_call(call->ctx, c.admin, milliseconds(5000));
      call->req.set_id(id);
      call->reader = stubs[(2 + static_cast<size_t>(k % 8)) % stubs.size()]->PrepareAsyncGetJob(&call->ctx, call->req, &cq);
      call->reader->StartCall();
      call->reader->Finish(&call->resp, &call->status, call);
    }
  });
  GetLoad out;
  for (int64_t got = 0; got < total; ++got) {  // each call has a deadline, so each answers
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    const auto done = Clock::now();
    std::unique_ptr<Call> call(static_cast<Call*>(tag));
    out.ok += call->status.ok();
    out.ms.push_back(ms_between(call->due, done));
    out.send_lag_ms.push_back(call->lag_ms);
    out.due.push_back(call->due);
  }
  sender.join();
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) delete static_cast<Call*>(tag);
  return out;
}

HeartbeatLoad run_heartbeats(const Clients& c, std::vector<std::unique_ptr<SimWorker>>& workers, milliseconds period,
                             Clock::time_point start, Clock::time_point measure_from, Clock::time_point end) {
  // kLoops threads, each with workers t, t + kLoops, ... on a queue of its own (offset by a
  // fraction of a slot), so that one loop's backlog does not delay the others' sends.
  constexpr size_t kLoops = 2;
  std::vector<HeartbeatLoad> parts(kLoops);
  std::vector<std::thread> loops;
  for (size_t t = 0; t < kLoops; ++t) {
    std::vector<SimWorker*> mine;
    for (size_t i = t; i < workers.size(); i += kLoops) mine.push_back(workers[i].get());
    LoadPlan plan;
    plan.period = period;
    plan.start = start + std::chrono::duration_cast<std::chrono::nanoseconds>(period) * static_cast<int64_t>(t) /
                             static_cast<int64_t>(kLoops * std::max<size_t>(1, mine.size()));
    plan.measure_from = measure_from;
    plan.end = end;
    loops.emplace_back([&c, &parts, t, mine = std::move(mine), plan] {
      parts[t] = c.unary_heartbeats ? run_load(c, mine, plan) : run_stream_load(c, mine, plan);
    });
  }
  HeartbeatLoad all;
  for (std::thread& th : loops) th.join();
  for (HeartbeatLoad& p : parts) {
    all.sent += p.sent;
    all.failed += p.failed;
    if (all.first_error.empty()) all.first_error = p.first_error;
    all.latencies_ms.insert(all.latencies_ms.end(), p.latencies_ms.begin(), p.latencies_ms.end());
    all.due.insert(all.due.end(), p.due.begin(), p.due.end());
    all.send_lag_ms.insert(all.send_lag_ms.end(), p.send_lag_ms.begin(), p.send_lag_ms.end());
  }
  return all;
}

std::map<std::string, std::string> worker_states(const Clients& c) {
  auto stub = v1::JobService::NewStub(c.channel(0));
  grpc::ClientContext ctx;
  rpc::prepare_call(ctx, c.admin, milliseconds(10000));
  v1::ListWorkersResponse resp;
  std::map<std::string, std::string> out;
  if (stub->ListWorkers(&ctx, v1::ListWorkersRequest{}, &resp).ok())
    for (const v1::WorkerStatus& w : resp.workers()) out[w.name()] = v1::WorkerState_Name(w.state());
  return out;
}

std::string tiny_spec(int i, const fs::path& dir) {
  return "name: bench-" + std::to_string(i) +
         "\nmodel: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4, "
         "intermediate_size: 64, max_position_embeddings: 32}}\n"
         "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
         "train: {steps: 3, micro_batch: 2, seq_len: 16, device: cpu}\n"
         "checkpoint: {dir: " + (dir / ("ckpt-" + std::to_string(i))).string() + "}\n";
}

// The database of T5, written before the coordinator first starts: `jobs` jobs, the first
// `queued` of them QUEUED (they need trainer slots, which no simulated worker offers, so
// they stay queued and every scheduling pass considers them), the rest SUCCEEDED. Restarts
// then read a store of that size, and submits check against that many jobs.
void prefill_store(const fs::path& dir, int jobs, int queued) {
  auto store = server::open_sqlite_store((dir / "coordinator.db").string());
  const auto now_ms = std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch());
  server::StoreBatch b;
  for (int i = 0; i < jobs; ++i) {
    server::JobRecord r;
    char id[32];
    std::snprintf(id, sizeof(id), "j-%06d", i + 1);
    r.id = id;
    r.name = "stored-" + std::to_string(i);
    // Each its own checkpoint directory, as the coordinator requires of live jobs.
    const JobSpec js = parse_job_spec(tiny_spec(1000000 + i, dir));
    r.spec_yaml = to_yaml(js);
    r.checkpoint_dir = js.checkpoint.dir;  // the spec facts, as the coordinator records them
    r.device = js.train.device;
    r.workers = js.resources.workers;
    r.gpus_per_worker = js.resources.gpus_per_worker;
    r.max_restarts = js.resources.max_restarts;
    r.submit_seq = i + 1;
    r.submit_time_ms = now_ms.count() - (jobs - i) * 1000;
    r.total_steps = 3;
    r.revision = 1;
    if (i >= queued) {
      r.state = "SUCCEEDED";
      r.attempt = 1;
      r.step = 3;
      r.start_time_ms = r.submit_time_ms + 10;
      r.end_time_ms = r.submit_time_ms + 500;
      r.exit_code = 0;
      r.placement = {"stored-worker"};
    }
    b.jobs.push_back(std::move(r));
    if (b.jobs.size() == 1000 || i + 1 == jobs) {
      store->commit(b);
      b = server::StoreBatch{};
    }
  }
}

// --- the scheduling pass ---

Quantiles schedule_pass(int jobs, int workers, int reps) {
  std::mt19937_64 rng(7);
  std::vector<scheduler::WorkerView> ws;
  for (int i = 0; i < workers; ++i) {
    scheduler::WorkerView w;
    w.id = "w" + std::to_string(i);
    w.gpus = 1 + static_cast<int64_t>(rng() % 8);
    w.gpu_model = rng() % 2 ? "H100-80GB" : "A100-80GB";
    w.gpu_memory_bytes = int64_t{80} << 30;
    w.host_memory_bytes = (int64_t{256} << 30) * (1 + static_cast<int64_t>(rng() % 4));
    w.physical_cores = 32 * (1 + static_cast<int64_t>(rng() % 4));
    ws.push_back(std::move(w));
  }
  std::vector<scheduler::JobView> js;
  for (int i = 0; i < jobs; ++i) {
    scheduler::JobView j;
    j.id = "j" + std::to_string(i);
    j.priority = static_cast<int64_t>(rng() % 4);
    j.submit_seq = i;
    j.workers = 1 + static_cast<int64_t>(rng() % 4);
    j.per_worker.slots = 1 + static_cast<int64_t>(rng() % 8);
    j.per_worker.host_memory_bytes = (int64_t{16} << 30) * (1 + static_cast<int64_t>(rng() % 16));
    j.per_worker.cores = 4 * (1 + static_cast<int64_t>(rng() % 8));
    js.push_back(std::move(j));
  }
  std::vector<double> v;
  scheduler::ScheduleOptions o;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    const scheduler::ScheduleDecision d = scheduler::schedule(ws, js, o);
    v.push_back(ms_between(t0, Clock::now()));
    if (d.waiting.size() + d.assignments.size() != js.size()) throw std::logic_error("schedule lost a job");
  }
  return quantiles(v);
}

// The machine's CPU time so far (all cores, /proc/stat), and how much of it the hypervisor
// gave to others (steal): a VM's pause of tens of milliseconds shows in every p99 row.
struct MachineCpu {
  double total = 0, steal = 0;
};
MachineCpu machine_cpu() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  MachineCpu m;
  in >> cpu;
  for (int i = 0; i < 10; ++i) {
    double v = 0;
    if (!(in >> v)) break;
    if (i < 8) m.total += v;  // user nice system idle iowait irq softirq steal (guest is within user)
    if (i == 7) m.steal = v;
  }
  return m;
}

double cpu_seconds_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> f; ++i) {
    if (i == 14) utime = std::stod(f);
    if (i == 15) stime = std::stod(f);
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// One run: its directory, the coordinator and the clients, the simulated workers, and the
// figures (`out`) the rows write as they go. The rows run in the order of the header
// comment; each needs what the ones before it left here (the coordinator, the registered
// workers, the acknowledged submits).
struct Bench {
  explicit Bench(const Args& args) : a(args) {}
  const Args& a;
  fs::path dir;  // of its own, inside --dir; removed at the end
  Clock::time_point started = Clock::now();
  json out;
  bool tls = true;  // false when openssl could not make the certificates
  Coordinator coord;
  Clients c;
  std::vector<std::unique_ptr<SimWorker>> sims;
  double registration_seconds = 0;
  std::set<std::string> acked;  // the ids of the submits the coordinator acknowledged

  void say(const std::string& s) const {
    char at[32];
    std::snprintf(at, sizeof(at), "[%6.1f s] ", std::chrono::duration<double>(Clock::now() - started).count());
    std::cerr << "bench control-plane: " << at << s << std::endl;
  }
};

// The directory, the machine, the pinning, the tokens and (with --tls) the certificates.
void prepare(Bench& b) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  // A directory of its own inside --dir (default: the current one), removed at the end:
  // nothing of the user's in --dir is touched.
  b.dir = (b.a.dir.empty() ? fs::current_path() : fs::path(b.a.dir)) /
          ("zenflow-bench-control-plane-" + std::to_string(::getpid()));
  if (fs::exists(b.dir)) throw std::runtime_error(b.dir.string() + " already exists");
  fs::create_directories(b.dir);
  b.started = Clock::now();
  b.out["machine"] = {
      {"nproc", cores}, {"cpu", cpu_model()}, {"filesystem", filesystem_of(b.dir)}, {"cpu_idle", cpu_idle()}};
  b.out["pinning"] = {{"coordinator", "core 0 (taskset -c 0)"},
                      {"load generator", "core " + std::to_string(cores - 1)}};
  pin_to(cores - 1);
  std::ofstream(b.dir / "admin.token") << "admin-bench-token-0123456789abcdef\n";
  std::ofstream(b.dir / "worker.token") << "worker-bench-token-0123456789abcdef\n";
  b.tls = b.a.tls;
  if (b.tls) {
    const std::string sh =
        "cd '" + b.dir.string() +
        "' && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca -keyout ca.key -out ca.pem"
        " && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr"
        " && printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > ext.cnf"
        " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext.cnf"
        " -out server.pem";
    if (std::system((sh + " >/dev/null 2>&1").c_str()) != 0) {
      b.say("openssl failed: running without TLS (rows labelled tls=false)");
      b.tls = false;
    }
  }
  b.out["tls"] = b.tls;
  b.out["synchronous"] = "FULL";
}

// Row "baselines", before the coordinator runs: fdatasync and a SQLite FULL commit.
void measure_disk_baselines(Bench& b) {
  b.say("baselines: fdatasync, SQLite FULL commit");
  const Quantiles fsync = fdatasync_latency(b.dir);
  const Quantiles commit = store_commit_latency(b.dir);
  b.out["baselines"] = {{"fdatasync_4k", to_json(fsync)}, {"sqlite_full_commit", to_json(commit)}};
}

// The stored jobs, then the coordinator on them and the clients' channels.
void start_on_stored_jobs(Bench& b) {
  if (b.a.stored_queued > b.a.stored_jobs) throw std::invalid_argument("--stored-queued exceeds --stored-jobs");
  b.say("store: " + std::to_string(b.a.stored_jobs) + " jobs, " + std::to_string(b.a.stored_queued) +
        " of them queued");
  prefill_store(b.dir, b.a.stored_jobs, b.a.stored_queued);
  b.out["store"] = {{"jobs", b.a.stored_jobs}, {"queued", b.a.stored_queued}};
  Clock::time_point exec_at;
  start_coordinator(b.coord, b.dir, "127.0.0.1:0", b.tls, 0, &exec_at);
  b.c = connect_clients(b.coord.address, b.dir, b.a.channels, b.tls);
  b.c.unary_heartbeats = b.a.heartbeat_rpc == "unary";
}

// Row "baselines": a null RPC at one in flight.
void measure_null_rpc(Bench& b) {
  std::vector<double> v;
  for (int i = 0; i < 2000; ++i) {
    const auto t0 = Clock::now();
    (void)call_get(b.c, 0, "j-none");
    if (i >= 200) v.push_back(ms_between(t0, Clock::now()));
  }
  b.out["baselines"]["null_rpc"] = to_json(quantiles(v));
  b.out["baselines"]["null_rpc"]["what"] = "GetJob of an unknown id: TLS + token check + one lock, 1 in flight";
}

void register_workers(Bench& b) {
  b.say("registering " + std::to_string(b.a.workers) + " simulated workers");
  const Clock::time_point registering = Clock::now();
  for (int i = 0; i < b.a.workers; ++i) {
    b.sims.push_back(std::make_unique<SimWorker>());
    b.sims.back()->name = "sim-" + std::to_string(i);
    b.sims.back()->channel = static_cast<size_t>(i) % b.c.channels.size();
  }
  std::vector<std::thread> pool;
  std::atomic<int> failed{0};
  for (int t = 0; t < 16; ++t)
    pool.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < b.sims.size(); i += 16)
        if (!register_sim(b.c, i, *b.sims[i])) failed.fetch_add(1);
    });
  for (auto& th : pool) th.join();
  if (failed.load()) b.say(std::to_string(failed.load()) + " simulated workers could not register");
  b.registration_seconds = std::chrono::duration<double>(Clock::now() - registering).count();
}

// Submits at 100/s in [from, to), open loop; the acknowledged ids go to b.acked.
struct SubmitLoad {
  std::vector<double> ms, send_lag_ms;  // latency from the scheduled send; how late it was sent
  int failed = 0;
};
SubmitLoad run_submits(Bench& b, Clock::time_point from, Clock::time_point to) {
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);  // as run_gets' sender
  auto stub = v1::JobService::NewStub(b.c.channel(1));
  SubmitLoad s;
  for (int i = 0;; ++i) {
    const auto due = from + milliseconds(10) * i;
    if (due >= to) return s;
    std::this_thread::sleep_until(due);
    s.send_lag_ms.push_back(ms_between(due, Clock::now()));
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, b.c.admin, milliseconds(5000));
    v1::SubmitJobRequest req;
    req.set_spec_yaml(tiny_spec(i, b.dir));
    req.set_request_id("bench-" + std::to_string(i));
    v1::SubmitJobResponse resp;
    const grpc::Status st = stub->SubmitJob(&ctx, req, &resp);
    s.ms.push_back(ms_between(due, Clock::now()));
    if (st.ok()) {
      b.acked.insert(resp.job().id());
    } else {
      ++s.failed;
    }
  }
}

// --latency-trace: "KIND SCHEDULED_MS LATENCY_MS", scheduled from the window's start.
void write_latency_trace(const Bench& b, Clock::time_point measure_from, const HeartbeatLoad& hb,
                         const GetLoad& gets, const SubmitLoad& submits) {
  std::ofstream trace(b.a.latency_trace);
  for (size_t i = 0; i < hb.latencies_ms.size(); ++i)
    trace << "heartbeat " << ms_between(measure_from, hb.due[i]) << ' ' << hb.latencies_ms[i] << '\n';
  for (size_t i = 0; i < gets.ms.size(); ++i)
    trace << "get " << ms_between(measure_from, gets.due[i]) << ' ' << gets.ms[i] << '\n';
  for (size_t i = 0; i < submits.ms.size(); ++i)
    trace << "submit " << 10.0 * static_cast<double>(i) << ' ' << submits.ms[i] << '\n';
  if (!trace) b.say("cannot write --latency-trace " + b.a.latency_trace);
}

// The simulated workers the coordinator holds LOST after the load. A LOST worker the
// generator kept sending for, each send within a lease less one beat period of the one
// before (its registration the first), is a false LOST: the coordinator's. One it left longer
// without a send (a slow VM registering 5,000 workers takes that long before the first beats)
// is the generator's, counted apart: a beat sent just inside the lease after such a gap still
// reaches the coordinator after it, and a worker beating every period never leaves such a gap.
struct LostCount {
  int false_lost = 0, after_generator_gap = 0;
};
LostCount count_lost(const Bench& b) {
  LostCount n;
  std::map<std::string, const SimWorker*> by_name;
  for (const auto& w : b.sims) by_name[w->name] = w.get();
  const int64_t gap_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(kLease - kBeatPeriod).count();
  for (const auto& [name, state] : worker_states(b.c)) {
    if (state != "LOST") continue;
    auto it = by_name.find(name);
    if (it != by_name.end() && it->second->max_gap_ns.load() >= gap_ns)
      ++n.after_generator_gap;
    else
      ++n.false_lost;
  }
  return n;
}

// Rows "heartbeats" and "submit / get": the open-loop load, heartbeats with submits and
// gets on top, each latency beside the generator's own send lag.
void measure_load(Bench& b) {
  const auto start = Clock::now() + milliseconds(200);
  const auto measure_from = start + milliseconds(3000);
  const auto end = measure_from + milliseconds(static_cast<int64_t>(b.a.seconds * 1000));
  const double cpu0 = cpu_seconds_of(b.coord.pid);
  const MachineCpu machine0 = machine_cpu();
  const double self0 = cpu_seconds_of(::getpid());
  b.say("open-loop load: " + std::to_string(b.a.workers) +
        " workers x 2 Hz heartbeats, 100 submits/s, 1,000 gets/s, " +
        std::to_string(static_cast<int>(b.a.seconds)) + " s measured");
  SubmitLoad submits;
  std::thread submitter([&] { submits = run_submits(b, measure_from, end); });
  // 1,000 gets/s from threads of their own, so that they do not wait behind the heartbeats' sends.
  GetLoad load;
  std::thread getter([&] { load = run_gets(b.c, 1000, measure_from, end, "j-000001"); });
  const HeartbeatLoad hb = run_heartbeats(b.c, b.sims, kBeatPeriod, start, measure_from, end);
  getter.join();
  submitter.join();
  if (!b.a.latency_trace.empty()) write_latency_trace(b, measure_from, hb, load, submits);
  const double cpu1 = cpu_seconds_of(b.coord.pid);
  const MachineCpu machine1 = machine_cpu();
  const double steal_share =
      machine1.total > machine0.total ? (machine1.steal - machine0.steal) / (machine1.total - machine0.total) : 0;
  const double self1 = cpu_seconds_of(::getpid());
  const LostCount lost = count_lost(b);

  json& hbj = b.out["heartbeats"];
  const Quantiles hbq = quantiles(hb.latencies_ms);
  hbj = to_json(hbq);
  hbj["per_second"] = double(hb.sent) / b.a.seconds;
  hbj["rpc"] = b.c.unary_heartbeats ? "Heartbeat (a unary call each)" : "HeartbeatStream (one stream per worker)";
  hbj["failed"] = hb.failed;
  if (hb.failed) {
    hbj["first_error"] = hb.first_error;
    b.say("heartbeats: " + std::to_string(hb.failed) + " failed; the first: " + hb.first_error);
  }
  hbj["false_lost"] = lost.false_lost;
  hbj["lost_after_generator_gap"] = lost.after_generator_gap;
  hbj["registration_seconds"] = b.registration_seconds;
  if (lost.after_generator_gap > 0)
    b.say(std::to_string(lost.after_generator_gap) +
          " simulated workers went LOST after the generator sent nothing for them " +
          "for a lease less one beat period or more (registering them took " +
          std::to_string(b.registration_seconds) + " s): not counted as false LOST");
  // CPU over the whole load (warm-up included) per request of every kind sent in it.
  const double load_seconds = std::chrono::duration<double>(end - start).count();
  hbj["coordinator_cores_used"] = (cpu1 - cpu0) / load_seconds;
  // The generator's own CPU (heartbeats, submits, gets): near 1 core, its latencies include
  // its own queueing.
  hbj["load_generator_cores_used"] = (self1 - self0) / load_seconds;
  const double null_rpc_p50 = b.out["baselines"]["null_rpc"]["p50_ms"].get<double>();
  hbj["p50_over_null_rpc"] = hbq.p50 / std::max(1e-9, null_rpc_p50);
  // The generator's own share of each heartbeat's latency: how late it sent it (AsyncNext
  // wakes on whole milliseconds, and a busy loop sends late).
  hbj["generator_send_lag"] = to_json(quantiles(hb.send_lag_ms));
  hbj["from_actual_send"] = to_json(quantiles(minus(hb.latencies_ms, hb.send_lag_ms)));
  hbj["cpu_steal_share"] = steal_share;  // of the machine's CPU time during the load

  const Quantiles sq = quantiles(submits.ms), gq = quantiles(load.ms);
  const double commit_p50 = b.out["baselines"]["sqlite_full_commit"]["p50_ms"].get<double>();
  b.out["submit"] = to_json(sq);
  b.out["submit"]["failed"] = submits.failed;
  b.out["submit"]["p50_over_sqlite_commit"] = sq.p50 / std::max(1e-9, commit_p50);
  b.out["submit"]["generator_send_lag"] = to_json(quantiles(submits.send_lag_ms));
  b.out["submit"]["from_actual_send"] = to_json(quantiles(minus(submits.ms, submits.send_lag_ms)));
  b.out["get"] = to_json(gq);
  b.out["get"]["failed"] = static_cast<int64_t>(load.ms.size()) - load.ok;
  b.out["get"]["generator_send_lag"] = to_json(quantiles(load.send_lag_ms));
  b.out["get"]["from_actual_send"] = to_json(quantiles(minus(load.ms, load.send_lag_ms)));
  b.out["get"]["p50_over_null_rpc"] = gq.p50 / std::max(1e-9, null_rpc_p50);
}

// Row "cpu": coordinator CPU per request (docs/operations.md, efficiency figures): stable
// where latencies on a shared host are not. Idle first (2 s, shorter than a lease), then
// the heartbeats alone, then with submits, then with gets, 5 s each: a submit or a get
// costs what it adds to the heartbeats' CPU, so every phase runs under the same lease
// traffic and no simulated worker is lost between phases.
void measure_cpu_per_request(Bench& b) {
  constexpr double kCpuPhaseSeconds = 5;
  b.say("coordinator CPU per request: idle 2 s, then heartbeats alone, + submits, + gets (" +
        std::to_string(static_cast<int>(kCpuPhaseSeconds)) + " s each)");
  struct CpuPhase {
    double cpu = 0, seconds = 0;
    int64_t calls = 0;
  };
  // CPU of the coordinator in [from, to), with `run` working meanwhile (it returns the calls it made).
  auto cpu_phase = [&](Clock::time_point from, Clock::time_point to,
                       const std::function<int64_t(Clock::time_point start, Clock::time_point end)>& run) {
    CpuPhase p;
    std::this_thread::sleep_until(from);
    const double c0 = cpu_seconds_of(b.coord.pid);
    const auto t0 = Clock::now();
    p.calls = run(t0, to);
    std::this_thread::sleep_until(to);
    p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    p.cpu = cpu_seconds_of(b.coord.pid) - c0;
    return p;
  };
  const milliseconds phase(static_cast<int64_t>(kCpuPhaseSeconds * 1000));
  const auto idle_from = Clock::now();
  const CpuPhase idle = cpu_phase(idle_from, idle_from + milliseconds(2000), [](Clock::time_point, Clock::time_point) {
    return int64_t{0};
  });
  const double idle_cores = idle.cpu / idle.seconds;
  // The heartbeats from beats_from, at their rate 500 ms later; then three phases.
  const auto beats_from = Clock::now();
  const auto hb_from = beats_from + milliseconds(500), submit_from = hb_from + phase, get_from = submit_from + phase,
             beats_to = get_from + phase + milliseconds(500);
  GetLoad cpu_load;
  // Heartbeats measured from beats_to: latencies are not this part's figures.
  std::thread beats([&] { (void)run_heartbeats(b.c, b.sims, kBeatPeriod, beats_from, beats_to, beats_to); });
  std::thread gets([&] { cpu_load = run_gets(b.c, 1000, get_from, get_from + phase, "j-000001"); });
  const CpuPhase hb_cpu = cpu_phase(hb_from, submit_from, [&](Clock::time_point, Clock::time_point) {
    return static_cast<int64_t>(double(b.sims.size()) * 1000.0 / double(kBeatPeriod.count()) * kCpuPhaseSeconds);
  });
  const double hb_cores = hb_cpu.cpu / hb_cpu.seconds;
  const CpuPhase submit_cpu = cpu_phase(submit_from, get_from, [&](Clock::time_point start, Clock::time_point end) {
    auto stub = v1::JobService::NewStub(b.c.channel(1));
    int64_t n = 0;
    for (int i = 0;; ++i) {
      const auto due = start + milliseconds(10) * i;
      if (due >= end) return n;
      std::this_thread::sleep_until(due);
      grpc::ClientContext ctx;
      rpc::prepare_call(ctx, b.c.admin, milliseconds(5000));
      v1::SubmitJobRequest req;
      req.set_spec_yaml(tiny_spec(500000 + i, b.dir));
      req.set_request_id("bench-cpu-" + std::to_string(i));
      v1::SubmitJobResponse resp;
      n += stub->SubmitJob(&ctx, req, &resp).ok();
    }
  });
  CpuPhase get_cpu = cpu_phase(get_from, get_from + phase, [](Clock::time_point, Clock::time_point) { return int64_t{0}; });
  beats.join();
  gets.join();
  get_cpu.calls = cpu_load.ok;  // sent by run_gets in that window
  // Per call: what the phase used beyond its base (idle, or idle plus the heartbeats).
  auto us_per_call = [](const CpuPhase& p, double base_cores) {
    return p.calls > 0 ? std::max(0.0, p.cpu - base_cores * p.seconds) / double(p.calls) * 1e6 : 0.0;
  };
  b.out["cpu_per_request"] = {
      {"idle_cores", idle_cores},
      {"heartbeat_load_cores", hb_cores},
      {"heartbeat_us", us_per_call(hb_cpu, idle_cores)},
      {"heartbeats", hb_cpu.calls},
      {"submit_us", us_per_call(submit_cpu, hb_cores)},
      {"submits", submit_cpu.calls},
      {"get_us", us_per_call(get_cpu, hb_cores)},
      {"gets", get_cpu.calls},
      {"phase_seconds", kCpuPhaseSeconds},
      {"what",
       "coordinator CPU-seconds (utime + stime) per request: a heartbeat beyond idle, a submit or "
       "a get beyond the heartbeat load"}};
}

// ListJobs: every page of 100, newest first, following the tokens, all jobs and the
// queued ones; each call timed (no other load: the heartbeats have stopped).
void measure_list_jobs(Bench& b) {
  b.say("ListJobs: every page of 100, all jobs and the queued ones");
  for (const bool only_queued : {false, true}) {
    auto stub = v1::JobService::NewStub(b.c.channel(0));
    std::vector<double> page_ms;
    int64_t listed = 0;
    std::string token;
    for (int pages = 0; pages < 100000; ++pages) {
      grpc::ClientContext ctx;
      rpc::prepare_call(ctx, b.c.admin, milliseconds(10000));
      v1::ListJobsRequest req;
      req.set_page_size(100);
      req.set_page_token(token);
      if (only_queued) req.add_states(v1::QUEUED);
      v1::ListJobsResponse resp;
      const auto t0 = Clock::now();
      const grpc::Status st = stub->ListJobs(&ctx, req, &resp);
      page_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      if (!st.ok()) {
        b.say("ListJobs failed: " + st.error_message());
        break;
      }
      listed += resp.jobs_size();
      token = resp.next_page_token();
      if (token.empty()) break;
    }
    json& row = b.out["list_jobs"][only_queued ? "queued" : "all"];
    row = to_json(quantiles(page_ms));
    row["jobs"] = listed;
    row["pages"] = page_ms.size();
  }
}

// Row "schedule".
void measure_schedule_pass(Bench& b) {
  b.say("scheduling pass: 1,000 queued jobs x 500 workers");
  b.out["schedule_1000x500"] = to_json(schedule_pass(1000, 500, 50));
  b.out["schedule_1000x500"]["what"] = "the decision only (pure function, one thread), not binding or start";
}

// Row "detection": `trials` workers stop at random moments while the others keep beating.
// The victims are live ones: a worker the load already had declared LOST (a false LOST, on
// an overloaded machine) has nothing left to detect, and its last good heartbeat is old.
void measure_detection(Bench& b) {
  const Args& a = b.a;
  auto& sims = b.sims;
  b.say("failure detection: " + std::to_string(a.trials) + " workers stop heartbeating" +
        (b.c.unary_heartbeats ? "" : ", " + std::to_string(a.trials) + " more have their stream break"));
  std::mt19937_64 rng(11);
  const auto states = worker_states(b.c);
  auto is_live = [&](const SimWorker& w) {
    const auto it = states.find(w.name);
    return it != states.end() && it->second != "LOST";
  };
  // Victims: `trials` that stop beating (a paused worker: its stream stays open) and, on
  // streams, `trials` more whose stream breaks (a dead one: its connection closes).
  const bool breaks = !b.c.unary_heartbeats;
  const int kinds = breaks ? 2 : 1;
  std::vector<size_t> victims, broken;
  for (int i = 0; i < a.trials * kinds; ++i) {
    size_t v = static_cast<size_t>(i) * (sims.size() / static_cast<size_t>(a.trials * kinds));
    while (v < sims.size() && !is_live(*sims[v])) ++v;  // the next live one
    if (v < sims.size() && (victims.empty() || v > victims.back()) && (broken.empty() || v > broken.back()))
      (i % kinds == 0 ? victims : broken).push_back(v);
  }
  if (victims.size() + broken.size() < static_cast<size_t>(a.trials * kinds))
    b.say("detection: only " + std::to_string(victims.size() + broken.size()) + " live workers to stop");
  const auto t_start = Clock::now() + milliseconds(100);
  const auto t_end = t_start + milliseconds(12000);
  std::thread beats([&] {
    const HeartbeatLoad l = run_heartbeats(b.c, sims, kBeatPeriod, t_start, t_end, t_end);
    if (!l.first_error.empty()) b.say("detection: a heartbeat failed: " + l.first_error);
  });
  std::thread stopper([&] {
    std::vector<std::pair<Clock::time_point, size_t>> when;  // (time, victim; broken ones + sims.size())
    for (size_t v : victims) when.emplace_back(t_start + milliseconds(500 + static_cast<int64_t>(rng() % 2000)), v);
    for (size_t v : broken)
      when.emplace_back(t_start + milliseconds(500 + static_cast<int64_t>(rng() % 2000)), v + sims.size());
    std::sort(when.begin(), when.end());
    for (const auto& [t, v] : when) {
      std::this_thread::sleep_until(t);
      if (v < sims.size()) {
        sims[v]->stopped.store(true);
      } else {
        sims[v - sims.size()]->drop.store(true);
      }
    }
  });
  // From its last answered beat (stopped) or from its stream's break (broken) to LOST.
  std::map<size_t, double> seen, seen_broken;
  while (Clock::now() < t_end && seen.size() + seen_broken.size() < victims.size() + broken.size()) {
    const auto states = worker_states(b.c);
    const auto now = Clock::now();
    auto lost = [&](size_t v) {
      auto it = states.find(sims[v]->name);
      return it != states.end() && it->second == "LOST";
    };
    for (size_t v : victims)
      if (!seen.count(v) && sims[v]->stopped.load() && lost(v))
        seen[v] = ms_between(Clock::time_point(Clock::duration(sims[v]->last_ok_ns.load())), now);
    for (size_t v : broken)
      if (!seen_broken.count(v) && sims[v]->broken_ns.load() > 0 && lost(v))
        seen_broken[v] = ms_between(Clock::time_point(Clock::duration(sims[v]->broken_ns.load())), now);
    std::this_thread::sleep_for(milliseconds(100));  // ListWorkers of every worker, 10/s
  }
  stopper.join();
  beats.join();
  std::vector<double> detect_ms, broken_ms;
  for (const auto& [v, ms] : seen) detect_ms.push_back(ms);
  b.out["detection"] = to_json(quantiles(detect_ms));
  b.out["detection"]["trials"] = victims.size();
  b.out["detection"]["detected"] = seen.size();
  b.out["detection"]["lease_ms"] = kLease.count();
  if (breaks) {
    for (const auto& [v, ms] : seen_broken) broken_ms.push_back(ms);
    json& row = b.out["detection_stream_broken"];
    row = to_json(quantiles(broken_ms));
    row["trials"] = broken.size();
    row["detected"] = seen_broken.size();
    row["interval_ms"] = kBeatPeriod.count();
    row["what"] = "a worker's HeartbeatStream breaks (its process died) -> LOST, polled every 100 ms";
  }
}

// Every live worker's next heartbeat accepted after a restart (parallel over the channels);
// how many were.
size_t reattach(const Bench& b, const std::vector<SimWorker*>& live) {
  std::atomic<size_t> attached{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 16; ++t)
    pool.emplace_back([&, t] {
      auto stub = v1::WorkerService::NewStub(b.c.channel(static_cast<size_t>(t)));
      for (size_t i = static_cast<size_t>(t); i < live.size(); i += 16) {
        for (int attempt = 0; attempt < 100; ++attempt) {
          grpc::ClientContext ctx;
          rpc::prepare_call(ctx, b.c.worker, milliseconds(1000), live[i]->session);
          ctx.set_wait_for_ready(true);
          v1::HeartbeatRequest req;
          req.set_name(live[i]->name);
          req.set_incarnation(live[i]->incarnation);
          v1::HeartbeatResponse resp;
          if (stub->Heartbeat(&ctx, req, &resp).ok()) {
            attached.fetch_add(1);
            break;
          }
        }
      }
    });
  for (auto& th : pool) th.join();
  return attached.load();
}

// The invariants after a restart: every acknowledged submit present (else ++*missing), no
// job listed twice and a retried request_id the same job (else ++*duplicates).
void check_restart_invariants(const Bench& b, int* missing, int* duplicates) {
  auto stub = v1::JobService::NewStub(b.c.channel(0));
  {
    v1::ListJobsRequest req;
    req.set_page_size(1000);
    std::set<std::string> present;
    for (std::string token;;) {
      grpc::ClientContext page_ctx;
      rpc::prepare_call(page_ctx, b.c.admin, milliseconds(10000));
      req.set_page_token(token);
      v1::ListJobsResponse resp;
      if (!stub->ListJobs(&page_ctx, req, &resp).ok()) break;
      for (const v1::JobStatus& j : resp.jobs())
        if (!present.insert(j.id()).second) ++*duplicates;
      token = resp.next_page_token();
      if (token.empty()) break;
    }
    for (const std::string& id : b.acked) *missing += present.count(id) == 0;
  }
  grpc::ClientContext ctx;
  rpc::prepare_call(ctx, b.c.admin, milliseconds(10000));
  v1::SubmitJobRequest req;
  req.set_spec_yaml(tiny_spec(0, b.dir));
  req.set_request_id("bench-0");
  v1::SubmitJobResponse resp;
  if (stub->SubmitJob(&ctx, req, &resp).ok() && resp.created()) ++*duplicates;
}

// Row "restart": SIGKILL, restart on the same DB and port, SERVING and re-attach times.
void measure_restarts(Bench& b) {
  b.say("coordinator SIGKILL + restart: " + std::to_string(b.a.trials) + " trials");
  std::vector<double> serving_ms, reattach_ms;
  int missing = 0, duplicates = 0, lost_after_restart = 0;
  // Re-attach and lost counts are over the workers live before the first kill: one the load
  // had declared LOST is not the restart's doing.
  std::vector<SimWorker*> live;
  {
    const auto states = worker_states(b.c);
    for (auto& s : b.sims) {
      const auto it = states.find(s->name);
      if (!s->stopped.load() && it != states.end() && it->second != "LOST") live.push_back(s.get());
    }
  }
  live.resize(std::min<size_t>(live.size(), 500));  // 500 live workers re-attaching
  for (int trial = 0; trial < b.a.trials; ++trial) {
    b.coord.kill();
    Clock::time_point exec;
    // Same port: the workers know only it.
    start_coordinator(b.coord, b.dir, b.coord.address, b.tls, trial + 1, &exec);
    // SERVING: poll health every 2 ms from exec.
    auto health = grpc::health::v1::Health::NewStub(rpc::make_channel(b.coord.address, b.c.co));
    for (int i = 0; i < 5000; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(200));
      grpc::health::v1::HealthCheckResponse r;
      if (health->Check(&ctx, {}, &r).ok() && r.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        serving_ms.push_back(ms_between(exec, Clock::now()));
        break;
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
    const size_t attached = reattach(b, live);
    reattach_ms.push_back(ms_between(exec, Clock::now()));
    check_restart_invariants(b, &missing, &duplicates);
    const auto states = worker_states(b.c);
    for (SimWorker* w : live) {
      auto it = states.find(w->name);
      lost_after_restart += it != states.end() && it->second == "LOST";
    }
    if (attached != live.size())
      b.say("trial " + std::to_string(trial) + ": only " + std::to_string(attached) + " workers re-attached");
  }
  b.out["restart"] = {{"serving", to_json(quantiles(serving_ms))},
                      {"all_workers_reattached", to_json(quantiles(reattach_ms))},
                      {"workers", live.size()},
                      {"trials", b.a.trials},
                      {"acked_submits_missing", missing},
                      {"duplicates", duplicates},
                      {"workers_lost_by_restart", lost_after_restart},
                      {"acked_submits", b.acked.size()}};
  b.coord.kill();
}

// The table (stderr): every figure from b.out, as the JSON has it.
void print_table(const Bench& b) {
  const json& out = b.out;
  std::fprintf(stderr, "\n%-44s %10s %10s %10s  %s\n", "row (TLS + tokens + synchronous=FULL)", "p50 ms", "p99 ms",
               "max ms", "note");
  auto row = [](const std::string& name, const Quantiles& q, const std::string& note) {
    std::fprintf(stderr, "%-44s %10.3f %10.3f %10.3f  %s\n", name.c_str(), q.p50, q.p99, q.max, note.c_str());
  };
  const auto q = quantiles_of;
  char note[160];
  const json& base = out["baselines"];
  row("baseline fdatasync 4 KiB", q(base["fdatasync_4k"]), out["machine"]["filesystem"].get<std::string>());
  row("baseline SQLite FULL commit (one job)", q(base["sqlite_full_commit"]), "");
  row("baseline null RPC (1 in flight)", q(base["null_rpc"]),
      "GetJob of an unknown id; " + cpu_idle_note(out["machine"]["cpu_idle"]));
  const json& hb = out["heartbeats"];
  std::snprintf(note, sizeof(note), "%.0f/s scheduled, %d false LOST, coordinator %.2f core, generator %.2f",
                hb["per_second"].get<double>(), hb["false_lost"].get<int>(), hb["coordinator_cores_used"].get<double>(),
                hb["load_generator_cores_used"].get<double>());
  row("heartbeats (" + std::to_string(b.a.workers) + " workers, 2 Hz, " +
          (b.c.unary_heartbeats ? "unary" : "streams") + ")",
      q(hb), note);
  row("  of which the generator's send lag", q(hb["generator_send_lag"]), "how late it sent them (included above)");
  row("  from the actual send", q(hb["from_actual_send"]), "each one's latency less its send lag");
  std::fprintf(stderr, "%-44s %10.2f %%  (the hypervisor's share of this VM's CPU time during the load)\n",
               "CPU steal during the load", 100.0 * hb["cpu_steal_share"].get<double>());
  const json& submit = out["submit"];
  std::snprintf(note, sizeof(note), "p50 = %.1fx the commit", submit["p50_over_sqlite_commit"].get<double>());
  row("SubmitJob at 100/s under heartbeat load", q(submit), note);
  row("  of which the generator's send lag", q(submit["generator_send_lag"]), "");
  row("  from the actual send", q(submit["from_actual_send"]), "");
  const json& get = out["get"];
  row("GetJob at 1,000/s under heartbeat load", q(get), "");
  row("  of which the generator's send lag", q(get["generator_send_lag"]), "");
  row("  from the actual send", q(get["from_actual_send"]), "");
  for (const auto& [key, what] : {std::pair{"all", "all jobs"}, std::pair{"queued", "state QUEUED"}}) {
    const json& l = out["list_jobs"][key];
    std::snprintf(note, sizeof(note), "%lld jobs in %lld pages, no other load",
                  static_cast<long long>(l.value("jobs", 0)), static_cast<long long>(l.value("pages", 0)));
    row(std::string("ListJobs page of 100, ") + what, q(l), note);
  }
  row("scheduling pass 1,000 jobs x 500 workers", q(out["schedule_1000x500"]), "decision only");
  const json& cpu = out["cpu_per_request"];
  std::fprintf(stderr, "%-44s %10.1f us/call (%lld calls)\n", "coordinator CPU per heartbeat",
               cpu["heartbeat_us"].get<double>(), static_cast<long long>(cpu["heartbeats"].get<int64_t>()));
  std::fprintf(stderr, "%-44s %10.1f us/call (%lld calls)\n", "coordinator CPU per SubmitJob",
               cpu["submit_us"].get<double>(), static_cast<long long>(cpu["submits"].get<int64_t>()));
  std::fprintf(stderr, "%-44s %10.1f us/call (%lld calls)\n", "coordinator CPU per GetJob", cpu["get_us"].get<double>(),
               static_cast<long long>(cpu["gets"].get<int64_t>()));
  std::fprintf(stderr, "%-44s %10.3f cores\n", "coordinator idle", cpu["idle_cores"].get<double>());
  const json& detection = out["detection"];
  row("worker stops -> LOST (lease 4 s)", q(detection),
      detection["detected"].dump() + " of " + detection["trials"].dump());
  if (out.contains("detection_stream_broken")) {
    const json& broken = out["detection_stream_broken"];
    row("worker's stream breaks -> LOST", q(broken),
        broken["detected"].dump() + " of " + broken["trials"].dump() +
            " (heartbeat interval 500 ms; polled every 100 ms)");
  }
  const json& restart = out["restart"];
  row("coordinator SIGKILL -> SERVING", q(restart["serving"]), "from exec");
  std::snprintf(note, sizeof(note), "%zu workers; missing %d, duplicates %d, lost %d",
                restart["workers"].get<size_t>(), restart["acked_submits_missing"].get<int>(),
                restart["duplicates"].get<int>(), restart["workers_lost_by_restart"].get<int>());
  row("coordinator SIGKILL -> all re-attached", q(restart["all_workers_reattached"]), note);
}

int run_bench(const Args& a) {
  Bench b(a);
  prepare(b);
  measure_disk_baselines(b);
  start_on_stored_jobs(b);
  measure_null_rpc(b);
  register_workers(b);
  measure_load(b);
  measure_cpu_per_request(b);
  measure_list_jobs(b);
  measure_schedule_pass(b);
  measure_detection(b);
  measure_restarts(b);
  print_table(b);
  std::cout << b.out.dump(2) << std::endl;
  std::error_code ec;
  remove_tree(b.dir, ec);
  return kExitOk;
}

CommandRegistrar reg(120, [](CommandContext& ctx) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = ctx.bench->add_subcommand("control-plane", "Coordinator heartbeats, submits, scheduling, detection and restart");
  cmd->add_option(
      "--dir", a->dir,
      "Where to work (a real disk; default: the current directory), in a subdirectory of its own that is "
      "removed at the end");
  cmd->add_option("--workers", a->workers, "Simulated workers")->check(CLI::Range(1, 100000));
  cmd->add_option("--seconds", a->seconds, "Measured seconds of the open-loop load")->check(CLI::Range(1.0, 600.0));
  cmd->add_option("--trials", a->trials, "Detection and restart trials")->check(CLI::Range(1, 1000));
  cmd->add_option("--channels", a->channels, "Client channels (TCP connections)")->check(CLI::Range(1, 1024));
  cmd->add_option("--stored-jobs", a->stored_jobs, "Jobs in the database before the coordinator starts")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--stored-queued", a->stored_queued, "How many of them are queued")->check(CLI::Range(0, 1000000));
  cmd->add_flag("!--no-tls", a->tls, "Plaintext (rows are labelled tls=false)");
  cmd->add_option(
         "--heartbeat-rpc", a->heartbeat_rpc,
         "How simulated workers beat: stream (HeartbeatStream, as zenflow-worker does) or unary (Heartbeat)")
      ->check(CLI::IsMember({"stream", "unary"}));
  cmd->add_option("--latency-trace", a->latency_trace,
                  "Write every measured heartbeat, get and submit (KIND SCHEDULED_MS LATENCY_MS) to this file");
  cmd->callback([a, &ctx] {
    try {
      ctx.exit_code = run_bench(*a);
    } catch (const std::exception& e) {
      std::cerr << "zenflow: bench control-plane: " << e.what() << "\n";
      ctx.exit_code = kExitFailure;
    }
  });
});

}  // namespace
}  // namespace zenflow::cli
