// The coordinator's scheduler: one pure pass from (workers, jobs, now) to a decision.
//
// schedule() is a function, not a service: it reads plain views of the worker registry
// and the job table, does no I/O, keeps no state between calls and never blocks, so the
// coordinator calls it on every change (submit, job end, worker joins or is lost, a
// timer) and applies the decision itself: it sends assignments, asks victims to
// checkpoint (the Ctrl-C path) and records the reasons for `zenflow status`. Everything
// the rules below need from the past (which jobs are already being preempted, where the
// head's reservation was) arrives in the views, so the same input always gives the same
// decision, whatever the order of the input vectors.
//
// The rules (docs/design.md §9.1 names the failures they prevent). A pass takes
// the queued jobs in queue order (1); each one starts if it fits (2-4), else is
// unschedulable, else may preempt (7), else becomes the head and reserves (5) or, after
// the head, waits (6).
//
//  1. Queue order: priority (higher first), then submit_seq (lower first), then job id.
//
//  2. Gang all-or-nothing: a job needing `workers` gang members starts only when that
//     many distinct workers fit one member each, all in this pass. Nothing is ever held
//     for a job that does not start (no partial holds), so two gangs that each fit only
//     partly never deadlock each other: neither holds anything.
//
//  3. Fit: a member fits on a worker when the worker is schedulable, matches the job's
//     constraints (slot kind, GPU model, GPU memory, node selector, and its allowed roots
//     cover every path of the job: common/allowed_roots.h, lexically) and its free slots,
//     free host RAM and free physical cores each cover the member's demand. Free =
//     capacity - reserved - the demands of the RUNNING and PREEMPTING jobs placed on it
//     (the scheduler derives allocations from the job views, so the caller cannot pass
//     an inconsistent pair). Slots are the worker's GPUs, or its CPU slots when it has
//     none (`--cpu-slots N`): a job's gpus_per_worker ranks then train on the CPU.
//
//  4. Placement: best fit. Among the workers a member fits on, the gang takes the ones
//     that leave the fewest free slots, then the least free host RAM, then the fewest
//     free cores, then the lowest worker id: big holes stay whole for big jobs, and the
//     tie-break makes the choice deterministic.
//
//  5. Head job and its reservation (EASY backfill). The first job in queue order that
//     cannot start, and could start on an otherwise empty cluster, is the head job. It
//     reserves `workers` specific workers: the eligible workers that would fit a member
//     soonest, assuming RUNNING jobs end at estimated_end_ms (unknown = never, a
//     PREEMPTING job = now); ties go to the workers it reserved in the previous pass
//     (JobView::reserved_workers), then smallest shortfall, then worker id. So the ones
//     that fit now are always reserved first, a reservation stays where it was until a
//     worker would fit sooner, and with no end times known new ones go where the head is
//     closest to fitting. (A head that can preempt, rule 7, reserves its plan's workers
//     instead.) On each reserved worker the reservation holds, per resource,
//     min(free now, member demand): a worker that fits the head now keeps the head's
//     share and lends out only the surplus; a worker that does not fit yet lends out
//     nothing.
//     A job whose gang could never fit (too few large-enough eligible workers) is
//     "unschedulable" and does not become the head, so it cannot block the queue.
//
//  6. Backfill (options.backfill): a later job may start only on capacity no
//     reservation holds. Why that never delays the head: the head starts once each of
//     its reserved workers has its demand free. Allocations on a worker change only by
//     (a) jobs ending, which frees capacity, and (b) backfilled jobs, which by (6) use
//     only free capacity beyond min(free, demand) per resource: where the head fits now
//     it still fits after them, and where it does not they use nothing. So the moment
//     the reserved workers' current occupants finish is the same with or without
//     backfill, pass after pass, as long as the caller passes the previous reservation
//     back in (reserved_workers) and the job stays the head. This is a guarantee about
//     the reserved workers; without end times the scheduler cannot know whether another
//     set would have freed sooner, so it keeps to the set it reserved, which is the rule
//     that needs no runtime estimates. With backfill off, nothing after the head
//     starts or preempts ("blocked behind head job X (backfill off)").
//
//  7. Preemption (options.preemption): a queued job that cannot start may evict RUNNING
//     jobs of strictly lower priority that have run at least
//     options.preemption_min_runtime_ms (now - start_time_ms of the current attempt).
//     Equal priority never preempts. Victims are tried lowest priority first, then most
//     recent start (least work lost), then job id, and only jobs with a gang member on a
//     worker the preemptor could use count. Greedily add victims until the preemptor
//     would fit with their resources freed; if it never would, evict NOTHING (no
//     preemption that cannot make the preemptor fit: the KAI-Scheduler#136 thrash). Then
//     drop every chosen victim whose eviction turns out unnecessary, trying the most
//     valuable (highest priority, oldest start) first: the set is irreducible. The
//     preemptor then reserves the workers it will use (as in 5, so nothing backfills onto
//     them), and the victims are claimed: nobody evicts them again. Preemptors may not
//     plan onto workers an earlier reservation holds.
//     Jobs already on their way out (PREEMPTING in the input, or claimed earlier in this
//     pass) count as freed on unreserved workers for every later plan, before any new
//     victim is chosen: a preemptor whose victims are still checkpointing waits for them
//     ("waiting for preempted job X to checkpoint") instead of evicting more, and a second
//     preemptor uses what a first one's victims free beyond the first one's reservation.
//     PREEMPTING jobs are never victims.
//     Victims stay RUNNING in this pass (they hold their resources until they have
//     checkpointed); the caller marks them PREEMPTING and records who they were evicted
//     for. When a victim exits, the caller requeues it (keeping its submit_seq, so it
//     resumes first within its priority, from its checkpoint); it is not re-placed in the
//     pass that preempts it because it is not queued yet.
//
//  8. Skipping jobs that stay unplaceable (options.generation >= 0). On a full cluster with
//     a long queue most passes would re-derive the same "waiting" for every job. So the
//     caller numbers the states of everything but the queue: it changes `generation`
//     whenever any input other than the set of queued jobs changes (a worker or an
//     optimizer node joins, leaves or changes; a job is placed, ends, is asked to stop or leaves the queue; a
//     decision is applied), and when now_ms reaches the decision's next_preemptable_ms.
//     It passes back, per queued job, the generation at which a decision marked it
//     WaitingJob::stable (it waits and holds no reservation: neither head nor
//     preemptor). While the generation stays, such a job is skipped: it is not
//     evaluated, gets no WaitingJob (its last reason stands) and counts in `skipped`.
//     Why that gives the decision a full pass would: between two passes of one
//     generation only queued jobs were added. An added job ahead of a stable job can
//     only take capacity, reserve or claim victims ahead of it, which never lets it
//     start; it could change the stable job's fate only by moving the reservations
//     ahead of it (a new head, a new preemptor and its claimed victims), and a stable
//     job holds nothing, so leaving it out changes no other job's decision. Hence: when
//     a pass that skipped something returns reservations other than the
//     reserved_workers passed in, the pass is run again over every job, and that
//     decision is returned. Jobs holding a reservation are never skipped, so the head
//     and every preemptor are evaluated in every pass, and backfill and preemption see
//     exactly what they would without skipping.
//  9. Optimizer nodes (zenflow-optimizer, optimizer.host.nodes: N). A node holds the host
//     optimizer state of one job at a time: it is free when it is schedulable and in no
//     RUNNING or PREEMPTING job's node_placement. A job with optimizer_nodes = N starts
//     only when its gang fits (2-4) AND N free nodes each offer node_memory_bytes, in the
//     same pass (gang: nothing is held for a job that does not start, beyond rule 5's
//     reservation). Placement is best fit: least host RAM left, then node id. The head and
//     every preemptor also hold the free nodes they would take (up to N), and later jobs
//     take only unheld nodes, so backfill cannot take the nodes a reservation waits for.
//     Preemption frees workers, never nodes: a job short of nodes does not preempt. A job
//     whose N exceeds the schedulable nodes that could ever hold its share is
//     unschedulable (and holds nothing).
//
// Every queued job that is not assigned gets exactly one reason (WaitingJob), e.g.
//   "waiting: needs 2 workers each with 1 GPU and 60 GiB host RAM; 1 fit now"
//   "waiting: needs 1 worker with 8 GPUs; 0 fit now; head of the queue, reserved w2
//    (earliest start in 9 s)"
//   "blocked behind head job train-7 (reservation): needs 1 worker with 1 GPU; 0 fit
//    outside reservations"
//   "preempting j3 (checkpoint, then requeue); needs 1 worker with 4 GPUs; reserved w1"
//   "unschedulable: needs 3 workers each with 1 GPU; only 2 schedulable workers could
//    ever fit one"
//   "unschedulable: needs 1 worker with 1 CPU slot; only 0 schedulable workers could ever
//    fit one; 1 schedulable worker refuses its paths: checkpoint.dir /etc/ck is outside the
//    allowed roots of w1 (/shared, /var/lib/zenflow/work)"
//
// Complexity, with W workers, J queued jobs, R running jobs, S distinct constraint sets
// among the queued jobs and E_j the workers eligible for job j: O(W log W + J log J +
// R log R + S·W + sum over queued jobs of E_j), plus O(victims tried × gang size +
// PREEMPTING workers) for each preemption plan. Three things keep the sum small: a fit
// scan skips, for the rest of the pass, workers that can no longer hold the smallest
// demand of their constraint set (free capacity only shrinks within a pass); a placement
// keeps only the `workers` tightest candidates while scanning; and a failed fit of one
// job shape is remembered until capacity changes, so a full cluster with many identical
// queued jobs costs one scan per shape. No step is O(J·W²). Measured figures are printed
// by tests/test_scheduler.cpp (T3 targets: 1,000 jobs × 500 workers p99 ≤ 20 ms; 10,000 ×
// 5,000 ≤ 500 ms, one thread).
//
// Thread safety: every function here is pure and may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace zenflow::scheduler {

