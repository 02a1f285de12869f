// Scheduler tests: queue order, gang all-or-nothing, RAM/core/slot fit, backfill, preemption, restarts, host
// RAM.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "server/scheduler.h"

namespace zenflow::scheduler {
namespace {

constexpr int64_t kGiB = 1LL << 30;

WorkerView gpu_worker(const std::string& id, int64_t gpus, int64_t ram_gib, int64_t cores,
                      const std::string& model = "A100") {
  WorkerView w;
  w.id = id;
  w.gpus = gpus;
  w.gpu_model = model;
  w.gpu_memory_bytes = 80 * kGiB;
  w.host_memory_bytes = ram_gib * kGiB;
  w.physical_cores = cores;
  return w;
}

WorkerView cpu_worker(const std::string& id, int64_t slots, int64_t ram_gib, int64_t cores) {
  WorkerView w;
  w.id = id;
  w.cpu_slots = slots;
  w.host_memory_bytes = ram_gib * kGiB;
  w.physical_cores = cores;
  return w;
}

JobView queued(const std::string& id, int64_t priority, int64_t seq, int64_t workers, int64_t slots,
               int64_t ram_gib = 0, int64_t cores = 0) {
  JobView j;
  j.id = id;
  j.priority = priority;
  j.submit_seq = seq;
  j.workers = workers;
  j.per_worker = {slots, ram_gib * kGiB, cores};
  return j;
}

JobView running(const std::string& id, int64_t priority, std::vector<std::string> placement, int64_t slots,
                int64_t start_ms = 0, int64_t ram_gib = 0, int64_t cores = 0) {
  JobView j = queued(id, priority, 0, static_cast<int64_t>(placement.size()), slots, ram_gib, cores);
  j.state = JobState::kRunning;
  j.placement = std::move(placement);
  j.start_time_ms = start_ms;
  return j;
}

std::vector<std::string> assigned(const ScheduleDecision& d, const std::string& job) {
  for (const Assignment& a : d.assignments)
    if (a.job_id == job) return a.worker_ids;
  return {};
}

std::string reason(const ScheduleDecision& d, const std::string& job) {
  for (const WaitingJob& w : d.waiting)
    if (w.job_id == job) return w.reason;
  return "<not waiting>";
}

std::vector<std::string> assigned_jobs(const ScheduleDecision& d) {
  std::vector<std::string> ids;
  for (const Assignment& a : d.assignments) ids.push_back(a.job_id);
  return ids;
}

std::vector<std::pair<std::string, std::string>> preemptions(const ScheduleDecision& d) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Preemption& p : d.preemptions) out.emplace_back(p.victim_job_id, p.preemptor_job_id);
  return out;
}

const Reservation* reservation(const ScheduleDecision& d, const std::string& job) {
  for (const Reservation& r : d.reservations)
    if (r.job_id == job) return &r;
  return nullptr;
}

std::vector<std::string> reserved_workers(const ScheduleDecision& d, const std::string& job) {
  const Reservation* r = reservation(d, job);
  return r ? r->worker_ids : std::vector<std::string>{};
}

// What the coordinator does with a decision: assigned jobs start now.
void apply(const ScheduleDecision& d, std::vector<JobView>* jobs, int64_t now_ms) {
  for (JobView& j : *jobs) {
    const std::vector<std::string> on = assigned(d, j.id);
    if (on.empty()) continue;
    j.state = JobState::kRunning;
    j.placement = on;
    j.start_time_ms = now_ms;
  }
  for (const Preemption& p : d.preemptions)
    for (JobView& j : *jobs)
      if (j.id == p.victim_job_id) j.state = JobState::kPreempting;
}

void erase_job(std::vector<JobView>* jobs, const std::string& id) {
  jobs->erase(std::remove_if(jobs->begin(), jobs->end(), [&](const JobView& j) { return j.id == id; }),
              jobs->end());
}

// --- Queue order ---

TEST(Scheduler, HigherPriorityFirstThenSubmitOrder) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8)};
  const std::vector<JobView> jobs = {queued("low", 0, 1, 1, 1), queued("high-late", 5, 3, 1, 1),
                                     queued("high-early", 5, 2, 1, 1)};
  const ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_EQ(assigned_jobs(d), std::vector<std::string>{"high-early"});
  ASSERT_EQ(d.waiting.size(), 2u);
  EXPECT_EQ(d.waiting[0].job_id, "high-late");  // queue order
  EXPECT_EQ(d.waiting[0].reason,
            "waiting: needs 1 worker with 1 GPU or CPU slot; 0 fit now; head of the queue, reserved w1 "
            "(earliest start unknown)");
  EXPECT_EQ(d.waiting[1].job_id, "low");
  EXPECT_EQ(d.waiting[1].reason, "waiting: needs 1 worker with 1 GPU or CPU slot; 0 fit now");
}

TEST(Scheduler, AssignmentsFollowQueueOrderWhenAllFit) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8),
                                           gpu_worker("w3", 1, 64, 8)};
  const std::vector<JobView> jobs = {queued("c", 0, 1, 1, 1), queued("a", 2, 9, 1, 1),
                                     queued("b", 0, 0, 1, 1)};
  const ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_EQ(assigned_jobs(d), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(assigned(d, "a"), std::vector<std::string>{"w1"});
  EXPECT_EQ(assigned(d, "b"), std::vector<std::string>{"w2"});
  EXPECT_EQ(assigned(d, "c"), std::vector<std::string>{"w3"});
  EXPECT_TRUE(d.waiting.empty());
}

// --- Gangs ---

TEST(Scheduler, GangStartsOnlyWhenEveryMemberFits) {
  std::vector<WorkerView> workers = {gpu_worker("a", 2, 64, 8), gpu_worker("b", 2, 64, 8)};
  std::vector<JobView> jobs = {running("r", 0, {"b"}, 2), queued("gang", 0, 1, 2, 2),
                               queued("small", 0, 2, 1, 1)};
  ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_TRUE(d.assignments.empty()) << "no partial hold: neither the gang nor a backfill on its reservation";
  EXPECT_EQ(
      reason(d, "gang"),
      "waiting: needs 2 workers each with 2 GPU or CPU slots; 1 fit now; head of the queue, reserved a, b "
      "(earliest start unknown)");
  // `small` fits on a, which the gang reserved: starting it there would delay the gang.
  EXPECT_EQ(
      reason(d, "small"),
      "blocked behind head job gang (reservation): needs 1 worker with 1 GPU or CPU slot; 0 fit outside "
      "reservations");

  // A worker too small for a gang member lies outside the reservation: backfill goes there.
  workers.push_back(gpu_worker("c", 1, 64, 8));
  d = schedule(workers, jobs, {});
  EXPECT_EQ(assigned_jobs(d), std::vector<std::string>{"small"});
  EXPECT_EQ(assigned(d, "small"), std::vector<std::string>{"c"});
  ASSERT_NE(reservation(d, "gang"), nullptr);
  EXPECT_EQ(reserved_workers(d, "gang"), (std::vector<std::string>{"a", "b"}));

  // When r ends, the gang takes both reserved workers at once.
  apply(d, &jobs, 1000);
  erase_job(&jobs, "r");
  d = schedule(workers, jobs, {1000});
  EXPECT_EQ(assigned(d, "gang"), (std::vector<std::string>{"a", "b"}));
}

TEST(Scheduler, TwoGangsThatFitOnlyPartlyHoldNothingAndTheFirstStartsWhenFree) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8),
                                           gpu_worker("w3", 1, 64, 8)};
  std::vector<JobView> jobs = {running("r", 0, {"w3"}, 1), queued("g1", 0, 1, 3, 1),
                               queued("g2", 0, 2, 3, 1)};
  ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_TRUE(d.assignments.empty());
  EXPECT_EQ(reason(d, "g2"),
            "waiting: needs 3 workers each with 1 GPU or CPU slot; 0 fit now, 2 more reserved for "
            "other jobs");
  erase_job(&jobs, "r");
  d = schedule(workers, jobs, {});
  EXPECT_EQ(assigned(d, "g1"), (std::vector<std::string>{"w1", "w2", "w3"}));
  EXPECT_EQ(reason(d, "g2"),
            "waiting: needs 3 workers each with 1 GPU or CPU slot; 0 fit now; head of the queue, "
            "reserved w1, w2, w3 (earliest start unknown)");
}

TEST(Scheduler, GangLargerThanTheClusterIsUnschedulableAndBlocksNobody) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8)};
  const std::vector<JobView> jobs = {queued("huge", 9, 1, 3, 1), queued("small", 0, 2, 1, 1)};
  const ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_EQ(
      reason(d, "huge"),
      "unschedulable: needs 3 workers each with 1 GPU or CPU slot; only 2 schedulable workers could ever fit "
      "one");
  EXPECT_EQ(assigned(d, "small"), std::vector<std::string>{"w1"});
  EXPECT_TRUE(d.reservations.empty());
}

// --- Fit: slots, host RAM, cores, constraints ---

