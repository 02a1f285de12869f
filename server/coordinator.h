// zenflow-coordinator's state machine: jobs, workers, leases, attempts, scheduling.
//
// The gRPC service classes (service.h) are thin: they authenticate, rate-limit and call
// one method here. Everything a transition changes is committed to the Store in one
// StoreBatch before the caller is answered, so an acknowledged submit, a recorded exit or
// a requeue survives a coordinator SIGKILL. Leases and heartbeats live in memory only.
//
// Submits are group-committed: a committer thread writes every submit that arrived while
// the previous transaction was being synced in one transaction (one fsync), without the
// coordinator's lock, and answers them. A submit is answered only once its transaction is
// durable, and its job is visible (get, list, scheduling) only from then on. request_id
// stays exactly-once while a submit is in flight: a second submit with the same request_id
// is answered after the first, with its job (or, if the first failed, tries anew).
// Registrations of new (or LOST) workers go through the same committer: a worker is
// placed on only once its record is durable, and a registration storm (thousands of
// agents starting, or coming back after a partition) holds the lock for no fsync.
//
// Jobs: QUEUED → STARTING → RUNNING → SUCCEEDED | FAILED | CANCELLED; RUNNING → (asked to
// checkpoint) → PREEMPTED, which queues like QUEUED and resumes from the checkpoint; a lost
// worker or a crashed rank sends the job back to QUEUED (attempt + 1) while
// resources.max_restarts allows, else FAILED. An attempt is (job id, attempt number): a
// report from any other attempt is refused (FAILED_PRECONDITION), so a stale worker back
// from a pause can never move a job.
//
// Workers are named; each registration gets a new incarnation. A worker whose lease runs
// out is LOST: its attempts are over (the agent's training processes fence themselves, see
// worker/agent), and calls from that incarnation are refused until it registers again.
// After a restart every known worker gets a fresh lease of `restart_grace`, and running
// jobs keep running: the agents re-attach with the same incarnation.
//
// Thread safety: every public method may be called from any thread. One mutex guards the
// state; a heartbeat without attempt reports touches only its worker's lease (own mutex),
// and the store has its own mutex, taken after the state's when both are held.
#pragma once

#include <grpcpp/support/status.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/job_spec.h"
#include "common/pricing.h"
#include "server/issued_ids.h"
#include "server/scheduler.h"
#include "server/store.h"
#include "zenflow/v1/jobs.pb.h"
#include "zenflow/v1/workers.pb.h"

