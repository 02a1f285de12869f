// The coordinator's durable state: jobs, workers, job logs and job profiles.
//
// Only what must survive a coordinator crash is written: a job's record on every state
// transition (and its progress now and then), a worker's registration, and log bytes.
// Leases and heartbeats never touch the store (they live in the coordinator's memory).
// Every change of one transition is one StoreBatch, committed in one transaction: a job
// is never half-written, and a batch either happens completely or not at all.
//
// Store is an interface so that another database can be added later; SqliteStore is the
// one there is. Thread safety: a Store is used by one thread at a time (the coordinator
// serializes calls); implementations need not lock.
// Errors: StoreError (a std::runtime_error) for I/O failures, a corrupt or newer-schema
// database, or a violated constraint (e.g. a second job with the same request_id).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zenflow::server {

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A job as `zenflow status` shows it after a restart. States are the proto enum names
// (QUEUED, STARTING, RUNNING, PREEMPTED, SUCCEEDED, FAILED, CANCELLED).
struct JobRecord {
  std::string id;          // unique, e.g. "j-000042"
  std::string request_id;  // the client's idempotency key; "" = none (unique when set)
  std::string name;
  std::string spec_yaml;   // the validated, resolved spec (to_yaml)
  std::string state = "QUEUED";
  int64_t priority = 0;
  int64_t submit_seq = 0;  // increasing at submit; FIFO within a priority
  int64_t submit_time_ms = 0;
  int64_t start_time_ms = 0;  // current or last attempt
  int64_t end_time_ms = 0;
  int64_t attempt = 0;        // attempts started (the current one's number)
  int64_t restarts = 0;
  int64_t preemptions = 0;
  std::vector<std::string> placement;  // worker names of the current or last attempt
  int64_t master_port = 0;             // rendezvous port of the current attempt
  int64_t host_memory_bytes_per_worker = 0;  // the placement demand computed at submit
  int64_t step = 0;
  int64_t total_steps = 0;
  int64_t resumed_from_step = 0;
  double last_loss = 0;
  double cost_usd = 0;
  std::string last_error;
  std::string stop_reason;  // non-empty while a cancel or preemption is asked of the attempt
  int64_t exit_code = -1;   // of the last ended attempt
  int64_t revision = 0;     // increases with every change
  // What the coordinator needs of the spec to schedule and show the job, so that a restart
  // parses no YAML (10,000 specs took 4 s). workers < 0: not recorded (a schema-1 row); the
  // coordinator derives them from spec_yaml once.
  std::string checkpoint_dir;
  std::string device;  // train.device: cuda, cpu or auto
  int64_t workers = -1;
  int64_t gpus_per_worker = -1;
  int64_t max_restarts = -1;
  // Cost (common/pricing.h): the job's rate while it holds workers (0: not priced), where
  // it comes from, and what restarts and preemptions cost (the repeated steps since the
  // last checkpoint, and the restarted attempt's start-up). cost_usd is the ended
  // attempts' sum; the running attempt adds (now - start_time_ms) at the rate.
  double usd_per_hour = 0;
  std::string price_source;
  double usd_lost_to_restarts = 0;
  // Optimizer nodes (optimizer.host.nodes, when the spec names no addresses): how many, the
  // host RAM each must offer (its share of the job's host state), and the ones the current
  // or last attempt holds (worker names of role OPTIMIZER).
  int64_t optimizer_nodes = 0;
  int64_t node_memory_bytes = 0;
  std::vector<std::string> node_placement;
  // The trainer's figures as last reported (ReportProgress), kept past the attempt and a
  // coordinator restart: a finished job still shows them, and the stall share and tokens per
  // step price its usd_lost_to_stalls and tokens.
  double stall_share = 0;
  double tokens_per_second = 0;
  double tokens_per_step = 0;  // the global batch's tokens (0: unknown)
  // No new attempt starts before this wall-clock time: the last attempt ran on a worker that
  // went silent, whose ranks may run until its self-fence (common/attempt_contract.h) has
  // passed. 0: none.
  int64_t fence_until_ms = 0;
  int64_t hang_timeout = 0;        // resources.hang_timeout in seconds (0: auto)
  int64_t log_dropped_bytes = 0;   // output not kept once the job's log reached its cap
  // The current attempt's secret for its optimizer nodes (Assignment.node_secret); "" when
  // it has none. Kept in clear: the coordinator hands it out again after a restart.
  std::string node_secret;
  bool operator==(const JobRecord& o) const;
};