TEST(Scheduler, BestFitTakesTheTightestWorkerThenLowestId) {
  const std::vector<WorkerView> workers = {gpu_worker("big", 8, 512, 64), gpu_worker("z-two", 2, 512, 64),
                                           gpu_worker("a-two", 2, 512, 64),
                                           gpu_worker("two-less-ram", 2, 256, 64)};
  const ScheduleDecision d = schedule(workers, {queued("j", 0, 1, 2, 2, 100)}, {});
  // Fewest slots left (0 on the 2-GPU workers), then least RAM left, then id.
  EXPECT_EQ(assigned(d, "j"), (std::vector<std::string>{"two-less-ram", "a-two"}));
}

TEST(Scheduler, WorkerWithGpusButTooLittleHostRamIsSkipped) {
  const std::vector<WorkerView> workers = {gpu_worker("tight-gpus", 2, 128, 32),
                                           gpu_worker("big-ram", 8, 1024, 96)};
  const ScheduleDecision d = schedule(workers, {queued("j", 0, 1, 1, 2, 200)}, {});
  EXPECT_EQ(assigned(d, "j"), std::vector<std::string>{"big-ram"});
}

TEST(Scheduler, OffloadJobWithAutoHostMemoryGoesToTheBigRamWorker) {
  // Llama-2-7B: 6,738,415,616 parameters, 6,738,149,376 of them in split 2-D matrices.
  HostMemoryInputs m;
  m.total_params = 6738415616;
  m.split_params = 6738149376;
  m.mode = OffloadMode::kOffload;
  m.weight_bytes = 2;
  m.ranks = 1;
  const int64_t per_rank = host_memory_bytes_per_rank(m);
  EXPECT_EQ(per_rank, (2LL << 30) + 6738415616LL * 32);  // 202.8 GiB
  JobView job = queued("offload-7b", 0, 1, 1, 1);
  job.per_worker.host_memory_bytes = per_rank * 1;  // gpus_per_worker 1
  const std::vector<WorkerView> workers = {gpu_worker("a-128g", 1, 128, 32), gpu_worker("b-192g", 4, 192, 32),
                                           gpu_worker("c-512g", 8, 512, 96)};
  ScheduleDecision d = schedule(workers, {job}, {});
  EXPECT_EQ(assigned(d, "offload-7b"), std::vector<std::string>{"c-512g"});
  d = schedule({workers[0], workers[1]}, {job}, {});
  EXPECT_EQ(reason(d, "offload-7b"),
            "unschedulable: needs 1 worker with 1 GPU or CPU slot and 202.8 GiB host RAM; only 0 schedulable "
            "workers "
            "could ever fit one");
}

TEST(Scheduler, HostRamAlreadyUsedByRunningJobsCounts) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 8, 256, 64), gpu_worker("w2", 8, 256, 64)};
  const std::vector<JobView> jobs = {running("r1", 0, {"w1"}, 1, 0, 200), running("r2", 0, {"w2"}, 1, 0, 100),
                                     queued("j", 0, 1, 1, 1, 100)};
  const ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_EQ(assigned(d, "j"), std::vector<std::string>{"w2"});  // w1 has 56 GiB left
}

TEST(Scheduler, WorkerWithoutEnoughFreeCoresIsSkipped) {
  std::vector<WorkerView> workers = {gpu_worker("few-cores", 4, 512, 8),
                                     gpu_worker("many-cores", 8, 512, 64)};
  workers[1].reserved.cores = 4;  // the agent's own cores
  const std::vector<JobView> jobs = {running("r", 0, {"few-cores"}, 1, 0, 0, 4),
                                     queued("j", 0, 1, 1, 2, 16, 6)};
  const ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_EQ(assigned(d, "j"), std::vector<std::string>{"many-cores"});
  const ScheduleDecision d2 = schedule({workers[0]}, jobs, {});
  EXPECT_EQ(
      reason(d2, "j"),
      "waiting: needs 1 worker with 2 GPU or CPU slots, 16 GiB host RAM and 6 cores; 0 fit now; head of the "
      "queue, reserved few-cores (earliest start unknown)");
}

TEST(Scheduler, CpuSlotWorkersTakeJobsThatMayTrainOnTheCpu) {
  const std::vector<WorkerView> workers = {cpu_worker("cpu1", 2, 24, 2), cpu_worker("cpu2", 1, 24, 2)};
  JobView any = queued("any", 0, 1, 1, 2, 4, 1);
  JobView gpu_only = queued("gpu-only", 0, 2, 1, 1);
  gpu_only.slot_kind = SlotKind::kGpu;
  JobView cpu = queued("cpu", 0, 3, 1, 1, 4, 1);
  cpu.slot_kind = SlotKind::kCpu;
  JobView too_wide = queued("three-ranks", 0, 4, 1, 3);
  const ScheduleDecision d = schedule(workers, {any, gpu_only, cpu, too_wide}, {});
  EXPECT_EQ(assigned(d, "any"), std::vector<std::string>{"cpu1"});
  EXPECT_EQ(assigned(d, "cpu"), std::vector<std::string>{"cpu2"});
  EXPECT_EQ(reason(d, "gpu-only"),
            "unschedulable: needs 1 worker with 1 GPU; only 0 schedulable workers could ever fit one");
  EXPECT_EQ(
      reason(d, "three-ranks"),
      "unschedulable: needs 1 worker with 3 GPU or CPU slots; only 0 schedulable workers could ever fit one");

  // A CPU job never lands on a GPU worker.
  const ScheduleDecision d2 = schedule({gpu_worker("g", 8, 512, 64)}, {cpu}, {});
  EXPECT_TRUE(d2.assignments.empty());
}

TEST(Scheduler, GpuModelLabelsAndSchedulabilityConstrainPlacement) {
  std::vector<WorkerView> workers = {
      gpu_worker("a100", 8, 512, 64, "A100"), gpu_worker("h100", 8, 512, 64, "H100"),
      gpu_worker("h100-b", 8, 512, 64, "H100"), gpu_worker("h100-drain", 8, 512, 64, "H100")};
  workers[2].labels = {{"zone", "b"}};
  workers[3].schedulable = false;
  JobView h = queued("needs-h100-zone-b", 0, 1, 1, 1);
  h.gpu_model = "H100";
  h.node_selector = {{"zone", "b"}};
  JobView two = queued("two-h100", 0, 2, 2, 8);
  two.gpu_model = "H100";
  const ScheduleDecision d = schedule(workers, {h, two}, {});
  EXPECT_EQ(assigned(d, "needs-h100-zone-b"), std::vector<std::string>{"h100-b"});
  EXPECT_EQ(
      reason(d, "two-h100"),
      "waiting: needs 2 workers each with 8 H100 GPUs; 1 fit now; head of the queue, reserved h100, h100-b "
      "(earliest start unknown)");
}

// Rule 3's paths: a worker admits a job only when its allowed roots cover every path of the
// spec, compared component by component as written ("/data" covers "/data/x", not
// "/database" nor "/data/../etc"; "/" covers everything); a worker with no roots (an agent
// from before them) admits every job. Jobs refused by the same workers share the rest of a
// signature, and one no worker may hold says which path and worker refuse it.
TEST(Scheduler, AWorkerAdmitsAJobOnlyWhenItsAllowedRootsCoverEveryPath) {
  std::vector<WorkerView> workers = {cpu_worker("data", 1, 64, 4), cpu_worker("everything", 1, 64, 4)};
  workers[0].allowed_roots = {"/work", "/data"};
  workers[1].allowed_roots = {"/"};
  auto job = [](const std::string& id, int64_t seq, const std::string& train) {
    JobView j = queued(id, 0, seq, 1, 1);
    j.confined_paths = {{"data.train", train}, {"checkpoint.dir", "/data/runs/" + id}};
    return j;
  };
  ScheduleDecision d = schedule(workers, {job("in", 1, "/data/x"), job("prefix", 2, "/database/x")}, {});
  EXPECT_EQ(assigned(d, "in"), std::vector<std::string>{"data"});
  EXPECT_EQ(assigned(d, "prefix"), std::vector<std::string>{"everything"});
  workers.pop_back();
  d = schedule(workers, {job("dotdot", 1, "/data/../etc/shadow"), job("prefix", 2, "/database/x")}, {});
  EXPECT_EQ(
      reason(d, "dotdot"),
      "unschedulable: needs 1 worker with 1 GPU or CPU slot; only 0 schedulable workers could ever fit one; "
      "1 schedulable worker refuses its paths: data.train /data/../etc/shadow is outside the allowed roots "
      "of data (/work, /data)");
  EXPECT_EQ(
      reason(d, "prefix"),
      "unschedulable: needs 1 worker with 1 GPU or CPU slot; only 0 schedulable workers could ever fit one; "
      "1 schedulable worker refuses its paths: data.train /database/x is outside the allowed roots "
      "of data (/work, /data)");
  workers.push_back(cpu_worker("unconfined", 1, 64, 4));
  d = schedule(workers, {job("dotdot", 1, "/data/../etc/shadow")}, {});
  EXPECT_EQ(assigned(d, "dotdot"), std::vector<std::string>{"unconfined"});
}

// --- Backfill ---