// An amount of the three resources placement counts. As a demand it is per gang member
// (one member per worker); as capacity it is per worker.
struct Resources {
  int64_t slots = 0;              // GPUs, or CPU slots on a worker without GPUs
  int64_t host_memory_bytes = 0;  // host RAM
  int64_t cores = 0;              // physical cores
};

// What kind of slot a job's ranks need. The caller maps train.device: cuda -> kGpu,
// cpu -> kCpu, auto -> kAny (then GPU and CPU slots count alike in best fit).
enum class SlotKind { kAny, kGpu, kCpu };

struct WorkerView {
  std::string id;                 // unique; the final placement tie-break
  bool schedulable = true;        // false while draining, LOST or not yet ready
  int64_t gpus = 0;               // 0: the worker offers cpu_slots CPU slots instead
  std::string gpu_model;          // e.g. "A100-SXM4-80GB"; ignored when gpus == 0
  int64_t gpu_memory_bytes = 0;   // per GPU
  int64_t cpu_slots = 1;          // used only when gpus == 0
  int64_t host_memory_bytes = 0;  // total host RAM
  int64_t physical_cores = 0;
  Resources reserved;  // held back for things outside the scheduler (OS, agent)
  std::map<std::string, std::string> labels;
  // The directories job specs may name there (zenflow-worker --allowed-root, its work dir
  // among them); absolute and normal. Empty: unconfined (an agent from before the field).
  std::vector<std::string> allowed_roots;
};