struct WorkerRecord {
  std::string name;  // unique
  std::string role = "TRAINER";
  std::string resources;  // serialized zenflow.v1.WorkerResources
  std::string address;
  std::vector<int64_t> rendezvous_ports;
  int64_t incarnation = 0;  // increases with every registration (unique across workers)
  int64_t registered_ms = 0;
  std::string state = "READY";  // READY | LOST | DRAINING
  // The agent's self-fence (RegisterWorkerRequest.fence_ms): its ranks have stopped this
  // long after its last accepted heartbeat was sent. 0: not reported (an older agent).
  int64_t fence_ms = 0;
  // SHA-256 of the session handed out with this incarnation (RegisterWorkerResponse.session;
  // the session itself is never stored). Empty: registered before sessions existed.
  std::string session_digest;
  // The directories the agent lets job specs read or write (RegisterWorkerRequest.
  // allowed_roots). Empty: it advertised none (an older agent), taken as unconfined.
  std::vector<std::string> allowed_roots;
  bool operator==(const WorkerRecord& o) const;
};

// Bytes of one attempt's output, appended to the job's log. attempt_offset is the byte
// offset of data within that attempt's output (uploads resume from it after a restart).
struct LogAppend {
  std::string job_id;
  int64_t attempt = 0;
  int64_t attempt_offset = 0;
  std::string data;
};

// A job's profile for `zenflow advise JOB_ID` (common/advisor/job_profile.h): the YAML its
// rank 0 wrote after an attempt that trained long enough, as uploaded by the agent. One per
// job: a later attempt's replaces an earlier one's.
struct ProfileRecord {
  std::string job_id;
  int64_t attempt = 0;
  std::string yaml;
  int64_t received_ms = 0;
  bool operator==(const ProfileRecord& o) const;
};

struct StoreBatch {
  std::vector<JobRecord> jobs;          // inserted or replaced by id
  std::vector<WorkerRecord> workers;    // inserted or replaced by name
  std::vector<LogAppend> logs;          // appended in order
  std::vector<ProfileRecord> profiles;  // inserted or replaced by job id (the job must exist)
  std::vector<std::string> removed_workers;  // deleted by name (after `workers`)
  bool empty() const {
    return jobs.empty() && workers.empty() && logs.empty() && profiles.empty() && removed_workers.empty();
  }
};

class Store {
 public:
  virtual ~Store() = default;
  // One transaction; durable when it returns (see SqliteStore for what that means).
  virtual void commit(const StoreBatch& batch) = 0;
  virtual std::vector<JobRecord> load_jobs() = 0;        // by submit_seq
  virtual std::vector<WorkerRecord> load_workers() = 0;  // by name
  // The job's log from byte `offset`, at most max_bytes ("" past the end).
  virtual std::string read_log(const std::string& job_id, int64_t offset, int64_t max_bytes) = 0;
  virtual int64_t log_size(const std::string& job_id) = 0;
  // Bytes held per (job id, attempt): where each attempt's upload resumes.
  virtual std::map<std::pair<std::string, int64_t>, int64_t> attempt_log_sizes() = 0;
  // The job's profile; nullopt when none was uploaded.
  virtual std::optional<ProfileRecord> load_profile(const std::string& job_id) = 0;
  virtual int schema_version() = 0;
};

struct SqliteOptions {
  // FULL: the WAL is synced at every commit, so a commit that returned survives power loss
  // and an OS crash. NORMAL (false) survives only a process crash (SQLite's own words: it
  // "does lose durability"). A kill -9 test cannot tell the two apart; FULL is the default
  // and what the coordinator promises.
  bool synchronous_full = true;
};

// Opens (creating when absent) a SQLite database in WAL mode and migrates it to the
// current schema (versioned migrations, each in its own transaction, recorded in
// PRAGMA user_version). A database written by a newer zenflow (higher version) is refused
// with StoreError naming both versions. The file is locked against a second coordinator
// (StoreError "database ... is in use by another coordinator").
std::unique_ptr<Store> open_sqlite_store(const std::string& path, const SqliteOptions& options = {});

// The schema version this build writes.
int sqlite_schema_version();

}  // namespace zenflow::server