TEST(Scheduler, BackfillNeverTakesCapacityTheHeadReserved) {
  // Naive backfill would put `small` on w1, the only worker with free GPUs: then the head,
  // which needs both w1 and w2, could not start when w2's job ends.
  std::vector<WorkerView> workers = {gpu_worker("w1", 8, 512, 64), gpu_worker("w2", 8, 512, 64)};
  std::vector<JobView> jobs = {running("long", 0, {"w2"}, 8), queued("head", 0, 1, 2, 8),
                               queued("small", 0, 2, 1, 1)};
  ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_TRUE(d.assignments.empty());
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_EQ(reserved_workers(d, "head"), (std::vector<std::string>{"w1", "w2"}));
  EXPECT_EQ(
      reason(d, "small"),
      "blocked behind head job head (reservation): needs 1 worker with 1 GPU or CPU slot; 0 fit outside "
      "reservations");

  // With backfill off the same job waits for the head without looking, even where it
  // would fit outside the reservation; one that could never fit still says so.
  workers.push_back(gpu_worker("w3", 1, 512, 64));
  jobs.push_back(queued("nine-gpus", 0, 3, 1, 9));
  d = schedule(workers, jobs, {0, 0, /*backfill=*/false});
  EXPECT_TRUE(d.assignments.empty());
  EXPECT_EQ(reason(d, "small"), "blocked behind head job head (backfill off)");
  EXPECT_EQ(
      reason(d, "nine-gpus"),
      "unschedulable: needs 1 worker with 9 GPU or CPU slots; only 0 schedulable workers could ever fit one");
  d = schedule(workers, jobs, {});
  EXPECT_EQ(assigned(d, "small"), std::vector<std::string>{"w3"});
}

TEST(Scheduler, BackfillUsesOnlyTheSurplusOfAReservedWorker) {
  // The head needs 4 GPUs on each of two workers; w1 has 8 free, so 4 of them are lent out.
  const std::vector<WorkerView> workers = {gpu_worker("w1", 8, 512, 64), gpu_worker("w2", 8, 512, 64)};
  std::vector<JobView> jobs = {running("long", 0, {"w2"}, 8), queued("head", 0, 1, 2, 4),
                               queued("five", 0, 2, 1, 5), queued("three", 0, 3, 1, 3)};
  ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_EQ(assigned_jobs(d), std::vector<std::string>{"three"});
  EXPECT_EQ(assigned(d, "three"), std::vector<std::string>{"w1"});
  EXPECT_EQ(
      reason(d, "five"),
      "blocked behind head job head (reservation): needs 1 worker with 5 GPU or CPU slots; 0 fit outside "
      "reservations");

  // The head is not delayed: the moment `long` ends it starts on its reserved workers.
  apply(d, &jobs, 10);
  erase_job(&jobs, "long");
  d = schedule(workers, jobs, {20});
  EXPECT_EQ(assigned(d, "head"), (std::vector<std::string>{"w1", "w2"}));
}

TEST(Scheduler, ReservationPrefersTheWorkerThatFreesSoonest) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 8, 512, 64), gpu_worker("w2", 8, 512, 64),
                                           gpu_worker("w3", 8, 512, 64)};
  std::vector<JobView> jobs = {running("r1", 0, {"w1"}, 8), running("r2", 0, {"w2"}, 8),
                               running("r3", 0, {"w3"}, 8), queued("head", 0, 1, 1, 8)};
  jobs[0].estimated_end_ms = 100000;
  jobs[1].estimated_end_ms = 10000;  // unknown for r3
  ScheduleDecision d = schedule(workers, jobs, {1000});
  ASSERT_NE(reservation(d, "head"), nullptr);
  EXPECT_EQ(reserved_workers(d, "head"), std::vector<std::string>{"w2"});
  EXPECT_EQ(reservation(d, "head")->earliest_start_ms, 10000);
  EXPECT_EQ(reason(d, "head"),
            "waiting: needs 1 worker with 8 GPU or CPU slots; 0 fit now; head of the queue, "
            "reserved w2 (earliest start in 9 s)");

  // No end times: the worker closest to fitting (smallest shortfall), then id.
  jobs = {running("r1", 0, {"w1"}, 7), running("r2", 0, {"w2"}, 3), running("r3", 0, {"w3"}, 3),
          queued("head", 0, 1, 1, 8)};
  d = schedule(workers, jobs, {1000});
  ASSERT_NE(reservation(d, "head"), nullptr);
  EXPECT_EQ(reserved_workers(d, "head"), std::vector<std::string>{"w2"});
  EXPECT_EQ(reservation(d, "head")->earliest_start_ms, -1);
}

TEST(Scheduler, HeadKeepsItsReservationSoABackfilledJobCannotDelayIt) {
  // Pass 1: the head (8 GPUs) reserves w2 (shortfall 6; w4's is 7), and `small` backfills
  // onto w4's free GPU.
  const std::vector<WorkerView> workers = {gpu_worker("w2", 8, 512, 64), gpu_worker("w4", 8, 512, 64)};
  std::vector<JobView> jobs = {running("r2", 0, {"w2"}, 6), running("r4", 0, {"w4"}, 7),
                               queued("head", 0, 1, 1, 8), queued("small", 0, 2, 1, 1)};
  ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_EQ(reserved_workers(d, "head"), std::vector<std::string>{"w2"});
  EXPECT_EQ(assigned(d, "small"), std::vector<std::string>{"w4"});
  apply(d, &jobs, 0);
  // Pass 2: r4 ends, so w4 is now closer to fitting (only `small` left on it). Moving the
  // reservation there would make the head wait for the job that backfilled; it stays.
  erase_job(&jobs, "r4");
  for (JobView& j : jobs)
    if (j.id == "head") j.reserved_workers = reserved_workers(d, "head");
  d = schedule(workers, jobs, {});
  EXPECT_EQ(reserved_workers(d, "head"), std::vector<std::string>{"w2"});
  // Without the previous reservation passed back, the head would move onto w4.
  for (JobView& j : jobs) j.reserved_workers.clear();
  EXPECT_EQ(reserved_workers(schedule(workers, jobs, {}), "head"), std::vector<std::string>{"w4"});
  // A worker that fits now always wins: the head starts there.
  jobs.push_back(running("r5", 0, {}, 1));
  const std::vector<WorkerView> more = {workers[0], workers[1], gpu_worker("w5", 8, 512, 64)};
  for (JobView& j : jobs)
    if (j.id == "head") j.reserved_workers = {"w2"};
  EXPECT_EQ(assigned(schedule(more, jobs, {}), "head"), std::vector<std::string>{"w5"});
}

// --- Preemption ---

TEST(Scheduler, PreemptsTheLowestPriorityJobFirst) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8)};
  const std::vector<JobView> jobs = {running("p1", 1, {"w1"}, 1, 0), running("p0", 0, {"w2"}, 1, 0),
                                     queued("urgent", 5, 1, 1, 1)};
  const ScheduleDecision d = schedule(workers, jobs, {1000});
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"p0", "urgent"}}));
  EXPECT_TRUE(d.assignments.empty()) << "the preemptor waits for its victim to checkpoint";
  EXPECT_EQ(reason(d, "urgent"),
            "preempting p0 (checkpoint, then requeue); needs 1 worker with 1 GPU or CPU slot; reserved w2");
}

TEST(Scheduler, AmongEqualPrioritiesPreemptsTheMostRecentlyStarted) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8)};
  const std::vector<JobView> jobs = {running("old", 0, {"w1"}, 1, 100), running("new", 0, {"w2"}, 1, 200),
                                     queued("urgent", 5, 1, 1, 1)};
  const ScheduleDecision d = schedule(workers, jobs, {1000});
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"new", "urgent"}}));
}

TEST(Scheduler, JobsYoungerThanMinRuntimeAreNotPreempted) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8)};
  const std::vector<JobView> jobs = {running("p0-young", 0, {"w1"}, 1, 950),
                                     running("p1-old", 1, {"w2"}, 1, 0), queued("urgent", 5, 1, 1, 1)};
  ScheduleOptions o{1000, /*min_runtime=*/100};
  ScheduleDecision d = schedule(workers, jobs, o);
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"p1-old", "urgent"}}));
  o.preemption_min_runtime_ms = 2000;
  d = schedule(workers, jobs, o);
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_EQ(reason(d, "urgent"),
            "waiting: needs 1 worker with 1 GPU or CPU slot; 0 fit now; head of the queue, "
            "reserved w1 (earliest start unknown)");
}

TEST(Scheduler, NoPreemptionWhenTheVictimsWouldNotMakeThePreemptorFit) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8)};
  const std::vector<JobView> jobs = {running("low", 0, {"w1"}, 1, 0), running("vip", 9, {"w2"}, 1, 0),
                                     queued("pair", 5, 1, 2, 1)};
  const ScheduleDecision d = schedule(workers, jobs, {1000});
  EXPECT_TRUE(d.preemptions.empty()) << "evicting `low` frees one worker of the two `pair` needs";
  EXPECT_EQ(
      reason(d, "pair"),
      "waiting: needs 2 workers each with 1 GPU or CPU slot; 0 fit now; head of the queue, reserved w1, w2 "
      "(earliest start unknown); preempting lower-priority jobs would not make it fit");
}

