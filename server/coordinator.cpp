#include "server/coordinator.h"

#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <future>
#include <iostream>
#include <random>
#include <sstream>

#include "common/advisor/job_profile.h"
#include "common/allowed_roots.h"
#include "common/attempt_contract.h"
#include "common/rpc/rpc.h"
#include "common/utf8.h"
#include "server/job_cost.h"

namespace zenflow::server {
namespace {

using grpc::Status;
using grpc::StatusCode;

constexpr const char* kQueued = "QUEUED";
constexpr const char* kStarting = "STARTING";
constexpr const char* kRunning = "RUNNING";
constexpr const char* kPreempted = "PREEMPTED";
constexpr const char* kSucceeded = "SUCCEEDED";
constexpr const char* kFailed = "FAILED";
constexpr const char* kCancelled = "CANCELLED";

// Progress reports change a job's revision in memory at once (watchers see every step) but
// reach the store at most every kProgressPersistMs; after a restart revisions continue
// kRestartRevisionGap above what was stored, so none a watcher saw is ever repeated.
constexpr int64_t kProgressPersistMs = 2000;
constexpr int64_t kRestartRevisionGap = 1 << 20;
constexpr const char* kStopCancel = "cancelled";
constexpr const char* kStopPreempt = "preempted";
// Job numbers and incarnations are reserved this many at a time (issued_ids.h): one fsync
// of DB.ids per block.
constexpr int64_t kIdBlock = 64;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

v1::JobState state_enum(const std::string& s) {
  v1::JobState e = v1::JOB_STATE_UNSPECIFIED;
  v1::JobState_Parse(s, &e);
  return e;
}

bool active(const std::string& state) { return state == kStarting || state == kRunning; }
bool queued(const std::string& state) { return state == kQueued || state == kPreempted; }

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

using attempt::exit_text;

bool known_state(const std::string& s) {
  for (const char* k : {kQueued, kStarting, kRunning, kPreempted, kSucceeded, kFailed, kCancelled})
    if (s == k) return true;
  return false;
}

// What a worker or a rank says, as it may go into a proto string: valid UTF-8, one KiB at most.
std::string reported_text(const std::string& s) { return valid_utf8(utf8_prefix(s, 1024)); }

std::string utc_time(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%H:%M:%S UTC", &tm);
  return buf;
}

Status bad(const std::string& what) { return {StatusCode::INVALID_ARGUMENT, what}; }

// A reported figure outside what any real run produces is refused, never applied: a report
// is a worker's word, and a worker may be broken or lying.
Status check_progress(const v1::ReportProgressRequest& r) {
  const auto in = [](double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; };
  const auto refuse = [](const char* field, double v, const char* range) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", v);
    return bad(std::string(field) + ": " + text + " is not " + range);
  };
  if (!std::isfinite(r.loss())) return refuse("loss", r.loss(), "a finite number");
  if (!in(r.tokens_per_second(), 0, 1e12)) return refuse("tokens_per_second", r.tokens_per_second(), "in [0, 1e12]");
  // (A share over 1 by a rounding of the trainer's sums is taken as 1.)
  if (!in(r.stall_share(), 0, 1.05)) return refuse("stall_share", r.stall_share(), "in [0, 1]");
  if (!in(r.step_seconds(), 0, 1e7)) return refuse("step_seconds", r.step_seconds(), "in [0, 1e7]");
  if (!in(r.eta_seconds(), -1, 1e10)) return refuse("eta_seconds", r.eta_seconds(), "in [-1, 1e10]");
  if (r.tokens_per_step() < 0 || r.tokens_per_step() > int64_t{1} << 40)
    return refuse("tokens_per_step", static_cast<double>(r.tokens_per_step()), "in [0, 2^40]");
  if (r.start_step() < 0 || r.start_step() > r.step())
    return refuse("start_step", static_cast<double>(r.start_step()), "in [0, step]");
  return Status::OK;
}

// Text a worker chose that operators will read (a GPU model, a label, an address): valid
// UTF-8 with no control characters, at most `max` bytes.
bool printable(const std::string& s, size_t max) {
  if (s.size() > max || !is_valid_utf8(s)) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) return false;
    if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) <= 0x9F) return false;  // C1
  }
  return true;
}

// What a registration offers, checked before anything of it is kept: bounded counts and
// printable text.
Status check_resources(const v1::RegisterWorkerRequest& req) {
  const v1::WorkerResources& res = req.resources();
  if (res.gpus_size() > 64) return bad("resources.gpus: at most 64, got " + std::to_string(res.gpus_size()));
  for (const v1::GpuInfo& g : res.gpus()) {
    if (!printable(g.model(), 128)) return bad("resources.gpus.model: printable, at most 128 bytes");
    if (g.memory_bytes() < 0 || g.memory_bytes() > (int64_t{16} << 40))
      return bad("resources.gpus.memory_bytes: in [0, 16 TiB], got " + std::to_string(g.memory_bytes()));
  }
  if (res.cpu_slots() > 4096) return bad("resources.cpu_slots: at most 4096, got " + std::to_string(res.cpu_slots()));
  if (res.physical_cores() > 65536)
    return bad("resources.physical_cores: at most 65536, got " + std::to_string(res.physical_cores()));
  if (res.host_memory_bytes() > (int64_t{1} << 50))
    return bad("resources.host_memory_bytes: at most 1 PiB, got " + std::to_string(res.host_memory_bytes()));
  if (!printable(res.hostname(), 255)) return bad("resources.hostname: printable, at most 255 bytes");
  if (res.labels_size() > 64) return bad("resources.labels: at most 64");
  for (const auto& [k, v] : res.labels())
    if (!printable(k, 128) || !printable(v, 128) || k.empty())
      return bad("resources.labels: keys and values printable, at most 128 bytes, keys not empty");
  if (!printable(req.address(), 255) || req.address().find(' ') != std::string::npos)
    return bad("address: a host name or IP address, got \"" + valid_utf8(utf8_prefix(req.address(), 64)) + "\"");
  if (req.rendezvous_ports_size() > 4096) return bad("rendezvous_ports: at most 4096");
  for (int32_t p : req.rendezvous_ports())
    if (p < 1 || p > 65535) return bad("rendezvous_ports: each in [1, 65535], got " + std::to_string(p));
  if (!printable(req.version(), 64)) return bad("version: printable, at most 64 bytes");
  if (req.allowed_roots_size() > static_cast<int>(kMaxAllowedRoots))
    return bad("allowed_roots: at most " + std::to_string(kMaxAllowedRoots) + ", got " +
               std::to_string(req.allowed_roots_size()));
  for (const std::string& root : req.allowed_roots()) {
    if (!printable(root, kMaxAllowedRootBytes))
      return bad("allowed_roots: each printable, at most " + std::to_string(kMaxAllowedRootBytes) + " bytes");
    if (!is_normal_root(root))
      return bad(
          "allowed_roots: each an absolute path in normal form (no '.', '..', repeated or trailing '/'; no "
          "':'), got \"" +
          root + "\"");
  }
  return Status::OK;
}

// Paths of a submitted spec must be absolute: the coordinator and the workers do not share
// the submitter's working directory (zenflow submit resolves them before sending).
Status check_absolute(const JobSpec& spec) {
  for (const auto& [key, p] : confined_paths(spec))
    if (!std::filesystem::path(p).is_absolute())
      return bad(std::string(key) +
                 ": must be an absolute path in a submitted spec (zenflow submit resolves "
                 "relative paths against its working directory), got \"" +
                 p + "\"");
  return Status::OK;
}

const Status kShuttingDown{StatusCode::UNAVAILABLE, "coordinator is shutting down"};

}  // namespace

Coordinator::Coordinator(std::unique_ptr<Store> store, CoordinatorOptions options)
    : store_(std::move(store)),
      options_(std::move(options)),
      step_aside_budget_(options_.submit_step_aside_saved),
      boot_((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
            static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count())) {
  load();
  ticker_ = std::thread([this] { ticker(); });
  intake_thread_ = std::thread([this] { parse_large_submits(); });
  committer_ = std::thread([this] { commit_submits(); });
  // Named for top -H and profiles (15 characters at most).
  pthread_setname_np(ticker_.native_handle(), "zf-co-ticker");
  pthread_setname_np(intake_thread_.native_handle(), "zf-co-intake");
  pthread_setname_np(committer_.native_handle(), "zf-co-committer");
}

Coordinator::~Coordinator() {
  shutdown();
  if (ticker_.joinable()) ticker_.join();
  if (intake_thread_.joinable()) intake_thread_.join();  // before the committer: it may queue for it
  if (committer_.joinable()) committer_.join();
}

void Coordinator::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(intake_mu_);
    intake_stopping_ = true;
  }
  announce_change();
  intake_cv_.notify_all();       // the intake thread answers what is queued (refused), then stops
  submits_queued_.notify_all();  // the committer commits what is queued (submits, registrations), then stops
}

int64_t Coordinator::fence_margin_ms() const {
  return std::max<int64_t>(options_.heartbeat_interval.count(), 2000);
}

int64_t Coordinator::now_ms() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Coordinator::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "zenflow-coordinator: %s\n", line.c_str());
  }
}

bool Coordinator::terminal(const std::string& state) const {
  return state == kSucceeded || state == kFailed || state == kCancelled;
}

void Coordinator::load() {
  const int64_t now = now_ms();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<JobRecord> records = store_->load_jobs();
  const auto t1 = std::chrono::steady_clock::now();
  StoreBatch upgraded;  // schema-1 rows, once: their spec facts derived from the spec
  for (JobRecord& rec : records) {
    Job j;
    if (rec.workers < 0) {
      try {
        record_spec_facts(parse_job_spec(rec.spec_yaml, {}, ".", SpecSite::kRunsElsewhere), &rec);
      } catch (const std::exception& e) {
        // A record this build cannot read any more: keep it visible, never run it.
        rec.checkpoint_dir.clear();
        rec.workers = rec.gpus_per_worker = 1;
        rec.max_restarts = 0;
        if (!terminal(rec.state)) {
          rec.state = kFailed;
          rec.last_error = std::string("stored spec no longer valid: ") + e.what();
          rec.end_time_ms = now;
        }
      }
      upgraded.jobs.push_back(rec);
    }
    j.rec = std::move(rec);
    j.rec.revision += kRestartRevisionGap;
    set_demand(j);
    // A RUNNING attempt has reported (its restart loss, if any, is recorded); a requeued
    // job's wait before the restart is not known, so it counts from now.
    j.progressed = j.rec.state == kRunning;
    j.queued_since_ms = j.rec.attempt == 0 ? j.rec.submit_time_ms : now;
    next_seq_ = std::max(next_seq_, j.rec.submit_seq + 1);
    if (active(j.rec.state)) {
      // The attempt goes on: its workers re-attach and report. Members count as started
      // (a RUNNING job's ranks were), STARTING ones as not yet.
      for (const std::string& w : j.rec.placement) {
        Member m;
        m.worker = w;
        m.started = j.rec.state == kRunning;
        j.members.push_back(std::move(m));
      }
    }
    if (!j.rec.request_id.empty()) by_request_[j.rec.request_id] = j.rec.id;
    if (!terminal(j.rec.state)) checkpoint_owner_[j.rec.checkpoint_dir] = j.rec.id;
    add_job(std::move(j));
  }
  commit(upgraded);
  const int64_t stored_next_seq = next_seq_;
  for (WorkerRecord& rec : store_->load_workers()) {
    next_incarnation_ = std::max(next_incarnation_, rec.incarnation + 1);
  }
  // What was issued before, out of the WAL's reach: never issue below it again.
  IssuedMarks marks;
  if (!options_.issued_ids_path.empty()) {
    issued_ids_ = std::make_unique<IssuedIds>(options_.issued_ids_path);
    marks = issued_ids_->marks();
    if (marks.job_seq_issued > stored_next_seq) {
      char first[32], last[32];
      std::snprintf(first, sizeof first, "j-%06lld", static_cast<long long>(stored_next_seq));
      std::snprintf(last, sizeof last, "j-%06lld", static_cast<long long>(marks.job_seq_issued - 1));
      log("WARNING: the store's newest job is numbered " + std::to_string(stored_next_seq - 1) + ", but " +
          issued_ids_->path() + " says numbers up to " + std::to_string(marks.job_seq_issued - 1) +
          " were issued: acknowledged jobs " + first + " to " + last +
          " may be missing (a truncated WAL, or an older copy of the database?). Their numbers are not "
          "issued again.");
    }
    next_seq_ = std::max(next_seq_, marks.job_seq_ceiling);
    next_incarnation_ = std::max(next_incarnation_, marks.incarnation_ceiling);
    marks.starts += 1;
    marks.job_seq_ceiling = next_seq_;  // reserved at the first submit (issue_job_seq)
    marks.incarnation_ceiling = next_incarnation_;
    issued_ids_->write(marks);  // StoreError: the coordinator cannot start (it could reissue ids)
  }
  revision_base_ = marks.starts << 32;
  for (WorkerRecord& rec : store_->load_workers()) {
    Worker w;
    w.resources.ParseFromString(rec.resources);
    // Every known worker gets a fresh lease: it may be training right now and will
    // re-attach with the incarnation it has.
    w.lease->deadline_ms = now + options_.restart_grace.count();
    w.lease->last_heartbeat_ms = now;  // unknown before the restart; counted from now
    w.lease->incarnation = rec.incarnation;
    w.lease->session_digest = rec.session_digest;
    w.lease->lost = rec.state == "LOST";
    // Above any revision the agent holds from before the restart: its long poll returns at
    // once with the current set, never a stale one.
    w.lease->assignment_revision = revision_base_ + 1;
    w.rec = std::move(rec);
    Worker& placed = workers_.emplace(w.rec.name, std::move(w)).first->second;
    (placed.rec.role == "TRAINER" ? trainers_ : optimizers_)[placed.rec.name] = &placed;
    leases_[placed.rec.name] = placed.lease;
  }
  StoreBatch repaired;
  repair_loaded_jobs(repaired);
  commit(repaired);
  for (const auto& [name, node] : optimizers_) refresh_grants(name);  // the placed attempts' secrets
  for (const auto& [key, bytes] : store_->attempt_log_sizes()) {
    stream_bytes_[key] = bytes;
  }
  for (auto& [id, j] : jobs_) log_bytes_[id] = store_->log_size(id);
  // Demands need the submitted model facts, which live in the spec and the record.
  const auto ms = [](auto a, auto b) { return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count()); };
  log("recovered " + std::to_string(jobs_.size()) + " jobs and " + std::to_string(workers_.size()) +
      " workers from the store in " + ms(t0, std::chrono::steady_clock::now()) + " ms (" + ms(t0, t1) + " ms reading jobs)");
}

