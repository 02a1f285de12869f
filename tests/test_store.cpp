// Store tests: every field round trips byte for byte, a batch is all or nothing, acknowledged
// commits survive SIGKILL, logs slice like a string, migrations and the coordinator lock refuse
// what they must. Prints the latency of a one-job commit with synchronous FULL and NORMAL.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>  // to age a database as a newer zenflow would (it comes with zenflow_store)
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/remove_tree.h"
#include "common/utf8.h"
#include "server/store.h"
#include "tests/support/disk_dir.h"

namespace zenflow::server {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// A database directory on a real disk (tests/support/disk_dir.h).
class StoreDir : public test_support::DiskDir {
 public:
  StoreDir() : DiskDir("test_store") {}
};

// Every byte value, and the characters an encoding could trip on.
std::string odd_bytes() {
  std::string s = "\",:;'\\\n\t%_ \xc3\xa9 \xff\xfe";
  for (int c = 0; c < 256; ++c) s.push_back(static_cast<char>(c));
  return s;
}

std::string random_bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// std::bit_cast, which C++17 lacks.
template <typename To, typename From>
To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// A job with no field at its default.
JobRecord full_job(const std::string& id) {
  JobRecord j;
  j.id = id;
  j.request_id = "req-" + id;
  j.name = "name " + odd_bytes();
  j.spec_yaml = "model: gpt2\nsteps: 100\n";
  j.state = "RUNNING";
  j.priority = -7;
  j.submit_seq = 42;
  j.submit_time_ms = 1'700'000'000'123;
  j.start_time_ms = 1'700'000'000'456;
  j.end_time_ms = -1;
  j.attempt = 3;
  j.restarts = 2;
  j.preemptions = 1;
  j.placement = {"w1", "w,2", "3:w", "", odd_bytes()};
  j.master_port = 29500;
  j.host_memory_bytes_per_worker = int64_t{60} << 30;
  j.step = 77;
  j.total_steps = 1000;
  j.resumed_from_step = 50;
  j.last_loss = 2.718281828459045;
  j.cost_usd = 0.1;
  j.last_error = std::string("error\0with a NUL", 16) + odd_bytes();
  j.stop_reason = "preempted by j-000001";
  j.exit_code = 137;
  j.revision = 9;
  j.checkpoint_dir = "/ckpt/" + odd_bytes();
  j.device = "cuda";
  j.workers = 3;
  j.gpus_per_worker = 8;
  j.max_restarts = 5;
  j.usd_per_hour = 98.32 / 8 * 2;
  j.price_source = "aws.amazon.com/ec2/pricing " + odd_bytes();
  j.usd_lost_to_restarts = -0.0;  // bits kept
  j.optimizer_nodes = 2;
  j.node_memory_bytes = int64_t{96} << 30;
  j.node_placement = {"opt-1", "opt,2" + odd_bytes()};
  j.stall_share = 0.133;
  j.tokens_per_second = std::nan("");  // bits kept
  j.tokens_per_step = 4096;
  j.fence_until_ms = 1'700'000'093'000;
  j.hang_timeout = 45;
  j.log_dropped_bytes = 123'456;
  j.node_secret = "0123456789abcdef";
  return j;
}

WorkerRecord full_worker(const std::string& name) {
  WorkerRecord w;
  w.name = name;
  w.role = "OPTIMIZER";
  w.resources = odd_bytes() + std::string(3, '\0');
  w.address = "10.0.0.7:7070";
  w.rendezvous_ports = {29500, 0, -1, kMax, kMin};
  w.incarnation = 12;
  w.registered_ms = 1'700'000'000'999;
  w.state = "DRAINING";
  w.fence_ms = 93'000;
  w.session_digest = std::string("\x00\xff\x01 digest", 10) + std::string(22, '\x80');
  w.allowed_roots = {"/shared", "/var/lib/zenflow/work", "/a,b:7"};
  return w;
}

LogAppend log_append(const std::string& job_id, int64_t attempt, int64_t attempt_offset, std::string data) {
  LogAppend l;
  l.job_id = job_id;
  l.attempt = attempt;
  l.attempt_offset = attempt_offset;
  l.data = std::move(data);
  return l;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const StoreError& e) {
    return e.what();
  }
  return "";
}

// What a Store holds, to compare a store with itself after a reopen or a failed batch.
struct Snapshot {
  std::vector<JobRecord> jobs;
  std::vector<WorkerRecord> workers;
  std::map<std::string, std::string> logs;
  std::map<std::pair<std::string, int64_t>, int64_t> attempt_sizes;
  bool operator==(const Snapshot& o) const {
    return jobs == o.jobs && workers == o.workers && logs == o.logs && attempt_sizes == o.attempt_sizes;
  }
};

Snapshot snapshot(Store& store) {
  Snapshot s;
  s.jobs = store.load_jobs();
  s.workers = store.load_workers();
  for (const JobRecord& j : s.jobs) s.logs[j.id] = store.read_log(j.id, 0, kMax);
  s.attempt_sizes = store.attempt_log_sizes();
  return s;
}