TEST(Scheduler, NoPreemptionWhenHostRamStaysShort) {
  // The victim frees the GPU but the co-located high-priority job keeps the RAM.
  const std::vector<WorkerView> workers = {gpu_worker("w1", 2, 128, 16)};
  const std::vector<JobView> jobs = {running("low", 0, {"w1"}, 1, 0, 8), running("vip", 9, {"w1"}, 1, 0, 100),
                                     queued("ram-hungry", 5, 1, 1, 1, 64)};
  const ScheduleDecision d = schedule(workers, jobs, {1000});
  EXPECT_TRUE(d.preemptions.empty());
}

TEST(Scheduler, EqualPriorityNeverPreempts) {
  // Evicting `low` alone frees 1 of the 2 GPUs; `peer` has the preemptor's priority.
  const std::vector<WorkerView> workers = {gpu_worker("w1", 2, 64, 8)};
  const std::vector<JobView> jobs = {running("low", 0, {"w1"}, 1, 0), running("peer", 5, {"w1"}, 1, 0),
                                     queued("same", 5, 1, 1, 2)};
  const ScheduleDecision d = schedule(workers, jobs, {100000});
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_EQ(reason(d, "same"),
            "waiting: needs 1 worker with 2 GPU or CPU slots; 0 fit now; head of the queue, "
            "reserved w1 (earliest start unknown); preempting lower-priority jobs would not make "
            "it fit");
}

TEST(Scheduler, AVictimIsNeverCountedTwice) {
  // p1 evicts `gang`, which also frees one GPU of w2; p2 needs both of w2's GPUs, and the
  // other one belongs to a higher-priority job: p2 must wait, not evict `gang` again.
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 2, 64, 8)};
  const std::vector<JobView> jobs = {running("gang", 0, {"w1", "w2"}, 1, 100),
                                     running("x", 9, {"w2"}, 1, 100), queued("p1", 5, 1, 1, 1),
                                     queued("p2", 5, 2, 1, 2)};
  const ScheduleDecision d = schedule(workers, jobs, {1000});
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"gang", "p1"}}));
  EXPECT_EQ(reason(d, "p2"),
            "waiting: needs 1 worker with 2 GPU or CPU slots; 0 fit now; preempting lower-priority "
            "jobs would not make it fit");
}

TEST(Scheduler, PreemptsAnIrreducibleSetSparingTheJobsItDoesNotNeed) {
  // Eviction order: a (prio 0, newest), b (prio 0), c (prio 1). a alone frees 2 of the 4
  // GPUs needed, a + b frees 6; b alone suffices, so a is spared.
  const std::vector<WorkerView> workers = {gpu_worker("w1", 8, 512, 64)};
  const std::vector<JobView> jobs = {running("a", 0, {"w1"}, 2, 300), running("b", 0, {"w1"}, 4, 200),
                                     running("c", 1, {"w1"}, 2, 100), queued("p", 5, 1, 1, 4)};
  const ScheduleDecision d = schedule(workers, jobs, {1000});
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"b", "p"}}));
}

TEST(Scheduler, VictimsOfAGangAreFreedOnEveryWorker) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8),
                                           gpu_worker("w3", 1, 64, 8)};
  const std::vector<JobView> jobs = {running("solo", 0, {"w1"}, 1, 500),
                                     running("gang", 0, {"w2", "w3"}, 1, 100), queued("pair", 5, 1, 2, 1)};
  const ScheduleDecision d = schedule(workers, jobs, {1000});
  // solo (newest) alone frees one worker; then gang frees two, after which solo is not needed.
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"gang", "pair"}}));
  EXPECT_EQ(reserved_workers(d, "pair"), (std::vector<std::string>{"w2", "w3"}));
}

TEST(Scheduler, TwoPendingJobsEvictOnlyOneVictimEach) {
  // KAI-Scheduler#136: two pending 1-GPU jobs must not cancel more than two running jobs.
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8),
                                           gpu_worker("w3", 1, 64, 8)};
  const std::vector<JobView> jobs = {running("r1", 0, {"w1"}, 1, 100), running("r2", 0, {"w2"}, 1, 200),
                                     running("r3", 0, {"w3"}, 1, 300), queued("p1", 5, 1, 1, 1),
                                     queued("p2", 5, 2, 1, 1)};
  const ScheduleDecision d = schedule(workers, jobs, {1000});
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"r3", "p1"}, {"r2", "p2"}}));
  EXPECT_EQ(reserved_workers(d, "p1"), std::vector<std::string>{"w3"});
  EXPECT_EQ(reserved_workers(d, "p2"), std::vector<std::string>{"w2"});
}

TEST(Scheduler, SecondPreemptorUsesWhatTheFirstOnesGangVictimFreesElsewhere) {
  // Evicting `gang` frees w1 and w2; p1 needs one of them, p2 takes the other instead of
  // evicting `other`.
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8), gpu_worker("w2", 1, 64, 8),
                                           gpu_worker("w3", 1, 64, 8)};
  std::vector<JobView> jobs = {running("gang", 0, {"w1", "w2"}, 1, 100), running("other", 0, {"w3"}, 1, 50),
                               queued("p1", 5, 1, 1, 1), queued("p2", 5, 2, 1, 1)};
  ScheduleDecision d = schedule(workers, jobs, {1000});
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"gang", "p1"}}));
  EXPECT_EQ(reason(d, "p1"),
            "preempting gang (checkpoint, then requeue); needs 1 worker with 1 GPU or CPU slot; "
            "reserved w1");
  EXPECT_EQ(reason(d, "p2"),
            "waiting for preempted job gang to checkpoint; needs 1 worker with 1 GPU or CPU slot; "
            "reserved w2");
  // Next pass, `gang` is checkpointing: still nothing more is evicted.
  apply(d, &jobs, 1000);
  d = schedule(workers, jobs, {2000});
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_EQ(reserved_workers(d, "p1"), std::vector<std::string>{"w1"});
  EXPECT_EQ(reserved_workers(d, "p2"), std::vector<std::string>{"w2"});
}

TEST(Scheduler, PreemptorWaitsForItsVictimsAndNothingBackfillsOntoThem) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 4, 256, 32)};
  std::vector<JobView> jobs = {running("low", 0, {"w1"}, 2, 0), queued("urgent", 5, 1, 1, 4),
                               queued("filler", 0, 2, 1, 2)};
  // Pass 1: evict `low`; the 2 free GPUs are held for `urgent`.
  ScheduleDecision d = schedule(workers, jobs, {1000});
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"low", "urgent"}}));
  EXPECT_EQ(
      reason(d, "filler"),
      "blocked behind head job urgent (reservation): needs 1 worker with 2 GPU or CPU slots; 0 fit outside "
      "reservations");
  // Pass 2: `low` is checkpointing; no second victim, no backfill.
  apply(d, &jobs, 1000);
  d = schedule(workers, jobs, {2000});
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_TRUE(d.assignments.empty());
  EXPECT_EQ(
      reason(d, "urgent"),
      "waiting for preempted job low to checkpoint; needs 1 worker with 4 GPU or CPU slots; reserved w1");
  // Pass 3: `low` exited and was requeued (keeping its submit_seq); `urgent` starts, and
  // `low` cannot preempt it back (lower priority).
  for (JobView& j : jobs)
    if (j.id == "low") j = queued("low", 0, 0, 1, 2);
  d = schedule(workers, jobs, {3000});
  EXPECT_EQ(assigned_jobs(d), std::vector<std::string>{"urgent"});
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_EQ(reason(d, "low"),
            "waiting: needs 1 worker with 2 GPU or CPU slots; 0 fit now; head of the queue, "
            "reserved w1 (earliest start unknown)");
}

TEST(Scheduler, PreemptionOffNeverEvicts) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8)};
  const std::vector<JobView> jobs = {running("low", 0, {"w1"}, 1, 0), queued("urgent", 5, 1, 1, 1)};
  ScheduleOptions o{1000};
  o.preemption = false;
  EXPECT_TRUE(schedule(workers, jobs, o).preemptions.empty());
  o.preemption = true;
  EXPECT_EQ(schedule(workers, jobs, o).preemptions.size(), 1u);
}

// --- Skipping jobs that stay unplaceable (rule 8) ---

bool same(const ScheduleDecision& a, const ScheduleDecision& b);  // below

// What the coordinator passes back after a pass of `generation`: the reservations, and the
// generation at which each waiting job was found stable.
void feed_back(const ScheduleDecision& d, std::vector<JobView>* jobs, int64_t generation) {
  for (JobView& j : *jobs) {
    if (j.state != JobState::kQueued) continue;
    j.reserved_workers = reserved_workers(d, j.id);
    for (const WaitingJob& w : d.waiting)
      if (w.job_id == j.id) j.unplaceable_generation = w.stable ? generation : -1;
  }
}

std::vector<std::string> waiting_jobs(const ScheduleDecision& d) {
  std::vector<std::string> ids;
  for (const WaitingJob& w : d.waiting) ids.push_back(w.job_id);
  return ids;
}