// Rows this build cannot run as they are, repaired at load and named in the log: a state no
// job has (failed: nothing can say what it was doing), and an attempt on a worker the store
// does not know or with no placement (requeued, after the default fence: whatever ran it may
// still be alive). Loaded silently, they stayed RUNNING forever and cancel did nothing.
void Coordinator::repair_loaded_jobs(StoreBatch& batch) {
  const int64_t now = now_ms();
  std::vector<Job*> unknown_state, orphaned;  // repairs change live_: collect first
  for (auto& [id, j] : jobs_) {
    if (!known_state(j.rec.state)) {
      unknown_state.push_back(&j);
      continue;
    }
    if (!active(j.rec.state)) continue;
    bool orphan = j.rec.placement.empty();
    for (const std::string& w : j.rec.placement) {
      auto it = workers_.find(w);
      orphan |= it == workers_.end() || it->second.rec.role != "TRAINER";
    }
    if (orphan) orphaned.push_back(&j);
  }
  for (Job* jp : unknown_state) {
    Job& j = *jp;
    const std::string what = "stored state \"" + valid_utf8(j.rec.state) +
                             "\" is not a job state this coordinator knows; failed when the store was loaded";
    j.rec.state = kFailed;
    j.rec.end_time_ms = now;
    j.rec.last_error = what;
    log("job " + j.rec.id + ": " + what);
    append_coordinator_log(j, "job failed: " + what, batch);
    touch(j, batch);
  }
  for (Job* jp : orphaned) {
    Job& j = *jp;
    std::string workers;
    for (const std::string& w : j.rec.placement) workers += (workers.empty() ? "" : ", ") + w;
    const std::string what = "it was " + j.rec.state +
                             (workers.empty() ? " with no placement" : " on " + workers + ", unknown to the store");
    j.rec.fence_until_ms = std::max(j.rec.fence_until_ms, now + options_.default_worker_fence.count());
    j.fence_worker.clear();
    log("job " + j.rec.id + ": repaired when the store was loaded: " + what + "; requeued, to start after " +
        utc_time(j.rec.fence_until_ms));
    requeue_or_fail(j, "repaired when the store was loaded (" + what + ")", batch);
  }
}

std::optional<int64_t> Coordinator::issue_job_seq(std::string* error) {
  if (issued_ids_ && next_seq_ >= issued_ids_->marks().job_seq_ceiling) {
    IssuedMarks m = issued_ids_->marks();
    if (last_issued_seq_ > 0) m.job_seq_issued = std::max(m.job_seq_issued, last_issued_seq_ + 1);
    m.job_seq_ceiling = next_seq_ + kIdBlock;
    try {
      issued_ids_->write(m);
    } catch (const StoreError& e) {
      *error = e.what();
      return std::nullopt;
    }
  }
  last_issued_seq_ = next_seq_;
  return next_seq_++;
}

std::optional<int64_t> Coordinator::issue_incarnation(std::string* error) {
  if (issued_ids_ && next_incarnation_ >= issued_ids_->marks().incarnation_ceiling) {
    IssuedMarks m = issued_ids_->marks();
    m.incarnation_ceiling = next_incarnation_ + kIdBlock;
    try {
      issued_ids_->write(m);
    } catch (const StoreError& e) {
      *error = e.what();
      return std::nullopt;
    }
  }
  return next_incarnation_++;
}

// The process did not run for a while (SIGSTOP, a VM pause, a stall in the kernel): no
// worker could renew its lease meanwhile, so none is found LOST for it; every lease runs
// again as after a restart.
void Coordinator::renew_all_leases(const std::string& why) {
  const int64_t now = now_ms();
  int64_t renewed = 0;
  for (auto& [name, w] : workers_) {
    if (w.rec.state == "LOST") continue;
    std::lock_guard<std::mutex> lease_lock(w.lease->mu);
    w.lease->deadline_ms = std::max(w.lease->deadline_ms, now + options_.restart_grace.count());
    ++renewed;
  }
  log(why + ": the leases of " + std::to_string(renewed) + " workers run " +
      std::to_string(options_.restart_grace.count()) + " ms from now, as after a restart");
}

// --- helpers ---

void Coordinator::record_spec_facts(const JobSpec& spec, JobRecord* r) {
  r->checkpoint_dir = spec.checkpoint.dir;
  r->device = spec.train.device;
  r->workers = spec.resources.workers;
  r->gpus_per_worker = spec.resources.gpus_per_worker;
  r->max_restarts = spec.resources.max_restarts;
  r->hang_timeout = spec.resources.hang_timeout;
  // Nodes the scheduler assigns (rule 9); addresses in the spec need none.
  r->optimizer_nodes = spec.optimizer.host.addresses.empty() ? spec.optimizer.host.nodes : 0;
}

std::vector<std::pair<std::string, std::string>> Coordinator::placement_paths(const JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, path] : confined_paths(spec)) out.emplace_back(key, path);
  return out;
}

// A restart loads the spec facts from their columns, not the specs: the paths are read from
// the spec once the job needs placing, and kept.
const std::vector<std::pair<std::string, std::string>>& Coordinator::confined_paths_of(Job& j) const {
  if (!j.confined_paths) {
    try {
      j.confined_paths = placement_paths(parse_job_spec(j.rec.spec_yaml, {}, ".", SpecSite::kRunsElsewhere));
    } catch (const std::exception& e) {
      // Its worker's ranks refuse it the same way, naming the key; no rule here.
      log("job " + j.rec.id + ": stored spec no longer parses (" + e.what() + "); placed without its paths");
      j.confined_paths.emplace();
    }
  }
  return *j.confined_paths;
}

void Coordinator::release_attempt(Job& j) {
  if (!j.members.empty() && j.rec.start_time_ms > 0) j.rec.cost_usd += held_usd(j.rec.usd_per_hour, j.rec.start_time_ms, now_ms());
  bump_workers_of(j);
  j.members.clear();
  for (const std::string& node : j.rec.node_placement) refresh_grants(node);  // the attempt's grant ends
  j.queued_since_ms = now_ms();
}

// Per gang member: a slot (and a physical core) per rank, and the host memory computed at
// submit (JobRecord::host_memory_bytes_per_worker).
void Coordinator::set_demand(Job& j) {
  j.demand.slots = std::max<int64_t>(1, j.rec.gpus_per_worker);
  j.demand.cores = j.demand.slots;
  j.demand.host_memory_bytes = j.rec.host_memory_bytes_per_worker;
  j.slot_kind = j.rec.device == "cuda"  ? scheduler::SlotKind::kGpu
                : j.rec.device == "cpu" ? scheduler::SlotKind::kCpu
                                        : scheduler::SlotKind::kAny;
}

// A transition is applied in memory before it is written; if the write fails the two would
// disagree, so the coordinator stops (fail-stop) and a restart reloads the store's state.
void Coordinator::commit(StoreBatch& batch) {
  if (batch.empty()) return;
  try {
    timed_commit(batch);
  } catch (const StoreError& e) {
    log(std::string("store write failed: ") + e.what() + "; exiting so a restart reloads a consistent state");
    std::_Exit(1);
  }
  batch = StoreBatch{};
}

// Every transition comes here, so every one of them changes what a scheduling pass sees.
void Coordinator::touch(Job& j, StoreBatch& batch) {
  ++j.rec.revision;
  ++generation_;
  persist(j, batch);
}

// Its caller waits for this (most hold mu_; the committer does not): a slow one is worth
// a line.
void Coordinator::timed_commit(const StoreBatch& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> store_lock(store_mu_);
    store_->commit(batch);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  if (ms >= 100)
    log("slow store commit: " + std::to_string(ms) + " ms for " + std::to_string(batch.jobs.size()) + " jobs, " +
        std::to_string(batch.workers.size()) + " workers, " + std::to_string(batch.logs.size()) + " log appends");
}

void Coordinator::add_job(Job&& j) {
  const int64_t seq = j.rec.submit_seq;
  Job& added = jobs_.emplace(j.rec.id, std::move(j)).first->second;
  by_seq_[seq] = &added;
  track_live(added);
}

void Coordinator::track_live(Job& j) {
  if (terminal(j.rec.state)) {
    live_.erase(j.rec.id);
    candidates_.erase(&j);
    stable_.erase(&j);
  } else {
    live_[j.rec.id] = &j;
    if (!stable_.count(&j)) candidates_.insert(&j);
  }
}

void Coordinator::persist(Job& j, StoreBatch& batch) {
  track_live(j);
  j.last_persist_ms = now_ms();
  progress_dirty_jobs_.erase(&j);
  batch.jobs.push_back(j.rec);
  announce_change();
}

void Coordinator::bump_assignments(Worker& w) {
  std::lock_guard<std::mutex> lease_lock(w.lease->mu);
  ++w.lease->assignment_revision;
}

void Coordinator::bump_workers_of(const Job& j) {
  for (const Member& m : j.members) {
    auto it = workers_.find(m.worker);
    if (it != workers_.end()) bump_assignments(it->second);
  }
  for (const std::string& name : j.rec.placement) {
    auto it = workers_.find(name);
    if (it != workers_.end()) bump_assignments(it->second);
  }
  for (const std::string& node : j.rec.node_placement) refresh_grants(node);
  announce_change();
}

void Coordinator::refresh_grants(const std::string& node) {
  auto w = workers_.find(node);
  if (w == workers_.end()) return;
  std::map<std::string, std::string> grants;
  for (const auto& [id, j] : live_) {
    if (j->members.empty() || j->rec.node_secret.empty()) continue;  // no placed attempt
    const auto& nodes = j->rec.node_placement;
    if (std::find(nodes.begin(), nodes.end(), node) != nodes.end())
      grants[attempt::node_key(id, j->rec.attempt)] = j->rec.node_secret;
  }
  std::lock_guard<std::mutex> lease_lock(w->second.lease->mu);
  w->second.lease->grants = std::move(grants);
}

void Coordinator::append_coordinator_log(Job& j, const std::string& line, StoreBatch& batch) {
  const std::pair<std::string, int64_t> key{j.rec.id, j.rec.attempt * kStreamsPerAttempt};
  LogAppend a{j.rec.id, key.second, stream_bytes_[key], "zenflow-coordinator: " + line + "\n"};
  stream_bytes_[key] += static_cast<int64_t>(a.data.size());
  log_bytes_[j.rec.id] += static_cast<int64_t>(a.data.size());
  batch.logs.push_back(std::move(a));
}

