#include "worker/distributed/communicator.h"

#include <csignal>

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
// Torch's CMake config defines USE_C10D_GLOO / USE_C10D_NCCL for the process groups
// its build has; the headers (and Gloo's own, which ProcessGroupGloo.hpp includes) must
// also have been shipped.
#if defined(USE_C10D_GLOO) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>) && \
    __has_include(<gloo/algorithm.h>)
#define ZENFLOW_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(USE_C10D_NCCL) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#define ZENFLOW_HAVE_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace zenflow::distributed {

// LibTorch 2.x splits ProcessGroup (the dispatcher-facing wrapper) from Backend (what
// ProcessGroupGloo/NCCL derive from); in 1.13 they derive from ProcessGroup directly.
// The collective methods used here have the same signatures on both bases.
#if TORCH_VERSION_MAJOR >= 2
using PGBase = c10d::Backend;
#else
using PGBase = c10d::ProcessGroup;
#endif

using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), s < 10 ? "%.2f s" : "%.1f s", s);
  return buf;
}

std::string fmt_ms(std::chrono::milliseconds ms) { return fmt_seconds(ms.count() / 1000.0); }

std::string fmt_bytes(int64_t b) {
  char buf[48];
  if (b < 1024) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(b));
  } else if (b < (int64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1024.0 * 1024.0));
  }
  return buf;
}