// A zenflow-optimizer node (role OPTIMIZER), for rule 9.
struct NodeView {
  std::string id;                 // unique; the final placement tie-break
  bool schedulable = true;        // false while LOST
  int64_t host_memory_bytes = 0;  // what it offers (--memory-limit)
  int64_t cores = 0;
};

// kRunning covers STARTING too: anything that holds its placement's resources.
// kPreempting: asked to checkpoint and exit; holds its resources until it does.
enum class JobState { kQueued, kRunning, kPreempting };

struct JobView {
  std::string id;  // unique
  JobState state = JobState::kQueued;
  int64_t priority = 0;    // resources.priority; higher runs first
  int64_t submit_seq = 0;  // increasing at submit; FIFO within a priority
  int64_t workers = 1;     // gang size (resources.workers), >= 1
  Resources per_worker;    // demand of each member; slots >= 1 (gpus_per_worker)
  SlotKind slot_kind = SlotKind::kAny;
  std::string gpu_model;                             // required GPU model; non-empty implies GPU slots
  int64_t min_gpu_memory_bytes = 0;                  // per GPU; applies on GPU workers
  std::map<std::string, std::string> node_selector;  // every pair must be in the labels
  // (key, absolute path) of every path the spec reads or writes (job_spec.h,
  // confined_paths): a worker with allowed roots admits the job only if they cover each.
  std::vector<std::pair<std::string, std::string>> confined_paths;
  // kQueued: the workers the previous decision reserved for this job
  // (Reservation::worker_ids), empty if none. As head it keeps them over workers that
  // would fit no sooner (rule 5), so a job backfilled elsewhere can never pull the
  // reservation onto itself in a later pass.
  std::vector<std::string> reserved_workers;
  // kQueued: the ScheduleOptions::generation of the decision that last marked this job
  // WaitingJob::stable (rule 8), -1 if none.
  int64_t unplaceable_generation = -1;
  // Rule 9: optimizer nodes the job needs (optimizer.host.nodes; 0: none) and the host RAM
  // each must offer (its share of the job's host optimizer state).
  int64_t optimizer_nodes = 0;
  int64_t node_memory_bytes = 0;