void Coordinator::fill_status(const Job& j, v1::JobStatus* out) const {
  const JobRecord& r = j.rec;
  out->set_id(r.id);
  out->set_name(r.name);
  out->set_state(state_enum(r.state));
  out->set_priority(r.priority);
  out->set_step(r.step);
  out->set_total_steps(r.total_steps);
  out->set_progress_percent(r.total_steps > 0 ? 100.0 * double(r.step) / double(r.total_steps) : 0);
  out->set_eta_seconds(active(r.state) ? j.eta_seconds : (r.state == kSucceeded ? 0 : -1));
  // While it runs, and once it ended: its last attempt's rate (queued or preempted: none).
  out->set_tokens_per_second(queued(r.state) ? 0 : r.tokens_per_second);
  out->set_last_loss(r.last_loss);
  out->set_stall_share(r.stall_share);
  out->set_restarts(r.restarts);
  out->set_attempt(r.attempt);
  out->set_last_error(r.last_error);
  for (const std::string& w : r.placement) out->add_placement(w);
  for (const std::string& n : r.node_placement) out->add_optimizer_nodes(n);
  const CostFigures cost =
      cost_figures(r.usd_per_hour, r.cost_usd, active(r.state) ? r.start_time_ms : 0, now_ms(), r.stall_share,
                   r.step, r.tokens_per_step, r.usd_lost_to_restarts);
  out->set_cost_usd(cost.usd);
  out->set_usd_per_hour(r.usd_per_hour);
  out->set_price_source(r.price_source);
  out->set_usd_lost_to_stalls(cost.usd_lost_to_stalls);
  out->set_usd_lost_to_restarts(cost.usd_lost_to_restarts);
  out->set_usd_per_1m_tokens(cost.usd_per_1m_tokens);
  out->set_tokens(cost.tokens);
  out->set_submit_time_ms(r.submit_time_ms);
  out->set_start_time_ms(r.start_time_ms);
  out->set_end_time_ms(r.end_time_ms);
  out->set_waiting_reason(queued(r.state) ? j.waiting_reason : (r.stop_reason.empty() ? "" : r.stop_reason));
  out->set_revision(r.revision);
  out->set_resumed_from_step(r.resumed_from_step);
  out->set_checkpoint_dir(r.checkpoint_dir);
  out->set_workers(r.workers);
  out->set_gpus_per_worker(r.gpus_per_worker);
  out->set_request_id(r.request_id);
  out->set_exit_code(r.exit_code);
  out->set_preemptions(r.preemptions);
}

// --- JobService ---

Status Coordinator::parse_submitted(const v1::SubmitJobRequest& req, JobSpec* spec, std::string* yaml) const {
  if (req.spec_yaml().empty()) return bad("spec_yaml: empty");
  if (req.spec_yaml().size() > (1u << 20)) return bad("spec_yaml: larger than 1 MiB");
  if (req.request_id().size() > 256) return bad("request_id: longer than 256 characters");
  try {
    *spec = parse_job_spec(req.spec_yaml(), {req.set().begin(), req.set().end()}, ".", SpecSite::kRunsElsewhere);
  } catch (const SpecError& e) {
    return bad(e.what());
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  if (req.checkpoint_dir_default() && !options_.checkpoint_root.empty())
    spec->checkpoint.dir = options_.checkpoint_root + "/" + spec->name;
  if (Status s = check_absolute(*spec); !s.ok()) return s;
  *yaml = to_yaml(*spec);
  return Status::OK;
}

Status Coordinator::submit(const v1::SubmitJobRequest& req, v1::SubmitJobResponse* resp) {
  std::promise<std::pair<Status, v1::SubmitJobResponse>> answered;
  std::future<std::pair<Status, v1::SubmitJobResponse>> answer = answered.get_future();
  submit_async(req, [&answered](const Status& s, const v1::SubmitJobResponse& r) { answered.set_value({s, r}); });
  auto [status, response] = answer.get();
  *resp = std::move(response);
  return status;
}

void Coordinator::submit_async(const v1::SubmitJobRequest& req, SubmitAnswer answer) {
  if (req.spec_yaml().size() <= kInlineSpecBytes || std::this_thread::get_id() == intake_thread_.get_id())
    return admit_submit(req, std::move(answer));
  std::unique_lock<std::mutex> lock(intake_mu_);
  if (intake_stopping_ || intake_.size() >= kMaxIntakeQueue) {
    const bool stopping = intake_stopping_;
    lock.unlock();
    return answer(stopping ? kShuttingDown
                           : Status{StatusCode::RESOURCE_EXHAUSTED,
                                    std::to_string(kMaxIntakeQueue) + " specs over " +
                                        std::to_string(kInlineSpecBytes >> 10) +
                                        " KiB are already waiting to be parsed; retry in a second"},
                  v1::SubmitJobResponse{});
  }
  intake_.push_back({std::make_shared<const v1::SubmitJobRequest>(req), std::move(answer)});
  lock.unlock();
  intake_cv_.notify_one();
}

// Large specs, parsed here in arrival order; once stopping, what is left is refused
// unparsed (UNAVAILABLE), so every answer is still called once and shutdown is prompt.
void Coordinator::parse_large_submits() {
  std::unique_lock<std::mutex> lock(intake_mu_);
  for (;;) {
    intake_cv_.wait(lock, [&] { return intake_stopping_ || !intake_.empty(); });
    if (intake_.empty()) return;
    Intake next = std::move(intake_.front());
    intake_.pop_front();
    const bool stopping = intake_stopping_;
    lock.unlock();
    if (stopping) {
      next.answer(kShuttingDown, v1::SubmitJobResponse{});
    } else {
      admit_submit(*next.req, std::move(next.answer));
    }
    lock.lock();
  }
}

void Coordinator::admit_submit(const v1::SubmitJobRequest& req, SubmitAnswer answer) {
  const auto refuse = [&answer](const Status& s) { answer(s, v1::SubmitJobResponse{}); };
  JobSpec spec;
  std::string yaml;
  if (Status s = parse_submitted(req, &spec, &yaml); !s.ok()) return refuse(s);
  scheduler::Resources demand;
  demand.slots = std::max<int64_t>(1, spec.resources.gpus_per_worker);
  demand.cores = demand.slots;
  if (!spec.resources.host_memory_gb_auto) {
    demand.host_memory_bytes = static_cast<int64_t>(spec.resources.host_memory_gb * double(1LL << 30));
  } else if (req.total_params() > 0) {
    scheduler::HostMemoryInputs in;
    in.total_params = req.total_params();
    in.split_params = std::min(req.split_params(), req.total_params());
    in.mode = spec.optimizer.mode == "device"    ? scheduler::OffloadMode::kDevice
              : spec.optimizer.mode == "offload" ? scheduler::OffloadMode::kOffload
                                                 : scheduler::OffloadMode::kZenFlow;
    in.weight_bytes = req.weight_bytes() == 2 ? 2 : 4;
    in.ranks = spec.resources.workers * demand.slots;
    try {
      demand.host_memory_bytes = scheduler::host_memory_bytes_per_rank(in) * demand.slots;
    } catch (const std::invalid_argument& e) {
      return refuse(bad(std::string("model size: ") + e.what()));
    }
  }
  // The job as it will be stored, but for its id and sequence number (taken under the lock).
  auto p = std::make_shared<PendingSubmit>();
  std::vector<std::string> price_warnings;
  const ResolvedPrice price = resolve_price(spec.cost, options_.catalog.get(), &price_warnings);
  Job& j = p->job;
  JobRecord& r = j.rec;
  record_spec_facts(spec, &r);
  j.confined_paths = placement_paths(spec);
  r.usd_per_hour = job_usd_per_hour(price, spec.resources.workers, spec.resources.gpus_per_worker,
                                    spec.train.device != "cpu");
  if (price.priced)
    r.price_source = (price.instance.empty() ? std::string() : price.instance + ": ") + price.source +
                     (price.date.empty() ? "" : " (" + price.date + ")");
  r.request_id = req.request_id();
  r.name = spec.name;
  r.spec_yaml = std::move(yaml);
  r.priority = spec.resources.priority;
  r.total_steps = spec.train.steps;
  r.host_memory_bytes_per_worker = demand.host_memory_bytes;
  if (r.optimizer_nodes > 0 && req.total_params() > 0) {
    // Each node holds its share of every rank's host state: fp32 master, m, v and, in
    // zenflow mode, two window accumulators (20 B per host-owned element, 12 B in offload
    // mode; the node refuses a session over its --memory-limit on the same count), plus its
    // buffers.
    const bool offload = spec.optimizer.mode == "offload";
    const int64_t host_elements = offload                              ? req.total_params()
                                  : spec.optimizer.mode == "zenflow" ? std::min(req.split_params(), req.total_params())
                                                                     : 0;
    const int64_t per_element = offload ? 12 : 20;
    r.node_memory_bytes =
        (per_element * host_elements + r.optimizer_nodes - 1) / r.optimizer_nodes + (int64_t{64} << 20);
  }
  r.revision = 1;
  set_demand(j);

  std::unique_lock<std::mutex> lock(mu_);
  const auto refuse_unlocked = [&](const Status& st) {
    lock.unlock();
    refuse(st);
  };
  if (stopping_) return refuse_unlocked(kShuttingDown);
  if (!r.request_id.empty()) {
    if (auto it = by_request_.find(r.request_id); it != by_request_.end()) {
      Job& old = jobs_.at(it->second);
      if (old.rec.spec_yaml != r.spec_yaml)
        return refuse_unlocked({StatusCode::ALREADY_EXISTS, "request_id " + r.request_id + " was used for job " +
                                                                old.rec.id + " with a different spec"});
      v1::SubmitJobResponse resp;
      fill_status(old, resp.mutable_job());
      resp.set_created(false);
      lock.unlock();
      return answer(Status::OK, resp);
    }
    if (auto in_flight = pending_requests_.find(r.request_id); in_flight != pending_requests_.end()) {
      const std::shared_ptr<PendingSubmit>& first = in_flight->second;
      if (first->job.rec.spec_yaml != r.spec_yaml)
        return refuse_unlocked({StatusCode::ALREADY_EXISTS, "request_id " + r.request_id + " was used for job " +
                                                                first->job.rec.id + " with a different spec"});
      // The same request, still being committed (a client's retry): answered as it is
      // answered, or, if its commit fails, tried anew.
      first->retries.push_back(
          [this, req, answer = std::move(answer)]() mutable { submit_async(req, std::move(answer)); });
      return;
    }
  }
  if (auto owner = checkpoint_owner_.find(r.checkpoint_dir); owner != checkpoint_owner_.end()) {
    auto pending = pending_jobs_.find(owner->second);
    const std::string state = pending != pending_jobs_.end() ? kQueued : jobs_.at(owner->second).rec.state;
    if (!terminal(state))
      return refuse_unlocked({StatusCode::FAILED_PRECONDITION,
                              "checkpoint.dir " + r.checkpoint_dir + " belongs to job " + owner->second + " (" + state +
                                  "); two live jobs cannot share a checkpoint directory"});
    p->previous_owner = owner->second;
    // Its ranks may still be alive on a silent worker (a job cancelled or failed while its
    // worker was cut off): this job's first attempt waits for the same fence.
    if (pending == pending_jobs_.end()) {
      const Job& prev = jobs_.at(owner->second);
      if (prev.rec.fence_until_ms > now_ms()) {
        r.fence_until_ms = prev.rec.fence_until_ms;
        j.fence_worker = prev.fence_worker;
      }
    }
  }
  std::string issue_error;
  const std::optional<int64_t> issued = issue_job_seq(&issue_error);  // a failed commit leaves a gap, never a reuse
  if (!issued) {
    return refuse_unlocked({StatusCode::UNAVAILABLE, "cannot reserve a job number: " + issue_error});
  }
  const int64_t seq = *issued;
  char id[32];
  std::snprintf(id, sizeof(id), "j-%06lld", static_cast<long long>(seq));
  r.id = id;
  r.submit_seq = seq;
  r.submit_time_ms = now_ms();
  j.waiting_reason = "waiting for the next scheduling pass";
  j.queued_since_ms = r.submit_time_ms;
  p->batch.jobs.push_back(r);
  for (const std::string& w : price_warnings) {  // in the job's log, in the same transaction
    const std::string line = "zenflow-coordinator: warning: " + w + "; no cost\n";
    int64_t at = 0;
    for (const LogAppend& a : p->batch.logs) at += static_cast<int64_t>(a.data.size());
    p->batch.logs.push_back(LogAppend{r.id, 0, at, line});
  }
  checkpoint_owner_[r.checkpoint_dir] = r.id;
  if (!r.request_id.empty()) pending_requests_[r.request_id] = p;
  pending_jobs_[r.id] = p;
  p->answer = std::move(answer);  // by the committer, once durable
  const bool alone = submit_queue_.empty();
  submit_queue_.push_back(p);
  lock.unlock();  // before waking the committer, which takes the lock first
  submits_queued_.notify_one();
  if (alone && std::this_thread::get_id() != committer_.get_id()) step_aside(*p);  // (not a retry)
}

// The submitting thread (for small specs the one serving every hot RPC) waits a little
// for a lone submit's commit and answer. Where both share a core, the committer woken by
// its fsync otherwise waits for the scheduler to take the core from that thread, which
// may run on to the end of its slice (EEVDF's run-to-parity; ~1.5 ms on 2 CPUs). Measured
// under heartbeat load (bench control-plane, 5,000 beats/s), submits alternating within
// a run: p50 1.55 -> 1.38 and 1.21 -> 1.15 ms, p90 1.99 -> 1.57 and 2.18 -> 1.66 ms. The wait is bounded (options_.submit_step_aside, then the thread goes
// back to serving, however slow the disk) and so is its share of the thread's time
// (kStepAsideShare): heartbeats and gets queue meanwhile.
void Coordinator::step_aside(const PendingSubmit& p) {
  using std::chrono::steady_clock;
  if (options_.submit_step_aside.count() <= 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  const auto now = steady_clock::now();
  const auto earned = std::chrono::duration_cast<std::chrono::nanoseconds>((now - step_aside_refilled_) * kStepAsideShare);
  step_aside_budget_ =
      std::min<std::chrono::nanoseconds>(step_aside_budget_ + earned, options_.submit_step_aside_saved);
  step_aside_refilled_ = now;
  if (step_aside_budget_.count() <= 0) return;  // one wait may overdraw it
  submits_answered_.wait_for(lock, options_.submit_step_aside, [&] { return p.answered; });
  step_aside_budget_ -= steady_clock::now() - now;
}

// Group commit: every submit queued while the previous transaction was syncing goes into
// the next one. The store is written without mu_, so heartbeats, gets and scheduling
// passes go on during the fsync; the jobs enter the state (and become visible) only once
// durable.
void Coordinator::commit_submits() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    submits_queued_.wait(lock,
                         [&] { return stopping_ || !submit_queue_.empty() || !registration_queue_.empty(); });
    if (submit_queue_.empty() && registration_queue_.empty()) return;  // stopping, and every call answered
    std::vector<std::shared_ptr<PendingSubmit>> group;
    group.swap(submit_queue_);
    std::vector<std::shared_ptr<PendingRegistration>> registrations;
    registrations.swap(registration_queue_);
    lock.unlock();
    StoreBatch batch;
    for (const auto& p : group) {
      batch.jobs.insert(batch.jobs.end(), p->batch.jobs.begin(), p->batch.jobs.end());
      batch.logs.insert(batch.logs.end(), p->batch.logs.begin(), p->batch.logs.end());
    }
    for (const auto& r : registrations) batch.workers.push_back(r->rec);
    Status status = Status::OK, registered = Status::OK;
    try {
      timed_commit(batch);
    } catch (const StoreError& e) {
      status = {StatusCode::UNAVAILABLE, std::string("job store write failed: ") + e.what()};
      registered = {StatusCode::UNAVAILABLE, std::string("worker store write failed: ") + e.what()};
    }
    lock.lock();
    const int64_t now = now_ms();
    for (const auto& r : registrations) {
      if (registered.ok()) enter_worker(r->rec, r->resources, now);
      registering_.erase(r->rec.name);
    }
    for (const auto& r : registrations) r->committed.set_value(registered);
    for (const auto& p : group) {
      const JobRecord& r = p->batch.jobs[0];
      const std::string id = r.id;
      if (status.ok()) {
        if (!r.request_id.empty()) by_request_[r.request_id] = id;
        int64_t log_size = 0;
        for (const LogAppend& a : p->batch.logs) log_size += static_cast<int64_t>(a.data.size());
        log_bytes_[id] = log_size;
        if (log_size > 0) stream_bytes_[{id, 0}] = log_size;
        add_job(std::move(p->job));
        log("job " + id + " (" + r.name + ") submitted");
      } else if (auto owner = checkpoint_owner_.find(r.checkpoint_dir);
                 owner != checkpoint_owner_.end() && owner->second == id) {
        if (p->previous_owner.empty()) {
          checkpoint_owner_.erase(owner);
        } else {
          owner->second = p->previous_owner;
        }
      }
      if (!r.request_id.empty()) pending_requests_.erase(r.request_id);
      pending_jobs_.erase(id);
    }
    if (status.ok()) schedule_dirty_ = true;
    // Answers (and the retries of the same request_ids) without the lock, before the
    // ticker is woken for the pass they make due: where the two share a core, a pass woken
    // first (up to a millisecond over thousands of queued jobs) would run ahead of them.
    std::vector<v1::SubmitJobResponse> responses(group.size());
    if (status.ok())
      for (size_t i = 0; i < group.size(); ++i) {
        fill_status(jobs_.at(group[i]->batch.jobs[0].id), responses[i].mutable_job());
        responses[i].set_created(true);
      }
    lock.unlock();
    for (size_t i = 0; i < group.size(); ++i) {
      group[i]->answer(status, status.ok() ? responses[i] : v1::SubmitJobResponse{});
      for (auto& retry : group[i]->retries) retry();
    }
    lock.lock();
    for (const auto& p : group) p->answered = true;
    group.clear();
    submits_answered_.notify_all();
    announce_change();
  }
}