TEST(Scheduler, StableJobIsSkippedUntilTheGenerationChanges) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 8, 512, 64)};
  std::vector<JobView> jobs = {running("r1", 0, {"w1"}, 8), queued("head", 0, 1, 1, 4),
                               queued("small", 0, 2, 1, 1), queued("huge", 0, 3, 1, 9)};
  ScheduleOptions o;
  o.generation = 7;
  ScheduleDecision d = schedule(workers, jobs, o);
  EXPECT_EQ(d.skipped, 0);
  ASSERT_EQ(d.waiting.size(), 3u);
  EXPECT_FALSE(d.waiting[0].stable) << "the head holds a reservation";
  EXPECT_TRUE(d.waiting[1].stable);
  EXPECT_TRUE(d.waiting[2].stable);
  feed_back(d, &jobs, 7);

  // Same generation, one more job queued: only the head and the new job are evaluated.
  jobs.push_back(queued("late", 0, 4, 1, 1));
  d = schedule(workers, jobs, o);
  EXPECT_EQ(d.skipped, 2);
  EXPECT_EQ(waiting_jobs(d), (std::vector<std::string>{"head", "late"}));
  EXPECT_TRUE(d.assignments.empty());
  EXPECT_EQ(reserved_workers(d, "head"), std::vector<std::string>{"w1"});
  feed_back(d, &jobs, 7);

  // r1 ends: a new generation, and every job is evaluated again.
  erase_job(&jobs, "r1");
  o.generation = 8;
  d = schedule(workers, jobs, o);
  EXPECT_EQ(d.skipped, 0);
  EXPECT_EQ(assigned_jobs(d), (std::vector<std::string>{"head", "small", "late"}));
  EXPECT_EQ(waiting_jobs(d), std::vector<std::string>{"huge"});
  // generation -1 never skips, whatever the marks say.
  o.generation = -1;
  feed_back(d, &jobs, -1);
  EXPECT_EQ(schedule(workers, jobs, o).skipped, 0);
}

TEST(Scheduler, ANewHeadMakesThePassReconsiderSkippedJobs) {
  // w1 has 1 free GPU, held by the head's reservation; `small` waits behind it (stable).
  std::vector<WorkerView> workers = {gpu_worker("w1", 4, 256, 32), gpu_worker("w2", 4, 256, 32)};
  workers[1].labels = {{"zone", "b"}};
  std::vector<JobView> jobs = {running("r1", 0, {"w1"}, 3), running("r2", 0, {"w2"}, 4),
                               queued("head", 0, 1, 1, 4), queued("small", 0, 2, 1, 1)};
  ScheduleOptions o;
  o.preemption = false;
  o.generation = 1;
  ScheduleDecision d = schedule(workers, jobs, o);
  EXPECT_EQ(reserved_workers(d, "head"), std::vector<std::string>{"w1"});
  EXPECT_EQ(reason(d, "small").rfind("blocked behind head job head (reservation)", 0), 0u)
      << reason(d, "small");
  feed_back(d, &jobs, 1);

  // A higher-priority job that only w2 can take becomes the head and reserves w2; the old
  // head no longer reserves w1, so `small` fits there now. Skipping it would leave it
  // waiting: the reservations moved, so the pass runs again over every job.
  JobView urgent = queued("urgent", 1, 3, 1, 4);
  urgent.node_selector = {{"zone", "b"}};
  jobs.push_back(urgent);
  d = schedule(workers, jobs, o);
  EXPECT_EQ(d.skipped, 0);
  EXPECT_EQ(assigned(d, "small"), std::vector<std::string>{"w1"});
  EXPECT_EQ(reserved_workers(d, "urgent"), std::vector<std::string>{"w2"});
  EXPECT_EQ(reservation(d, "head"), nullptr);
  ScheduleOptions full = o;
  full.generation = -1;
  EXPECT_TRUE(same(d, schedule(workers, jobs, full)));
}

TEST(Scheduler, TheHeadIsEvaluatedEveryPassSoNothingBackfillsOntoItsReservation) {
  // The head needs all 8 GPUs of w1, where 2 are free: it holds them. Even marked stable
  // (a stale mark), a job holding a reservation is never skipped, so a later 1-GPU job
  // cannot take what the head holds.
  const std::vector<WorkerView> workers = {gpu_worker("w1", 8, 512, 64)};
  std::vector<JobView> jobs = {running("r1", 0, {"w1"}, 6), queued("head", 0, 1, 1, 8),
                               queued("two", 0, 2, 1, 2)};
  ScheduleOptions o;
  o.generation = 3;
  ScheduleDecision d = schedule(workers, jobs, o);
  EXPECT_TRUE(d.assignments.empty());
  feed_back(d, &jobs, 3);
  for (JobView& j : jobs) j.unplaceable_generation = 3;
  jobs.push_back(queued("one", 0, 3, 1, 1));
  d = schedule(workers, jobs, o);
  EXPECT_EQ(d.skipped, 1);  // `two`
  EXPECT_TRUE(d.assignments.empty());
  EXPECT_EQ(reserved_workers(d, "head"), std::vector<std::string>{"w1"});
  EXPECT_EQ(reason(d, "one").rfind("blocked behind head job head (reservation)", 0), 0u) << reason(d, "one");
}

TEST(Scheduler, SkippedJobPreemptsOnceTheCallerMarksANewVictim) {
  // `head` (H100 only) reserves w2; `mid` could evict `low` on w1, but `low` has run less
  // than the minimum: mid waits, stable, and the decision says when `low` becomes a victim.
  const std::vector<WorkerView> workers = {gpu_worker("w1", 4, 256, 32, "A100"),
                                           gpu_worker("w2", 4, 256, 32, "H100")};
  JobView head = queued("head", 5, 1, 1, 4);
  head.gpu_model = "H100";
  JobView mid = queued("mid", 3, 2, 1, 4);
  mid.gpu_model = "A100";
  std::vector<JobView> jobs = {running("low", 0, {"w1"}, 4, 0), running("top", 9, {"w2"}, 4, 3000), head,
                               mid};
  ScheduleOptions o{1000, 10000};
  o.generation = 1;
  ScheduleDecision d = schedule(workers, jobs, o);
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_EQ(d.next_preemptable_ms, 10000);  // low: 0 + 10000 (top: 13000)
  feed_back(d, &jobs, 1);
  o.now_ms = 5000;
  d = schedule(workers, jobs, o);
  EXPECT_EQ(d.skipped, 1);
  EXPECT_TRUE(d.preemptions.empty());
  // At next_preemptable_ms the caller changes the generation: mid is evaluated and evicts low.
  o.now_ms = 10000;
  o.generation = 2;
  d = schedule(workers, jobs, o);
  EXPECT_EQ(d.skipped, 0);
  EXPECT_EQ(preemptions(d), (std::vector<std::pair<std::string, std::string>>{{"low", "mid"}}));
  EXPECT_EQ(d.next_preemptable_ms, 13000);
}

// --- Inputs ---

TEST(Scheduler, InvalidDemandIsReportedAndDoesNotStopThePass) {
  const std::vector<WorkerView> workers = {gpu_worker("w1", 1, 64, 8)};
  const std::vector<JobView> jobs = {queued("zero-workers", 9, 1, 0, 1), queued("ok", 0, 2, 1, 1)};
  const ScheduleDecision d = schedule(workers, jobs, {});
  EXPECT_EQ(reason(d, "zero-workers"), "invalid demand: workers must be >= 1, got 0");
  EXPECT_EQ(assigned(d, "ok"), std::vector<std::string>{"w1"});
  EXPECT_THROW(schedule({workers[0], workers[0]}, jobs, {}), std::invalid_argument);
  EXPECT_THROW(schedule(workers, {jobs[1], jobs[1]}, {}), std::invalid_argument);
}

// --- Restarts ---

TEST(Scheduler, LostWorkerRequeuesUntilMaxRestartsThenFails) {
  RestartDecision r = decide_restart_after_lost_worker("w7", 0, 3);
  EXPECT_TRUE(r.requeue);
  EXPECT_EQ(r.restarts_used, 1);
  EXPECT_EQ(r.reason, "worker w7 lost; requeued (restart 1 of 3)");
  r = decide_restart_after_lost_worker("w7", 2, 3);
  EXPECT_TRUE(r.requeue);
  EXPECT_EQ(r.restarts_used, 3);
  EXPECT_EQ(r.reason, "worker w7 lost; requeued (restart 3 of 3)");
  r = decide_restart_after_lost_worker("w7", 3, 3);
  EXPECT_FALSE(r.requeue);
  EXPECT_EQ(r.restarts_used, 3);
  EXPECT_EQ(r.reason, "worker w7 lost; restarts 3 of 3 used");
  r = decide_restart_after_lost_worker("w1", 0, 0);
  EXPECT_FALSE(r.requeue);
  EXPECT_EQ(r.reason, "worker w1 lost; restarts 0 of 0 used");
}

// --- host_memory_gb: auto ---