// c10::Error::what() carries a C++ backtrace; the message alone is what users need.
std::string error_text(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// The store keys of a rendezvous generation (CommunicatorOptions::generation).
std::string key_space(int64_t generation) {
  return generation > 0 ? "zenflow/g" + std::to_string(generation) + "/" : "zenflow/";
}
std::string hb_key(int64_t generation, int rank) { return key_space(generation) + "hb/" + std::to_string(rank); }

// State shared with the heartbeat thread and the failure probe. Both touch the store
// through `monitor`, a client connection of their own; a store operation can block
// when the store's host is stopped, so neither is ever joined without a deadline.
//
// Suspect mode: while a wait on a collective has lasted longer than `suspect_after`,
// the heartbeat thread also reads every rank's counter each tick and keeps the last
// few readings, so that a collective that times out can name the stale ranks at once
// (comparing with a reading a few intervals old) instead of sampling afterwards.
struct MonitorState {
  c10::intrusive_ptr<c10d::TCPStore> monitor;
  int rank = 0;
  int world = 1;
  int64_t generation = 0;
  std::chrono::milliseconds interval{0};
  std::chrono::milliseconds suspect_after{0};
  std::atomic<int64_t> waiting_since_ns{0};  // steady-clock ns of the current wait; 0 = none
  std::mutex store_mu;                       // one store operation at a time on `monitor`
  std::mutex mu;                             // guards everything below
  std::condition_variable cv;
  bool stop = false;
  bool exited = false;
  std::atomic<bool> store_lost{false};
  std::deque<std::pair<Clock::time_point, std::vector<int64_t>>> readings;  // suspect mode
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

std::vector<int64_t> read_heartbeats(MonitorState& st) {
  std::lock_guard<std::mutex> g(st.store_mu);
  std::vector<int64_t> out(st.world);
  for (int r = 0; r < st.world; ++r) out[r] = st.monitor->add(hb_key(st.generation, r), 0);
  return out;
}

void heartbeat_loop(std::shared_ptr<MonitorState> st) {
  std::unique_lock<std::mutex> lk(st->mu);
  while (!st->stop) {
    lk.unlock();
    std::vector<int64_t> reading;
    try {
      {
        std::lock_guard<std::mutex> g(st->store_mu);
        st->monitor->add(hb_key(st->generation, st->rank), 1);
      }
      const int64_t since = st->waiting_since_ns.load();
      if (since != 0 && now_ns() - since > std::chrono::nanoseconds(st->suspect_after).count()) {
        reading = read_heartbeats(*st);
      }
    } catch (const std::exception&) {
      st->store_lost = true;  // the store's host (rank 0) is gone; nothing more to beat
      lk.lock();
      break;
    }
    lk.lock();
    if (!reading.empty()) {
      st->readings.emplace_back(Clock::now(), std::move(reading));
      if (st->readings.size() > 8) st->readings.pop_front();
    } else if (st->waiting_since_ns.load() == 0) {
      st->readings.clear();
    }
    st->cv.wait_for(lk, st->interval, [&] { return st->stop; });
  }
  st->exited = true;
  st->cv.notify_all();
}

struct ProbeResult {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool store_error = false;
  std::vector<int64_t> first, second;
};

}  // namespace

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

const char* traffic_name(Traffic t) {
  switch (t) {
    case Traffic::kGradients:
      return "gradients";
    case Traffic::kSelection:
      return "selection";
    case Traffic::kParameters:
      return "parameters";
    case Traffic::kOther:
      return "other";
  }
  return "?";
}

int64_t CommStats::total_bytes() const {
  int64_t s = 0;
  for (const auto& k : by_kind) s += k.bytes;
  return s;
}

namespace detail {
struct PendingOp {
  Communicator* comm = nullptr;
  c10::intrusive_ptr<c10d::Work> work;
  CollectiveKind kind = CollectiveKind::kAllreduce;
  std::string what;  // "allreduce of 4.0 KiB (gradients)"
  Clock::time_point start;
  std::mutex mu;
  bool done = false;
  std::function<void()> after;  // run once the collective succeeded (copy-back of a wire buffer)
};
}  // namespace detail

struct Communicator::Impl {
  RankInfo info;
  CommunicatorOptions opts;
  Communicator* self = nullptr;
  std::string backend;
  int port = 0;
  c10::intrusive_ptr<c10d::TCPStore> store;  // rendezvous (rank 0 hosts it unless store_external)
  c10::intrusive_ptr<PGBase> pg;
  std::shared_ptr<MonitorState> mon;
  std::thread hb_thread;

  std::mutex launch_mu;
  mutable std::mutex stats_mu;
  CommStats stats;
  mutable std::mutex fail_mu;
  std::string failure;
  std::atomic<bool> failed{false};

  std::string where() const {
    return "rank " + std::to_string(info.rank) + " of " + std::to_string(info.world_size);
  }

  void start_heartbeat(c10::intrusive_ptr<c10d::TCPStore> monitor);
  void stop_heartbeat();
  void close_store();

  void check_usable(const std::string& what) const {
    if (!failed) return;
    std::lock_guard<std::mutex> lk(fail_mu);
    throw std::runtime_error("zenflow distributed: " + what + " refused on " + where() +
                             ": the communicator failed earlier: " + failure);
  }

  void check_tensor(const at::Tensor& t, const char* op) const {
    if (!t.defined()) throw std::invalid_argument(std::string(op) + ": undefined tensor");
    if (t.is_sparse()) throw std::invalid_argument(std::string(op) + ": sparse tensors are not supported");
    if (t.device().type() != opts.device_type) {
      throw std::invalid_argument(std::string(op) + ": tensor on " + t.device().str() + " but the " +
                                  backend + " communicator works on " +
                                  c10::DeviceTypeName(opts.device_type));
    }
  }

  std::shared_ptr<detail::PendingOp> launch(CollectiveKind kind, int64_t bytes, Traffic traffic,
                                            const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
    auto op = std::make_shared<detail::PendingOp>();
    op->comm = self;
    op->kind = kind;
    op->what =
        std::string(collective_kind_name(kind)) +
        (kind == CollectiveKind::kBarrier ? std::string()
                                          : " of " + fmt_bytes(bytes) + " (" + traffic_name(traffic) + ")");
    check_usable(op->what);
    {
      std::lock_guard<std::mutex> lk(launch_mu);
      op->start = Clock::now();
      try {
        op->work = start();
      } catch (const std::exception& e) {
        throw std::runtime_error("zenflow distributed: " + op->what + " could not be launched on " + where() +
                                 ": " + error_text(e));
      }
    }
    {
      std::lock_guard<std::mutex> lk(stats_mu);
      auto& k = stats.by_kind[static_cast<int>(kind)];
      k.calls += 1;
      k.bytes += bytes;
      stats.bytes_by_traffic[static_cast<int>(traffic)] += bytes;
    }
    return op;
  }

  double complete(detail::PendingOp& op) {
    std::lock_guard<std::mutex> lk(op.mu);
    if (op.done) return 0.0;
    const auto t0 = Clock::now();
    int64_t mark = 0;
    if (mon) {
      int64_t expected = 0;
      mark = now_ns();
      if (!mon->waiting_since_ns.compare_exchange_strong(expected, mark)) mark = 0;  // an older wait marks it
    }
    struct Unmark {
      MonitorState* st;
      int64_t mark;
      ~Unmark() {
        if (st != nullptr && mark != 0) st->waiting_since_ns.compare_exchange_strong(mark, 0);
      }
    } unmark{mon.get(), mark};
    try {
      if (backend == "nccl") {
        // NCCL: wait() makes the current stream wait; its watchdog enforces the timeout.
        op.work->wait();
      } else {
        op.work->wait(info.timeout);
      }
    } catch (const std::exception& e) {
      op.done = true;
      fail(op, error_text(e));
    }
    const double waited = seconds_since(t0);
    op.done = true;
    op.work.reset();
    if (op.after) {
      op.after();
      op.after = nullptr;
    }
    std::lock_guard<std::mutex> g(stats_mu);
    stats.by_kind[static_cast<int>(op.kind)].wait_seconds += waited;
    return waited;
  }

  double run(const std::shared_ptr<detail::PendingOp>& op) { return complete(*op); }

  bool store_is_remote() const { return info.rank != 0 || info.store_external; }

  std::string store_lost_text(bool silent) const {
    const char* how = silent ? "does not answer" : "no longer answers";
    if (info.store_external) {
      return std::string("the rendezvous store (hosted outside the ranks, e.g. by the launcher) ") + how;
    }
    if (info.rank == 0) return std::string("the heartbeat store (hosted by this rank) ") + how;
    return std::string("lost rank 0 (it hosts the rendezvous store, which ") + how + ")";
  }

  // Names the ranks whose heartbeat counter stopped: compares a fresh reading with one
  // taken at least 2.5 intervals ago in suspect mode, or, without one, reads twice 3
  // intervals apart. Store reads run on a helper thread with a deadline (a stopped store
  // host would block the store client).
  std::string lost_ranks_report() {
    const int world = info.world_size;
    if (world == 1) return "no peer to lose (world size 1)";
    if (!mon) return "heartbeat not running";
    if (mon->store_lost && store_is_remote()) return store_lost_text(false);
    auto res = std::make_shared<ProbeResult>();
    auto st = mon;
    Clock::time_point base_time;
    {
      std::lock_guard<std::mutex> lk(st->mu);
      const auto cutoff = Clock::now() - st->interval * 5 / 2;
      for (auto it = st->readings.rbegin(); it != st->readings.rend(); ++it) {
        if (it->first <= cutoff) {
          res->first = it->second;
          base_time = it->first;
          break;
        }
      }
    }
    const bool have_base = !res->first.empty();
    const auto pause = have_base ? std::chrono::milliseconds(0) : 3 * st->interval;
    if (!have_base) base_time = Clock::now();
    std::thread([st, res, have_base, pause] {
      bool err = false;
      std::vector<int64_t> a, b;
      try {
        if (!have_base) {
          a = read_heartbeats(*st);
          std::this_thread::sleep_for(pause);
        }
        b = read_heartbeats(*st);
      } catch (const std::exception&) {
        err = true;
      }
      std::lock_guard<std::mutex> lk(res->mu);
      res->store_error = err;
      if (!have_base) res->first = std::move(a);
      res->second = std::move(b);
      res->done = true;
      res->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lk(res->mu);
    const bool done =
        res->cv.wait_for(lk, pause + std::chrono::milliseconds(2000), [&] { return res->done; });
    if (!done) return store_lost_text(true);
    if (res->store_error) return store_lost_text(false);
    const double silent = seconds_since(base_time);
    std::vector<int> stale;
    for (int r = 0; r < world; ++r) {
      if (r != info.rank && res->first[r] == res->second[r]) stale.push_back(r);
    }
    if (stale.empty()) {
      return "every peer's heartbeat is alive: a peer did not join this collective in time (hung, "
             "diverged, or failed itself; see its log)";
    }
    return std::string(stale.size() == 1 ? "lost rank " : "lost ranks ") + join_ranks(stale) +
           " (no heartbeat in the last " + fmt_seconds(silent) + ")";
  }

  [[noreturn]] void fail(const detail::PendingOp& op, const std::string& cause) {
    const double elapsed = seconds_since(op.start);
    bool first = false;
    if (!failed) {
      const std::string lost = lost_ranks_report();  // takes a few heartbeat intervals
      std::lock_guard<std::mutex> lk(fail_mu);
      if (!failed) {
        failure = op.what + " failed on " + where() + " after " + fmt_seconds(elapsed) + " (timeout " +
                  fmt_ms(info.timeout) + "): " + lost + "; cause: " + cause;
        failed = true;
        first = true;
      }
    }
    std::lock_guard<std::mutex> lk(fail_mu);
    if (first) throw std::runtime_error("zenflow distributed: " + failure);
    throw std::runtime_error("zenflow distributed: " + op.what + " aborted on " + where() +
                             " after an earlier failure: " + failure);
  }
};

namespace {

// What the constructor builds. It is built on a helper thread that the constructor waits
// for with a deadline: a TCPStore client has no receive timeout, so a store operation
// against a silent endpoint (a stopped store host, a port that is not a store) would
// block forever. On the deadline the helper is let go with this state.
struct Setup {
  RankInfo info;
  CommunicatorOptions opts;
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::TCPStore> monitor;
  c10::intrusive_ptr<PGBase> pg;
  std::string backend;
  int port = 0;
  std::string where() const {
    return "rank " + std::to_string(info.rank) + " of " + std::to_string(info.world_size);
  }
};

void rendezvous(Setup& su) {
  const RankInfo& info = su.info;
  const std::string addr = info.master_addr + ":" + std::to_string(info.master_port);
  const bool host = info.rank == 0 && !info.store_external;
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(info.master_port);
  so.isServer = host;
  so.waitWorkers = false;  // our own join protocol below names the missing ranks
  const std::chrono::milliseconds rdzv_timeout = su.opts.rendezvous_timeout;
  so.timeout = rdzv_timeout;
  resolve_master_addr(info.master_addr, rdzv_timeout);
  try {
    su.store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
  } catch (const std::exception& e) {
    if (host) {
      throw std::runtime_error("zenflow distributed: rank 0 cannot host the rendezvous store on " + addr +
                               ": " + error_text(e));
    }
    throw std::runtime_error(
        "zenflow distributed: " + su.where() + " could not reach the rendezvous store at " + addr +
        " within " + fmt_ms(rdzv_timeout) + " (is " + (info.store_external ? "the launcher" : "rank 0") +
        " running?): " + error_text(e));
  }
  su.port = su.store->getPort();
  const std::string joined = key_space(su.opts.generation) + "rdzv/joined/";
  try {
    if (su.store->add(joined + std::to_string(info.rank), 1) != 1) {
      throw std::runtime_error("zenflow distributed: rank " + std::to_string(info.rank) +
                               " joined the rendezvous at " + addr +
                               " twice (two processes with the same rank?)");
    }
    const std::string ws_key = key_space(su.opts.generation) + "rdzv/world_size";
    const std::string ws = std::to_string(info.world_size);
    if (info.rank == 0) su.store->set(ws_key, std::vector<uint8_t>(ws.begin(), ws.end()));
    std::vector<std::string> keys;
    keys.reserve(info.world_size + 1);
    for (int r = 0; r < info.world_size; ++r) keys.push_back(joined + std::to_string(r));
    keys.push_back(ws_key);
    try {
      su.store->wait(keys, rdzv_timeout);
    } catch (const std::exception&) {
      std::vector<int> missing;
      for (int r = 0; r < info.world_size; ++r) {
        if (!su.store->check({keys[r]})) missing.push_back(r);
      }
      throw std::runtime_error("zenflow distributed: rendezvous at " + addr + " timed out after " +
                               fmt_ms(rdzv_timeout) + " on " + su.where() + ": " +
                               (missing.empty() ? std::string("world size never published")
                                                : std::string(missing.size() == 1 ? "rank " : "ranks ") +
                                                      join_ranks(missing) + " did not join"));
    }
    const auto v = su.store->get(ws_key);
    const std::string got(v.begin(), v.end());
    if (got != ws) {
      throw std::runtime_error("zenflow distributed: world size mismatch at " + addr + ": rank 0 has " + got +
                               ", " + su.where() + " has " + ws);
    }
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    throw std::runtime_error("zenflow distributed: rendezvous at " + addr + " failed on " + su.where() +
                             ": " + error_text(e));
  }
}

void create_process_group(Setup& su) {
  const RankInfo& info = su.info;
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>(key_space(su.opts.generation) + "pg", su.store);
  if (su.opts.device_type == at::kCUDA) {
#ifdef ZENFLOW_HAVE_NCCL
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = info.timeout;
    su.pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(pg_store, info.rank, info.world_size, o);
    su.backend = "nccl";
    return;
#else
    throw std::invalid_argument(
        "zenflow distributed: CUDA tensors need NCCL, and this LibTorch was built without it "
        "(USE_C10D_NCCL)");
#endif
  }
  if (su.opts.device_type != at::kCPU) {
    throw std::invalid_argument(std::string("zenflow distributed: no process group for device type ") +
                                c10::DeviceTypeName(su.opts.device_type));
  }
#ifdef ZENFLOW_HAVE_GLOO
  auto o = c10d::ProcessGroupGloo::Options::create(info.timeout);
  std::string local = info.local_addr;
  if (local.empty() && is_loopback(info.master_addr)) local = "127.0.0.1";
  try {
    o->devices.push_back(local.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                       : c10d::ProcessGroupGloo::createDeviceForHostname(local));
  } catch (const std::exception& e) {
    throw std::runtime_error("zenflow distributed: cannot create a Gloo device on " +
                             (local.empty() ? std::string("this host") : local) + ": " + error_text(e));
  }
  o->threads = std::max(1, su.opts.gloo_threads);
  su.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, info.rank, info.world_size, o);
  su.backend = "gloo";
#else
  throw std::invalid_argument(
      "zenflow distributed: no Gloo process group in this build (LibTorch without USE_C10D_GLOO, or "
      "without Gloo's headers, as PyTorch wheels ship): CPU ranks need the system LibTorch; CUDA ranks use "
      "NCCL");
#endif
}

void connect_monitor(Setup& su) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(su.port);
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = su.info.timeout;
  su.monitor = c10::make_intrusive<c10d::TCPStore>(su.info.master_addr, so);
  su.monitor->add(hb_key(su.opts.generation, su.info.rank), 1);
}

// Runs fn on a helper thread and waits at most `limit`: returns true when it finished
// (rethrowing its exception), false on the deadline, leaving the helper detached with
// whatever fn captured (which must therefore own its state).
bool run_bounded(std::function<void()> fn, std::chrono::milliseconds limit) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto d = std::make_shared<Done>();
  std::thread([d, fn = std::move(fn)] {
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lk(d->mu);
    d->error = error;
    d->done = true;
    d->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lk(d->mu);
  if (!d->cv.wait_for(lk, limit, [&] { return d->done; })) return false;
  if (d->error) std::rethrow_exception(d->error);
  return true;
}

}  // namespace

void Communicator::Impl::start_heartbeat(c10::intrusive_ptr<c10d::TCPStore> monitor) {
  mon = std::make_shared<MonitorState>();
  mon->monitor = std::move(monitor);
  mon->rank = info.rank;
  mon->world = info.world_size;
  mon->generation = opts.generation;
  mon->interval = opts.heartbeat_interval;
  mon->suspect_after =
      std::max<std::chrono::milliseconds>(info.timeout / 2, info.timeout - 4 * opts.heartbeat_interval);
  hb_thread = std::thread(heartbeat_loop, mon);
}

void Communicator::Impl::stop_heartbeat() {
  if (!mon) return;
  std::unique_lock<std::mutex> lk(mon->mu);
  mon->stop = true;
  mon->cv.notify_all();
  // A store operation blocked on a stopped store host would hold the thread: wait a
  // bounded time, then let it go (it owns its state through the shared pointer).
  const bool exited =
      mon->cv.wait_for(lk, mon->interval * 2 + std::chrono::milliseconds(1000), [&] { return mon->exited; });
  lk.unlock();
  if (hb_thread.joinable()) {
    if (exited) {
      hb_thread.join();
    } else {
      hb_thread.detach();
    }
  }
}

void Communicator::Impl::close_store() {
  // Every rank counts itself out; rank 0, when it hosts the store, keeps it alive until
  // the others have closed (or close_grace passed), so that their last store operations
  // do not fail. Bounded: the store's host may be gone or stopped.
  if (!store || failed) return;
  auto st = store;
  const int rank = info.rank, world = info.world_size;
  const bool host = rank == 0 && !info.store_external;
  const auto grace = opts.close_grace;
  const std::string closed = key_space(opts.generation) + "closed";
  try {
    run_bounded(
        [st, rank, world, host, grace, closed] {
          const int64_t n = st->add(closed, 1);
          if (!host || n >= world) return;
          const auto deadline = Clock::now() + grace;
          while (Clock::now() < deadline) {
            if (st->add(closed, 0) >= world) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
        },
        grace + std::chrono::milliseconds(1000));
  } catch (const std::exception&) {
    // The store host is gone: nothing to close.
  }
}

Communicator::Communicator(const RankInfo& info, CommunicatorOptions options)
    : impl_(std::make_unique<Impl>()) {
  info.validate();
  // A peer that dies leaves sockets whose next write raises SIGPIPE, which would kill this
  // rank before the collective can report the lost peer: ignore it process-wide (the
  // write then fails with EPIPE and surfaces as an error naming the rank).
  std::signal(SIGPIPE, SIG_IGN);
  auto& im = *impl_;
  im.info = info;
  im.self = this;
  if (options.heartbeat_interval.count() <= 0) {
    options.heartbeat_interval =
        std::clamp(info.timeout / 10, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
  }
  if (options.close_grace.count() <= 0) {
    options.close_grace = std::min<std::chrono::milliseconds>(info.timeout, std::chrono::milliseconds(5000));
  }
  if (options.rendezvous_timeout.count() <= 0) options.rendezvous_timeout = info.timeout;
  if (options.gloo_threads < 1) throw std::invalid_argument("CommunicatorOptions::gloo_threads must be >= 1");
  im.opts = options;

  auto su = std::make_shared<Setup>();
  su->info = info;
  su->opts = options;
  // Rendezvous, then the process group (Gloo's or NCCL's own rendezvous over the store),
  // then the heartbeat connection; all of it bounded.
  const auto limit = options.rendezvous_timeout + info.timeout + std::chrono::milliseconds(2000);
  const std::string addr = info.master_addr + ":" + std::to_string(info.master_port);
  const bool finished = run_bounded(
      [su] {
        rendezvous(*su);
        try {
          create_process_group(*su);
        } catch (const std::invalid_argument&) {
          throw;
        } catch (const std::exception& e) {
          throw std::runtime_error("zenflow distributed: creating the process group failed on " +
                                   su->where() + " (timeout " + fmt_ms(su->info.timeout) +
                                   "): " + error_text(e));
        }
        try {
          connect_monitor(*su);
        } catch (const std::exception& e) {
          throw std::runtime_error("zenflow distributed: heartbeat connection to the store failed on " +
                                   su->where() + ": " + error_text(e));
        }
      },
      limit);
  if (!finished) {
    throw std::runtime_error(
        "zenflow distributed: rendezvous at " + addr + " did not complete within " + fmt_ms(limit) + " on " +
        im.where() +
        ": the store does not answer (is that address a zenflow rendezvous store? is its "
        "host stopped?)");
  }
  im.store = su->store;
  im.pg = su->pg;
  im.backend = su->backend;
  im.port = su->port;
  im.start_heartbeat(su->monitor);
}

Communicator::~Communicator() {
  if (!impl_) return;
  impl_->stop_heartbeat();
  impl_->close_store();
  impl_->pg.reset();  // joins Gloo's threads: each in-flight op ends within the timeout
  // The monitor connection lives as long as MonitorState: a heartbeat or probe thread
  // that was let go while blocked on a stopped store host still owns it.
  impl_->store.reset();
}

int Communicator::rank() const { return impl_->info.rank; }
int Communicator::world_size() const { return impl_->info.world_size; }
std::chrono::milliseconds Communicator::timeout() const { return impl_->info.timeout; }
std::chrono::milliseconds Communicator::heartbeat_interval() const { return impl_->opts.heartbeat_interval; }
int Communicator::master_port() const { return impl_->port; }
std::string Communicator::backend() const { return impl_->backend; }
at::DeviceType Communicator::device_type() const { return impl_->opts.device_type; }

CommStats Communicator::stats() const {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  return impl_->stats;
}

void Communicator::reset_stats() {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  impl_->stats = CommStats{};
}

bool Communicator::failed() const { return impl_->failed; }

std::string Communicator::failure_message() const {
  std::lock_guard<std::mutex> lk(impl_->fail_mu);
  return impl_->failure;
}

double CommWork::wait() {
  if (!op_) throw std::logic_error("CommWork::wait on an empty work");
  return op_->comm->impl_->complete(*op_);
}

bool CommWork::is_completed() const {
  if (!op_) return true;
  std::lock_guard<std::mutex> lk(op_->mu);
  return op_->done || (op_->work && op_->work->isCompleted());
}

CommWork Communicator::allreduce_sum_async(const at::Tensor& t, Traffic traffic) {
  impl_->check_tensor(t, "allreduce");
  if (!t.is_contiguous()) throw std::invalid_argument("allreduce_sum_async: the tensor must be contiguous");
  auto& im = *impl_;
  // Gloo (LibTorch 1.13) has no bf16 reductions: sum in fp32 and round once on the way back.
  const bool widen = im.backend == "gloo" && t.scalar_type() == at::kBFloat16;
  at::Tensor buf = widen ? t.to(at::kFloat) : t;
  CommWork w;
  w.op_ = im.launch(CollectiveKind::kAllreduce, nbytes(t), traffic, [&] {
    std::vector<at::Tensor> v{buf};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = im.info.timeout;
    return im.pg->allreduce(v, o);
  });
  if (widen) w.op_->after = [t, buf]() mutable { t.copy_(buf); };
  return w;
}

void Communicator::allreduce_sum_(at::Tensor& t, Traffic traffic) {
  impl_->check_tensor(t, "allreduce");
  if (t.is_contiguous()) {
    allreduce_sum_async(t, traffic).wait();
    return;
  }
  at::Tensor tmp = t.contiguous();
  allreduce_sum_async(tmp, traffic).wait();
  t.copy_(tmp);
}

void Communicator::allreduce_mean_(at::Tensor& t, Traffic traffic) {
  allreduce_sum_(t, traffic);
  t.div_(world_size());
}

void Communicator::allreduce_sum_(std::vector<at::Tensor>& ts, Traffic traffic) {
  if (ts.empty()) return;
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) {
    impl_->check_tensor(t, "allreduce (list)");
    if (t.scalar_type() != ts[0].scalar_type() || t.device() != ts[0].device()) {
      throw std::invalid_argument(
          "allreduce (list): every tensor must have the dtype and device of the first (" +
          std::string(c10::toString(ts[0].scalar_type())) + " on " + ts[0].device().str() + ")");
    }
    flat.push_back(t.reshape({-1}));
  }
  at::Tensor buf = at::cat(flat);
  allreduce_sum_async(buf, traffic).wait();
  int64_t off = 0;
  for (auto& t : ts) {
    const int64_t n = t.numel();
    t.copy_(buf.narrow(0, off, n).view(t.sizes()));
    off += n;
  }
}

void Communicator::allreduce_mean_(std::vector<at::Tensor>& ts, Traffic traffic) {
  allreduce_sum_(ts, traffic);
  for (auto& t : ts) t.div_(world_size());
}

bool Communicator::nccl_available() {
#ifdef ZENFLOW_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

bool Communicator::gloo_available() {
#ifdef ZENFLOW_HAVE_GLOO
  return true;
#else
  return false;
#endif
}

std::vector<int64_t> Communicator::even_shards(int64_t numel, int world_size) {
  if (world_size < 1 || numel < 0) throw std::invalid_argument("even_shards: bad numel or world size");
  std::vector<int64_t> s(world_size, numel / world_size);
  for (int64_t r = 0; r < numel % world_size; ++r) s[r] += 1;
  return s;
}

namespace {
void check_shards(const char* op, const std::vector<int64_t>& sizes, int world, int64_t total,
                  bool check_total) {
  if (static_cast<int>(sizes.size()) != world) {
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(sizes.size()) +
                                " shard sizes for world size " + std::to_string(world));
  }
  int64_t sum = 0;
  for (int64_t s : sizes) {
    if (s < 0) throw std::invalid_argument(std::string(op) + ": negative shard size");
    sum += s;
  }
  if (check_total && sum != total) {
    throw std::invalid_argument(std::string(op) + ": shard sizes sum to " + std::to_string(sum) +
                                " but the buffer has " + std::to_string(total) + " elements");
  }
}
}  // namespace

at::Tensor Communicator::reduce_scatter(const at::Tensor& flat_in, const std::vector<int64_t>& shard_sizes,
                                        Reduction reduction, Traffic traffic, ReduceScatterAlgo algo) {
  auto& im = *impl_;
  im.check_tensor(flat_in, "reduce_scatter");
  if (flat_in.dim() != 1) throw std::invalid_argument("reduce_scatter: the buffer must be 1-D");
  if (im.backend == "gloo" && flat_in.scalar_type() == at::kBFloat16)  // no bf16 in Gloo here
    return reduce_scatter(flat_in.to(at::kFloat), shard_sizes, reduction, traffic, algo).to(at::kBFloat16);
  const int world = world_size();
  const int me = rank();
  check_shards("reduce_scatter", shard_sizes, world, flat_in.numel(), true);
  at::Tensor flat = flat_in.contiguous();
  int64_t offset = 0;
  for (int r = 0; r < me; ++r) offset += shard_sizes[r];
  const int64_t mine = shard_sizes[me];
  const int64_t bytes = nbytes(flat);
  at::Tensor result;

  if (flat.numel() == 0) {
    result = flat.new_empty({0});
  } else if (algo == ReduceScatterAlgo::kAllreduce) {
    at::Tensor buf = flat.clone();
    im.run(im.launch(CollectiveKind::kReduceScatter, bytes, traffic, [&] {
      std::vector<at::Tensor> v{buf};
      c10d::AllreduceOptions o;
      o.timeout = im.info.timeout;
      return im.pg->allreduce(v, o);
    }));
    result = buf.narrow(0, offset, mine).clone();
  } else if (im.backend == "nccl") {
    const int64_t m = *std::max_element(shard_sizes.begin(), shard_sizes.end());
    at::Tensor padded = at::zeros({world * m}, flat.options());
    int64_t off = 0;
    for (int r = 0; r < world; ++r) {
      padded.narrow(0, r * m, shard_sizes[r]).copy_(flat.narrow(0, off, shard_sizes[r]));
      off += shard_sizes[r];
    }
    at::Tensor out = at::empty({m}, flat.options());
    im.run(im.launch(CollectiveKind::kReduceScatter, bytes, traffic, [&] {
      c10d::ReduceScatterOptions o;
      o.timeout = im.info.timeout;
      return im.pg->_reduce_scatter_base(out, padded, o);
    }));
    result = out.narrow(0, 0, mine);
  } else {
    // Gloo: all-to-all of the per-owner pieces, then a local sum over the W senders.
    at::Tensor recv = at::empty({world * mine}, flat.options());
    std::vector<int64_t> in_counts = shard_sizes;
    std::vector<int64_t> out_counts(world, mine);
    im.run(im.launch(CollectiveKind::kReduceScatter, bytes, traffic, [&] {
      c10d::AllToAllOptions o;
      o.timeout = im.info.timeout;
      return im.pg->alltoall_base(recv, flat, out_counts, in_counts, o);
    }));
    result = recv.view({world, mine}).sum(0);
  }
  if (reduction == Reduction::kMean) result.div_(world);
  return result;
}

at::Tensor Communicator::all_gather(const at::Tensor& shard_in, const std::vector<int64_t>& shard_sizes,
                                    Traffic traffic) {
  auto result = std::make_shared<at::Tensor>();
  CommWork w = all_gather_async(shard_in, shard_sizes, traffic, result);
  if (w.valid()) w.wait();
  return *result;
}

CommWork Communicator::all_gather_async(const at::Tensor& shard_in, const std::vector<int64_t>& shard_sizes,
                                        Traffic traffic, std::shared_ptr<at::Tensor> result) {
  auto& im = *impl_;
  if (!result) throw std::invalid_argument("all_gather_async: no result holder");
  im.check_tensor(shard_in, "all_gather");
  // Gloo (LibTorch 1.13) moves no bf16: the shards travel as fp32 and come back rounded.
  const bool widen = im.backend == "gloo" && shard_in.scalar_type() == at::kBFloat16;
  const at::Tensor shard = widen ? shard_in.to(at::kFloat) : shard_in;
  const int world = world_size();
  const int me = rank();
  check_shards("all_gather", shard_sizes, world, 0, false);
  if (shard.numel() != shard_sizes[me]) {
    throw std::invalid_argument("all_gather: rank " + std::to_string(me) + " passed " +
                                std::to_string(shard.numel()) + " elements, its shard size is " +
                                std::to_string(shard_sizes[me]));
  }
  const int64_t m = *std::max_element(shard_sizes.begin(), shard_sizes.end());
  int64_t total = 0;
  for (int64_t s : shard_sizes) total += s;
  if (m == 0) {
    *result = shard_in.new_empty({0});
    return CommWork();
  }
  at::Tensor padded = at::zeros({m}, shard.options());
  padded.narrow(0, 0, shard_sizes[me]).copy_(shard.reshape({-1}));
  at::Tensor gathered = at::empty({world, m}, shard.options());
  const int64_t bytes = total * static_cast<int64_t>(shard_in.element_size());
  CommWork w;
  if (im.backend == "nccl") {
    at::Tensor out = gathered.view({-1});
    w.op_ = im.launch(CollectiveKind::kAllGather, bytes, traffic, [&] {
      c10d::AllgatherOptions o;
      o.timeout = im.info.timeout;
      return im.pg->_allgather_base(out, padded, o);
    });
  } else {
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < world; ++r) outs[0].push_back(gathered[r]);
    std::vector<at::Tensor> ins{padded};
    w.op_ = im.launch(CollectiveKind::kAllGather, bytes, traffic, [&] {
      c10d::AllgatherOptions o;
      o.timeout = im.info.timeout;
      return im.pg->allgather(outs, ins, o);
    });
  }
  // The shards in rank order, without the padding, once the collective is done.
  w.op_->after = [result, gathered, padded, shard_sizes, world, widen] {
    std::vector<at::Tensor> parts;
    for (int r = 0; r < world; ++r) parts.push_back(gathered[r].narrow(0, 0, shard_sizes[static_cast<size_t>(r)]));
    *result = widen ? at::cat(parts).to(at::kBFloat16) : at::cat(parts);
  };
  return w;
}

void Communicator::broadcast_(at::Tensor& t, int root, Traffic traffic) {
  auto& im = *impl_;
  im.check_tensor(t, "broadcast");
  if (im.backend == "gloo" && t.scalar_type() == at::kBFloat16) {  // no bf16 in Gloo here
    at::Tensor wide = t.to(at::kFloat);
    broadcast_(wide, root, traffic);
    t.copy_(wide);
    return;
  }
  if (root < 0 || root >= world_size()) {
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank of " +
                                std::to_string(world_size()));
  }
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  im.run(im.launch(CollectiveKind::kBroadcast, nbytes(t), traffic, [&] {
    std::vector<at::Tensor> v{buf};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.rootTensor = 0;
    o.timeout = im.info.timeout;
    return im.pg->broadcast(v, o);
  }));
  if (!buf.is_same(t)) t.copy_(buf);
}

void Communicator::barrier() {
  auto& im = *impl_;
  im.run(im.launch(CollectiveKind::kBarrier, 0, Traffic::kOther, [&] {
    c10d::BarrierOptions o;
    o.timeout = im.info.timeout;
    return im.pg->barrier(o);
  }));
}

}  // namespace zenflow::distributed