Status Coordinator::get(const std::string& id, v1::JobStatus* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return {StatusCode::NOT_FOUND, "no job " + id};
  fill_status(it->second, out);
  return Status::OK;
}

Status Coordinator::list(const v1::ListJobsRequest& req, v1::ListJobsResponse* resp) {
  int page = req.page_size() <= 0 ? 100 : req.page_size();
  if (page > 1000) return bad("page_size: at most 1000, got " + std::to_string(req.page_size()));
  int64_t before = INT64_MAX;  // page_token: the submit_seq the next page starts below
  if (!req.page_token().empty()) {
    try {
      size_t used = 0;
      before = std::stoll(req.page_token(), &used);
      if (used != req.page_token().size()) throw std::invalid_argument("");
    } catch (const std::exception&) {
      return bad("page_token: not a token this coordinator gave out");
    }
  }
  std::set<std::string> states;
  for (int s : req.states()) states.insert(v1::JobState_Name(static_cast<v1::JobState>(s)));
  std::lock_guard<std::mutex> lock(mu_);
  // Newest first, from below the token: the page, and whether one more job follows it.
  std::vector<const Job*> order;
  for (auto it = std::make_reverse_iterator(by_seq_.lower_bound(before));
       it != by_seq_.rend() && order.size() <= static_cast<size_t>(page); ++it)
    if (states.empty() || states.count(it->second->rec.state)) order.push_back(it->second);
  for (size_t i = 0; i < order.size() && i < static_cast<size_t>(page); ++i)
    fill_status(*order[i], resp->add_jobs());
  if (order.size() > static_cast<size_t>(page))
    resp->set_next_page_token(std::to_string(order[static_cast<size_t>(page) - 1]->rec.submit_seq));
  return Status::OK;
}

Status Coordinator::cancel(const std::string& id, v1::JobStatus* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return {StatusCode::NOT_FOUND, "no job " + id};
  Job& j = it->second;
  if (terminal(j.rec.state))
    return {StatusCode::FAILED_PRECONDITION, "job " + id + " already ended (" + j.rec.state + ")"};
  StoreBatch batch;
  if (queued(j.rec.state)) {
    j.rec.state = kCancelled;
    j.rec.end_time_ms = now_ms();
    j.rec.last_error.clear();
    append_coordinator_log(j, "cancelled before it started", batch);
    touch(j, batch);
  } else if (!starts_with(j.rec.stop_reason, kStopCancel)) {
    // The Ctrl-C path: the ranks finish their step, checkpoint and exit; the job is
    // CANCELLED when they have.
    j.rec.stop_reason = std::string(kStopCancel) + " by the user: checkpointing and stopping";
    append_coordinator_log(j, "cancel requested: asking the ranks to checkpoint and stop", batch);
    touch(j, batch);
    bump_workers_of(j);
  }
  commit(batch);
  schedule_dirty_ = true;
  fill_status(j, out);
  return Status::OK;
}

Status Coordinator::wait_job(const std::string& id, int64_t after_revision, std::chrono::milliseconds wait,
                             v1::JobStatus* out) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return {StatusCode::NOT_FOUND, "no job " + id};
  const Job& j = it->second;  // jobs are never erased: the reference stays valid
  changed_.wait_for(lock, wait, [&] { return stopping_ || j.rec.revision > after_revision; });
  fill_status(j, out);
  return Status::OK;
}

void Coordinator::announce_change() {
  change_seq_.fetch_add(1, std::memory_order_relaxed);
  changed_.notify_all();
  std::lock_guard<std::mutex> lock(listener_mu_);
  if (change_listener_) change_listener_();
}

void Coordinator::set_change_listener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  change_listener_ = std::move(listener);
}

Status Coordinator::probe_stream(const std::string& id, StreamProbe* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return {StatusCode::NOT_FOUND, "no job " + id};
  const Job& j = it->second;
  const auto bytes = log_bytes_.find(id);
  out->revision = j.rec.revision;
  out->terminal = terminal(j.rec.state);
  out->log_bytes = bytes == log_bytes_.end() ? 0 : bytes->second;
  out->log_done = out->terminal && j.members.empty();
  return Status::OK;
}

Status Coordinator::read_log(const std::string& id, int64_t offset, int64_t max, std::chrono::milliseconds wait,
                             std::string* data, bool* finished) {
  if (offset < 0) return bad("offset: must be >= 0");
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return {StatusCode::NOT_FOUND, "no job " + id};
  const Job& j = it->second;
  auto size = [&] { return log_bytes_[id]; };
  auto done = [&] { return terminal(j.rec.state) && j.members.empty(); };
  if (offset >= size() && !done() && wait.count() > 0)
    changed_.wait_for(lock, wait, [&] { return stopping_ || offset < size() || done(); });
  try {
    std::lock_guard<std::mutex> store_lock(store_mu_);
    *data = store_->read_log(id, offset, max);
  } catch (const StoreError& e) {
    return {StatusCode::UNAVAILABLE, std::string("log read failed: ") + e.what()};
  }
  *finished = done() && offset + static_cast<int64_t>(data->size()) >= size();
  return Status::OK;
}

void Coordinator::list_workers(v1::ListWorkersResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::vector<std::string>> jobs_on;  // one pass over the live jobs
  for (const auto& [id, j] : live_)
    if (active(j->rec.state))
      for (const Member& m : j->members)
        if (!m.exited) jobs_on[m.worker].push_back(id);
  for (const auto& [id, j] : live_)
    if (active(j->rec.state))
      for (const std::string& node : j->rec.node_placement) jobs_on[node].push_back(id);
  for (const auto& [name, w] : workers_) {
    v1::WorkerStatus* s = resp->add_workers();
    s->set_name(name);
    v1::WorkerRole role = v1::TRAINER;
    v1::WorkerRole_Parse(w.rec.role, &role);
    s->set_role(role);
    v1::WorkerState st = v1::READY;
    v1::WorkerState_Parse(w.rec.state, &st);
    s->set_state(st);
    *s->mutable_resources() = w.resources;
    s->set_address(w.rec.address);
    s->set_registered_ms(w.rec.registered_ms);
    {
      std::lock_guard<std::mutex> lease_lock(w.lease->mu);
      s->set_last_heartbeat_ms(w.lease->last_heartbeat_ms);
    }
    s->set_incarnation(w.rec.incarnation);
    for (const std::string& root : w.rec.allowed_roots) s->add_allowed_roots(root);
    if (auto on = jobs_on.find(name); on != jobs_on.end())
      for (const std::string& id : on->second) s->add_jobs(id);
  }
}

// --- WorkerService ---

ClusterSnapshot Coordinator::snapshot() const {
  constexpr int64_t kEndedShownMs = 3'600'000;
  ClusterSnapshot out;
  for (const char* state : {kQueued, kStarting, kRunning, kPreempted, kSucceeded, kFailed, kCancelled})
    out.jobs_by_state[state] = 0;
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = now_ms();
  std::map<std::string, const Worker*> trainers;
  for (const auto& [name, w] : workers_) {
    ++out.workers[{w.rec.role, w.rec.state}];
    if (w.rec.role != "TRAINER" || w.rec.state == "LOST") continue;
    trainers[name] = &w;
    out.slots_total["gpu"] += w.resources.gpus_size();
    out.slots_total["cpu"] += w.resources.gpus_size() > 0 ? 0 : w.resources.cpu_slots();
  }
  for (const auto& [id, j] : jobs_) {
    ++out.jobs_by_state[j.rec.state];
    for (const Member& m : j.members) {
      auto w = trainers.find(m.worker);
      if (w == trainers.end() || m.exited) continue;
      const std::string kind = w->second->resources.gpus_size() > 0 ? "gpu" : "cpu";
      out.slots_allocated[kind] += j.demand.slots;
      if (j.rec.state == kRunning) out.slots_busy[kind] += j.demand.slots;
    }
    if (terminal(j.rec.state) && now - j.rec.end_time_ms > kEndedShownMs) continue;
    const CostFigures cost =
        cost_figures(j.rec.usd_per_hour, j.rec.cost_usd, active(j.rec.state) ? j.rec.start_time_ms : 0, now,
                     j.rec.stall_share, j.rec.step, j.rec.tokens_per_step, j.rec.usd_lost_to_restarts);
    ClusterSnapshot::JobFigures f;
    f.id = id;
    f.state = j.rec.state;
    f.restarts = j.rec.restarts;
    f.preemptions = j.rec.preemptions;
    f.cost_usd = cost.usd;
    f.usd_lost_to_stalls = cost.usd_lost_to_stalls;
    f.usd_lost_to_restarts = cost.usd_lost_to_restarts;
    f.usd_per_hour = j.rec.usd_per_hour;
    out.jobs.push_back(std::move(f));
  }
  out.workers_lost = workers_lost_;
  for (const char* kind : {"gpu", "cpu"}) {
    out.slots_total[kind] += 0;
    out.slots_allocated[kind] += 0;
    out.slots_busy[kind] += 0;
  }
  return out;
}