TEST(HostMemory, BytesPerRankForEachModeAndRankCount) {
  HostMemoryInputs m;
  m.total_params = 1000001;
  m.split_params = 900000;
  m.overhead_bytes = 0;
  auto at = [&](OffloadMode mode, int64_t weight_bytes, int64_t ranks) {
    m.mode = mode;
    m.weight_bytes = weight_bytes;
    m.ranks = ranks;
    return host_memory_bytes_per_rank(m);
  };
  EXPECT_EQ(at(OffloadMode::kDevice, 4, 1), 0);
  EXPECT_EQ(at(OffloadMode::kDevice, 2, 4), 0);
  // offload: every parameter; 40 B fp32, 32 B bf16 on one rank, 34 B bf16 on several.
  EXPECT_EQ(at(OffloadMode::kOffload, 4, 1), 1000001 * 40);
  EXPECT_EQ(at(OffloadMode::kOffload, 2, 1), 1000001 * 32);
  EXPECT_EQ(at(OffloadMode::kOffload, 4, 4), 250001 * 40);  // ceil(1000001 / 4)
  EXPECT_EQ(at(OffloadMode::kOffload, 2, 4), 250001 * 34);
  // zenflow: the split parameters only.
  EXPECT_EQ(at(OffloadMode::kZenFlow, 4, 1), 900000 * 40);
  EXPECT_EQ(at(OffloadMode::kZenFlow, 2, 1), 900000 * 32);
  EXPECT_EQ(at(OffloadMode::kZenFlow, 4, 4), 225000 * 40);
  EXPECT_EQ(at(OffloadMode::kZenFlow, 2, 4), 225000 * 34);
  // The overhead is per rank, added once.
  m.overhead_bytes = 2LL << 30;
  EXPECT_EQ(at(OffloadMode::kZenFlow, 2, 4), (2LL << 30) + 225000 * 34);
  EXPECT_EQ(at(OffloadMode::kDevice, 2, 4), 2LL << 30);
}

// --- optimizer nodes (rule 9) ---

NodeView node(const std::string& id, int64_t ram_gib, bool schedulable = true) {
  NodeView n;
  n.id = id;
  n.host_memory_bytes = ram_gib * kGiB;
  n.cores = 8;
  n.schedulable = schedulable;
  return n;
}

JobView with_nodes(JobView j, int64_t nodes, int64_t node_ram_gib) {
  j.optimizer_nodes = nodes;
  j.node_memory_bytes = node_ram_gib * kGiB;
  return j;
}

std::vector<std::string> nodes_of(const ScheduleDecision& d, const std::string& job) {
  for (const Assignment& a : d.assignments)
    if (a.job_id == job) return a.node_ids;
  return {};
}

// Gang with the workers: the job starts only with its nodes, on the tightest ones that
// hold its share, never on a node another running job holds or a LOST one.
TEST(SchedulerNodes, NodesAreTakenWithTheWorkersBestFitAndExclusively) {
  const std::vector<WorkerView> w = {gpu_worker("w1", 8, 512, 64)};
  const std::vector<NodeView> n = {node("big", 512), node("small", 128), node("mid", 256), node("lost", 128, false),
                                   node("busy", 128)};
  JobView other = running("other", 0, {"w1"}, 1);
  other.node_placement = {"busy"};
  const ScheduleDecision d =
      schedule(w, {other, with_nodes(queued("a", 0, 1, 1, 1), 2, 100), with_nodes(queued("b", 0, 2, 1, 1), 1, 100)},
               ScheduleOptions{}, n);
  EXPECT_EQ(assigned(d, "a"), (std::vector<std::string>{"w1"}));
  EXPECT_EQ(nodes_of(d, "a"), (std::vector<std::string>{"small", "mid"}));
  EXPECT_EQ(nodes_of(d, "b"), (std::vector<std::string>{"big"}));
  // A third job finds no free node: its workers fit, it waits for nodes, naming them.
  const ScheduleDecision d2 = schedule(
      w, {other, with_nodes(queued("c", 0, 1, 1, 1), 1, 100)}, ScheduleOptions{},
      {node("busy", 128), node("lost", 128, false)});
  EXPECT_TRUE(d2.assignments.empty());
  EXPECT_NE(reason(d2, "c").find("needs 1 optimizer node with 100 GiB host RAM; 0 free"), std::string::npos)
      << reason(d2, "c");
  // Without nodes, a job that needs none starts as before.
  EXPECT_EQ(assigned(schedule(w, {queued("plain", 0, 1, 1, 1)}, ScheduleOptions{}, {}), "plain"),
            (std::vector<std::string>{"w1"}));
}

TEST(SchedulerNodes, TooFewNodesThatCouldEverHoldTheShareIsUnschedulableAndBlocksNoOne) {
  const std::vector<WorkerView> w = {gpu_worker("w1", 8, 512, 64)};
  const std::vector<NodeView> n = {node("n1", 64), node("n2", 512)};
  const ScheduleDecision d = schedule(
      w, {with_nodes(queued("huge", 10, 1, 1, 1), 2, 100), with_nodes(queued("ok", 0, 2, 1, 1), 1, 100)},
      ScheduleOptions{}, n);
  EXPECT_EQ(reason(d, "huge"),
            "unschedulable: needs 2 optimizer nodes each with 100 GiB host RAM; only 1 schedulable optimizer "
            "node could ever hold one");
  EXPECT_EQ(nodes_of(d, "ok"), (std::vector<std::string>{"n2"}));
  EXPECT_TRUE(d.reservations.empty());
}

// The head holds the nodes it will take: a later job that fits on other workers does not
// backfill onto them, but may take a node the head does not need.
TEST(SchedulerNodes, TheHeadHoldsItsNodesAgainstBackfill) {
  const std::vector<WorkerView> w = {gpu_worker("w1", 2, 512, 64), gpu_worker("w2", 2, 512, 64)};
  const std::vector<NodeView> n = {node("n1", 128), node("n2", 128), node("n3", 128)};
  // The head needs 2 whole workers and 2 nodes; w1 is busy, so it reserves w1 and w2.
  const JobView busy = running("busy", 0, {"w1"}, 2);
  const ScheduleDecision d = schedule(w,
                                      {busy, with_nodes(queued("head", 0, 1, 2, 2), 2, 100),
                                       with_nodes(queued("later", 0, 2, 1, 1), 2, 100),
                                       with_nodes(queued("small", 0, 3, 1, 1), 1, 100)},
                                      ScheduleOptions{}, n);
  ASSERT_EQ(d.reservations.size(), 1u);
  EXPECT_EQ(d.reservations[0].job_id, "head");
  // w2 is reserved whole (the head needs both its GPUs): the others are blocked on workers,
  // and neither takes the head's nodes.
  EXPECT_TRUE(nodes_of(d, "later").empty());
  EXPECT_TRUE(nodes_of(d, "small").empty());

  // On a cluster where the backfill fits on workers, it may only take the unheld node.
  const std::vector<WorkerView> w3 = {gpu_worker("w1", 2, 512, 64), gpu_worker("w2", 2, 512, 64),
                                      gpu_worker("w3", 1, 512, 64)};
  const ScheduleDecision d3 = schedule(w3,
                                       {busy, with_nodes(queued("head", 0, 1, 2, 2), 2, 100),
                                        with_nodes(queued("later", 0, 2, 1, 1), 2, 100),
                                        with_nodes(queued("small", 0, 3, 1, 1), 1, 100)},
                                       ScheduleOptions{}, n);
  EXPECT_TRUE(assigned(d3, "later").empty());  // needs 2 nodes, only n3 is unheld
  EXPECT_NE(reason(d3, "later").find("needs 2 optimizer nodes each with 100 GiB host RAM; 1 free (2 more held "
                                     "for job head)"),
            std::string::npos)
      << reason(d3, "later");
  EXPECT_EQ(assigned(d3, "small"), (std::vector<std::string>{"w3"}));
  EXPECT_EQ(nodes_of(d3, "small"), (std::vector<std::string>{"n3"}));
}

// Eviction frees workers, never nodes: a higher-priority job short of nodes does not preempt.
TEST(SchedulerNodes, AJobShortOfNodesDoesNotPreempt) {
  const std::vector<WorkerView> w = {gpu_worker("w1", 1, 512, 64)};
  JobView low = running("low", 0, {"w1"}, 1);
  low.node_placement = {"n1"};
  ScheduleOptions o{1000, /*min_runtime=*/0};
  const ScheduleDecision d =
      schedule(w, {low, with_nodes(queued("high", 10, 1, 1, 1), 1, 10)}, o, {node("n1", 128)});
  EXPECT_TRUE(d.preemptions.empty());
  EXPECT_NE(reason(d, "high").find("needs 1 optimizer node with 10 GiB host RAM; 0 free"), std::string::npos)
      << reason(d, "high");
  // With a spare node it does preempt for the worker, and holds the spare meanwhile.
  const ScheduleDecision d2 =
      schedule(w, {low, with_nodes(queued("high", 10, 1, 1, 1), 1, 10)}, o, {node("n1", 128), node("n2", 128)});
  ASSERT_EQ(d2.preemptions.size(), 1u);
  EXPECT_EQ(d2.preemptions[0].victim_job_id, "low");
  const ScheduleDecision d3 = schedule(w,
                                       {low, with_nodes(queued("high", 10, 1, 1, 1), 1, 10),
                                        with_nodes(queued("other", 0, 2, 1, 1), 1, 10)},
                                       o, {node("n1", 128), node("n2", 128)});
  EXPECT_TRUE(nodes_of(d3, "other").empty());
  EXPECT_EQ(d3.preemptions.size(), 1u);
}