  // kRunning and kPreempting only:
  std::vector<std::string> placement;  // worker ids, one per member; unknown ids are ignored
  std::vector<std::string> node_placement;  // optimizer node ids it holds; unknown ids are ignored
  int64_t start_time_ms = 0;           // start of the current attempt
  int64_t estimated_end_ms = 0;        // 0 = unknown (then reservations assume "never")
};

struct ScheduleOptions {
  int64_t now_ms = 0;                     // same clock as start_time_ms / estimated_end_ms
  int64_t preemption_min_runtime_ms = 0;  // preemption.min_runtime
  bool backfill = true;
  bool preemption = true;
  // The caller's number for the state of workers and running jobs (rule 8); -1: skip
  // nothing.
  int64_t generation = -1;
};

struct Assignment {
  std::string job_id;
  std::vector<std::string> worker_ids;  // one per gang member, best fit first
  std::vector<std::string> node_ids;    // optimizer nodes (rule 9), best fit first
};

struct Preemption {
  std::string victim_job_id;     // checkpoint (Ctrl-C path), then requeue
  std::string preemptor_job_id;  // the queued job it makes room for
};

// Workers held for a job that cannot start yet (the head job, or a preemptor).
struct Reservation {
  std::string job_id;
  std::vector<std::string> worker_ids;
  int64_t earliest_start_ms = -1;  // head job: when its reserved workers fit; -1 unknown
};

struct WaitingJob {
  std::string job_id;
  std::string reason;  // one line for `zenflow status`
  // Holds no reservation: the next pass of the same generation may skip it (rule 8).
  bool stable = false;
};

struct ScheduleDecision {
  std::vector<Assignment> assignments;    // in queue order
  std::vector<Preemption> preemptions;    // grouped by preemptor, in queue order
  std::vector<Reservation> reservations;  // head first, then preemptors in queue order
  std::vector<WaitingJob> waiting;        // every queued job not assigned nor skipped, in queue order
  int64_t skipped = 0;                    // queued jobs skipped as stable (rule 8)
  // The earliest now_ms at which a RUNNING job of the input becomes a preemption victim
  // (start_time_ms + preemption_min_runtime_ms), -1 if none will: the caller changes the
  // generation then, so that skipped jobs see the new victim.
  int64_t next_preemptable_ms = -1;
};