Coordinator::Worker* Coordinator::live_worker(const std::string& name, int64_t incarnation, Status* status) {
  auto it = workers_.find(name);
  if (it == workers_.end()) {
    *status = {StatusCode::FAILED_PRECONDITION, "worker " + name + " is not registered; register again"};
    return nullptr;
  }
  Worker& w = it->second;
  if (w.rec.incarnation != incarnation || w.rec.state == "LOST") {
    *status = not_leased(name, incarnation, *w.lease);  // mu_ held: its incarnation and lost are stable
    return nullptr;
  }
  return &w;
}

Status Coordinator::not_leased(const std::string& name, int64_t incarnation, const Lease& lease) {
  return {StatusCode::FAILED_PRECONDITION,
          "worker " + name + " incarnation " + std::to_string(incarnation) + " is no longer leased (" +
              (lease.lost ? "declared LOST" : "re-registered as " + std::to_string(lease.incarnation)) +
              "); kill its training processes and register again"};
}

Status Coordinator::register_worker(const v1::RegisterWorkerRequest& req, v1::RegisterWorkerResponse* resp) {
  const std::string& name = req.name();
  if (name.empty() || name.size() > 128) return bad("name: 1 to 128 characters");
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return bad("name: only letters, digits, '-', '_' and '.', got \"" + name + "\"");
  const v1::WorkerResources& res = req.resources();
  if (res.host_memory_bytes() < 0 || res.physical_cores() < 0 || res.cpu_slots() < 0)
    return bad("resources: negative amounts");
  if (Status s = check_resources(req); !s.ok()) return s;
  if (req.role() != v1::OPTIMIZER && res.gpus_size() == 0 && res.cpu_slots() == 0)
    return bad("resources: a trainer offers GPUs or CPU slots (--cpu-slots)");
  if (req.role() != v1::OPTIMIZER &&
      req.rendezvous_ports_size() < std::max<int>(res.gpus_size(), static_cast<int>(res.cpu_slots())))
    return bad("rendezvous_ports: one per slot needed");
  std::shared_ptr<PendingRegistration> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return kShuttingDown;
    if (registering_.count(name))
      return {StatusCode::ALREADY_EXISTS,
              "worker " + name +
                  " is being registered by another call; another agent with this name? (retry in a second)"};
    const int64_t now = now_ms();
    auto it = workers_.find(name);
    if (it != workers_.end() && it->second.rec.state != "LOST") {
      Worker& old = it->second;
      int64_t deadline = 0, last_heartbeat = 0;
      {
        std::lock_guard<std::mutex> lease_lock(old.lease->mu);
        deadline = old.lease->deadline_ms;
        last_heartbeat = old.lease->last_heartbeat_ms;
      }
      if (deadline > now && last_heartbeat > 0)
        return {StatusCode::ALREADY_EXISTS,
                "worker " + name + " is registered and its lease runs " + std::to_string(deadline - now) +
                    " ms more; another agent with this name? (retry after the lease)"};
      // A new incarnation of a worker not yet found LOST: the old one's training processes
      // died with its agent. Its attempts end in the same transaction as the new record.
      std::string issue_error;
      const std::optional<int64_t> incarnation = issue_incarnation(&issue_error);
      if (!incarnation) return {StatusCode::UNAVAILABLE, "cannot reserve an incarnation: " + issue_error};
      StoreBatch batch;
      lose_worker(old, "re-registered (the agent restarted)", /*silent=*/false, batch);
      const WorkerRecord rec = registration_record(req, now, *incarnation, resp->mutable_session());
      enter_worker(rec, res, now);
      batch.workers.push_back(rec);
      commit(batch);
      resp->set_incarnation(rec.incarnation);
    } else {
      // New, or LOST: nothing else changes with it, so it waits for the committer's next
      // transaction like a submit, without holding the lock through the sync.
      std::string issue_error;
      const std::optional<int64_t> incarnation = issue_incarnation(&issue_error);
      if (!incarnation) return {StatusCode::UNAVAILABLE, "cannot reserve an incarnation: " + issue_error};
      pending = std::make_shared<PendingRegistration>();
      pending->rec = registration_record(req, now, *incarnation, resp->mutable_session());
      pending->resources = res;
      registering_.insert(name);
      registration_queue_.push_back(pending);
      resp->set_incarnation(pending->rec.incarnation);
    }
  }
  if (pending != nullptr) {
    submits_queued_.notify_one();
    if (Status s = pending->committed.get_future().get(); !s.ok()) return s;
  }
  resp->set_heartbeat_interval_ms(options_.heartbeat_interval.count());
  resp->set_lease_ms(options_.lease.count());
  return Status::OK;
}

WorkerRecord Coordinator::registration_record(const v1::RegisterWorkerRequest& req, int64_t now,
                                              int64_t incarnation, std::string* session) {
  WorkerRecord rec;
  *session = rpc::random_token();  // 256 bits from the kernel: unguessable, unlike the incarnation
  rec.session_digest = rpc::session_digest(*session);
  rec.name = req.name();
  rec.role = req.role() == v1::OPTIMIZER ? "OPTIMIZER" : "TRAINER";
  req.resources().SerializeToString(&rec.resources);
  rec.address = req.address().empty() ? "127.0.0.1" : req.address();
  rec.rendezvous_ports.assign(req.rendezvous_ports().begin(), req.rendezvous_ports().end());
  rec.incarnation = incarnation;  // a failed commit leaves a gap, never a reuse
  rec.registered_ms = now;
  rec.state = "READY";
  rec.fence_ms = std::max<int64_t>(0, req.fence_ms());
  rec.allowed_roots.assign(req.allowed_roots().begin(), req.allowed_roots().end());
  return rec;
}

void Coordinator::enter_worker(const WorkerRecord& rec, const v1::WorkerResources& resources, int64_t now) {
  const std::string& name = rec.name;
  Worker& w = workers_[name];
  w.rec = rec;
  w.resources = resources;
  if (w.rec.role == "TRAINER") {
    trainers_[name] = &w;
    optimizers_.erase(name);
  } else {
    optimizers_[name] = &w;
    trainers_.erase(name);
  }
  {
    std::lock_guard<std::mutex> lease_lock(w.lease->mu);
    w.lease->incarnation = w.rec.incarnation;
    w.lease->session_digest = w.rec.session_digest;
    w.lease->lost = false;
    renew(*w.lease, now);
    w.lease->assignment_revision = std::max(w.lease->assignment_revision, revision_base_) + 1;
  }
  // Registered again: the agent has no rank left of its previous life (a restarted agent's
  // died with the old one, PR_SET_PDEATHSIG; a fenced one killed its own before registering).
  // The jobs waiting for its fence need not wait longer.
  for (const auto& [id, j] : live_)
    if (j->rec.fence_until_ms > now && j->fence_worker == name) {  // (the integer first: most jobs wait for none)
      j->rec.fence_until_ms = 0;
      j->fence_worker.clear();
      log("job " + id + ": worker " + name + " registered again; its ranks are gone, the job may start");
    }
  next_lease_expiry_ms_ = std::min(next_lease_expiry_ms_, now + options_.lease.count());
  if (!leases_.count(name)) {
    std::unique_lock<std::shared_mutex> table_lock(leases_mu_);
    leases_[name] = w.lease;
  }
  ++generation_;
  log("worker " + name + " registered (incarnation " + std::to_string(w.rec.incarnation) + ", " +
      (resources.gpus_size() ? std::to_string(resources.gpus_size()) + " GPUs"
                             : std::to_string(resources.cpu_slots()) + " CPU slots") +
      ")");
  schedule_dirty_ = true;
  announce_change();
}

Coordinator::Job* Coordinator::current_attempt(const std::string& job_id, int64_t attempt, const std::string& worker,
                                               int* member, Status* status) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    *status = {StatusCode::FAILED_PRECONDITION, "no job " + job_id};
    return nullptr;
  }
  Job& j = it->second;
  for (size_t m = 0; m < j.members.size(); ++m) {
    if (j.members[m].worker == worker && j.rec.attempt == attempt && active(j.rec.state)) {
      *member = static_cast<int>(m);
      return &j;
    }
  }
  *status = {StatusCode::FAILED_PRECONDITION, "attempt " + std::to_string(attempt) + " of job " + job_id + " on " +
                                                  worker + " is not current (the job is " + j.rec.state +
                                                  ", attempt " + std::to_string(j.rec.attempt) + ")"};
  return nullptr;
}

Status Coordinator::heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp, int64_t stream) {
  resp->set_heartbeat_interval_ms(options_.heartbeat_interval.count());
  resp->set_lease_ms(options_.lease.count());
  resp->set_coordinator_boot(boot_);
  if (stream != 0 && req.attempts_size() > 0)
    return {StatusCode::INVALID_ARGUMENT,
            "attempts: a beat on the heartbeat stream carries none (report attempts with Heartbeat)"};
  if (req.attempts_size() == 0) {
    // Nearly every heartbeat: renew the lease, touching nothing else (no mu_).
    const std::shared_ptr<Lease> lease = lease_of(req.name());
    if (!lease)
      return {StatusCode::FAILED_PRECONDITION, "worker " + req.name() + " is not registered; register again"};
    {
      std::lock_guard<std::mutex> lease_lock(lease->mu);
      if (lease->incarnation != req.incarnation() || lease->lost)
        return not_leased(req.name(), req.incarnation(), *lease);
      renew(*lease, now_ms());
      if (stream != 0) lease->pulse_stream = stream;
      resp->set_assignment_revision(lease->assignment_revision);
      for (const auto& [key, secret] : lease->grants) {
        v1::NodeGrant* g = resp->add_node_grants();
        g->set_key(key);
        g->set_secret(secret);
      }
    }
    apply_progress(req);
    return Status::OK;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st;
    Worker* w = live_worker(req.name(), req.incarnation(), &st);
    if (!w) return st;
    {
      std::lock_guard<std::mutex> lease_lock(w->lease->mu);
      renew(*w->lease, now_ms());
    }
    StoreBatch batch;
    for (const v1::AttemptReport& r : req.attempts()) {
      int m = -1;
      Status ignored;
      Job* j = current_attempt(r.job_id(), r.attempt(), req.name(), &m, &ignored);
      if (j) apply_attempt_report(*j, m, r, batch);
      // Ended attempts are acknowledged once recorded, or when they are stale (nothing to record).
      if (r.exited()) {
        v1::AttemptRef* a = resp->add_acknowledged();
        a->set_job_id(r.job_id());
        a->set_attempt(r.attempt());
      }
    }
    commit(batch);
    resp->set_assignment_revision(w->lease->assignment_revision);
  }
  apply_progress(req);  // after the attempts: a start reported in this beat is known
  return Status::OK;
}

// The progress a beat carries, each as ReportProgress takes it; one refused (a stale
// attempt, a bad step) or of another worker's name or incarnation is skipped.
void Coordinator::apply_progress(const v1::HeartbeatRequest& req) {
  for (const v1::ReportProgressRequest& p : req.progress())
    if (p.name() == req.name() && p.incarnation() == req.incarnation()) (void)report_progress(p);
}

Status Coordinator::check_session(const std::string& name, int64_t incarnation, std::string_view session) {
  const std::shared_ptr<Lease> lease = lease_of(name);
  if (!lease) return {StatusCode::FAILED_PRECONDITION, "worker " + name + " is not registered; register again"};
  const std::string digest = rpc::session_digest(session);
  std::lock_guard<std::mutex> lease_lock(lease->mu);
  // Only the current incarnation's digest is kept: an older incarnation's agent (whatever it
  // presents) is told to register again, which is what its session would get it anyway.
  if (lease->incarnation != incarnation) return not_leased(name, incarnation, *lease);
  if (lease->session_digest.empty())
    return {StatusCode::FAILED_PRECONDITION,
            "worker " + name + " incarnation " + std::to_string(incarnation) +
                " was registered with a coordinator that handed out no sessions; register again"};
  if (!rpc::constant_time_equal(digest, lease->session_digest))
    return {StatusCode::UNAUTHENTICATED,
            session.empty() ? "no worker session (" + std::string(rpc::kSessionMetadata) +
                                  " metadata): a worker calls with the session RegisterWorker gave it"
                            : "the worker session is not the one handed to worker " + name + " incarnation " +
                                  std::to_string(incarnation)};
  if (lease->lost) return not_leased(name, incarnation, *lease);
  return Status::OK;
}