TEST(SchedulerNodes, DuplicateNodeIdsAndNegativeDemandsAreRefused) {
  const std::vector<WorkerView> w = {gpu_worker("w1", 1, 512, 64)};
  EXPECT_THROW(schedule(w, {}, ScheduleOptions{}, {node("n", 1), node("n", 2)}), std::invalid_argument);
  const ScheduleDecision d =
      schedule(w, {with_nodes(queued("bad", 0, 1, 1, 1), -1, 1)}, ScheduleOptions{}, {node("n", 1)});
  EXPECT_EQ(reason(d, "bad"), "invalid demand: optimizer nodes must be >= 0");
}

TEST(HostMemory, SevenBillionZenflowModelOnOneAndEightRanks) {
  HostMemoryInputs m;
  m.total_params = 6738415616;
  m.split_params = 6738149376;
  m.mode = OffloadMode::kZenFlow;
  m.weight_bytes = 2;
  m.ranks = 1;
  EXPECT_EQ(host_memory_bytes_per_rank(m), (2LL << 30) + 6738149376LL * 32);  // 202.8 GiB
  m.ranks = 8;
  EXPECT_EQ(host_memory_bytes_per_rank(m), (2LL << 30) + 842268672LL * 34);  // 28.7 GiB
}

TEST(HostMemory, RejectsImpossibleInputs) {
  HostMemoryInputs m;
  m.total_params = 10;
  m.split_params = 11;
  EXPECT_THROW(host_memory_bytes_per_rank(m), std::invalid_argument);
  m.split_params = 5;
  m.ranks = 0;
  EXPECT_THROW(host_memory_bytes_per_rank(m), std::invalid_argument);
  m.ranks = 1;
  m.weight_bytes = 8;
  EXPECT_THROW(host_memory_bytes_per_rank(m), std::invalid_argument);
  m.weight_bytes = 4;
  m.total_params = -1;
  EXPECT_THROW(host_memory_bytes_per_rank(m), std::invalid_argument);
}

// --- Random clusters: invariants, determinism, the T3 figures ---

struct Cluster {
  std::vector<WorkerView> workers;
  std::vector<JobView> jobs;
};

// Heterogeneous workers (8xA100/1 TiB, 8xH100/2 TiB, 4xL4/256 GiB, CPU 4 slots/128 GiB),
// about 60% of them busy, and `queued` jobs of mixed shapes, priorities and constraints.
Cluster make_cluster(int n_workers, int n_queued, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  Cluster c;
  for (int i = 0; i < n_workers; ++i) {
    char id[16];
    std::snprintf(id, sizeof id, "w%05d", i);
    WorkerView w;
    switch (pick(4)) {
      case 0:
        w = gpu_worker(id, 8, 1024, 96, "A100");
        break;
      case 1:
        w = gpu_worker(id, 8, 2048, 112, "H100");
        break;
      case 2:
        w = gpu_worker(id, 4, 256, 32, "L4");
        break;
      default:
        w = cpu_worker(id, 4, 128, 16);
        break;
    }
    w.labels = {{"zone", pick(2) ? "a" : "b"}};
    w.reserved = {0, 8 * kGiB, 2};
    w.schedulable = pick(50) != 0;
    c.workers.push_back(w);
  }
  int job_no = 0;
  for (int i = 0; i < n_workers; ++i) {
    if (pick(10) >= 6) continue;
    const WorkerView& w = c.workers[static_cast<size_t>(i)];
    const int64_t slots = w.gpus > 0 ? w.gpus : w.cpu_slots;
    JobView r = running("r" + std::to_string(job_no++), pick(3), {w.id}, 1 + pick(static_cast<int>(slots)),
                        pick(100000), 16 * (1 + pick(4)), 2 + pick(6));
    if (pick(2)) r.estimated_end_ms = 100000 + pick(1000000);
    c.jobs.push_back(r);
  }
  const int64_t slot_choices[] = {1, 1, 1, 2, 4, 8};
  const int64_t ram_choices[] = {8, 32, 64, 200, 400};
  for (int i = 0; i < n_queued; ++i) {
    JobView q = queued("q" + std::to_string(i), pick(5), i, pick(8) == 0 ? 2 + pick(3) : 1,
                       slot_choices[pick(6)], ram_choices[pick(5)], 4 * (1 + pick(4)));
    switch (pick(8)) {
      case 0:
        q.gpu_model = "H100";
        break;
      case 1:
        q.slot_kind = SlotKind::kCpu;
        q.per_worker.slots = 1 + pick(2);
        q.per_worker.host_memory_bytes = 16 * kGiB;
        break;
      case 2:
        q.node_selector = {{"zone", "a"}};
        break;
      case 3:
        q.slot_kind = SlotKind::kGpu;
        break;
      default:
        break;
    }
    c.jobs.push_back(q);
  }
  return c;
}

// Checks a decision against the rules it must never break.
void expect_invariants(const Cluster& c, const ScheduleDecision& d, const ScheduleOptions& o) {
  std::map<std::string, const WorkerView*> workers;
  for (const WorkerView& w : c.workers) workers[w.id] = &w;
  std::map<std::string, const JobView*> jobs;
  for (const JobView& j : c.jobs) jobs[j.id] = &j;
  std::map<std::string, Resources> used;
  for (const JobView& j : c.jobs)
    if (j.state != JobState::kQueued)
      for (const std::string& w : j.placement) {
        used[w].slots += j.per_worker.slots;
        used[w].host_memory_bytes += j.per_worker.host_memory_bytes;
        used[w].cores += j.per_worker.cores;
      }
  std::map<std::string, Resources> free_before;
  for (const WorkerView& w : c.workers) {
    const Resources& u = used[w.id];
    free_before[w.id] = {(w.gpus > 0 ? w.gpus : w.cpu_slots) - w.reserved.slots - u.slots,
                         w.host_memory_bytes - w.reserved.host_memory_bytes - u.host_memory_bytes,
                         w.physical_cores - w.reserved.cores - u.cores};
  }
  size_t queued_count = 0;
  for (const JobView& j : c.jobs) queued_count += j.state == JobState::kQueued;
  EXPECT_EQ(d.assignments.size() + d.waiting.size(), queued_count)
      << "every queued job is placed or explained";
  for (const Assignment& a : d.assignments) {
    const JobView& j = *jobs.at(a.job_id);
    EXPECT_EQ(static_cast<int64_t>(a.worker_ids.size()), j.workers) << a.job_id;
    std::vector<std::string> distinct = a.worker_ids;
    std::sort(distinct.begin(), distinct.end());
    EXPECT_EQ(std::unique(distinct.begin(), distinct.end()), distinct.end()) << a.job_id;
    for (const std::string& w : a.worker_ids) {
      const WorkerView& wv = *workers.at(w);
      EXPECT_TRUE(wv.schedulable) << a.job_id << " on " << w;
      if (!j.gpu_model.empty()) {
        EXPECT_EQ(wv.gpu_model, j.gpu_model);
      }
      if (j.slot_kind == SlotKind::kCpu) {
        EXPECT_EQ(wv.gpus, 0);
      }
      if (j.slot_kind == SlotKind::kGpu) {
        EXPECT_GT(wv.gpus, 0);
      }
      for (const auto& [k, v] : j.node_selector) EXPECT_EQ(wv.labels.at(k), v);
      used[w].slots += j.per_worker.slots;
      used[w].host_memory_bytes += j.per_worker.host_memory_bytes;
      used[w].cores += j.per_worker.cores;
    }
  }
  for (const WorkerView& w : c.workers) {
    const Resources& u = used[w.id];
    const Resources& before = free_before[w.id];
    const bool over = u.slots + w.reserved.slots > (w.gpus > 0 ? w.gpus : w.cpu_slots) ||
                      u.host_memory_bytes + w.reserved.host_memory_bytes > w.host_memory_bytes ||
                      u.cores + w.reserved.cores > w.physical_cores;
    // A worker already over-committed by its running jobs gets nothing more.
    const bool was_over = before.slots < 0 || before.host_memory_bytes < 0 || before.cores < 0;
    EXPECT_FALSE(over && !was_over) << w.id << " over-committed by this pass";
  }
  // Reserved capacity stays free: min(free when reserved, demand) per resource, where
  // "when reserved" counts the jobs ahead of the reserving one in queue order.
  auto ahead = [](const JobView& x, const JobView& y) {
    if (x.priority != y.priority) return x.priority > y.priority;
    if (x.submit_seq != y.submit_seq) return x.submit_seq < y.submit_seq;
    return x.id < y.id;
  };
  std::map<std::string, std::vector<const JobView*>> placed_here;  // this decision's jobs per worker
  for (const Assignment& a : d.assignments)
    for (const std::string& w : a.worker_ids) placed_here[w].push_back(jobs.at(a.job_id));
  for (const Reservation& r : d.reservations) {
    const JobView& j = *jobs.at(r.job_id);
    for (const std::string& w : r.worker_ids) {
      const WorkerView& wv = *workers.at(w);
      const Resources& u = used[w];
      const Resources after = {(wv.gpus > 0 ? wv.gpus : wv.cpu_slots) - wv.reserved.slots - u.slots,
                               wv.host_memory_bytes - wv.reserved.host_memory_bytes - u.host_memory_bytes,
                               wv.physical_cores - wv.reserved.cores - u.cores};
      Resources b = free_before[w];
      for (const JobView* x : placed_here[w]) {
        if (!ahead(*x, j)) continue;
        b.slots -= x->per_worker.slots;
        b.host_memory_bytes -= x->per_worker.host_memory_bytes;
        b.cores -= x->per_worker.cores;
      }
      EXPECT_GE(after.slots, std::min(std::max<int64_t>(b.slots, 0), j.per_worker.slots))
          << r.job_id << " on " << w;
      EXPECT_GE(after.host_memory_bytes,
                std::min(std::max<int64_t>(b.host_memory_bytes, 0), j.per_worker.host_memory_bytes));
      EXPECT_GE(after.cores, std::min(std::max<int64_t>(b.cores, 0), j.per_worker.cores));
    }
  }
  for (const Preemption& p : d.preemptions) {
    const JobView& v = *jobs.at(p.victim_job_id);
    const JobView& q = *jobs.at(p.preemptor_job_id);
    EXPECT_EQ(v.state, JobState::kRunning);
    EXPECT_LT(v.priority, q.priority);
    EXPECT_GE(o.now_ms - v.start_time_ms, o.preemption_min_runtime_ms);
  }
  std::vector<std::string> victims;
  for (const Preemption& p : d.preemptions) victims.push_back(p.victim_job_id);
  std::sort(victims.begin(), victims.end());
  EXPECT_EQ(std::unique(victims.begin(), victims.end()), victims.end()) << "a victim is evicted once";
}