namespace zenflow::server {

struct CoordinatorOptions {
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds lease{4000};
  std::chrono::milliseconds restart_grace{8000};  // fresh lease for known workers after a restart
  std::chrono::milliseconds preemption_min_runtime{60'000};
  // The self-fence assumed for a worker that reports none (an older agent, which kept its
  // ranks for --disconnected-grace 120 s and then up to --stop-grace 60 s more).
  std::chrono::milliseconds default_worker_fence{185'000};
  // A worker LOST (and silent) this long is forgotten: its row, its lease, its line in
  // ListWorkers. It registers again as a new worker if it comes back.
  std::chrono::milliseconds lost_worker_retention{24 * 3600 * 1000};
  // A job's log (its ranks' output and the coordinator's lines) is kept up to this many
  // bytes; later output is dropped and counted (JobRecord::log_dropped_bytes).
  int64_t max_job_log_bytes = int64_t{64} << 20;
  // DB.ids (issued_ids.h): the job numbers and incarnations issued, out of the WAL's reach.
  // "": none kept (a coordinator that never restarts on its database, e.g. a test's).
  std::string issued_ids_path;
  // The wall clock, in ms since the epoch, that leases, fences and costs are measured on;
  // null: the system clock. Tests pass their own to move time without sleeping.
  std::function<int64_t()> clock;
  std::chrono::milliseconds tick{100};  // lease checks and scheduling passes
  // How long the thread that submits a lone job may wait for its commit (step_aside()):
  // 0 never waits. The default is a few ordinary commits; a slower one goes on without it.
  std::chrono::microseconds submit_step_aside{2000};
  // Those waits take at most Coordinator::kStepAsideShare of the thread's time, with up to
  // this much saved up: a run of slow commits spends it, and then submits go on at once.
  std::chrono::milliseconds submit_step_aside_saved{20};
  bool backfill = true;
  bool preemption = true;
  std::function<void(const std::string&)> log;  // one line each; default: stderr
  // Prices for cost.instance_type (common/pricing.h); null: only cost.usd_per_hour prices.
  std::shared_ptr<const PricingCatalog> catalog;
  // Where the checkpoints of jobs whose spec names no checkpoint.dir go: ROOT/<job name>
  // (s3://BUCKET/PREFIX, or an absolute path on a volume every worker mounts). "": where the
  // submitting client put them (runs/<name> under its directory).
  std::string checkpoint_root;
  // Called (under the coordinator's lock, so it must be quick) with a job's wait in the
  // queue each time an attempt is placed: the queue-wait histogram (coordinator_metrics.h).
  std::function<void(double seconds)> on_placed;
};

// Log streams of an attempt: the coordinator's own lines are stream 0 of the attempt, the
// output of gang member m (0-based) is stream m + 1 (LogAppend::attempt holds
// attempt * kStreamsPerAttempt + stream).
inline constexpr int64_t kStreamsPerAttempt = 1024;

// What the coordinator's /metrics shows (coordinator_metrics.h), read in one pass under
// its lock.
struct ClusterSnapshot {
  std::map<std::string, int64_t> jobs_by_state;  // every state, zeros included
  std::map<std::pair<std::string, std::string>, int64_t> workers;  // (role, state) -> count
  // Slots of TRAINER workers that are not LOST, by kind ("gpu", "cpu"): all of them, those
  // held by a STARTING or RUNNING attempt, and those of RUNNING attempts (busy).
  std::map<std::string, int64_t> slots_total, slots_allocated, slots_busy;
  struct JobFigures {
    std::string id;
    std::string state;
    int64_t restarts = 0;
    int64_t preemptions = 0;
    double cost_usd = 0;
    double usd_lost_to_stalls = 0;
    double usd_lost_to_restarts = 0;
    double usd_per_hour = 0;
  };
  std::vector<JobFigures> jobs;  // live jobs, and jobs that ended in the last hour
  int64_t workers_lost = 0;      // workers declared LOST since this coordinator started
};

class Coordinator {
 public:
  // Loads every job and worker from `store` (which it owns) and starts the ticker.
  Coordinator(std::unique_ptr<Store> store, CoordinatorOptions options);
  ~Coordinator();  // stops the ticker; wakes every waiting stream
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // --- JobService ---
  // The answer to a submit: called exactly once, without the coordinator's lock, from the
  // submitting thread (a refusal, a known request_id), the intake thread (the same, for a
  // spec over kInlineSpecBytes) or the committer's (once the job is durable, or its commit
  // failed).
  using SubmitAnswer = std::function<void(const grpc::Status&, const v1::SubmitJobResponse&)>;
  // Checks and queues the submit for the committer, and returns: it never waits for a
  // commit longer than options.submit_step_aside (the gRPC hot path serves SubmitJob
  // without a thread per call), and only for a lone submit (step_aside()). A spec longer
  // than kInlineSpecBytes is copied and parsed on the intake thread instead: parsing 1 MiB
  // takes 4-25 ms (comments to a long list), which on the hot path would hold up every
  // heartbeat behind it.
  void submit_async(const v1::SubmitJobRequest& req, SubmitAnswer answer);
  static constexpr size_t kInlineSpecBytes = 16 << 10;  // 0.1-0.6 ms of parsing
  // The submitting thread steps aside for lone submits' commits (step_aside()) for at most
  // this share of its time, with up to options.submit_step_aside_saved of it saved up.
  static constexpr double kStepAsideShare = 0.1;
  static constexpr size_t kMaxIntakeQueue = 64;         // large specs waiting: 64 MiB at most
  // submit_async, blocking until answered.
  grpc::Status submit(const v1::SubmitJobRequest& req, v1::SubmitJobResponse* resp);
  grpc::Status get(const std::string& id, v1::JobStatus* out);
  grpc::Status list(const v1::ListJobsRequest& req, v1::ListJobsResponse* resp);
  grpc::Status cancel(const std::string& id, v1::JobStatus* out);
  // Blocks up to `wait` for the job's revision to pass after_revision; *out is its status
  // then (also when it timed out). NOT_FOUND for an unknown id.
  grpc::Status wait_job(const std::string& id, int64_t after_revision, std::chrono::milliseconds wait,
                        v1::JobStatus* out);
  // Log bytes from offset (at most max); *finished: the job is terminal and every stream
  // has ended, so no byte will follow. Blocks up to `wait` when there is nothing yet.
  grpc::Status read_log(const std::string& id, int64_t offset, int64_t max, std::chrono::milliseconds wait,
                        std::string* data, bool* finished);
  // What a WatchJob or StreamLogs stream needs to know whether it has something to send,
  // under one lock and without building a JobStatus or reading the store.
  struct StreamProbe {
    int64_t revision = 0;
    bool terminal = false;
    int64_t log_bytes = 0;  // the job's log size
    bool log_done = false;  // terminal and every stream ended: no log byte will follow
  };
  grpc::Status probe_stream(const std::string& id, StreamProbe* out) const;
  // `listener` runs after every change a wait_job or read_log waiter would wake for (a job's
  // revision, its log, shutdown), on the changing thread, possibly under the coordinator's
  // lock: it must only note the change (it may not call the coordinator). Null: none.
  void set_change_listener(std::function<void()> listener);
  // + 1 on every such change.
  int64_t change_seq() const { return change_seq_.load(std::memory_order_relaxed); }
  void list_workers(v1::ListWorkersResponse* resp);
  // The job's profile (the newest one kept); NOT_FOUND for an unknown job,
  // FAILED_PRECONDITION (saying why) when it has none.
  grpc::Status get_profile(const std::string& id, v1::JobProfile* out);
  ClusterSnapshot snapshot() const;

  // --- WorkerService ---
  // A new incarnation, with its session (resp->session) when the registration is accepted.
  grpc::Status register_worker(const v1::RegisterWorkerRequest& req, v1::RegisterWorkerResponse* resp);
  // Whether `session` is the one handed to incarnation `incarnation` of worker `name`: OK;
  // UNAUTHENTICATED when it is not (a call with another worker's session, or none);
  // FAILED_PRECONDITION when that incarnation is no longer leased (or was registered before
  // sessions existed): the agent registers again. Every WorkerService call but
  // RegisterWorker is checked with it before its handler runs (server/service.cpp).
  grpc::Status check_session(const std::string& name, int64_t incarnation, std::string_view session);
  // `stream`: the HeartbeatStream the beat came on (an id the service gives each stream,
  // > 0), or 0 for a unary Heartbeat. A streamed beat must carry no attempts.
  grpc::Status heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp, int64_t stream = 0);
  // Random, new at every start (HeartbeatResponse.coordinator_boot).
  uint64_t boot() const { return boot_; }
  // Heartbeat stream `stream` of (name, incarnation) broke without the worker closing it:
  // when it carried the worker's latest streamed beat, the lease is cut to one heartbeat
  // interval from now (a live worker opens a new stream and beats at once).
  void heartbeat_stream_broken(const std::string& name, int64_t incarnation, int64_t stream);
  grpc::Status fetch_assignments(const v1::FetchAssignmentsRequest& req, v1::FetchAssignmentsResponse* resp);
  grpc::Status report_progress(const v1::ReportProgressRequest& req);
  grpc::Status report_event(const v1::ReportEventRequest& req);
  grpc::Status upload_logs(const v1::UploadLogsRequest& req, v1::UploadLogsResponse* resp);
  grpc::Status upload_profile(const v1::UploadProfileRequest& req);

  // Wakes every blocked wait (shutdown).
  void shutdown();

  // For tests and the benchmark: one lease check and scheduling pass now.
  void tick_now();

 private:
  struct Member {
    std::string worker;
    bool started = false;
    bool exited = false;
    int exit_code = 0;
    bool stopped_by_agent = false;
    std::string message;
    std::string lost_optimizer_node;  // HOST:PORT its ranks lost (exit 76)
  };
  struct Job {
    JobRecord rec;                // with the spec facts the coordinator uses (no JobSpec kept)
    scheduler::Resources demand;  // per gang member
    scheduler::SlotKind slot_kind = scheduler::SlotKind::kAny;
    std::vector<Member> members;  // current attempt (empty when not placed)
    std::vector<std::string> reserved_workers;
    std::string waiting_reason;
    double eta_seconds = -1;
    double step_seconds = 0;     // of the latest progress report
    bool progressed = false;     // the current attempt has reported progress (restart loss taken)
    int64_t queued_since_ms = 0; // submit or requeue: the queue wait starts here
    int64_t last_persist_ms = 0;
    // The generation_ at which a scheduling pass found it stable: it is skipped until
    // the generation changes (scheduler.h, rule 8).
    int64_t unplaceable_generation = -1;
    // The silent worker whose self-fence rec.fence_until_ms waits for: its registering
    // again ends the wait (a registered agent has no rank left of its previous life).
    std::string fence_worker;
    // (key, path) of every path the spec reads or writes (job_spec.h, confined_paths): a
    // worker's allowed roots must cover them (scheduler.h, rule 3). Set at submit; after a
    // restart, from the stored spec when the job is first queued (confined_paths_of).
    std::optional<std::vector<std::pair<std::string, std::string>>> confined_paths;
  };
  // What a heartbeat reads and writes, under its own mutex rather than mu_, so that the
  // thousands of heartbeats a second never wait for a scheduling pass or a commit.
  // incarnation, lost and assignment_revision change only with mu_ held too (a reader
  // holding mu_ needs no lease lock for them); deadline_ms, last_heartbeat_ms, pulse_stream
  // and stream_broken_ms change under the lease's mutex alone.
  struct Lease {
    std::mutex mu;
    int64_t incarnation = 0;
    bool lost = false;  // rec.state == "LOST"
    int64_t deadline_ms = 0;
    int64_t last_heartbeat_ms = 0;
    int64_t pulse_stream = 0;      // the heartbeat stream of the latest streamed beat
    int64_t stream_broken_ms = 0;  // when that stream broke, cutting the lease (0: it did not)
    // Qualified by the coordinator's start (issued_ids.h): never below one handed out
    // before a restart.
    int64_t assignment_revision = 1;
    std::string session_digest;  // of the incarnation's session (rpc::session_digest)
    // An optimizer node's: "JOB_ID/ATTEMPT" -> secret of the attempts placed on it now
    // (HeartbeatResponse.node_grants), kept by refresh_grants() with mu_ held.
    std::map<std::string, std::string> grants;
  };
  struct Worker {
    WorkerRecord rec;
    v1::WorkerResources resources;
    // Shared with leases_: a heartbeat holding it outlives the worker's pruning.
    std::shared_ptr<Lease> lease = std::make_shared<Lease>();
  };
  // A submit between its checks and its commit (submit_async(), commit_submits()).
  struct PendingSubmit {
    Job job;
    StoreBatch batch;            // the job's record and its coordinator log lines
    std::string previous_owner;  // of its checkpoint.dir, restored if the commit fails
    SubmitAnswer answer;
    // Submits of the same request_id that arrived meanwhile (a client's retry): run again
    // once this one is done, they get its job, or try anew if its commit failed.
    std::vector<std::function<void()>> retries;
    bool answered = false;  // by the committer, guarded by mu_ (admit_submit may wait for it)
  };

  // A registration between its checks and its commit (register_worker, commit_submits):
  // the worker enters the state once its record is durable. One per name at a time.
  struct PendingRegistration {
    WorkerRecord rec;
    v1::WorkerResources resources;
    std::promise<grpc::Status> committed;
  };

  int64_t now_ms() const;
  // Added to a silent worker's fence: a heartbeat interval, at least 2 s (a loaded host kills
  // and reaps processes late; the agent's and the coordinator's clocks run at their own rates).
  int64_t fence_margin_ms() const;
  void log(const std::string& line) const;
  bool terminal(const std::string& state) const;
  void fill_status(const Job& j, v1::JobStatus* out) const;
  static void record_spec_facts(const JobSpec& spec, JobRecord* r);
  static std::vector<std::pair<std::string, std::string>> placement_paths(const JobSpec& spec);
  const std::vector<std::pair<std::string, std::string>>& confined_paths_of(Job& j) const;
  static void set_demand(Job& j);
  void release_attempt(Job& j);  // the attempt ends: charge its held time, free its workers
  void track_live(Job& j);       // live_ follows the job's state
  void add_job(Job&& j);         // into jobs_, by_seq_ and (while not terminal) live_
  void commit(StoreBatch& batch);  // fail-stop: exits the process when the store write fails
  void timed_commit(const StoreBatch& batch);  // store_->commit, logging a slow one
  void touch(Job& j, StoreBatch& batch);    // revision + 1, then persist
  void persist(Job& j, StoreBatch& batch);  // add the record to the batch, wake watchers
  void bump_workers_of(const Job& j);
  // Recomputes the node grants of `node` (an optimizer worker's name) from the placed jobs
  // (mu_ held), for its next heartbeat.
  void refresh_grants(const std::string& node);
  static void bump_assignments(Worker& w);  // assignment_revision + 1 (mu_ held)
  static grpc::Status not_leased(const std::string& name, int64_t incarnation, const Lease& lease);
  void append_coordinator_log(Job& j, const std::string& line, StoreBatch& batch);
  Worker* live_worker(const std::string& name, int64_t incarnation, grpc::Status* status);
  Job* uploading_job(const std::string& name, int64_t incarnation, const std::string& job_id, grpc::Status* status);
  Job* current_attempt(const std::string& job_id, int64_t attempt, const std::string& worker, int* member,
                       grpc::Status* status);
  void apply_attempt_report(Job& j, int member, const v1::AttemptReport& r, StoreBatch& batch);
  grpc::Status take_progress(Job& j, const v1::ReportProgressRequest& req, StoreBatch& batch);
  void end_attempt(Job& j, StoreBatch& batch);
  void requeue_or_fail(Job& j, const std::string& reason, StoreBatch& batch);
  // `silent`: it stopped heartbeating (its agent may be alive and cut off, so its jobs wait
  // for its self-fence); not silent: it registered again (its old ranks are gone).
  void lose_worker(Worker& w, const std::string& why, bool silent, StoreBatch& batch);
  // The next job number / incarnation, reserving a block in issued_ids_ when the last one
  // is used up; nullopt (with *error) when the reservation cannot be written.
  std::optional<int64_t> issue_job_seq(std::string* error);
  std::optional<int64_t> issue_incarnation(std::string* error);
  void repair_loaded_jobs(StoreBatch& batch);  // rows this build cannot run as they are
  void renew_all_leases(const std::string& why);  // after a pause of the whole process
  // The record a registration writes (a new incarnation), and the worker entering the
  // state with it: its lease, its role's index, a scheduling pass. Under mu_.
  // The record of a new incarnation; *session is its session (the record holds its digest).
  WorkerRecord registration_record(const v1::RegisterWorkerRequest& req, int64_t now, int64_t incarnation,
                                   std::string* session);
  void enter_worker(const WorkerRecord& rec, const v1::WorkerResources& resources, int64_t now);
  void check_leases(StoreBatch& batch);
  std::shared_ptr<Lease> lease_of(const std::string& name);  // null: not registered (no mu_ needed)
  void prune_lost_workers(StoreBatch& batch);  // LOST longer than options_.lost_worker_retention
  // A beat (or a registration) at `now`: the lease runs a full term again. Under the lease's mutex.
  void renew(Lease& lease, int64_t now) const;
  void apply_progress(const v1::HeartbeatRequest& req);  // the beat's progress entries (takes mu_)
  void run_schedule(StoreBatch& batch);
  void persist_progress(StoreBatch& batch);
  void tick_locked();
  void ticker();
  void commit_submits();  // the committer thread
  void parse_large_submits();  // the intake thread
  // submit_async's checks, on the calling thread.
  void admit_submit(const v1::SubmitJobRequest& req, SubmitAnswer answer);
  void step_aside(const PendingSubmit& p);
  void load();
  grpc::Status parse_submitted(const v1::SubmitJobRequest& req, JobSpec* spec, std::string* yaml) const;

  std::unique_ptr<Store> store_;
  CoordinatorOptions options_;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // notified by announce_change()
  void announce_change();
  std::atomic<int64_t> change_seq_{0};
  std::mutex listener_mu_;
  std::function<void()> change_listener_;  // guarded by listener_mu_
  std::map<std::string, Job> jobs_;          // by id
  // The same jobs by submit order (JobRecord::submit_seq, unique): ListJobs pages from its
  // token down this index instead of collecting and sorting every job on every page.
  std::map<int64_t, const Job*> by_seq_;
  // The jobs not yet terminal (queued or with an attempt), which every tick and scheduling
  // pass looks at: a few among the thousands kept. Kept by persist() (every transition goes
  // through it), submit() and load().
  std::map<std::string, Job*> live_;
  // The jobs with progress not yet written, and those the last pass gave a reservation: what a tick
  // must visit of live_, which a walk of its thousands of queued jobs would cost ~0.2 ms
  // under the lock each time (bench control-plane: 2,000-3,000 live jobs). jobs_ never
  // erases, so the pointers stay valid.
  std::set<Job*> progress_dirty_jobs_;
  std::vector<Job*> reserved_jobs_;
  // What a scheduling pass looks at: live_ less the queued jobs that the pass at
  // stable_generation_ found stable (scheduler.h, rule 8), which wait in stable_ until the
  // generation changes (every transition changes it). A long queue that cannot be placed
  // is then neither visited nor copied by the passes that new submits make due.
  std::set<Job*> candidates_;
  std::set<Job*> stable_;
  int64_t stable_generation_ = -1;
  // TRAINER workers, the ones a scheduling pass places on (kept by register_worker, load).
  std::map<std::string, Worker*> trainers_;
  // OPTIMIZER workers (zenflow-optimizer nodes), the ones a pass gives jobs (rule 9); kept likewise.
  std::map<std::string, Worker*> optimizers_;
  std::map<std::string, std::string> by_request_;  // request_id -> job id
  // checkpoint.dir -> the last job that used it; a live owner refuses a second live job.
  std::unordered_map<std::string, std::string> checkpoint_owner_;
  std::map<std::string, Worker> workers_;    // by name
  std::map<std::pair<std::string, int64_t>, int64_t> stream_bytes_;  // (job, stream) -> bytes held
  std::map<std::string, int64_t> log_bytes_;  // job -> log size
  std::unique_ptr<IssuedIds> issued_ids_;  // null: none kept (options_.issued_ids_path "")
  int64_t revision_base_ = 0;              // start << 32: assignment revisions of this start
  int64_t next_fence_ms_ = 0;              // the earliest fence a queued job waits for (0: none)
  int64_t next_seq_ = 1;
  int64_t last_issued_seq_ = 0;  // this start's last job number (0: none yet)
  int64_t workers_lost_ = 0;
  int64_t next_incarnation_ = 1;
  bool schedule_dirty_ = true;
  // Changes with everything a scheduling pass reads except the queue (scheduler.h, rule
  // 8): worker joins and losses, and every job transition (touch()).
  int64_t generation_ = 0;
  int64_t next_preemptable_ms_ = -1;  // of the last decision: the generation changes then
  int64_t next_lease_expiry_ms_ = 0;  // no lease runs out before: check_leases() skips the scan
  bool stopping_ = false;
  // Workers by name for heartbeats (an entry goes when its worker is pruned).
  std::shared_mutex leases_mu_;
  std::unordered_map<std::string, std::shared_ptr<Lease>> leases_;
  int64_t next_prune_ms_ = 0;
  // Submits waiting for the committer, and the in-flight ones by request_id and by job id.
  std::vector<std::shared_ptr<PendingSubmit>> submit_queue_;
  std::map<std::string, std::shared_ptr<PendingSubmit>> pending_requests_;
  std::map<std::string, std::shared_ptr<PendingSubmit>> pending_jobs_;
  // Registrations waiting for the committer, and the names being registered.
  std::vector<std::shared_ptr<PendingRegistration>> registration_queue_;
  std::set<std::string> registering_;
  std::condition_variable submits_queued_;    // the committer waits for submit_queue_ and registration_queue_
  std::condition_variable submits_answered_;  // admit_submit waits for its submit (below)
  // How long the submitting thread may still step aside for the committer (refilled at
  // kStepAsideShare of wall time, up to options_.submit_step_aside_saved), and when it
  // was refilled.
  std::chrono::nanoseconds step_aside_budget_;
  std::chrono::steady_clock::time_point step_aside_refilled_ = std::chrono::steady_clock::now();
  std::mutex store_mu_;                     // serializes store_ (taken after mu_)
  // Large submits waiting to be parsed (submit_async); intake_mu_ is never held with mu_.
  struct Intake {
    std::shared_ptr<const v1::SubmitJobRequest> req;
    SubmitAnswer answer;
  };
  std::mutex intake_mu_;
  std::condition_variable intake_cv_;
  std::deque<Intake> intake_;
  bool intake_stopping_ = false;
  const uint64_t boot_;
  std::thread ticker_;
  std::thread intake_thread_;
  std::thread committer_;
};

}  // namespace zenflow::server