std::shared_ptr<Coordinator::Lease> Coordinator::lease_of(const std::string& name) {
  std::shared_lock<std::shared_mutex> table_lock(leases_mu_);
  auto it = leases_.find(name);
  return it == leases_.end() ? nullptr : it->second;
}

void Coordinator::renew(Lease& lease, int64_t now) const {
  lease.deadline_ms = now + options_.lease.count();
  lease.last_heartbeat_ms = now;
  lease.stream_broken_ms = 0;
}

void Coordinator::heartbeat_stream_broken(const std::string& name, int64_t incarnation, int64_t stream) {
  const std::shared_ptr<Lease> lease = lease_of(name);
  if (!lease) return;
  int64_t deadline = 0;
  {
    std::lock_guard<std::mutex> lease_lock(lease->mu);
    // A stream the worker already replaced (its new one beat first) cuts nothing.
    if (lease->incarnation != incarnation || lease->lost || lease->pulse_stream != stream) return;
    const int64_t now = now_ms();
    lease->deadline_ms = std::min(lease->deadline_ms, now + options_.heartbeat_interval.count());
    lease->stream_broken_ms = now;
    deadline = lease->deadline_ms;
  }
  std::lock_guard<std::mutex> lock(mu_);
  next_lease_expiry_ms_ = std::min(next_lease_expiry_ms_, deadline);
}

Status Coordinator::fetch_assignments(const v1::FetchAssignmentsRequest& req, v1::FetchAssignmentsResponse* resp) {
  const auto wait = std::chrono::milliseconds(std::clamp<int64_t>(req.wait_ms(), 0, 30'000));
  std::unique_lock<std::mutex> lock(mu_);
  Status st;
  Worker* w = live_worker(req.name(), req.incarnation(), &st);
  if (!w) return st;
  const std::string name = req.name();
  const int64_t incarnation = req.incarnation();
  changed_.wait_for(lock, wait, [&] {
    auto it = workers_.find(name);
    return stopping_ || it == workers_.end() || it->second.rec.incarnation != incarnation ||
           it->second.rec.state == "LOST" || it->second.lease->assignment_revision > req.after_revision();
  });
  w = live_worker(name, incarnation, &st);
  if (!w) return st;
  resp->set_revision(w->lease->assignment_revision);
  for (const auto& [id, live] : live_) {
    const Job& j = *live;
    if (!active(j.rec.state)) continue;
    for (size_t m = 0; m < j.members.size(); ++m) {
      if (j.members[m].worker != name || j.members[m].exited) continue;
      v1::Assignment* a = resp->add_assignments();
      const int ranks = static_cast<int>(j.demand.slots);
      a->set_job_id(id);
      a->set_attempt(j.rec.attempt);
      a->set_spec_yaml(j.rec.spec_yaml);
      a->set_first_rank(static_cast<int>(m) * ranks);
      a->set_local_ranks(ranks);
      a->set_world_size(static_cast<int>(j.members.size()) * ranks);
      auto host = workers_.find(j.members[0].worker);
      a->set_master_addr(host == workers_.end() ? "127.0.0.1" : host->second.rec.address);
      a->set_master_port(static_cast<int>(j.rec.master_port));
      a->set_hosts_rendezvous(m == 0);
      a->set_action(j.rec.stop_reason.empty() ? v1::Assignment::RUN : v1::Assignment::STOP);
      a->set_stop_reason(j.rec.stop_reason);
      a->set_hang_timeout_seconds(j.rec.hang_timeout);
      for (const std::string& node : j.rec.node_placement)
        if (auto n = workers_.find(node); n != workers_.end()) a->add_optimizer_addresses(n->second.rec.address);
      if (!j.rec.node_placement.empty()) a->set_node_secret(j.rec.node_secret);
    }
  }
  return Status::OK;
}

Status Coordinator::report_progress(const v1::ReportProgressRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  Status st;
  if (!live_worker(req.name(), req.incarnation(), &st)) return st;
  int m = -1;
  Job* j = current_attempt(req.attempt().job_id(), req.attempt().attempt(), req.name(), &m, &st);
  if (!j) return st;
  if (m != 0) return Status::OK;  // rank 0's worker speaks for the job
  StoreBatch batch;
  const Status taken = take_progress(*j, req, batch);
  commit(batch);
  return taken;
}

// Progress of the current attempt from rank 0's worker (a report, a beat's entry, or the last
// progress an exit carries). Under mu_.
Status Coordinator::take_progress(Job& job, const v1::ReportProgressRequest& req, StoreBatch& batch) {
  Job* j = &job;
  if (req.step() < 0 || req.step() > j->rec.total_steps) return bad("step: out of range");
  if (Status s = check_progress(req); !s.ok()) {
    log("refused a progress report from " + req.name() + " for job " + j->rec.id + ": " + s.error_message());
    return s;
  }
  // Steps only grow within an attempt: an older report that arrives late (a beat in flight
  // while the agent sent the final one by ReportProgress) changes nothing.
  if (j->progressed && req.step() < j->rec.step) return Status::OK;
  if (!j->members[0].started) {
    v1::AttemptReport started;
    started.set_job_id(j->rec.id);
    started.set_attempt(j->rec.attempt);
    apply_attempt_report(*j, 0, started, batch);
  }
  if (!j->progressed) {
    // A resumed attempt's first report: what the restart wasted (server/job_cost.h). rec.step
    // is still the step the previous attempt reached.
    j->progressed = true;
    if (j->rec.attempt > 1 && j->rec.usd_per_hour > 0) {
      const double startup =
          startup_seconds(j->rec.start_time_ms, now_ms(), req.step() - req.start_step(), req.step_seconds());
      j->rec.usd_lost_to_restarts +=
          restart_loss_usd(j->rec.usd_per_hour, j->rec.step, req.start_step(), req.step_seconds(), startup);
      persist(*j, batch);
    }
  }
  j->rec.step = req.step();
  j->rec.resumed_from_step = req.start_step();
  j->step_seconds = req.step_seconds();
  if (req.tokens_per_step() > 0) {
    j->rec.tokens_per_step = static_cast<double>(req.tokens_per_step());
  } else if (req.tokens_per_second() > 0 && req.step_seconds() > 0) {  // an older trainer: estimated
    j->rec.tokens_per_step = req.tokens_per_second() * req.step_seconds();
  }
  j->rec.last_loss = req.loss();
  // A report of the step it resumed at (no step trained yet) keeps the rates of the last one.
  if (req.step_seconds() > 0 || req.tokens_per_second() > 0) {
    j->rec.tokens_per_second = req.tokens_per_second();
    j->rec.stall_share = std::min(1.0, req.stall_share());
  }
  j->eta_seconds = req.eta_seconds();
  ++j->rec.revision;
  progress_dirty_jobs_.insert(j);
  announce_change();
  return Status::OK;
}

Status Coordinator::report_event(const v1::ReportEventRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  Status st;
  if (!live_worker(req.name(), req.incarnation(), &st)) return st;
  int m = -1;
  Job* j = current_attempt(req.attempt().job_id(), req.attempt().attempt(), req.name(), &m, &st);
  if (!j) return st;
  StoreBatch batch;
  apply_attempt_report(*j, m, req.attempt(), batch);
  commit(batch);
  return Status::OK;
}

// The job an upload from worker `name` (that incarnation, live) is for; null with *st set
// otherwise. Under mu_.
Coordinator::Job* Coordinator::uploading_job(const std::string& name, int64_t incarnation, const std::string& job_id,
                                             Status* st) {
  if (!live_worker(name, incarnation, st)) return nullptr;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    *st = {StatusCode::FAILED_PRECONDITION, "no job " + job_id};
    return nullptr;
  }
  return &it->second;
}

Status Coordinator::upload_logs(const v1::UploadLogsRequest& req, v1::UploadLogsResponse* resp) {
  if (req.data().size() > (64u << 10)) return bad("data: at most 64 KiB per upload");
  if (req.offset() < 0) return bad("offset: must be >= 0");
  std::lock_guard<std::mutex> lock(mu_);
  Status st;
  Job* jp = uploading_job(req.name(), req.incarnation(), req.attempt().job_id(), &st);
  if (!jp) return st;
  Job& j = *jp;
  // The current attempt, or the last one (an agent uploads the tail of an attempt's output
  // before it reports the exit, but a retry may arrive after).
  int member = -1;
  if (req.attempt().attempt() == j.rec.attempt)
    for (size_t m = 0; m < j.rec.placement.size(); ++m)
      if (j.rec.placement[m] == req.name()) member = static_cast<int>(m);
  if (member < 0)
    return {StatusCode::FAILED_PRECONDITION, "attempt " + std::to_string(req.attempt().attempt()) + " of job " +
                                                 j.rec.id + " on " + req.name() + " is not current"};
  // An ended job's log is closed (the agent reports an exit only once its output is held,
  // so nothing of it is missing), and so is the output of a member whose exit is recorded.
  if (terminal(j.rec.state))
    return {StatusCode::FAILED_PRECONDITION, "job " + j.rec.id + " ended (" + j.rec.state + "); its log is closed"};
  const std::pair<std::string, int64_t> key{j.rec.id, j.rec.attempt * kStreamsPerAttempt + member + 1};
  int64_t& held = stream_bytes_[key];
  const int64_t end = req.offset() + static_cast<int64_t>(req.data().size());
  const bool member_exited = static_cast<size_t>(member) < j.members.size() &&
                             j.members[static_cast<size_t>(member)].worker == req.name() &&
                             j.members[static_cast<size_t>(member)].exited;
  if (end > held && !member_exited) {
    StoreBatch batch;
    int64_t& size = log_bytes_[j.rec.id];
    if (size >= options_.max_job_log_bytes) {
      // Over the cap: counted, not kept. The first drop says so in the log, where it happens.
      if (j.rec.log_dropped_bytes == 0)
        append_coordinator_log(j, "the job's log reached its cap of " + std::to_string(options_.max_job_log_bytes) +
                                      " bytes; later output is dropped (counted; each worker keeps an attempt's "
                                      "whole output in its work dir)",
                               batch);
      j.rec.log_dropped_bytes += end - std::max(held, req.offset());
      progress_dirty_jobs_.insert(&j);  // the count reaches the store with the next progress write
    } else {
      if (req.offset() > held)
        // Bytes the agent had sent and no longer holds, which this coordinator lost (a store
        // restored from an older copy): said in the log, and the upload goes on from here.
        append_coordinator_log(j, std::to_string(req.offset() - held) + " bytes of the output of " + req.name() +
                                      " were lost by the coordinator's store",
                               batch);
      const int64_t from = std::max(held, req.offset());
      batch.logs.push_back(
          LogAppend{j.rec.id, key.second, from, req.data().substr(static_cast<size_t>(from - req.offset()))});
    }
    try {
      timed_commit(batch);
    } catch (const StoreError& e) {
      return {StatusCode::UNAVAILABLE, std::string("log write failed: ") + e.what()};
    }
    if (!batch.logs.empty() && batch.logs.back().job_id == j.rec.id && batch.logs.back().attempt == key.second)
      size += end - std::max(held, req.offset());
    held = end;
    announce_change();
  }
  resp->set_next_offset(held);
  return Status::OK;
}

Status Coordinator::upload_profile(const v1::UploadProfileRequest& req) {
  if (req.profile_yaml().size() > rpc::kMaxProfileBytes)
    return bad("profile_yaml: at most " + std::to_string(rpc::kMaxProfileBytes) + " bytes, got " +
               std::to_string(req.profile_yaml().size()));
  // The caller first: a worker whose lease is gone (or who names a job of another worker)
  // gets no parse of up to 1 MiB of YAML.
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st;
    const Job* jp = uploading_job(req.name(), req.incarnation(), req.attempt().job_id(), &st);
    if (!jp) return st;
    if (req.attempt().attempt() != jp->rec.attempt || jp->rec.placement.empty() ||
        jp->rec.placement[0] != req.name())
      return {StatusCode::FAILED_PRECONDITION, "attempt " + std::to_string(req.attempt().attempt()) + " of job " +
                                                   jp->rec.id + " on " + req.name() +
                                                   " is not the current attempt's rank 0"};
  }
  // Parsed before it is kept: `zenflow advise JOB_ID` gets a profile it can read, and a
  // malformed one is the uploader's error (outside the lock: parsing is the slow part).
  try {
    (void)advisor::JobProfile::parse(req.profile_yaml(), "the profile of job " + req.attempt().job_id());
  } catch (const std::exception& e) {
    return bad(std::string("profile_yaml: ") + e.what());
  }
  std::lock_guard<std::mutex> lock(mu_);
  Status st;
  Job* jp = uploading_job(req.name(), req.incarnation(), req.attempt().job_id(), &st);
  if (!jp) return st;
  Job& j = *jp;
  // Rank 0 writes the profile, so it comes from the first gang member of the current (or,
  // once it ended, the last) attempt; an older attempt's never replaces a newer one's.
  if (req.attempt().attempt() != j.rec.attempt || j.rec.placement.empty() || j.rec.placement[0] != req.name())
    return {StatusCode::FAILED_PRECONDITION, "attempt " + std::to_string(req.attempt().attempt()) + " of job " +
                                                 j.rec.id + " on " + req.name() +
                                                 " is not the current attempt's rank 0"};
  StoreBatch batch;
  batch.profiles.push_back(ProfileRecord{j.rec.id, j.rec.attempt, req.profile_yaml(), now_ms()});
  try {
    timed_commit(batch);  // under store_mu_: the committer thread writes submits meanwhile
  } catch (const StoreError& e) {
    return {StatusCode::UNAVAILABLE, std::string("profile write failed: ") + e.what()};
  }
  log("job " + j.rec.id + ": profile of attempt " + std::to_string(j.rec.attempt) + " kept (" +
      std::to_string(req.profile_yaml().size()) + " bytes)");
  return Status::OK;
}