TEST(Store, RecordEqualityLooksAtEveryField) {
  // The round-trip tests compare with ==: a field it skipped would go unchecked there.
  const JobRecord j = full_job("j-1");
  const std::vector<void (*)(JobRecord&)> job_changes = {
      [](JobRecord& r) { r.id += "x"; },
      [](JobRecord& r) { r.request_id += "x"; },
      [](JobRecord& r) { r.name += "x"; },
      [](JobRecord& r) { r.spec_yaml += "x"; },
      [](JobRecord& r) { r.state = "FAILED"; },
      [](JobRecord& r) { ++r.priority; },
      [](JobRecord& r) { ++r.submit_seq; },
      [](JobRecord& r) { ++r.submit_time_ms; },
      [](JobRecord& r) { ++r.start_time_ms; },
      [](JobRecord& r) { ++r.end_time_ms; },
      [](JobRecord& r) { ++r.attempt; },
      [](JobRecord& r) { ++r.restarts; },
      [](JobRecord& r) { ++r.preemptions; },
      [](JobRecord& r) { r.placement.pop_back(); },
      [](JobRecord& r) { ++r.master_port; },
      [](JobRecord& r) { ++r.host_memory_bytes_per_worker; },
      [](JobRecord& r) { ++r.step; },
      [](JobRecord& r) { ++r.total_steps; },
      [](JobRecord& r) { ++r.resumed_from_step; },
      [](JobRecord& r) { r.last_loss = 1; },
      [](JobRecord& r) { r.cost_usd = 1; },
      [](JobRecord& r) { r.last_error += "x"; },
      [](JobRecord& r) { r.stop_reason += "x"; },
      [](JobRecord& r) { ++r.exit_code; },
      [](JobRecord& r) { ++r.revision; },
      [](JobRecord& r) { r.checkpoint_dir += "x"; },
      [](JobRecord& r) { r.device += "x"; },
      [](JobRecord& r) { ++r.workers; },
      [](JobRecord& r) { ++r.gpus_per_worker; },
      [](JobRecord& r) { ++r.max_restarts; },
      [](JobRecord& r) { r.usd_per_hour = 1; },
      [](JobRecord& r) { r.price_source += "x"; },
      [](JobRecord& r) { r.usd_lost_to_restarts = 0.0; },  // -0.0 -> 0.0: other bits
      [](JobRecord& r) { r.optimizer_nodes++; },
      [](JobRecord& r) { r.node_memory_bytes++; },
      [](JobRecord& r) { r.node_placement.pop_back(); },
      [](JobRecord& r) { r.stall_share = 0.1; },
      [](JobRecord& r) { r.tokens_per_second = 1; },
      [](JobRecord& r) { r.tokens_per_step = 1; },
      [](JobRecord& r) { ++r.fence_until_ms; },
      [](JobRecord& r) { ++r.hang_timeout; },
      [](JobRecord& r) { ++r.log_dropped_bytes; },
      [](JobRecord& r) { r.node_secret += "x"; }};
  EXPECT_EQ(job_changes.size(), 43u);  // one per JobRecord field
  EXPECT_TRUE(j == full_job("j-1"));
  for (size_t i = 0; i < job_changes.size(); ++i) {
    JobRecord changed = j;
    job_changes[i](changed);
    EXPECT_FALSE(changed == j) << "change " << i;
  }
  // Doubles compare by bits: NaN equals itself, -0.0 differs from 0.0.
  JobRecord nan = j, nan2 = j, zero = j, negative_zero = j;
  nan.last_loss = nan2.last_loss = std::nan("");
  zero.cost_usd = 0.0;
  negative_zero.cost_usd = -0.0;
  EXPECT_TRUE(nan == nan2);
  EXPECT_FALSE(zero == negative_zero);

  const WorkerRecord w = full_worker("w");
  const std::vector<void (*)(WorkerRecord&)> worker_changes = {
      [](WorkerRecord& r) { r.name += "x"; },
      [](WorkerRecord& r) { r.role = "TRAINER"; },
      [](WorkerRecord& r) { r.resources += "x"; },
      [](WorkerRecord& r) { r.address += "x"; },
      [](WorkerRecord& r) { r.rendezvous_ports.push_back(1); },
      [](WorkerRecord& r) { ++r.incarnation; },
      [](WorkerRecord& r) { ++r.registered_ms; },
      [](WorkerRecord& r) { r.state = "LOST"; },
      [](WorkerRecord& r) { ++r.fence_ms; },
      [](WorkerRecord& r) { r.session_digest[5] ^= 1; },
      [](WorkerRecord& r) { r.allowed_roots.back() += "x"; }};
  EXPECT_TRUE(w == full_worker("w"));
  for (size_t i = 0; i < worker_changes.size(); ++i) {
    WorkerRecord changed = w;
    worker_changes[i](changed);
    EXPECT_FALSE(changed == w) << "change " << i;
  }
}