bool same(const ScheduleDecision& a, const ScheduleDecision& b) {
  auto eq_a = [](const Assignment& x, const Assignment& y) {
    return x.job_id == y.job_id && x.worker_ids == y.worker_ids;
  };
  auto eq_p = [](const Preemption& x, const Preemption& y) {
    return x.victim_job_id == y.victim_job_id && x.preemptor_job_id == y.preemptor_job_id;
  };
  auto eq_r = [](const Reservation& x, const Reservation& y) {
    return x.job_id == y.job_id && x.worker_ids == y.worker_ids && x.earliest_start_ms == y.earliest_start_ms;
  };
  auto eq_w = [](const WaitingJob& x, const WaitingJob& y) {
    return x.job_id == y.job_id && x.reason == y.reason;
  };
  return std::equal(a.assignments.begin(), a.assignments.end(), b.assignments.begin(), b.assignments.end(),
                    eq_a) &&
         std::equal(a.preemptions.begin(), a.preemptions.end(), b.preemptions.begin(), b.preemptions.end(),
                    eq_p) &&
         std::equal(a.reservations.begin(), a.reservations.end(), b.reservations.begin(),
                    b.reservations.end(), eq_r) &&
         std::equal(a.waiting.begin(), a.waiting.end(), b.waiting.begin(), b.waiting.end(), eq_w);
}

TEST(Scheduler, RandomClustersKeepEveryInvariant) {
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    const Cluster c = make_cluster(40, 120, seed);
    const ScheduleOptions o{200000, 50000};
    const ScheduleDecision d = schedule(c.workers, c.jobs, o);
    SCOPED_TRACE("seed " + std::to_string(seed));
    expect_invariants(c, d, o);
    EXPECT_FALSE(d.assignments.empty());
  }
}

TEST(Scheduler, SameInputInAnyOrderGivesTheSameDecision) {
  Cluster c = make_cluster(60, 200, 7);
  const ScheduleOptions o{200000, 50000};
  const ScheduleDecision first = schedule(c.workers, c.jobs, o);
  EXPECT_FALSE(first.assignments.empty());
  EXPECT_FALSE(first.preemptions.empty());
  EXPECT_TRUE(same(first, schedule(c.workers, c.jobs, o)));
  std::mt19937 rng(99);
  std::shuffle(c.workers.begin(), c.workers.end(), rng);
  std::shuffle(c.jobs.begin(), c.jobs.end(), rng);
  EXPECT_TRUE(same(first, schedule(c.workers, c.jobs, o)));
}

// Rule 8 against a full pass: on random clusters, apply decisions (a new generation each
// time) until one changes nothing, pass its reservations and stable marks back, queue new
// jobs (of every priority, or of the lowest), and compare the pass that skips with the
// one that does not.
TEST(Scheduler, SkippingGivesTheDecisionOfAFullPass) {
  int64_t skipped = 0, reruns = 0;
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Cluster c = make_cluster(40, 120, seed);
    ScheduleOptions o{200000, 50000};
    int64_t generation = 1;
    ScheduleDecision d;
    for (int round = 0; round < 20; ++round, ++generation) {
      o.generation = generation;
      d = schedule(c.workers, c.jobs, o);
      if (d.assignments.empty() && d.preemptions.empty()) break;
      apply(d, &c.jobs, o.now_ms);
      feed_back(d, &c.jobs, generation);
    }
    ASSERT_TRUE(d.assignments.empty() && d.preemptions.empty());
    feed_back(d, &c.jobs, generation);
    int64_t stable = 0;
    for (const WaitingJob& w : d.waiting) stable += w.stable;
    std::map<std::string, std::string> before;
    for (const WaitingJob& w : d.waiting) before[w.job_id] = w.reason;

    const Cluster more = make_cluster(40, 12, seed + 1000);
    for (const JobView& j : more.jobs) {
      if (j.state != JobState::kQueued) continue;
      JobView n = j;
      n.id = "new-" + j.id;
      n.submit_seq = 1000 + j.submit_seq;
      if (seed % 2) n.priority = 0;  // behind most: the reservations usually stay, and the pass skips
      c.jobs.push_back(n);
    }
    ScheduleOptions full = o;
    full.generation = -1;
    const ScheduleDecision skipping = schedule(c.workers, c.jobs, o);
    const ScheduleDecision all = schedule(c.workers, c.jobs, full);
    skipped += skipping.skipped;
    reruns += stable > 0 && skipping.skipped == 0;
    ScheduleDecision all_but_waiting = all, skipping_but_waiting = skipping;
    all_but_waiting.waiting.clear();
    skipping_but_waiting.waiting.clear();
    EXPECT_TRUE(same(skipping_but_waiting, all_but_waiting));
    EXPECT_EQ(skipping.waiting.size() + static_cast<size_t>(skipping.skipped), all.waiting.size());
    std::map<std::string, std::string> now;
    for (const WaitingJob& w : skipping.waiting) now[w.job_id] = w.reason;
    for (const WaitingJob& w : all.waiting) {
      auto it = now.find(w.job_id);
      // A skipped job keeps its last reason, which is what the full pass says.
      EXPECT_EQ(it != now.end() ? it->second : before[w.job_id], w.reason) << w.job_id;
    }
  }
  EXPECT_GT(skipped, 0);
  EXPECT_GT(reruns, 0);
  std::printf("[figure] rule 8 over 30 clusters: %lld jobs skipped, %lld passes run again\n",
              static_cast<long long>(skipped), static_cast<long long>(reruns));
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Prints the T3 figures; speed is never asserted (docs/design.md §8), the decisions are checked.
TEST(Scheduler, PassFiguresOverLargeQueues) {
  const ScheduleOptions o{200000, 50000};
  const Cluster small = make_cluster(500, 1000, 42);
  std::vector<double> times;
  for (int run = 0; run < 50; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    const ScheduleDecision d = schedule(small.workers, small.jobs, o);
    times.push_back(ms_since(t0));
    if (run == 0) expect_invariants(small, d, o);
  }
  std::sort(times.begin(), times.end());
  const double p50 = times[times.size() / 2];
  const double p99 =
      times[std::min(times.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(times.size())))];

  const Cluster large = make_cluster(5000, 10000, 43);
  std::vector<double> large_times;
  ScheduleDecision d;
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    d = schedule(large.workers, large.jobs, o);
    large_times.push_back(ms_since(t0));
  }
  expect_invariants(large, d, o);
  std::sort(large_times.begin(), large_times.end());
  std::printf("[figure] scheduler pass 1000x500: p50 %.2f ms p99 %.2f ms over 50 runs (%zu assigned)\n", p50,
              p99, schedule(small.workers, small.jobs, o).assignments.size());
  std::printf(
      "[figure] scheduler pass 10000x5000: %.1f ms (median of 3; max %.1f ms; %zu assigned, %zu preempted)\n",
      large_times[1], large_times[2], d.assignments.size(), d.preemptions.size());
}

}  // namespace
}  // namespace zenflow::scheduler