Status Coordinator::get_profile(const std::string& id, v1::JobProfile* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return {StatusCode::NOT_FOUND, "no job " + id};
  std::optional<ProfileRecord> p;
  try {
    std::lock_guard<std::mutex> store_lock(store_mu_);
    p = store_->load_profile(id);
  } catch (const StoreError& e) {
    return {StatusCode::UNAVAILABLE, std::string("profile read failed: ") + e.what()};
  }
  if (!p) {
    const Job& j = it->second;
    return {StatusCode::FAILED_PRECONDITION,
            "job " + id + " has no profile yet: " +
                (j.rec.attempt == 0 ? std::string("it has not started")
                 : terminal(j.rec.state)
                     ? "no attempt trained long enough to profile (" + j.rec.state + " at step " +
                           std::to_string(j.rec.step) + ")"
                     : "it is " + j.rec.state + " at step " + std::to_string(j.rec.step) +
                           "; rank 0 writes it when an attempt ends")};
  }
  out->set_job_id(p->job_id);
  out->set_attempt(p->attempt);
  out->set_profile_yaml(std::move(p->yaml));
  out->set_received_ms(p->received_ms);
  return Status::OK;
}

// --- transitions ---

void Coordinator::apply_attempt_report(Job& j, int member, const v1::AttemptReport& r, StoreBatch& batch) {
  Member& mem = j.members[static_cast<size_t>(member)];
  if (!r.exited()) {
    if (mem.started) return;
    mem.started = true;
    if (j.rec.state == kStarting &&
        std::all_of(j.members.begin(), j.members.end(), [](const Member& x) { return x.started; })) {
      j.rec.state = kRunning;
      append_coordinator_log(j, "attempt " + std::to_string(j.rec.attempt) + " running", batch);
      touch(j, batch);
    }
    return;
  }
  if (mem.exited) return;
  // The exit of rank 0's worker carries the attempt's last progress: taken first, so the job
  // ends with its final step and loss even if the report that sent them was lost.
  if (member == 0 && r.has_last_progress() && r.last_progress().attempt().job_id() == j.rec.id &&
      r.last_progress().attempt().attempt() == j.rec.attempt) {
    mem.started = true;
    (void)take_progress(j, r.last_progress(), batch);  // refused figures: logged, the exit still counts
  }
  mem.started = true;
  mem.exited = true;
  mem.exit_code = r.exit_code();
  mem.stopped_by_agent = r.stopped_by_agent();
  mem.message = reported_text(r.message());
  mem.lost_optimizer_node = reported_text(r.lost_optimizer_node());
  append_coordinator_log(j, "ranks on " + mem.worker + " " + exit_text(r.exit_code()) +
                                (mem.message.empty() ? "" : ": " + mem.message), batch);
  if (std::all_of(j.members.begin(), j.members.end(), [](const Member& x) { return x.exited; })) {
    end_attempt(j, batch);
    return;
  }
  if (r.exit_code() != 0 && j.rec.stop_reason.empty()) {
    // One member failed: the others cannot go on (their collectives would hang until
    // their timeout). Ask them to stop now.
    j.rec.stop_reason = "stopping: the ranks on " + mem.worker + " " + exit_text(r.exit_code());
    bump_workers_of(j);
  }
  touch(j, batch);
}

void Coordinator::end_attempt(Job& j, StoreBatch& batch) {
  // An optimizer node the ranks lost is declared LOST now, before the requeue, so that the
  // next pass places the job on a spare (its lease might not have run out yet). A node that
  // is in fact alive finds its incarnation fenced, drops its sessions and registers again.
  for (const Member& m : j.members) {
    if (m.lost_optimizer_node.empty()) continue;
    for (const std::string& node : j.rec.node_placement) {
      auto it = workers_.find(node);
      if (it == workers_.end() || it->second.rec.address != m.lost_optimizer_node || it->second.rec.state == "LOST")
        continue;
      lose_worker(it->second, "job " + j.rec.id + "'s ranks on " + m.worker + " lost it", /*silent=*/true, batch);
      append_coordinator_log(j, "optimizer node " + node + " (" + m.lost_optimizer_node + ") lost; the job moves to a spare",
                             batch);
    }
  }
  // A copy: release_attempt() below clears j.members.
  std::optional<Member> failed;
  for (const Member& m : j.members)
    if (m.exit_code != 0 && (!failed || (failed->stopped_by_agent && !m.stopped_by_agent))) failed = m;
  const int64_t now = now_ms();
  const std::string stop = j.rec.stop_reason;
  release_attempt(j);
  j.rec.stop_reason.clear();
  j.rec.exit_code =
      failed ? failed->exit_code : 0;  // (its last rate and stall share stay: the ended attempt's)
  j.eta_seconds = -1;
  schedule_dirty_ = true;
  if (j.rec.log_dropped_bytes > 0)
    append_coordinator_log(j, std::to_string(j.rec.log_dropped_bytes) + " bytes of the job's output dropped so far: its log reached its cap of " +
                                  std::to_string(options_.max_job_log_bytes) +
                                  " bytes (each worker keeps an attempt's whole output in its work dir)",
                           batch);
  if (!failed) {
    j.rec.state = kSucceeded;
    j.rec.step = j.rec.total_steps;
    j.rec.end_time_ms = now;
    j.rec.last_error.clear();
    append_coordinator_log(j, "job succeeded", batch);
  } else if (starts_with(stop, kStopCancel)) {
    j.rec.state = kCancelled;
    j.rec.end_time_ms = now;
    append_coordinator_log(j, "job cancelled", batch);
  } else if (starts_with(stop, kStopPreempt)) {
    j.rec.state = kPreempted;
    ++j.rec.preemptions;
    j.rec.last_error = stop;
    append_coordinator_log(j, stop + "; queued to resume from its checkpoint", batch);
  } else {
    const std::string what = "ranks on " + failed->worker + " " + exit_text(failed->exit_code) +
                             (failed->message.empty() ? "" : ": " + failed->message);
    // An attempt the agent stopped on its own (it is shutting down, or it fenced itself when
    // cut off) ended for the worker's reason, whatever its status: requeued.
    if (attempt::exit_fails_the_job(failed->exit_code) && !failed->stopped_by_agent) {
      // Bad input (2) or a training error (1: divergence…) would fail the same way again; so
      // would an attempt interrupted on its own. The worker's faults (74: its work dir, a
      // checkpoint lock still held) and lost leases or nodes are requeued below.
      j.rec.state = kFailed;
      j.rec.end_time_ms = now;
      j.rec.last_error = what;
      append_coordinator_log(j, "job failed: " + what, batch);
    } else {
      requeue_or_fail(j, what, batch);
      return;
    }
  }
  touch(j, batch);
}

void Coordinator::requeue_or_fail(Job& j, const std::string& reason, StoreBatch& batch) {
  release_attempt(j);
  j.rec.stop_reason.clear();
  j.rec.tokens_per_second = 0;  // the next attempt's, once it reports
  j.eta_seconds = -1;
  schedule_dirty_ = true;
  const int64_t max = j.rec.max_restarts;
  if (j.rec.restarts < max) {
    ++j.rec.restarts;
    j.rec.state = kQueued;
    j.rec.last_error = reason + "; requeued (restart " + std::to_string(j.rec.restarts) + " of " +
                       std::to_string(max) + ")";
    append_coordinator_log(j, j.rec.last_error, batch);
  } else {
    j.rec.state = kFailed;
    j.rec.end_time_ms = now_ms();
    j.rec.last_error = reason + "; restarts " + std::to_string(j.rec.restarts) + " of " + std::to_string(max) + " used";
    append_coordinator_log(j, "job failed: " + j.rec.last_error, batch);
  }
  touch(j, batch);
}

void Coordinator::lose_worker(Worker& w, const std::string& why, bool silent, StoreBatch& batch) {
  w.rec.state = "LOST";
  int64_t last_heartbeat = 0;
  {
    std::lock_guard<std::mutex> lease_lock(w.lease->mu);
    w.lease->lost = true;
    ++w.lease->assignment_revision;
    last_heartbeat = w.lease->last_heartbeat_ms;
  }
  // A silent worker's agent may be alive and cut off, its ranks training on: they stop by
  // its self-fence, counted from the last heartbeat it sent (which we received later), plus
  // a margin for the processes to die and for the two clocks' rates. No attempt of its jobs
  // starts before.
  const int64_t fence_ms = w.rec.fence_ms > 0 ? w.rec.fence_ms : options_.default_worker_fence.count();
  const int64_t fence_until = silent ? last_heartbeat + fence_ms + fence_margin_ms() : 0;
  ++workers_lost_;
  ++generation_;
  batch.workers.push_back(w.rec);
  log("worker " + w.rec.name + " LOST: " + why);
  std::vector<Job*> on_worker;  // requeueing changes live_: collect first
  for (const auto& [id, j] : live_)
    if (active(j->rec.state)) on_worker.push_back(j);
  for (Job* jp : on_worker) {
    Job& j = *jp;
    bool on_it = false;
    for (const Member& m : j.members) on_it |= m.worker == w.rec.name && !m.exited;
    if (!on_it) continue;
    const std::string reason = "worker " + w.rec.name + " lost (" + why + ")";
    if (fence_until > j.rec.fence_until_ms) {
      j.rec.fence_until_ms = fence_until;
      j.fence_worker = w.rec.name;
    }
    if (starts_with(j.rec.stop_reason, kStopCancel)) {
      release_attempt(j);
      j.rec.stop_reason.clear();
      j.rec.state = kCancelled;
      j.rec.end_time_ms = now_ms();
      append_coordinator_log(j, reason + " while cancelling; job cancelled", batch);
      touch(j, batch);
    } else if (starts_with(j.rec.stop_reason, kStopPreempt)) {
      release_attempt(j);
      j.rec.state = kPreempted;
      ++j.rec.preemptions;
      j.rec.stop_reason.clear();
      append_coordinator_log(j, reason + " while preempting; queued to resume from its last checkpoint", batch);
      touch(j, batch);
      schedule_dirty_ = true;
    } else {
      requeue_or_fail(j, reason, batch);
    }
  }
  schedule_dirty_ = true;
  announce_change();
}

void Coordinator::check_leases(StoreBatch& batch) {
  const int64_t now = now_ms();
  if (now < next_lease_expiry_ms_) return;  // leases only get longer meanwhile
  int64_t next = INT64_MAX;
  for (auto& [name, w] : workers_) {
    if (w.rec.state == "LOST") continue;
    int64_t last_heartbeat = 0, stream_broken = 0;
    {
      // Decided under the lease's lock: a heartbeat renews it before, or is refused after.
      std::lock_guard<std::mutex> lease_lock(w.lease->mu);
      if (w.lease->deadline_ms > now) {
        next = std::min(next, w.lease->deadline_ms);
        continue;
      }
      w.lease->lost = true;
      last_heartbeat = w.lease->last_heartbeat_ms;
      stream_broken = w.lease->stream_broken_ms;
    }
    lose_worker(w,
                stream_broken > 0
                    ? "its heartbeat stream broke " + std::to_string(now - stream_broken) +
                          " ms ago (connection closed) and no heartbeat followed within the interval (" +
                          std::to_string(options_.heartbeat_interval.count()) + " ms)"
                    : "no heartbeat for " + std::to_string(now - last_heartbeat) + " ms (lease " +
                          std::to_string(options_.lease.count()) + " ms)",
                /*silent=*/true, batch);
  }
  next_lease_expiry_ms_ = next;
}