TEST(Store, EveryFieldRoundTripsByteForByte) {
  StoreDir dir;
  std::mt19937_64 rng(1);
  std::vector<JobRecord> jobs;
  JobRecord odd = full_job("j-odd " + odd_bytes());
  odd.submit_seq = 3;
  odd.last_loss = bit_cast<double>(0x7ff8'0000'dead'beefULL);  // a NaN with a payload
  odd.cost_usd = -0.0;
  jobs.push_back(odd);
  JobRecord extremes = full_job("j-extremes");
  extremes.submit_seq = 1;
  extremes.priority = kMin;
  extremes.submit_time_ms = kMax;
  extremes.exit_code = kMin;
  extremes.revision = kMax;
  extremes.last_loss = std::numeric_limits<double>::denorm_min();
  extremes.cost_usd = -std::numeric_limits<double>::infinity();
  extremes.spec_yaml = random_bytes(rng, 3 << 20);  // several MiB, every byte value
  extremes.placement.assign(200, std::string(100, 'w'));
  jobs.push_back(extremes);
  JobRecord defaults;  // "" everywhere, no placement, no request_id
  defaults.id = "j-defaults";
  defaults.submit_seq = 2;
  jobs.push_back(defaults);
  JobRecord defaults2 = defaults;  // a second job without a request_id is not a duplicate
  defaults2.id = "j-defaults-2";
  defaults2.submit_seq = 4;
  jobs.push_back(defaults2);

  std::vector<WorkerRecord> workers = {full_worker("w-b"), full_worker("w-a " + odd_bytes()), WorkerRecord{}};
  workers[2].name = "w-c";  // defaults: no resources, no ports
  workers[1].incarnation = 13;
  workers[0].resources = random_bytes(rng, 1 << 20);

  auto store = open_sqlite_store(dir.db());
  store->commit({jobs, workers, {}, {}, {}});
  store->commit({});  // an empty batch is no transaction and no error

  // load_jobs is by submit_seq; load_workers by name.
  const std::vector<JobRecord> by_seq = {jobs[1], jobs[2], jobs[0], jobs[3]};
  const std::vector<WorkerRecord> by_name = {workers[1], workers[0], workers[2]};
  EXPECT_TRUE(store->load_jobs() == by_seq);
  EXPECT_TRUE(store->load_workers() == by_name);
  const std::vector<JobRecord> loaded = store->load_jobs();
  ASSERT_EQ(loaded.size(), 4u);
  EXPECT_EQ(bit_cast<uint64_t>(loaded[2].last_loss), 0x7ff8'0000'dead'beefULL);
  EXPECT_EQ(bit_cast<uint64_t>(loaded[2].cost_usd), 0x8000'0000'0000'0000ULL);
  EXPECT_EQ(loaded[2].last_error.size(), odd.last_error.size());
  EXPECT_EQ(loaded[2].last_error, odd.last_error);
  EXPECT_EQ(loaded[2].placement, odd.placement);
  EXPECT_EQ(loaded[0].spec_yaml.size(), size_t{3} << 20);
  EXPECT_EQ(store->load_workers()[0].rendezvous_ports, workers[1].rendezvous_ports);
}

TEST(Store, CommitReplacesJobsByIdAndWorkersByName) {
  StoreDir dir;
  auto store = open_sqlite_store(dir.db());
  const JobRecord first = full_job("j-1");
  store->commit({{first}, {full_worker("w")}, {}, {}, {}});

  JobRecord second = full_job("j-1");
  second.request_id = "req-other";
  second.state = "SUCCEEDED";
  second.placement = {"w9"};
  second.last_loss = 0.5;
  second.revision = 10;
  WorkerRecord worker = full_worker("w");
  worker.incarnation = 99;
  worker.rendezvous_ports.clear();
  store->commit({{second}, {worker}, {}, {}, {}});
  EXPECT_TRUE(store->load_jobs() == std::vector<JobRecord>{second});
  EXPECT_TRUE(store->load_workers() == std::vector<WorkerRecord>{worker});

  // Replacing a job keeps its own request_id without conflicting with itself, and the
  // request_id it dropped is free for another job.
  store->commit({{second}, {}, {}, {}, {}});
  JobRecord reuse = full_job("j-2");
  reuse.request_id = first.request_id;
  reuse.submit_seq = 50;
  store->commit({{reuse}, {}, {}, {}, {}});
  EXPECT_TRUE(store->load_jobs() == (std::vector<JobRecord>{second, reuse}));
}

TEST(Store, FailedBatchLeavesNothingBehind) {
  StoreDir dir;
  auto store = open_sqlite_store(dir.db());
  JobRecord a = full_job("j-a");
  a.request_id = "req-a";
  const std::string a_log = "0123456789";
  store->commit({{a}, {full_worker("w")}, {log_append("j-a", 1, 0, a_log)}, {}, {}});
  const Snapshot before = snapshot(*store);

  JobRecord b = full_job("j-b");
  b.request_id = "req-b";
  b.submit_seq = 43;
  JobRecord c = full_job("j-c");
  c.request_id = "req-a";  // already a's
  c.submit_seq = 44;
  WorkerRecord w2 = full_worker("w");
  w2.incarnation = 13;
  const std::vector<WorkerRecord> workers = {w2, full_worker("x")};
  const std::vector<LogAppend> logs = {log_append("j-a", 2, 0, "ABCDE"), log_append("j-b", 1, 0, "xyz")};

  // Each failed batch leaves the store as it was: no job, worker or log byte of the batch,
  // and the log sizes (the next append's offsets) where they were.
  auto expect_refused = [&](const StoreBatch& batch, const std::string& what,
                            const std::string& sqlite_says) {
    const std::string error = error_of([&] { store->commit(batch); });
    EXPECT_NE(error.find("database " + dir.db() + ": " + what + ": "), std::string::npos) << error;
    EXPECT_NE(error.find(sqlite_says), std::string::npos) << error;
    EXPECT_TRUE(snapshot(*store) == before);
    EXPECT_EQ(store->log_size("j-a"), 10);
    EXPECT_EQ(store->log_size("j-b"), 0);
  };
  expect_refused({{b, c}, workers, logs, {}, {}}, "writing job \"j-c\" (request_id \"req-a\")",
                 "UNIQUE constraint failed: jobs.request_id");
  // This one fails on its last log append, after the others advanced the batch's log sizes.
  std::vector<LogAppend> bad_logs = logs;
  bad_logs.push_back(log_append("j-missing", 1, 0, "?"));
  expect_refused({{b}, workers, bad_logs, {}, {}}, "appending 1 bytes to the log of job \"j-missing\" (attempt 1)",
                 "FOREIGN KEY constraint failed");

  // The next commit works, and its appends start where the last successful commit left off.
  store->commit({{b}, workers, logs, {}, {}});
  EXPECT_EQ(store->log_size("j-a"), 15);
  EXPECT_EQ(store->read_log("j-a", 0, 100), a_log + "ABCDE");
  EXPECT_EQ(store->read_log("j-b", 0, 100), "xyz");
  EXPECT_TRUE(store->load_workers() == (std::vector<WorkerRecord>{w2, full_worker("x")}));
  const Snapshot after = snapshot(*store);
  store.reset();
  EXPECT_TRUE(snapshot(*open_sqlite_store(dir.db())) == after);
}

TEST(Store, ReopenGivesIdenticalRecords) {
  StoreDir dir;
  std::mt19937_64 rng(2);
  Snapshot written;
  {
    auto store = open_sqlite_store(dir.db());
    for (int i = 0; i < 20; ++i) {
      JobRecord j = full_job("j-" + std::to_string(i));
      j.submit_seq = 100 - i;
      j.last_loss = std::ldexp(static_cast<double>(rng()), -70);
      WorkerRecord w = full_worker("w-" + std::to_string(i % 3));
      w.incarnation = i;
      store->commit({{j}, {w}, {log_append(j.id, 1, 0, random_bytes(rng, 10 + i * 100))}, {}, {}});
    }
    written = snapshot(*store);
    EXPECT_EQ(written.jobs.size(), 20u);
  }
  auto reopened = open_sqlite_store(dir.db());
  EXPECT_TRUE(snapshot(*reopened) == written);
  for (const auto& [id, log] : written.logs)
    EXPECT_EQ(reopened->log_size(id), static_cast<int64_t>(log.size()));
}

// What the child of AcknowledgedCommitsSurviveSigkill writes in batch i: job i, its log, and
// worker "w" at incarnation i, so that a half-written batch would show as a mismatch.
JobRecord crash_job(int64_t i) {
  JobRecord j = full_job("j-" + std::to_string(i));
  j.request_id = "req-" + std::to_string(i);
  j.submit_seq = i;
  j.revision = i * 3;
  j.spec_yaml = std::string(static_cast<size_t>(200 + i % 2000), 'y');
  return j;
}
std::string crash_log(int64_t i) {
  std::mt19937_64 rng(static_cast<uint64_t>(i));
  return random_bytes(rng, static_cast<size_t>(1 + i % 700));
}

// The child: commits batches from where the store stands and writes each id to `ack_fd`
// once commit() has returned. Never returns.
[[noreturn]] void commit_until_killed(const std::string& db, int ack_fd) {
  try {
    auto store = open_sqlite_store(db);
    const int64_t start = static_cast<int64_t>(store->load_jobs().size());
    for (int64_t i = start; i < start + 100'000; ++i) {
      WorkerRecord w = full_worker("w");
      w.incarnation = i;
      store->commit({{crash_job(i)}, {w}, {log_append(crash_job(i).id, 1, 0, crash_log(i))}, {}, {}});
      if (::write(ack_fd, &i, sizeof i) != static_cast<ssize_t>(sizeof i)) ::_exit(3);
    }
    ::_exit(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    ::_exit(2);
  }
}

// Reads one acknowledged id; false at EOF or after `timeout_ms` without one.
bool read_ack(int fd, int64_t& id, int timeout_ms) {
  size_t got = 0;
  while (got < sizeof id) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    const ssize_t n = ::read(fd, reinterpret_cast<char*>(&id) + got, sizeof id - got);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

TEST(Store, AcknowledgedCommitsSurviveSigkill) {
  StoreDir dir;
  std::mt19937_64 rng(3);
  std::set<int64_t> acked;
  int64_t present = 0;  // jobs in the store after the last round
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(fds[0]);
      commit_until_killed(dir.db(), fds[1]);
    }
    ::close(fds[1]);
    // Kill after a random number of acknowledgements and a random delay: mostly inside a
    // commit, since that is where the child spends its time.
    const int64_t wait_for = 1 + static_cast<int64_t>(rng() % 150);
    int64_t id = 0;
    for (int64_t n = 0; n < wait_for && read_ack(fds[0], id, 30'000); ++n) acked.insert(id);
    ::usleep(static_cast<useconds_t>(rng() % 3000));
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the child ended by itself, status " << status;
    while (read_ack(fds[0], id, 30'000)) acked.insert(id);  // written before the kill
    ::close(fds[0]);

    auto store = open_sqlite_store(dir.db());
    const std::vector<JobRecord> jobs = store->load_jobs();
    ASSERT_FALSE(acked.empty());
    // Batches commit in order, so the store holds jobs 0..n-1: every acknowledged one, and
    // at most one more (committed, killed before its acknowledgement was written).
    const int64_t n = static_cast<int64_t>(jobs.size());
    EXPECT_GT(n, present) << "the round committed nothing";
    EXPECT_GE(n, *acked.rbegin() + 1);
    EXPECT_LE(n, *acked.rbegin() + 2);
    std::set<std::string> ids;
    for (const JobRecord& j : jobs) ids.insert(j.id);
    EXPECT_EQ(ids.size(), jobs.size()) << "a job is present twice";
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(jobs[static_cast<size_t>(i)] == crash_job(i))
          << "job " << i << " is not what batch " << i << " wrote";
      EXPECT_EQ(store->read_log(crash_job(i).id, 0, kMax), crash_log(i)) << "log of job " << i;
    }
    const std::vector<WorkerRecord> workers = store->load_workers();
    ASSERT_EQ(workers.size(), 1u);
    EXPECT_EQ(workers[0].incarnation, n - 1) << "the worker row is from another batch than the last job";
    EXPECT_EQ(store->attempt_log_sizes().size(), static_cast<size_t>(n));
    present = n;
  }
  std::printf("[ figure ] SIGKILL rounds: 6, acknowledged commits: %zu, all present once\n", acked.size());
}

TEST(Store, ReadLogSlicesLikeAString) {
  StoreDir dir;
  std::mt19937_64 rng(4);
  const std::vector<std::string> ids = {"j-0", "j-1", "j-2"};
  std::map<std::string, std::string> model;
  std::map<std::string, int64_t> attempt_of;
  std::map<std::pair<std::string, int64_t>, int64_t> attempt_sizes;
  auto store = open_sqlite_store(dir.db());
  std::vector<JobRecord> jobs;
  for (const std::string& id : ids) {
    jobs.push_back(full_job(id));
    jobs.back().request_id = "";
    attempt_of[id] = 1;
  }
  store->commit({jobs, {}, {}, {}, {}});

  auto random_length = [&]() -> size_t {
    switch (rng() % 10) {
      case 0:
        return 0;
      case 1:
        return 70'000 + rng() % 1000;  // more than a page: overflow pages
      default:
        return 1 + rng() % 300;
    }
  };
  int reads = 0;
  for (int op = 0; op < 600; ++op) {
    const uint64_t what = rng() % 100;
    if (what < 40) {  // a batch of 1 to 3 appends, possibly to one job several times
      StoreBatch batch;
      for (uint64_t k = 0, n = 1 + rng() % 3; k < n; ++k) {
        const std::string& id = ids[rng() % ids.size()];
        if (rng() % 8 == 0) ++attempt_of[id];  // a restart: its offsets start again at 0
        const int64_t attempt = attempt_of[id];
        int64_t& held = attempt_sizes[{id, attempt}];
        const std::string data = random_bytes(rng, random_length());
        batch.logs.push_back(log_append(id, attempt, held, data));
        model[id] += data;
        held += static_cast<int64_t>(data.size());
        if (held == 0) attempt_sizes.erase({id, attempt});  // an empty append holds nothing
      }
      store->commit(batch);
    } else if (what < 97) {
      const std::string& id = ids[rng() % ids.size()];
      const std::string& log = model[id];
      const int64_t size = static_cast<int64_t>(log.size());
      const int64_t offset = static_cast<int64_t>(rng() % static_cast<uint64_t>(size + 10));
      const int64_t max =
          rng() % 10 == 0 ? kMax : static_cast<int64_t>(rng() % static_cast<uint64_t>(size + 10));
      const std::string expected =
          offset >= size ? "" : log.substr(static_cast<size_t>(offset), static_cast<size_t>(max));
      ASSERT_EQ(store->read_log(id, offset, max), expected) << id << " offset " << offset << " max " << max;
      ASSERT_EQ(store->log_size(id), size);
      ++reads;
    } else {  // the log sizes are loaded at open
      store.reset();
      store = open_sqlite_store(dir.db());
    }
  }
  EXPECT_GT(reads, 300);
  for (const std::string& id : ids) {
    EXPECT_EQ(store->read_log(id, 0, kMax), model[id]);
    EXPECT_GT(model[id].size(), 70'000u);
  }
  EXPECT_EQ(store->attempt_log_sizes(), attempt_sizes);
  EXPECT_EQ(store->log_size("j-unknown"), 0);
  EXPECT_EQ(store->read_log("j-unknown", 0, 10), "");
  EXPECT_NE(error_of([&] { store->read_log("j-0", -1, 10); }).find("neither may be negative"),
            std::string::npos);
  EXPECT_NE(error_of([&] { store->read_log("j-0", 0, -1); }).find("neither may be negative"),
            std::string::npos);
}

int64_t raw_user_version(const std::string& db, int64_t set_to = -1) {
  sqlite3* raw = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  if (set_to >= 0) {
    const std::string sql = "PRAGMA user_version = " + std::to_string(set_to);
    EXPECT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
  }
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(raw, "PRAGMA user_version", -1, &s, nullptr), SQLITE_OK);
  EXPECT_EQ(sqlite3_step(s), SQLITE_ROW);
  const int64_t version = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(raw);
  return version;
}

// The indexes a schema declares (not SQLite's own for primary keys), by name.
std::vector<std::string> index_names(const std::string& db) {
  sqlite3* raw = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(
                raw, "SELECT name FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL ORDER BY name",
                -1, &s, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(raw);
  std::vector<std::string> names;
  while (sqlite3_step(s) == SQLITE_ROW)
    names.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)));
  sqlite3_finalize(s);
  sqlite3_close(raw);
  return names;
}

// Pages in the write-ahead log: each commit appends a frame (header + page) per page it
// changed, and nothing checkpoints it below SQLite's 1,000-page threshold.
int64_t wal_frames(const std::string& db) {
  std::ifstream wal(db + "-wal", std::ios::binary);
  unsigned char header[32] = {};
  if (!wal.read(reinterpret_cast<char*>(header), sizeof header)) return 0;
  const int64_t page =
      (int64_t{header[8]} << 24) | (int64_t{header[9]} << 16) | (header[10] << 8) | header[11];
  wal.seekg(0, std::ios::end);
  return (static_cast<int64_t>(wal.tellg()) - 32) / (24 + page);
}

// What a commit costs is the pages it syncs. A transition or progress write of a job that
// exists changes its row's page and no index page (the request_id entry is written at
// submit, and only again when a job's request_id really changes).
TEST(Store, AJobUpdateWritesOnlyItsRowsPage) {
  StoreDir dir;
  auto store = open_sqlite_store(dir.db());
  std::vector<JobRecord> jobs;
  for (int i = 0; i < 40; ++i) {  // several leaves of the table and of both indexes
    jobs.push_back(full_job("j-" + std::to_string(100 + i)));
    jobs.back().request_id = "req-" + std::to_string(100 + i);
    jobs.back().submit_seq = i;
  }
  store->commit({jobs, {}, {}, {}, {}});
  JobRecord j = jobs[17];
  for (const char* state : {"STARTING", "RUNNING"}) {
    j.state = state;
    ++j.step;
    ++j.revision;
    const int64_t before = wal_frames(dir.db());
    store->commit({{j}, {}, {}, {}, {}});
    EXPECT_EQ(wal_frames(dir.db()) - before, 1) << state;
  }
  // A changed request_id is still written (the row and its index entries).
  j.request_id = "req-renamed";
  const int64_t before = wal_frames(dir.db());
  store->commit({{j}, {}, {}, {}, {}});
  EXPECT_GE(wal_frames(dir.db()) - before, 2);
  std::vector<JobRecord> want = jobs;
  want[17] = j;
  EXPECT_TRUE(store->load_jobs() == want);
  // And the old key is free, the new one taken.
  JobRecord other = full_job("j-200");
  other.request_id = "req-117";
  other.submit_seq = 99;
  store->commit({{other}, {}, {}, {}, {}});
  other.id = "j-201";
  other.request_id = "req-renamed";
  EXPECT_NE(error_of([&] {
              store->commit({{other}, {}, {}, {}, {}});
            }).find("UNIQUE constraint failed: jobs.request_id"),
            std::string::npos);
}

TEST(Store, FreshDatabaseIsAtTheCurrentSchemaVersion) {
  StoreDir dir;
  EXPECT_GE(sqlite_schema_version(), 1);
  open_sqlite_store(dir.db())->commit({{full_job("j-1")}, {}, {}, {}, {}});
  EXPECT_EQ(raw_user_version(dir.db()), sqlite_schema_version());
  // Opening again migrates nothing and keeps the data.
  auto store = open_sqlite_store(dir.db());
  EXPECT_EQ(store->schema_version(), sqlite_schema_version());
  EXPECT_EQ(store->load_jobs().size(), 1u);
}

// A database written by schema 1 (no spec-fact columns) opens at the current version, its
// jobs intact and their facts "not recorded" (workers = -1) for the coordinator to fill in.
TEST(Store, SchemaOneDatabaseMigratesKeepingItsJobs) {
  StoreDir dir;
  open_sqlite_store(dir.db())->commit({{full_job("j-1")}, {}, {}, {}, {}});
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open_v2(dir.db().c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    for (const char* column :
         {"checkpoint_dir", "device", "workers", "gpus_per_worker", "max_restarts", "usd_per_hour_bits",
          "price_source", "usd_lost_to_restarts_bits", "optimizer_nodes", "node_memory_bytes",
          "node_placement", "stall_share_bits", "tokens_per_second_bits", "tokens_per_step_bits",
          "fence_until_ms", "hang_timeout", "log_dropped_bytes", "node_secret"}) {
      const std::string sql = std::string("ALTER TABLE jobs DROP COLUMN ") + column;
      ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    }
    for (const char* column : {"fence_ms", "session_digest", "allowed_roots"}) {
      const std::string sql = std::string("ALTER TABLE workers DROP COLUMN ") + column;
      ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    }
    ASSERT_EQ(sqlite3_exec(raw, "DROP TABLE profiles", nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    ASSERT_EQ(sqlite3_exec(raw, "CREATE INDEX jobs_by_state ON jobs (state)", nullptr, nullptr, nullptr),
              SQLITE_OK)
        << sqlite3_errmsg(raw);  // schema 1 had it; schema 5 drops it
    sqlite3_close(raw);
  }
  ASSERT_EQ(raw_user_version(dir.db(), 1), 1);
  EXPECT_EQ(index_names(dir.db()), (std::vector<std::string>{"jobs_by_request_id", "jobs_by_state"}));
  auto store = open_sqlite_store(dir.db());
  EXPECT_EQ(store->schema_version(), sqlite_schema_version());
  EXPECT_EQ(index_names(dir.db()), std::vector<std::string>{"jobs_by_request_id"});
  const std::vector<JobRecord> jobs = store->load_jobs();
  ASSERT_EQ(jobs.size(), 1u);
  JobRecord want = full_job("j-1");
  want.checkpoint_dir = "";
  want.device = "";
  want.workers = want.gpus_per_worker = want.max_restarts = -1;
  want.usd_per_hour = 0;
  want.price_source = "";
  want.usd_lost_to_restarts = 0;
  want.optimizer_nodes = want.node_memory_bytes = 0;
  want.node_placement.clear();
  want.stall_share = want.tokens_per_second = want.tokens_per_step = 0;
  want.fence_until_ms = want.hang_timeout = want.log_dropped_bytes = 0;
  want.node_secret.clear();
  want.last_error = valid_utf8(want.last_error);  // schema 6 repairs invalid UTF-8
  want.name = valid_utf8(want.name);
  EXPECT_TRUE(jobs[0] == want);
}

// Schema 7 adds each worker's session digest (and each job's node secret), schema 8 the roots
// it advertises: a row an
// older coordinator wrote loads without what came after it (the coordinator then tells that
// worker to register again; with no roots it is unconfined), the rest unchanged.
TEST(Store, OlderWorkerRowsLoadWithoutTheColumnsAddedSince) {
  struct Old {
    int version;
    std::vector<const char*> missing;
  };
  // (table, column) pairs: schema 7 also added jobs.node_secret.
  for (const Old& old : {Old{6, {"workers session_digest", "jobs node_secret", "workers allowed_roots"}},
                         Old{7, {"workers allowed_roots"}}}) {
    StoreDir dir;
    open_sqlite_store(dir.db())->commit({{}, {full_worker("w1")}, {}, {}, {}});
    {
      sqlite3* raw = nullptr;
      ASSERT_EQ(sqlite3_open_v2(dir.db().c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
      for (const char* table_column : old.missing) {
        std::string sql = std::string("ALTER TABLE ") + table_column;
        sql.replace(sql.find(' ', 12), 1, " DROP COLUMN ");
        ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
            << sqlite3_errmsg(raw);
      }
      sqlite3_close(raw);
    }
    ASSERT_EQ(raw_user_version(dir.db(), old.version), old.version);
    auto store = open_sqlite_store(dir.db());
    EXPECT_EQ(store->schema_version(), sqlite_schema_version());
    const std::vector<WorkerRecord> workers = store->load_workers();
    ASSERT_EQ(workers.size(), 1u);
    WorkerRecord want = full_worker("w1");
    if (old.version < 7) want.session_digest.clear();
    want.allowed_roots.clear();
    EXPECT_TRUE(workers[0] == want) << "schema " << old.version;
  }
}

// Schema 6 repairs what a coordinator before it stored as invalid UTF-8 (freed heap bytes as
// a failed job's last_error made every listing holding the row fail): replaced, the valid
// rest kept byte for byte, and valid rows left alone.
TEST(Store, SchemaFiveRowsWithInvalidUtf8AreRepairedByTheMigration) {
  StoreDir dir;
  JobRecord broken = full_job("j-1");
  broken.last_error = std::string("ranks on \xa0\x15\x7f\xff w1: rank 0 exited", 31);
  broken.stop_reason = "stopping \xc3";
  JobRecord fine = full_job("j-2");
  fine.request_id = "req-2";
  fine.name = "caf\xc3\xa9 \xe2\x82\xac";  // valid: café €
  fine.last_error = "all good \xf0\x9f\x98\x80";
  open_sqlite_store(dir.db())->commit({{broken, fine}, {}, {}, {}, {}});
  ASSERT_EQ(raw_user_version(dir.db(), 5), 5);
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open_v2(dir.db().c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    for (const char* sql :
         {"ALTER TABLE jobs DROP COLUMN fence_until_ms", "ALTER TABLE jobs DROP COLUMN hang_timeout",
          "ALTER TABLE jobs DROP COLUMN log_dropped_bytes", "ALTER TABLE workers DROP COLUMN fence_ms",
          "ALTER TABLE workers DROP COLUMN session_digest", "ALTER TABLE jobs DROP COLUMN node_secret",
          "ALTER TABLE workers DROP COLUMN allowed_roots"})
      ASSERT_EQ(sqlite3_exec(raw, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    sqlite3_close(raw);
  }
  const std::vector<JobRecord> jobs = open_sqlite_store(dir.db())->load_jobs();
  ASSERT_EQ(jobs.size(), 2u);
  const JobRecord& repaired = jobs[0].id == "j-1" ? jobs[0] : jobs[1];
  const JobRecord& kept = jobs[0].id == "j-1" ? jobs[1] : jobs[0];
  EXPECT_EQ(repaired.last_error, "ranks on \xef\xbf\xbd\x15\x7f\xef\xbf\xbd w1: rank 0 exited");
  EXPECT_EQ(repaired.stop_reason, "stopping \xef\xbf\xbd");
  EXPECT_TRUE(is_valid_utf8(repaired.name));
  EXPECT_EQ(kept.name, fine.name);
  EXPECT_EQ(kept.last_error, fine.last_error);
}

// Job profiles (zenflow advise JOB_ID): one per job, a later upload replacing the earlier,
// byte for byte across a reopen; none for a job that has none; only for a job that exists,
// and a refused batch writes none of its profiles.
TEST(Store, ProfilesAreKeptOnePerJob) {
  StoreDir dir;
  const std::string yaml1 = "zenflow_profile: 1\nstep: {step_seconds: 0.25}\n", yaml2 = std::string("\0\xff é", 5);
  {
    auto store = open_sqlite_store(dir.db());
    StoreBatch b;
    b.jobs = {full_job("j-1"), full_job("j-2")};
    b.jobs[1].request_id = "req-2";
    b.profiles = {ProfileRecord{"j-1", 1, yaml1, 111}};
    store->commit(b);
    ASSERT_TRUE(store->load_profile("j-1").has_value());
    EXPECT_TRUE(*store->load_profile("j-1") == (ProfileRecord{"j-1", 1, yaml1, 111}));
    EXPECT_FALSE(store->load_profile("j-2").has_value());
    EXPECT_FALSE(store->load_profile("j-nope").has_value());
    StoreBatch later;
    later.profiles = {ProfileRecord{"j-1", 3, yaml2, 333}};
    store->commit(later);
    StoreBatch orphan;  // the job must exist (REFERENCES jobs)
    orphan.profiles = {ProfileRecord{"j-2", 1, yaml1, 1}, ProfileRecord{"j-missing", 1, yaml1, 1}};
    const std::string error = error_of([&] { store->commit(orphan); });
    EXPECT_NE(error.find("writing the profile of job \"j-missing\" (attempt 1)"), std::string::npos) << error;
    EXPECT_NE(error.find("FOREIGN KEY constraint failed"), std::string::npos) << error;
    EXPECT_FALSE(store->load_profile("j-2").has_value());  // the whole batch rolled back
  }
  auto store = open_sqlite_store(dir.db());
  const std::optional<ProfileRecord> p = store->load_profile("j-1");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->attempt, 3);
  EXPECT_EQ(p->yaml, yaml2);
  EXPECT_EQ(p->received_ms, 333);
  EXPECT_FALSE(store->load_profile("j-2").has_value());
}

TEST(Store, NewerSchemaIsRefusedNamingBothVersions) {
  StoreDir dir;
  open_sqlite_store(dir.db());
  const int64_t newer = sqlite_schema_version() + 7;
  ASSERT_EQ(raw_user_version(dir.db(), newer), newer);
  const std::string error = error_of([&] { open_sqlite_store(dir.db()); });
  EXPECT_NE(error.find("database " + dir.db() + " has schema version " + std::to_string(newer) +
                       ", newer than version " + std::to_string(sqlite_schema_version())),
            std::string::npos)
      << error;
  EXPECT_EQ(raw_user_version(dir.db()), newer) << "the refused database was changed";
}

TEST(Store, FileThatIsNotADatabaseIsRefusedNamingThePath) {
  StoreDir dir;
  std::string garbage;
  while (garbage.size() < 8192) garbage += "this is not an SQLite database\n";
  { std::ofstream(dir.db(), std::ios::binary) << garbage; }
  const std::string error = error_of([&] { open_sqlite_store(dir.db()); });
  EXPECT_NE(error.find("database " + dir.db() + ": "), std::string::npos) << error;
  EXPECT_NE(error.find("file is not a database"), std::string::npos) << error;
  std::ifstream in(dir.db(), std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), garbage) << "the refused file was changed";

  const std::string missing_dir = dir.path() + "/no/such/dir/coordinator.db";
  const std::string unopenable = error_of([&] { open_sqlite_store(missing_dir); });
  EXPECT_NE(unopenable.find("database " + missing_dir + ": cannot open " + missing_dir + ".lock"),
            std::string::npos)
      << unopenable;
}

TEST(Store, SecondOpenIsRefusedWhileTheFirstIsOpen) {
  StoreDir dir;
  auto first = open_sqlite_store(dir.db());
  first->commit({{full_job("j-1")}, {}, {}, {}, {}});
  const std::string in_use = "database " + dir.db() + " is in use by another coordinator (" + dir.db() +
                             ".lock is locked by pid " + std::to_string(::getpid()) + ")";
  // flock belongs to the open file description: a second open in this process conflicts too.
  EXPECT_EQ(error_of([&] { open_sqlite_store(dir.db()); }), in_use);
  EXPECT_EQ(error_of([&] { open_sqlite_store(dir.db(), SqliteOptions{false}); }), in_use);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // another process: refused before it touches the database
    const std::string error = error_of([&] { open_sqlite_store(dir.db()); });
    ::_exit(error == in_use ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;

  first->commit({{full_job("j-2")}, {}, {}, {}, {}});  // the refused opens disturbed nothing
  first.reset();                               // releases the lock
  EXPECT_EQ(open_sqlite_store(dir.db())->load_jobs().size(), 2u);
}

std::string filesystem_type(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) return "unknown";
  switch (static_cast<uint64_t>(fs.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794C7630:
      return "overlayfs";
    default: {
      char hex[32];
      std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(fs.f_type));
      return hex;
    }
  }
}

// The coordinator commits on hot paths (a submit is one commit): print what one costs.
TEST(Store, OneJobCommitLatency) {
  for (const bool full : {true, false}) {
    StoreDir dir;
    auto store = open_sqlite_store(dir.db(), SqliteOptions{full});
    constexpr int kCommits = 300;
    std::vector<double> micros;
    for (int i = 0; i < kCommits + 10; ++i) {  // the first 10 warm up
      JobRecord j = full_job("j-" + std::to_string(i));
      j.submit_seq = i;
      const auto start = std::chrono::steady_clock::now();
      store->commit({{j}, {}, {}, {}, {}});
      const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
      if (i >= 10) micros.push_back(took.count());
    }
    EXPECT_EQ(store->load_jobs().size(), static_cast<size_t>(kCommits + 10));
    std::sort(micros.begin(), micros.end());
    std::printf(
        "[ figure ] one-job commit, synchronous=%s: median %.0f us, p99 %.0f us (%d commits, %s at %s)\n",
        full ? "FULL" : "NORMAL", micros[micros.size() / 2], micros[micros.size() * 99 / 100], kCommits,
        filesystem_type(dir.path()).c_str(), ZENFLOW_BINARY_DIR);
  }
}

}  // namespace
}  // namespace zenflow::server