// One scheduling pass over `jobs` (any states; only kQueued jobs are placed) and
// `workers`. Returns the decision; the inputs are not modified.
// A queued job with an invalid demand (workers < 1, slots < 1, negative RAM or cores)
// is not placed and gets the reason "invalid demand: ..."; it never stops the pass.
// Throws std::invalid_argument only for a caller bug: duplicate worker, node or job ids.
ScheduleDecision schedule(const std::vector<WorkerView>& workers, const std::vector<JobView>& jobs,
                          const ScheduleOptions& options, const std::vector<NodeView>& nodes = {});

// --- host_memory_gb: auto ---

// The optimizer mode of the job spec (optimizer.mode).
enum class OffloadMode { kDevice, kOffload, kZenFlow };

// What the host-RAM estimate needs from the model; the caller computes the counts from
// the model config (worker/ owns that arithmetic).
struct HostMemoryInputs {
  int64_t total_params = 0;  // every trainable parameter
  int64_t split_params = 0;  // of 2-D matrices with numel >= zenflow.min_split_numel
  OffloadMode mode = OffloadMode::kZenFlow;
  int64_t weight_bytes = 4;            // bytes per weight element on the device: 4 fp32, 2 bf16/fp16
  int64_t ranks = 1;                   // ranks of the job = workers x gpus_per_worker (>= 1)
  int64_t overhead_bytes = 2LL << 30;  // per rank process: runtime, data loader, allocator slack
};

// Bytes of host RAM one rank of the job needs: overhead_bytes plus the host-side
// optimizer state the engine allocates (worker/engine/zenflow_optimizer.cpp, build()):
//   host elements N: kDevice 0 (everything stays on the device); kOffload every
//   parameter (ZeRO-Offload keeps all of them on the host); kZenFlow the split
//   parameters (1-D and small ones stay on the device).
//   per rank: n = ceil(N / ranks) (ZeRO-2: host state is partitioned over every rank).
//   per element: fp32 master + m + v + two window accumulators  = 5 x 4 = 20 B
//                gradient staging ring (2) + last-gradient (2)  = 4 x weight_bytes
//                low-precision output pair (only if weight_bytes != 4) = 2 x weight_bytes
//                packed output (with ranks > 1, or fp32 weights)   = 1 x weight_bytes
//   so 40 B per element with fp32 weights; with bf16/fp16 32 B on one rank, 34 B on more.
// Why not (1 - topk_ratio) of it, nor one accumulator without overlap_step: the engine
// sizes its arenas for every split column, because warm-up runs as offload (the host
// owns every column until the first selection), and it always keeps two accumulators.
// The engine packs fp32 output for one rank only on CUDA; on a CPU device that case is an
// upper bound by 4 B per element (tests/test_zenflow_engine.cpp pins 36 and 32 B there,
// HostMemoryIsCountedBufferByBuffer). The engine cuts
// host columns into whole-column ranges balanced by bytes, so one rank may hold up to one
// column per matrix more than ceil(N / ranks); overhead_bytes covers it.
// On a CPU-slot worker the "device" is host RAM too: weights, gradients, device-side
// optimizer state and activations are then not in this figure; the caller adds them.
// A worker's demand is gpus_per_worker x this (one rank per slot).
// Throws std::invalid_argument for negative counts, split_params > total_params,
// weight_bytes not 2 or 4, or ranks < 1.
int64_t host_memory_bytes_per_rank(const HostMemoryInputs& in);

// --- Restarts after a lost worker ---

struct RestartDecision {
  bool requeue = false;       // true: back to QUEUED; false: FAILED with `reason`
  int64_t restarts_used = 0;  // after this decision (the job record keeps it)
  std::string reason;         // "worker W lost; requeued (restart 1 of 3)" or
                              // "worker W lost; restarts 3 of 3 used"
};

// The job of a worker that missed its lease: requeued while restarts_used <
// max_restarts (resources.max_restarts; 0 = never restart), else FAILED. Preemption is
// not a failure and does not count as a restart.
RestartDecision decide_restart_after_lost_worker(const std::string& worker_id, int64_t restarts_used,
                                                 int64_t max_restarts);

}  // namespace zenflow::scheduler