void Coordinator::run_schedule(StoreBatch& batch) {
  std::vector<scheduler::WorkerView> views;
  views.reserve(trainers_.size());
  for (const auto& [name, trainer] : trainers_) {
    const Worker& w = *trainer;
    scheduler::WorkerView v;
    v.id = name;
    v.schedulable = w.rec.state == "READY";
    v.gpus = w.resources.gpus_size();
    if (v.gpus > 0) {
      v.gpu_model = w.resources.gpus(0).model();
      v.gpu_memory_bytes = w.resources.gpus(0).memory_bytes();
      for (const v1::GpuInfo& g : w.resources.gpus())
        v.gpu_memory_bytes = std::min<int64_t>(v.gpu_memory_bytes, g.memory_bytes());
    }
    v.cpu_slots = w.resources.cpu_slots();
    v.host_memory_bytes = w.resources.host_memory_bytes();
    v.physical_cores = w.resources.physical_cores();
    v.labels.insert(w.resources.labels().begin(), w.resources.labels().end());
    v.allowed_roots = w.rec.allowed_roots;
    views.push_back(std::move(v));
  }
  if (generation_ != stable_generation_ && !stable_.empty()) {  // something changed: all of them again
    candidates_.insert(stable_.begin(), stable_.end());
    stable_.clear();
  }
  std::vector<scheduler::JobView> jobs;
  jobs.reserve(candidates_.size());
  const int64_t now = now_ms();
  next_fence_ms_ = 0;
  for (Job* live : candidates_) {
    Job& j = *live;
    if (!queued(j.rec.state) && !active(j.rec.state)) continue;
    if (queued(j.rec.state) && j.rec.fence_until_ms > now) {
      // Not a candidate until then: the tick that passes the fence makes the next pass.
      next_fence_ms_ = next_fence_ms_ == 0 ? j.rec.fence_until_ms : std::min(next_fence_ms_, j.rec.fence_until_ms);
      j.waiting_reason = "waiting until " + utc_time(j.rec.fence_until_ms) + " (" +
                         std::to_string((j.rec.fence_until_ms - now + 999) / 1000) +
                         " s) for the ranks of its last attempt to stop: " +
                         (j.fence_worker.empty() ? std::string("where they ran is not known")
                                                 : "worker " + j.fence_worker + " went silent") +
                         ", and a worker cut off from the coordinator stops its ranks only at its self-fence";
      continue;
    }
    // A queued job the pass would skip (rule 8: stable since this generation, holding no
    // reservation) is left out here already: the views of thousands of waiting jobs cost
    // more than the decision, under the lock the heartbeats' thread also takes.
    if (queued(j.rec.state) && j.unplaceable_generation == generation_ && j.reserved_workers.empty()) continue;
    scheduler::JobView v;
    v.id = j.rec.id;
    v.priority = j.rec.priority;
    v.submit_seq = j.rec.submit_seq;
    v.workers = j.rec.workers;
    v.per_worker = j.demand;
    v.slot_kind = j.slot_kind;
    v.optimizer_nodes = j.rec.optimizer_nodes;
    v.node_memory_bytes = j.rec.node_memory_bytes;
    if (queued(j.rec.state)) {
      v.state = scheduler::JobState::kQueued;
      v.confined_paths = confined_paths_of(j);
      v.reserved_workers = j.reserved_workers;
      v.unplaceable_generation = j.unplaceable_generation;
    } else {
      v.state = j.rec.stop_reason.empty() ? scheduler::JobState::kRunning : scheduler::JobState::kPreempting;
      for (const Member& m : j.members) v.placement.push_back(m.worker);
      v.node_placement = j.rec.node_placement;
      v.start_time_ms = j.rec.start_time_ms;
    }
    jobs.push_back(std::move(v));
  }
  // The optimizer nodes, only when some job asks for them or holds some (rule 9): most
  // passes then do not index every node.
  std::vector<scheduler::NodeView> nodes;
  if (std::any_of(jobs.begin(), jobs.end(), [](const scheduler::JobView& v) { return v.optimizer_nodes > 0; })) {
    nodes.reserve(optimizers_.size());
    for (const auto& [name, node] : optimizers_) {
      const Worker& w = *node;
      scheduler::NodeView n;
      n.id = name;
      n.schedulable = w.rec.state == "READY" && !w.rec.address.empty();
      n.host_memory_bytes = w.resources.host_memory_bytes();
      n.cores = w.resources.physical_cores();
      nodes.push_back(std::move(n));
    }
  }
  scheduler::ScheduleOptions so;
  so.now_ms = now_ms();
  so.preemption_min_runtime_ms = options_.preemption_min_runtime.count();
  so.backfill = options_.backfill;
  so.preemption = options_.preemption;
  so.generation = generation_;  // applying the decision below changes it (touch())
  // In id order, as a walk of live_ gave them: the decision does not depend on the order
  // of its input (scheduler.h), and the same input gives the same decision regardless.
  std::sort(jobs.begin(), jobs.end(),
            [](const scheduler::JobView& a, const scheduler::JobView& b) { return a.id < b.id; });
  const scheduler::ScheduleDecision d = scheduler::schedule(views, jobs, so, nodes);
  next_preemptable_ms_ = d.next_preemptable_ms;
  if (!d.assignments.empty() && options_.preemption) {  // the jobs placed below are victims from then
    const int64_t at = so.now_ms + options_.preemption_min_runtime.count();
    if (next_preemptable_ms_ < 0 || at < next_preemptable_ms_) next_preemptable_ms_ = at;
  }
  for (Job* j : reserved_jobs_) j->reserved_workers.clear();
  reserved_jobs_.clear();
  for (const scheduler::Reservation& r : d.reservations) {
    Job& j = jobs_.at(r.job_id);
    j.reserved_workers = r.worker_ids;
    reserved_jobs_.push_back(&j);
  }
  for (const scheduler::WaitingJob& w : d.waiting) {
    Job& j = jobs_.at(w.job_id);
    j.waiting_reason = w.reason;
    j.unplaceable_generation = w.stable ? so.generation : -1;
    if (w.stable && j.reserved_workers.empty()) {
      candidates_.erase(&j);
      stable_.insert(&j);
    }
  }
  stable_generation_ = so.generation;
  for (const scheduler::Preemption& p : d.preemptions) {
    Job& victim = jobs_.at(p.victim_job_id);
    victim.rec.stop_reason = std::string(kStopPreempt) + " for job " + p.preemptor_job_id + " (priority " +
                             std::to_string(jobs_.at(p.preemptor_job_id).rec.priority) + ")";
    append_coordinator_log(victim, victim.rec.stop_reason + ": asking the ranks to checkpoint and stop", batch);
    touch(victim, batch);
    bump_workers_of(victim);
  }
  for (const scheduler::Assignment& a : d.assignments) {
    Job& j = jobs_.at(a.job_id);
    // Rank 0's worker holds one rendezvous port per slot; take one no other live job uses.
    // (live_, not jobs_: a placement must not walk every job that ever ended.)
    const Worker& host = workers_.at(a.worker_ids[0]);
    std::set<int64_t> used;
    for (const auto& [id, other] : live_)
      if (active(other->rec.state) && !other->members.empty() && other->members[0].worker == host.rec.name)
        used.insert(other->rec.master_port);
    int64_t port = 0;
    for (int64_t p : host.rec.rendezvous_ports)
      if (!used.count(p)) {
        port = p;
        break;
      }
    if (port == 0) {
      j.waiting_reason = "waiting: worker " + host.rec.name + " has no free rendezvous port";
      j.unplaceable_generation = -1;
      continue;
    }
    j.rec.master_port = port;
    j.rec.fence_until_ms = 0;  // passed (a fenced job is no candidate before)
    j.fence_worker.clear();
    ++j.rec.attempt;
    j.rec.state = kStarting;
    j.rec.placement = a.worker_ids;
    j.rec.node_placement = a.node_ids;
    // A secret of the attempt's own for its nodes: the ranks prove it, the nodes hold it
    // while the attempt is placed (refresh_grants, from bump_workers_of below).
    j.rec.node_secret = a.node_ids.empty() ? "" : rpc::random_token();
    j.rec.start_time_ms = now_ms();
    if (options_.on_placed && j.queued_since_ms > 0)
      options_.on_placed(static_cast<double>(j.rec.start_time_ms - j.queued_since_ms) / 1000.0);
    j.progressed = false;
    j.rec.stop_reason.clear();
    j.members.clear();
    for (const std::string& w : a.worker_ids) {
      Member m;
      m.worker = w;
      j.members.push_back(std::move(m));
    }
    j.waiting_reason.clear();
    j.reserved_workers.clear();
    append_coordinator_log(j, "attempt " + std::to_string(j.rec.attempt) + " on " + join(a.worker_ids) +
                                  (a.node_ids.empty() ? "" : " with optimizer nodes " + join(a.node_ids)) +
                                  (j.rec.attempt > 1 ? " (resumes from the newest checkpoint)" : ""),
                           batch);
    touch(j, batch);
    bump_workers_of(j);
    log("job " + j.rec.id + " attempt " + std::to_string(j.rec.attempt) + " placed on " + join(a.worker_ids));
  }
}

void Coordinator::persist_progress(StoreBatch& batch) {
  const int64_t now = now_ms();
  std::vector<Job*> due;  // persist() changes progress_dirty_jobs_
  for (Job* j : progress_dirty_jobs_)
    if (now - j->last_persist_ms >= kProgressPersistMs) due.push_back(j);
  for (Job* j : due) persist(*j, batch);
}

void Coordinator::tick_locked() {
  StoreBatch batch;
  check_leases(batch);
  if (next_fence_ms_ > 0 && now_ms() >= next_fence_ms_) {
    // A queued job's fence passed: it is a candidate again.
    next_fence_ms_ = 0;
    ++generation_;
    schedule_dirty_ = true;
  }
  if (next_preemptable_ms_ >= 0 && now_ms() >= next_preemptable_ms_) {
    // A running job has become a preemption victim: jobs waiting for one may now preempt.
    next_preemptable_ms_ = -1;
    ++generation_;
    schedule_dirty_ = true;
  }
  if (schedule_dirty_) {
    schedule_dirty_ = false;
    run_schedule(batch);
  }
  persist_progress(batch);
  prune_lost_workers(batch);
  commit(batch);
}

void Coordinator::prune_lost_workers(StoreBatch& batch) {
  const int64_t now = now_ms();
  if (now < next_prune_ms_) return;
  next_prune_ms_ = now + 60'000;  // a walk of the workers a minute is plenty
  std::set<std::string> busy;  // a member of an attempt that has not ended keeps its worker
  for (const auto& [id, j] : live_)
    for (const Member& m : j->members) busy.insert(m.worker);
  std::vector<std::string> gone;
  for (const auto& [name, w] : workers_) {
    if (w.rec.state != "LOST" || busy.count(name) || registering_.count(name)) continue;
    int64_t last = 0;
    {
      std::lock_guard<std::mutex> lease_lock(w.lease->mu);
      last = w.lease->last_heartbeat_ms;
    }
    if (now - last > options_.lost_worker_retention.count()) gone.push_back(name);
  }
  if (gone.empty()) return;
  {
    std::unique_lock<std::shared_mutex> table_lock(leases_mu_);
    for (const std::string& name : gone) leases_.erase(name);
  }
  for (const std::string& name : gone) {
    trainers_.erase(name);
    optimizers_.erase(name);
    workers_.erase(name);
    batch.removed_workers.push_back(name);
  }
  ++generation_;
  log("forgot " + std::to_string(gone.size()) + " workers LOST for over " +
      std::to_string(options_.lost_worker_retention.count() / 1000) + " s: " + join(gone));
}

void Coordinator::tick_now() {
  std::lock_guard<std::mutex> lock(mu_);
  schedule_dirty_ = true;
  tick_locked();
}

void Coordinator::ticker() {
  // Passes are coalesced: a burst of submits (or exits) makes one pass per interval, not
  // one each, since a pass holds the lock for its duration. The interval is at least
  // kMinPassInterval and at least kPassCostFactor times the last tick's duration, so that
  // passes over a long queue (thousands of jobs that cannot be placed) take at most about
  // a tenth of a core, and heartbeats and submits keep the rest.
  constexpr auto kMinPassInterval = std::chrono::milliseconds(25);
  constexpr int kPassCostFactor = 9;
  std::unique_lock<std::mutex> lock(mu_);
  auto last_pass = std::chrono::steady_clock::now() - kMinPassInterval;
  std::chrono::steady_clock::duration interval = kMinPassInterval;
  auto last_wake = std::chrono::steady_clock::now();
  while (!stopping_) {
    changed_.wait_for(lock, options_.tick, [&] { return stopping_ || schedule_dirty_; });
    if (stopping_) break;
    // The ticker wakes at least every options_.tick; a gap of half a lease means the whole
    // process was stopped (its heartbeat threads too), not the workers.
    const auto woke = std::chrono::steady_clock::now();
    if (woke - last_wake > options_.lease / 2)
      renew_all_leases("the coordinator did not run for " +
                       std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(woke - last_wake).count()) +
                       " ms (paused?)");
    last_wake = woke;
    const auto next = last_pass + interval;
    if (schedule_dirty_ && std::chrono::steady_clock::now() < next) {
      changed_.wait_until(lock, next, [&] { return stopping_; });
      if (stopping_) break;
    }
    last_pass = std::chrono::steady_clock::now();
    tick_locked();
    const auto took = std::chrono::steady_clock::now() - last_pass;
    interval = std::max<std::chrono::steady_clock::duration>(kMinPassInterval, took * kPassCostFactor);
  }
}

}  // namespace zenflow::server
