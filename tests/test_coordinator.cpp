// Coordinator tests in one process, on a real SQLite store: group-committed submits (none
// lost or duplicated, request_id exactly once, acknowledged means durable across a
// SIGKILL), heartbeats on the lease table, and scheduling passes that skip stable jobs
// until the cluster changes.
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>  // to read the store beside a running coordinator
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/remove_tree.h"
#include "server/coordinator.h"
#include "server/coordinator_metrics.h"
#include "server/store.h"
#include "tests/support/disk_dir.h"
#include "zenflow/v1/jobs.grpc.pb.h"
#include "zenflow/v1/workers.grpc.pb.h"

namespace zenflow::server {
namespace {

// A directory on a real disk (commits fsync; tests/support/disk_dir.h) and job specs
// checkpointing into it.
class TestDir : public test_support::DiskDir {
 public:
  TestDir() : DiskDir("test_coordinator") {}
  std::string spec(const std::string& name) const {
    return "name: " + name +
           "\nmodel: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4, "
           "intermediate_size: 64, max_position_embeddings: 32}}\n"
           "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
           "train: {steps: 3, micro_batch: 2, seq_len: 16, device: cpu}\n"
           "checkpoint: {dir: " +
           path() + "/ckpt-" + name + "}\n";
  }
};

std::unique_ptr<Coordinator> open_coordinator(const std::string& db) {
  CoordinatorOptions o;
  o.log = [](const std::string&) {};
  return std::make_unique<Coordinator>(open_sqlite_store(db), o);
}

v1::SubmitJobRequest submit_request(const TestDir& dir, const std::string& name,
                                    const std::string& request_id) {
  v1::SubmitJobRequest req;
  req.set_spec_yaml(dir.spec(name));
  req.set_request_id(request_id);
  return req;
}

std::string describe(const grpc::Status& s) {
  return std::to_string(s.error_code()) + ": " + s.error_message();
}

TEST(Coordinator, ConcurrentSubmitsAreEachStoredOnce) {
  TestDir dir;
  constexpr int kThreads = 8, kEach = 25;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::string> errors;
  std::mutex errors_mu;
  {
    auto c = open_coordinator(dir.db());
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t)
      pool.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          const std::string name = "t" + std::to_string(t) + "-" + std::to_string(i);
          v1::SubmitJobResponse resp;
          // Every other one without a request_id: those are never deduplicated.
          const grpc::Status s = c->submit(submit_request(dir, name, i % 2 ? "" : "rid-" + name), &resp);
          if (!s.ok() || !resp.created()) {
            std::lock_guard<std::mutex> lock(errors_mu);
            errors.push_back(name + ": " + describe(s));
            continue;
          }
          ids[static_cast<size_t>(t)].push_back(resp.job().id());
        }
      });
    for (std::thread& th : pool) th.join();
    ASSERT_TRUE(errors.empty()) << errors.front();
    v1::ListJobsRequest req;
    req.set_page_size(1000);
    v1::ListJobsResponse list;
    ASSERT_TRUE(c->list(req, &list).ok());
    EXPECT_EQ(list.jobs_size(), kThreads * kEach);
  }
  std::set<std::string> acked;
  for (const auto& part : ids) acked.insert(part.begin(), part.end());
  EXPECT_EQ(acked.size(), static_cast<size_t>(kThreads * kEach)) << "two submits got one id";
  const std::vector<JobRecord> stored = open_sqlite_store(dir.db())->load_jobs();
  std::set<std::string> stored_ids;
  for (const JobRecord& r : stored) stored_ids.insert(r.id);
  EXPECT_EQ(stored.size(), acked.size());
  EXPECT_EQ(stored_ids, acked);
}

// ListJobs: newest first, pages chained by their tokens with no job twice or missing, a
// state filter applied before paging, the same listing after a restart (the order is
// rebuilt from the store), and bad paging arguments refused with their names.
TEST(Coordinator, ListJobsPagesNewestFirstWithAStateFilterAndAfterARestart) {
  TestDir dir;
  constexpr int kJobs = 25;
  std::vector<std::string> ids, cancelled;  // in submit order
  {
    auto c = open_coordinator(dir.db());
    for (int i = 0; i < kJobs; ++i) {
      v1::SubmitJobResponse resp;
      ASSERT_TRUE(c->submit(submit_request(dir, "list-" + std::to_string(i), ""), &resp).ok());
      ids.push_back(resp.job().id());
    }
    for (int i = 0; i < kJobs; i += 3) {  // no workers: the rest stay QUEUED
      v1::JobStatus out;
      ASSERT_TRUE(c->cancel(ids[static_cast<size_t>(i)], &out).ok());
      cancelled.push_back(ids[static_cast<size_t>(i)]);
    }
  }
  std::vector<std::string> queued;
  for (const std::string& id : ids)
    if (std::find(cancelled.begin(), cancelled.end(), id) == cancelled.end()) queued.push_back(id);
  auto newest_first = [](std::vector<std::string> v) {
    std::reverse(v.begin(), v.end());
    return v;
  };
  // Every page of `size`, following the tokens; the pages' sizes go to *sizes.
  auto list_all = [](Coordinator& c, int size, std::vector<v1::JobState> states, std::vector<int>* sizes) {
    std::vector<std::string> got;
    std::string token;
    for (int pages = 0; pages < 100; ++pages) {
      v1::ListJobsRequest req;
      req.set_page_size(size);
      req.set_page_token(token);
      for (v1::JobState s : states) req.add_states(s);
      v1::ListJobsResponse resp;
      const grpc::Status st = c.list(req, &resp);
      EXPECT_TRUE(st.ok()) << describe(st);
      sizes->push_back(resp.jobs_size());
      for (const v1::JobStatus& j : resp.jobs()) got.push_back(j.id());
      token = resp.next_page_token();
      if (token.empty()) break;
    }
    return got;
  };
  for (int restart = 0; restart < 2; ++restart) {
    auto c = open_coordinator(dir.db());
    std::vector<int> sizes;
    EXPECT_EQ(list_all(*c, 7, {}, &sizes), newest_first(ids)) << "restart " << restart;
    EXPECT_EQ(sizes, (std::vector<int>{7, 7, 7, 4}));
    sizes.clear();
    EXPECT_EQ(list_all(*c, 3, {v1::CANCELLED}, &sizes), newest_first(cancelled));
    EXPECT_EQ(sizes, (std::vector<int>{3, 3, 3}));  // 9 cancelled: the last full page has no token
    sizes.clear();
    EXPECT_EQ(list_all(*c, 100, {v1::QUEUED, v1::CANCELLED}, &sizes), newest_first(ids));
    EXPECT_EQ(list_all(*c, 5, {v1::QUEUED}, &sizes), newest_first(queued));
    sizes.clear();
    EXPECT_TRUE(list_all(*c, 10, {v1::RUNNING}, &sizes).empty());
    EXPECT_EQ(sizes, std::vector<int>{0});
    v1::ListJobsRequest bad;
    v1::ListJobsResponse resp;
    bad.set_page_token("12x");
    grpc::Status st = c->list(bad, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("page_token"), std::string::npos) << st.error_message();
    bad.clear_page_token();
    bad.set_page_size(1001);
    st = c->list(bad, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("page_size"), std::string::npos) << st.error_message();
  }
}

TEST(Coordinator, SameRequestIdAtOnceMakesOneJob) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  constexpr int kRounds = 20, kThreads = 6;
  for (int round = 0; round < kRounds; ++round) {
    const std::string rid = "same-" + std::to_string(round);
    std::atomic<int> ready{0};
    std::vector<v1::SubmitJobResponse> resp(kThreads);
    std::vector<grpc::Status> status(kThreads);
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t)
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < kThreads) {
        }  // all at once, so that some arrive while the first is being committed
        status[static_cast<size_t>(t)] = c->submit(submit_request(dir, "job-" + std::to_string(round), rid),
                                                   &resp[static_cast<size_t>(t)]);
      });
    for (std::thread& th : pool) th.join();
    int created = 0;
    std::set<std::string> ids;
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_TRUE(status[static_cast<size_t>(t)].ok()) << describe(status[static_cast<size_t>(t)]);
      created += resp[static_cast<size_t>(t)].created();
      ids.insert(resp[static_cast<size_t>(t)].job().id());
    }
    EXPECT_EQ(created, 1) << rid;
    EXPECT_EQ(ids.size(), 1u) << rid;
  }
  // The same request_id with another spec is refused, naming the job it made.
  v1::SubmitJobResponse other;
  const grpc::Status s = c->submit(submit_request(dir, "something-else", "same-0"), &other);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << describe(s);
  c.reset();
  const std::vector<JobRecord> stored = open_sqlite_store(dir.db())->load_jobs();
  EXPECT_EQ(stored.size(), static_cast<size_t>(kRounds));
  std::set<std::string> rids;
  for (const JobRecord& r : stored) rids.insert(r.request_id);
  EXPECT_EQ(rids.size(), static_cast<size_t>(kRounds));
}

// A store that calls `before` ahead of every commit (which may wait, or throw StoreError).
class HookedStore : public Store {
 public:
  HookedStore(std::unique_ptr<Store> inner, std::function<void(const StoreBatch&)> before)
      : inner_(std::move(inner)), before_(std::move(before)) {}
  void commit(const StoreBatch& batch) override {
    before_(batch);
    inner_->commit(batch);
  }
  std::vector<JobRecord> load_jobs() override { return inner_->load_jobs(); }
  std::vector<WorkerRecord> load_workers() override { return inner_->load_workers(); }
  std::string read_log(const std::string& job_id, int64_t offset, int64_t max_bytes) override {
    return inner_->read_log(job_id, offset, max_bytes);
  }
  int64_t log_size(const std::string& job_id) override { return inner_->log_size(job_id); }
  std::map<std::pair<std::string, int64_t>, int64_t> attempt_log_sizes() override {
    return inner_->attempt_log_sizes();
  }
  std::optional<ProfileRecord> load_profile(const std::string& job_id) override {
    return inner_->load_profile(job_id);
  }
  int schema_version() override { return inner_->schema_version(); }

 private:
  std::unique_ptr<Store> inner_;
  std::function<void(const StoreBatch&)> before_;
};

// A slow disk: every commit takes `delay` longer.
std::unique_ptr<Store> slow_store(std::unique_ptr<Store> inner, std::chrono::milliseconds delay) {
  return std::make_unique<HookedStore>(std::move(inner),
                                       [delay](const StoreBatch&) { std::this_thread::sleep_for(delay); });
}

// One submit_async's answer: when it came, and on which thread.
struct SubmitAnswerProbe {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  std::string id;
  std::thread::id thread;
  Coordinator::SubmitAnswer callback() {
    return [this](const grpc::Status& s, const v1::SubmitJobResponse& r) {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      status = s;
      id = r.job().id();
      thread = std::this_thread::get_id();
      cv.notify_all();
    };
  }
  bool answered() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
  bool wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; });
  }
};

// A lone submit's caller (the gRPC serving thread) waits for its commit and answer, so
// that the committer gets the core; the committer still answers it.
TEST(Coordinator, ALoneSubmitsCallerStepsAsideUntilItIsAnswered) {
  TestDir dir;
  CoordinatorOptions o;
  o.log = [](const std::string&) {};
  o.submit_step_aside = std::chrono::seconds(20);  // longer than any commit here
  o.submit_step_aside_saved = std::chrono::seconds(600);  // and five of them, however slow the disk
  Coordinator c(open_sqlite_store(dir.db()), o);
  for (int i = 0; i < 5; ++i) {
    SubmitAnswerProbe probe;
    c.submit_async(submit_request(dir, "alone-" + std::to_string(i), ""), probe.callback());
    EXPECT_TRUE(probe.answered()) << "submit " << i << ": the caller went on before its job was committed";
    ASSERT_TRUE(probe.wait());
    EXPECT_TRUE(probe.status.ok()) << describe(probe.status);
    EXPECT_NE(probe.thread, std::this_thread::get_id()) << "answered by the caller, not the committer";
  }
}

// A run of slow commits spends the caller's saved step-aside time (each wait takes 80 ms,
// ten times what 80 ms of serving earns back), and then the caller goes on at once: it
// waits for at most kStepAsideShare of its time, not for every commit.
TEST(Coordinator, SlowCommitsSpendTheStepAsideBudget) {
  TestDir dir;
  CoordinatorOptions o;
  o.log = [](const std::string&) {};
  o.submit_step_aside = std::chrono::seconds(20);
  o.submit_step_aside_saved = std::chrono::milliseconds(100);
  Coordinator c(slow_store(open_sqlite_store(dir.db()), std::chrono::milliseconds(80)), o);
  std::vector<bool> waited;
  for (int i = 0; i < 8; ++i) {
    SubmitAnswerProbe probe;
    c.submit_async(submit_request(dir, "budget-" + std::to_string(i), ""), probe.callback());
    waited.push_back(probe.answered());
    ASSERT_TRUE(probe.wait());
    ASSERT_TRUE(probe.status.ok()) << describe(probe.status);
  }
  EXPECT_TRUE(waited[0]) << "the first submit, with 100 ms saved, did not wait for its 80 ms commit";
  // Each wait spends >= 80 ms and earns back a tenth of the time since the last: after
  // two, the 100 ms saved are gone unless the test thread idled ~600 ms between submits.
  EXPECT_NE(std::count(waited.begin(), waited.end(), false), 0) << "the caller waited for all 8 slow commits";
  EXPECT_FALSE(waited[2] && waited[3] && waited[4]) << "three waits in a row after the budget ran out";
}

// However slow the disk, the caller goes back to serving after submit_step_aside, and
// the job is answered once committed.
TEST(Coordinator, ASlowCommitHoldsTheSubmittingThreadOnlyBriefly) {
  TestDir dir;
  CoordinatorOptions o;
  o.log = [](const std::string&) {};
  o.submit_step_aside = std::chrono::milliseconds(20);
  Coordinator c(slow_store(open_sqlite_store(dir.db()), std::chrono::milliseconds(1500)), o);
  SubmitAnswerProbe probe;
  c.submit_async(submit_request(dir, "slow", "rid-slow"), probe.callback());
  EXPECT_FALSE(probe.answered()) << "the caller waited out a 1.5 s commit";
  ASSERT_TRUE(probe.wait());
  ASSERT_TRUE(probe.status.ok()) << describe(probe.status);
  v1::JobStatus got;
  EXPECT_TRUE(c.get(probe.id, &got).ok());
  EXPECT_EQ(got.name(), "slow");
}

// `spec` padded with a comment to exactly `bytes`.
std::string padded(std::string spec, size_t bytes) {
  spec += "#" + std::string(bytes - spec.size() - 2, 'x') + "\n";
  return spec;
}

// A spec over kInlineSpecBytes is parsed on the intake thread, not the submitter's (the
// gRPC hot path, which also serves every heartbeat); a small one still is answered at once
// on the calling thread. Either way errors name the key, and a valid large spec is stored.
TEST(Coordinator, LargeSpecsAreParsedOffTheSubmittingThread) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  struct Answer {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    std::thread::id thread;
  };
  auto ask = [&](const std::string& yaml, Answer& a) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    c->submit_async(req, [&a](const grpc::Status& s, const v1::SubmitJobResponse&) {
      std::lock_guard<std::mutex> lock(a.mu);
      a.done = true;
      a.status = s;
      a.thread = std::this_thread::get_id();
      a.cv.notify_all();
    });
  };
  auto wait = [](Answer& a) {
    std::unique_lock<std::mutex> lock(a.mu);
    return a.cv.wait_for(lock, std::chrono::seconds(30), [&] { return a.done; });
  };

  Answer small;
  ask(dir.spec("small") + "bogus_key: 1\n", small);
  ASSERT_TRUE(small.done) << "a small spec's refusal was not answered before submit_async returned";
  EXPECT_EQ(small.thread, std::this_thread::get_id());
  EXPECT_EQ(small.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << describe(small.status);

  Answer large;
  ask(padded(dir.spec("large") + "bogus_key: 1\n", 1u << 20), large);
  ASSERT_TRUE(wait(large));
  EXPECT_NE(large.thread, std::this_thread::get_id()) << "a 1 MiB spec was parsed on the submitting thread";
  EXPECT_EQ(large.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << describe(large.status);
  EXPECT_NE(large.status.error_message().find("bogus_key"), std::string::npos) << describe(large.status);

  v1::SubmitJobRequest req = submit_request(dir, "large-ok", "rid-large-ok");
  req.set_spec_yaml(padded(req.spec_yaml(), Coordinator::kInlineSpecBytes + 1));
  v1::SubmitJobResponse resp;
  const grpc::Status ok = c->submit(req, &resp);
  ASSERT_TRUE(ok.ok()) << describe(ok);
  EXPECT_TRUE(resp.created());
  v1::JobStatus got;
  EXPECT_TRUE(c->get(resp.job().id(), &got).ok());
  EXPECT_EQ(got.name(), "large-ok");
}

// Large specs arriving faster than they parse wait in a bounded queue: beyond it they are
// refused (RESOURCE_EXHAUSTED), and a shutdown answers every queued one (UNAVAILABLE).
// Every submit is answered exactly once and the store holds exactly the accepted ones.
TEST(Coordinator, QueuedLargeSpecsAreBoundedAndEachAnsweredOnceAtShutdown) {
  TestDir dir;
  // The submits must outrun the intake thread by more than the queue holds. A 1 MiB spec
  // takes it ~6 ms (parse and commit), a submit here ~0.1 ms (a copy): the intake thread
  // would have to parse 96 specs, or the submitting thread stall for ~0.6 s, before the
  // queue of 64 fills. (With 80 submits and the specs built in the loop, CI once saw the
  // queue never fill: the loop had been descheduled long enough.)
  constexpr int kSubmits = 160;
  std::vector<v1::SubmitJobRequest> requests;
  for (int i = 0; i < kSubmits; ++i) {
    requests.push_back(submit_request(dir, "big-" + std::to_string(i), ""));
    requests.back().set_spec_yaml(padded(requests.back().spec_yaml(), 1u << 20));
  }
  std::mutex mu;
  std::map<int, int> answers;  // submit -> times answered
  std::map<int, grpc::Status> status;
  std::map<std::string, int> created;  // job id -> submit
  {
    auto c = open_coordinator(dir.db());
    for (int i = 0; i < kSubmits; ++i) {
      const auto& req = requests[static_cast<size_t>(i)];
      c->submit_async(req, [&, i](const grpc::Status& s, const v1::SubmitJobResponse& r) {
        std::lock_guard<std::mutex> lock(mu);
        ++answers[i];
        status[i] = s;
        if (s.ok()) created[r.job().id()] = i;
      });
    }
    // A few parsed and committed, most of the 64 still queued (~0.4 s of parsing).
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }  // shutdown with the rest still queued
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(answers.size(), static_cast<size_t>(kSubmits));
  int accepted = 0, exhausted = 0, unavailable = 0;
  for (const auto& [i, n] : answers) {
    EXPECT_EQ(n, 1) << "submit " << i << " answered " << n << " times";
    const grpc::StatusCode code = status[i].error_code();
    accepted += code == grpc::StatusCode::OK;
    exhausted += code == grpc::StatusCode::RESOURCE_EXHAUSTED;
    unavailable += code == grpc::StatusCode::UNAVAILABLE;
  }
  EXPECT_EQ(accepted + exhausted + unavailable, kSubmits);
  EXPECT_GE(exhausted, kSubmits - static_cast<int>(Coordinator::kMaxIntakeQueue) - accepted);
  EXPECT_GT(exhausted, 0);
  EXPECT_GT(unavailable, 0) << "the shutdown came after every queued spec was parsed: no check of the drain";
  const std::vector<JobRecord> stored = open_sqlite_store(dir.db())->load_jobs();
  std::set<std::string> stored_ids;
  for (const JobRecord& r : stored) stored_ids.insert(r.id);
  std::set<std::string> acked;
  for (const auto& [id, i] : created) acked.insert(id);
  EXPECT_EQ(stored_ids, acked);
}

// Every submit that was answered OK is in the store after a SIGKILL at a random moment, and
// a retry of its request_id after the restart returns it instead of a second job.
TEST(Coordinator, AcknowledgedSubmitsSurviveASigkill) {
  TestDir dir;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    auto c = open_coordinator(dir.db());
    std::vector<std::thread> pool;
    for (int t = 0; t < 4; ++t)
      pool.emplace_back([&, t] {
        for (int i = 0;; ++i) {
          const std::string name = "k" + std::to_string(t) + "-" + std::to_string(i);
          v1::SubmitJobResponse resp;
          if (!c->submit(submit_request(dir, name, "rid-" + name), &resp).ok()) ::_exit(3);
          const std::string line = "rid-" + name + " " + resp.job().id() + "\n";  // only once acknowledged
          if (::write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(4);
        }
      });
    for (std::thread& th : pool) th.join();
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string acks;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::count(acks.begin(), acks.end(), '\n') < 60 && std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    acks.append(buf, static_cast<size_t>(n));
  }
  ::kill(child, SIGKILL);
  int wstatus = 0;
  ::waitpid(child, &wstatus, 0);
  EXPECT_TRUE(WIFSIGNALED(wstatus)) << "the child stopped on its own: status " << wstatus;
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) acks.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  std::map<std::string, std::string> acked;  // request_id -> job id
  for (size_t at = 0, nl; (nl = acks.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string line = acks.substr(at, nl - at);
    const size_t sp = line.find(' ');
    acked[line.substr(0, sp)] = line.substr(sp + 1);
  }
  ASSERT_GE(acked.size(), 60u);

  std::map<std::string, std::string> stored;
  for (const JobRecord& r : open_sqlite_store(dir.db())->load_jobs()) {
    EXPECT_TRUE(stored.emplace(r.request_id, r.id).second) << "request_id " << r.request_id << " twice";
  }
  int missing = 0;
  for (const auto& [rid, id] : acked) {
    auto it = stored.find(rid);
    missing += it == stored.end();
    if (it != stored.end()) {
      EXPECT_EQ(it->second, id) << rid;
    }
  }
  EXPECT_EQ(missing, 0) << "of " << acked.size() << " acknowledged submits";

  auto c = open_coordinator(dir.db());
  for (const auto& [rid, id] : acked) {
    v1::SubmitJobResponse resp;
    const grpc::Status s = c->submit(submit_request(dir, rid.substr(4), rid), &resp);
    ASSERT_TRUE(s.ok()) << rid << ": " << describe(s);
    EXPECT_FALSE(resp.created()) << rid;
    EXPECT_EQ(resp.job().id(), id) << rid;
  }
  // A new submit gets an id no stored job has.
  v1::SubmitJobResponse fresh;
  ASSERT_TRUE(c->submit(submit_request(dir, "after-restart", "rid-after-restart"), &fresh).ok());
  EXPECT_TRUE(fresh.created());
  for (const auto& [rid, id] : stored) EXPECT_NE(id, fresh.job().id());
}

v1::RegisterWorkerRequest trainer(const std::string& name, int port) {
  v1::RegisterWorkerRequest req;
  req.set_name(name);
  req.set_role(v1::TRAINER);
  req.mutable_resources()->set_cpu_slots(1);
  req.mutable_resources()->set_host_memory_bytes(int64_t{64} << 30);
  req.mutable_resources()->set_physical_cores(4);
  req.add_rendezvous_ports(port);
  return req;
}

// Registrations are group-committed like submits: while a registration's record is being
// synced the coordinator's lock is free (other calls are answered), the worker is not yet
// listed or placed on, a second registration of its name is refused, and the registrations
// that arrive meanwhile share the next transaction. A failed write refuses them, enters
// none, and a retry registers them.
TEST(Coordinator, RegistrationsAreGroupCommittedOutsideTheLock) {
  TestDir dir;
  CoordinatorOptions o;
  o.log = [](const std::string&) {};
  std::mutex mu;
  std::condition_variable cv;
  bool gate_open = false, first_waiting = false;
  int fail_next = 0;
  std::vector<size_t> worker_commits;  // workers per commit that has any
  auto hook = [&](const StoreBatch& b) {
    if (b.workers.empty()) return;
    std::unique_lock<std::mutex> lock(mu);
    worker_commits.push_back(b.workers.size());
    first_waiting = true;
    cv.notify_all();
    cv.wait(lock, [&] { return gate_open; });
    if (fail_next > 0) {
      --fail_next;
      throw StoreError("disk full (test)");
    }
  };
  auto c = std::make_unique<Coordinator>(std::make_unique<HookedStore>(open_sqlite_store(dir.db()), hook), o);
  auto open_gate = [&] {
    std::lock_guard<std::mutex> lock(mu);
    gate_open = true;
    cv.notify_all();
  };
  auto listed = [&] {
    v1::ListWorkersResponse workers;
    c->list_workers(&workers);
    std::set<std::string> names;
    for (const v1::WorkerStatus& w : workers.workers()) names.insert(w.name());
    return names;
  };

  constexpr int kWorkers = 16;
  std::vector<grpc::Status> status(kWorkers);
  std::vector<v1::RegisterWorkerResponse> resp(kWorkers);
  std::vector<std::thread> pool;
  auto register_one = [&](int i) {
    pool.emplace_back([&, i] {
      status[static_cast<size_t>(i)] =
          c->register_worker(trainer("w-" + std::to_string(i), 29500 + i), &resp[static_cast<size_t>(i)]);
    });
  };
  register_one(0);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return first_waiting; }));
  }
  // w-0's record is being synced. The lock is free: a list is answered (bounded, so that a
  // coordinator that held the lock fails here instead of hanging the test).
  auto during = std::async(std::launch::async, listed);
  if (during.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    open_gate();
    for (std::thread& t : pool) t.join();
    FAIL() << "list_workers waited for a registration's commit: the registration held the lock";
  }
  EXPECT_TRUE(during.get().empty()) << "w-0 was listed before its record was durable";
  v1::RegisterWorkerResponse twin;
  const grpc::Status dup = c->register_worker(trainer("w-0", 29600), &twin);
  EXPECT_EQ(dup.error_code(), grpc::StatusCode::ALREADY_EXISTS) << describe(dup);
  EXPECT_NE(dup.error_message().find("being registered"), std::string::npos) << dup.error_message();
  for (int i = 1; i < kWorkers; ++i) register_one(i);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let them queue behind w-0
  open_gate();
  for (std::thread& t : pool) t.join();
  pool.clear();
  std::set<int64_t> incarnations;
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(status[static_cast<size_t>(i)].ok()) << i << ": " << describe(status[static_cast<size_t>(i)]);
    incarnations.insert(resp[static_cast<size_t>(i)].incarnation());
    EXPECT_EQ(resp[static_cast<size_t>(i)].lease_ms(), o.lease.count());
  }
  EXPECT_EQ(incarnations.size(), static_cast<size_t>(kWorkers));
  EXPECT_EQ(listed().size(), static_cast<size_t>(kWorkers));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(worker_commits.front(), 1u);
    EXPECT_LT(worker_commits.size(), static_cast<size_t>(kWorkers)) << "no two registrations shared a commit";
    size_t total = 0;
    for (size_t n : worker_commits) total += n;
    EXPECT_EQ(total, static_cast<size_t>(kWorkers));
    fail_next = 1;
  }
  // A failed write: refused, not entered; the retry gets a new incarnation.
  v1::RegisterWorkerResponse late;
  const grpc::Status failed = c->register_worker(trainer("late", 29700), &late);
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::UNAVAILABLE) << describe(failed);
  EXPECT_NE(failed.error_message().find("worker store write failed: disk full (test)"), std::string::npos)
      << failed.error_message();
  EXPECT_EQ(listed().count("late"), 0u);
  ASSERT_TRUE(c->register_worker(trainer("late", 29700), &late).ok());
  EXPECT_EQ(listed().count("late"), 1u);
  EXPECT_EQ(incarnations.count(late.incarnation()), 0u);
  // Every acknowledged registration is in the store, with its incarnation.
  c.reset();
  std::map<std::string, int64_t> stored;
  for (const WorkerRecord& w : open_sqlite_store(dir.db())->load_workers()) stored[w.name] = w.incarnation;
  ASSERT_EQ(stored.size(), static_cast<size_t>(kWorkers + 1));
  for (int i = 0; i < kWorkers; ++i)
    EXPECT_EQ(stored["w-" + std::to_string(i)], resp[static_cast<size_t>(i)].incarnation()) << i;
  EXPECT_EQ(stored["late"], late.incarnation());
}

TEST(Coordinator, HeartbeatRenewsOnlyTheCurrentIncarnation) {
  TestDir dir;
  CoordinatorOptions o;
  o.log = [](const std::string&) {};
  o.lease = std::chrono::milliseconds(300);
  o.tick = std::chrono::milliseconds(20);
  Coordinator c(open_sqlite_store(dir.db()), o);
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c.register_worker(trainer("w1", 29500), &reg).ok());
  v1::HeartbeatRequest hb;
  hb.set_name("w1");
  hb.set_incarnation(reg.incarnation());
  v1::HeartbeatResponse resp;
  ASSERT_TRUE(c.heartbeat(hb, &resp).ok());
  EXPECT_GE(resp.assignment_revision(), 1);
  EXPECT_EQ(resp.lease_ms(), 300);

  hb.set_incarnation(reg.incarnation() + 1);
  grpc::Status s = c.heartbeat(hb, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("re-registered as " + std::to_string(reg.incarnation())),
            std::string::npos)
      << s.error_message();
  hb.set_name("nobody");
  s = c.heartbeat(hb, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("not registered"), std::string::npos) << s.error_message();

  // Silent past its lease: LOST, and its heartbeats are refused from then on.
  bool lost = false;
  for (int i = 0; i < 500 && !lost; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v1::ListWorkersResponse workers;
    c.list_workers(&workers);
    lost = workers.workers_size() == 1 && workers.workers(0).state() == v1::LOST;
  }
  ASSERT_TRUE(lost);
  hb.set_name("w1");
  hb.set_incarnation(reg.incarnation());
  s = c.heartbeat(hb, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("declared LOST"), std::string::npos) << s.error_message();
  // A new registration leases it again.
  ASSERT_TRUE(c.register_worker(trainer("w1", 29500), &reg).ok());
  hb.set_incarnation(reg.incarnation());
  EXPECT_TRUE(c.heartbeat(hb, &resp).ok());
}

// HeartbeatStream's lease cut: a broken stream that carried the worker's latest streamed
// beat cuts its lease to one interval, and the LOST reason says so; one the worker already
// replaced, or a unary beat's worker, keeps the whole lease.
TEST(Coordinator, ABrokenHeartbeatStreamCutsTheLeaseOnlyWhenItWasTheLatest) {
  TestDir dir;
  std::vector<std::string> lines;
  std::mutex lines_mu;
  CoordinatorOptions o;
  o.log = [&](const std::string& l) {
    std::lock_guard<std::mutex> lock(lines_mu);
    lines.push_back(l);
  };
  o.lease = std::chrono::milliseconds(3000);
  o.heartbeat_interval = std::chrono::milliseconds(100);
  o.tick = std::chrono::milliseconds(10);
  Coordinator c(open_sqlite_store(dir.db()), o);
  auto state_of = [&](const std::string& name) {
    v1::ListWorkersResponse workers;
    c.list_workers(&workers);
    for (const v1::WorkerStatus& w : workers.workers())
      if (w.name() == name) return w.state();
    return v1::WorkerState{};
  };
  v1::RegisterWorkerResponse ra, rb;
  ASSERT_TRUE(c.register_worker(trainer("a", 29500), &ra).ok());
  ASSERT_TRUE(c.register_worker(trainer("b", 29501), &rb).ok());
  v1::HeartbeatRequest a, b;
  a.set_name("a");
  a.set_incarnation(ra.incarnation());
  b.set_name("b");
  b.set_incarnation(rb.incarnation());
  v1::HeartbeatResponse resp;
  ASSERT_TRUE(c.heartbeat(a, &resp, /*stream=*/7).ok());
  ASSERT_TRUE(c.heartbeat(a, &resp, /*stream=*/8).ok());  // a moved to stream 8
  ASSERT_TRUE(c.heartbeat(b, &resp, /*stream=*/9).ok());
  a.add_attempts()->set_job_id("j-1");
  EXPECT_EQ(c.heartbeat(a, &resp, 8).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  a.clear_attempts();
  c.heartbeat_stream_broken("a", ra.incarnation(), 7);      // replaced: nothing
  c.heartbeat_stream_broken("b", rb.incarnation() + 1, 9);  // another incarnation: nothing
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // 5 intervals
  c.tick_now();
  EXPECT_EQ(state_of("a"), v1::READY);
  EXPECT_EQ(state_of("b"), v1::READY);
  c.heartbeat_stream_broken("b", rb.incarnation(), 9);
  for (int i = 0; i < 200 && state_of("b") != v1::LOST; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(state_of("b"), v1::LOST);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2500));  // before its lease
  EXPECT_EQ(state_of("a"), v1::READY);
  std::lock_guard<std::mutex> lock(lines_mu);
  bool said = false;
  for (const std::string& l : lines)
    said |= l.find("worker b LOST: its heartbeat stream broke") != std::string::npos;
  EXPECT_TRUE(said);
}

// The report that attempt 1 of `job_id` on `worker` exited (0: it succeeded).
v1::ReportEventRequest exited(const std::string& worker, int64_t incarnation, const std::string& job_id) {
  v1::ReportEventRequest ev;
  ev.set_name(worker);
  ev.set_incarnation(incarnation);
  ev.mutable_attempt()->set_job_id(job_id);
  ev.mutable_attempt()->set_attempt(1);
  ev.mutable_attempt()->set_exited(true);
  return ev;
}

// A failed attempt's cause is what the ranks reported, byte for byte, in memory and after a
// restart: end_attempt once read the failing member after release_attempt() had cleared
// the members, storing freed heap bytes as last_error (invalid UTF-8 that broke every
// ListJobs page holding the job).
TEST(Coordinator, AFailedAttemptsCauseIsStoredAsTheRanksReportedIt) {
  TestDir dir;
  std::string requeued_id, failed_id;
  const std::string cause(200, 'x');  // long enough to live on the heap, not in the SSO buffer
  {
    auto c = open_coordinator(dir.db());
    v1::RegisterWorkerRequest two = trainer("w1", 29500);
    two.mutable_resources()->set_cpu_slots(2);
    two.add_rendezvous_ports(29501);
    v1::RegisterWorkerResponse reg;
    ASSERT_TRUE(c->register_worker(two, &reg).ok());
    for (const char* name : {"requeued", "failed"}) {
      v1::SubmitJobResponse sub;
      ASSERT_TRUE(c->submit(submit_request(dir, name, ""), &sub).ok());
      (std::string(name) == "requeued" ? requeued_id : failed_id) = sub.job().id();
    }
    c->tick_now();
    // Killed by a signal (9): a worker-side failure, requeued. Exit 1: final.
    for (auto [id, code] : {std::pair<std::string, int>{requeued_id, 137}, {failed_id, 1}}) {
      v1::ReportEventRequest ev = exited("w1", reg.incarnation(), id);
      ev.mutable_attempt()->set_exit_code(code);
      ev.mutable_attempt()->set_message("rank 0 " + cause);
      ASSERT_TRUE(c->report_event(ev).ok());
    }
    v1::JobStatus st;
    ASSERT_TRUE(c->get(requeued_id, &st).ok());
    EXPECT_EQ(st.last_error(), "ranks on w1 killed by signal 9: rank 0 " + cause + "; requeued (restart 1 of 3)");
    ASSERT_TRUE(c->get(failed_id, &st).ok());
    EXPECT_EQ(st.state(), v1::FAILED);
    EXPECT_EQ(st.last_error(), "ranks on w1 exited with status 1: rank 0 " + cause);
  }
  auto again = open_coordinator(dir.db());
  v1::ListJobsRequest req;
  v1::ListJobsResponse list;
  ASSERT_TRUE(again->list(req, &list).ok());
  ASSERT_EQ(list.jobs_size(), 2);
  std::string serialized;
  EXPECT_TRUE(list.SerializeToString(&serialized));  // fails on invalid UTF-8 in a string field
  v1::JobStatus st;
  ASSERT_TRUE(again->get(failed_id, &st).ok());
  EXPECT_EQ(st.last_error(), "ranks on w1 exited with status 1: rank 0 " + cause);
}

// A finished job keeps the throughput and stall share its trainer last reported, and what
// they price (stall dollars, tokens), across a coordinator restart.
TEST(Coordinator, AFinishedJobKeepsItsLastRateAndStallShareAcrossARestart) {
  TestDir dir;
  v1::JobStatus done;
  std::string id;
  {
    auto c = open_coordinator(dir.db());
    v1::RegisterWorkerResponse reg;
    ASSERT_TRUE(c->register_worker(trainer("w1", 29500), &reg).ok());
    v1::SubmitJobRequest req = submit_request(dir, "priced", "");
    req.set_spec_yaml(req.spec_yaml() + "cost: {usd_per_hour: 3.6}\n");
    v1::SubmitJobResponse sub;
    ASSERT_TRUE(c->submit(req, &sub).ok());
    id = sub.job().id();
    c->tick_now();
    // Held for a while (its cost is the time it holds the worker, at the rate).
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    v1::ReportProgressRequest p;
    p.set_name("w1");
    p.set_incarnation(reg.incarnation());
    p.mutable_attempt()->set_job_id(id);
    p.mutable_attempt()->set_attempt(1);
    p.set_step(3);
    p.set_total_steps(3);
    p.set_tokens_per_second(1234.5);
    p.set_stall_share(0.25);
    p.set_step_seconds(0.05);
    p.set_tokens_per_step(64);
    ASSERT_TRUE(c->report_progress(p).ok());
    ASSERT_TRUE(c->report_event(exited("w1", reg.incarnation(), id)).ok());
    ASSERT_TRUE(c->get(id, &done).ok());
  }
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_EQ(done.tokens_per_second(), 1234.5);
  EXPECT_EQ(done.stall_share(), 0.25);
  EXPECT_GT(done.cost_usd(), 0);
  EXPECT_DOUBLE_EQ(done.usd_lost_to_stalls(), 0.25 * done.cost_usd());
  EXPECT_EQ(done.tokens(), 3 * 64);
  auto again = open_coordinator(dir.db());
  v1::JobStatus after;
  ASSERT_TRUE(again->get(id, &after).ok());
  EXPECT_EQ(after.state(), v1::SUCCEEDED);
  EXPECT_EQ(after.tokens_per_second(), 1234.5);
  EXPECT_EQ(after.stall_share(), 0.25);
  EXPECT_EQ(after.cost_usd(), done.cost_usd());
  EXPECT_EQ(after.usd_lost_to_stalls(), done.usd_lost_to_stalls());
  EXPECT_EQ(after.tokens(), 3 * 64);
  EXPECT_EQ(after.usd_per_1m_tokens(), done.usd_per_1m_tokens());
}

// Progress reaches the store without a transition: a running job's reported step is
// written by a tick once it is kProgressPersistMs (2 s) old, for every job that reported,
// and not before. (Ticks visit only the jobs with unwritten progress.)
TEST(Coordinator, ReportedProgressIsWrittenByATickAfterTwoSeconds) {
  TestDir dir;
  std::vector<std::string> ids;
  {
    auto c = open_coordinator(dir.db());
    std::vector<v1::RegisterWorkerResponse> regs(2);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(
          c->register_worker(trainer("w" + std::to_string(i), 29500 + i), &regs[static_cast<size_t>(i)])
              .ok());
      v1::SubmitJobResponse sub;
      v1::SubmitJobRequest req = submit_request(dir, "progress-" + std::to_string(i), "");
      req.add_set("train.steps=100");
      ASSERT_TRUE(c->submit(req, &sub).ok()) << req.spec_yaml();
      ids.push_back(sub.job().id());
    }
    v1::SubmitJobResponse idle;  // queued behind them, never reporting
    ASSERT_TRUE(c->submit(submit_request(dir, "idle", ""), &idle).ok());
    c->tick_now();
    auto report = [&](int i, int64_t step) {
      v1::JobStatus st;
      EXPECT_TRUE(c->get(ids[static_cast<size_t>(i)], &st).ok());
      ASSERT_EQ(st.placement_size(), 1);
      const int w = st.placement(0) == "w0" ? 0 : 1;
      v1::ReportProgressRequest p;
      p.set_name(st.placement(0));
      p.set_incarnation(regs[static_cast<size_t>(w)].incarnation());
      p.mutable_attempt()->set_job_id(ids[static_cast<size_t>(i)]);
      p.mutable_attempt()->set_attempt(1);
      p.set_step(step);
      p.set_total_steps(st.total_steps());
      p.set_step_seconds(0.01);
      const grpc::Status s = c->report_progress(p);
      ASSERT_TRUE(s.ok()) << describe(s);
    };
    report(0, 1);  // the first report starts the attempt: a transition, written at once
    report(1, 1);
    report(0, 7);
    report(1, 9);
    c->tick_now();
    // Read beside the running coordinator (WAL readers do not block it).
    auto stored_step = [&](const std::string& id) {
      sqlite3* raw = nullptr;
      int64_t step = -1;
      if (sqlite3_open_v2(dir.db().c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
        sqlite3_stmt* q = nullptr;
        if (sqlite3_prepare_v2(raw, "SELECT step FROM jobs WHERE id = ?1", -1, &q, nullptr) == SQLITE_OK) {
          sqlite3_bind_text(q, 1, id.c_str(), -1, SQLITE_TRANSIENT);
          if (sqlite3_step(q) == SQLITE_ROW) step = sqlite3_column_int64(q, 0);
        }
        sqlite3_finalize(q);
      }
      sqlite3_close(raw);
      return step;
    };
    EXPECT_EQ(stored_step(ids[0]), 0);  // as the start wrote it: progress waits its 2 s
    EXPECT_EQ(stored_step(ids[1]), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(2100));
    c->tick_now();
    EXPECT_EQ(stored_step(ids[0]), 7);
    EXPECT_EQ(stored_step(ids[1]), 9);
    EXPECT_EQ(stored_step(idle.job().id()), 0);
  }
  std::map<std::string, int64_t> steps;
  for (const JobRecord& r : open_sqlite_store(dir.db())->load_jobs()) steps[r.id] = r.step;
  EXPECT_EQ(steps[ids[0]], 7);
  EXPECT_EQ(steps[ids[1]], 9);
}

// Progress rides on the heartbeat stream (HeartbeatRequest.progress, how the agent sends it):
// each entry is taken as ReportProgress takes it; one of another incarnation, a stale
// attempt or a step out of range is skipped, and the beat still renews the lease.
TEST(Coordinator, ProgressOnAStreamBeatIsTakenAsReportProgressTakesIt) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w1", 29500), &reg).ok());
  v1::SubmitJobRequest req = submit_request(dir, "beats", "");
  req.add_set("train.steps=100");
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(req, &sub).ok());
  const std::string id = sub.job().id();
  c->tick_now();
  auto entry = [&](int64_t incarnation, int64_t attempt, int64_t step, double loss) {
    v1::ReportProgressRequest p;
    p.set_name("w1");
    p.set_incarnation(incarnation);
    p.mutable_attempt()->set_job_id(id);
    p.mutable_attempt()->set_attempt(attempt);
    p.set_step(step);
    p.set_total_steps(100);
    p.set_loss(loss);
    p.set_step_seconds(0.01);
    return p;
  };
  auto beat = [&](std::vector<v1::ReportProgressRequest> progress) {
    v1::HeartbeatRequest hb;
    hb.set_name("w1");
    hb.set_incarnation(reg.incarnation());
    for (auto& p : progress) *hb.add_progress() = std::move(p);
    v1::HeartbeatResponse resp;
    return c->heartbeat(hb, &resp, /*stream=*/7);
  };
  auto status = [&] {
    v1::JobStatus st;
    EXPECT_TRUE(c->get(id, &st).ok());
    return st;
  };
  ASSERT_TRUE(beat({entry(reg.incarnation(), 1, 12, 2.5)}).ok());
  EXPECT_EQ(status().state(), v1::RUNNING) << "the first progress starts the attempt";
  EXPECT_EQ(status().step(), 12);
  EXPECT_EQ(status().last_loss(), 2.5);
  // Skipped, each: another incarnation, a stale attempt, a step beyond the total. The
  // beat is still accepted, and the good entry beside them is taken.
  const grpc::Status s = beat({entry(reg.incarnation() + 1, 1, 50, 9.0), entry(reg.incarnation(), 2, 60, 9.0),
                               entry(reg.incarnation(), 1, 500, 9.0), entry(reg.incarnation(), 1, 20, 2.25)});
  ASSERT_TRUE(s.ok()) << describe(s);
  EXPECT_EQ(status().step(), 20);
  EXPECT_EQ(status().last_loss(), 2.25);
  // An older report arriving late (a beat in flight while the final one went by
  // ReportProgress) changes nothing.
  ASSERT_TRUE(beat({entry(reg.incarnation(), 1, 15, 7.0)}).ok());
  EXPECT_EQ(status().step(), 20);
  EXPECT_EQ(status().last_loss(), 2.25);
  // A unary Heartbeat (stream 0) takes it the same way.
  v1::HeartbeatRequest hb;
  hb.set_name("w1");
  hb.set_incarnation(reg.incarnation());
  *hb.add_progress() = entry(reg.incarnation(), 1, 30, 2.0);
  v1::HeartbeatResponse resp;
  ASSERT_TRUE(c->heartbeat(hb, &resp).ok());
  EXPECT_EQ(status().step(), 30);
}

// A spec that named no checkpoint.dir (the client says so) goes under the coordinator's
// --checkpoint-root, ROOT/<name>, and that is what its workers are given; one that named a
// dir keeps it; without a root, the client's default stands.
TEST(Coordinator, JobsThatNameNoCheckpointDirGoUnderTheCheckpointRoot) {
  TestDir dir;
  CoordinatorOptions o;
  o.log = [](const std::string&) {};
  o.checkpoint_root = "s3://zf-runs/team-a";
  auto c = std::make_unique<Coordinator>(open_sqlite_store(dir.db()), o);
  auto submit = [&](const std::string& name, bool defaulted) {
    v1::SubmitJobRequest req = submit_request(dir, name, "rid-" + name);
    req.set_checkpoint_dir_default(defaulted);
    v1::SubmitJobResponse resp;
    const grpc::Status s = c->submit(req, &resp);
    EXPECT_TRUE(s.ok()) << describe(s);
    return resp.job();
  };
  const v1::JobStatus defaulted = submit("unnamed", true);
  EXPECT_EQ(defaulted.checkpoint_dir(), "s3://zf-runs/team-a/unnamed");
  // The worker it is placed on is given that directory in the spec.
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  c->tick_now();
  v1::FetchAssignmentsRequest fetch;
  fetch.set_name("w");
  fetch.set_incarnation(reg.incarnation());
  v1::FetchAssignmentsResponse assigned;
  ASSERT_TRUE(c->fetch_assignments(fetch, &assigned).ok());
  ASSERT_EQ(assigned.assignments_size(), 1);
  EXPECT_NE(assigned.assignments(0).spec_yaml().find("dir: \"s3://zf-runs/team-a/unnamed\""), std::string::npos)
      << assigned.assignments(0).spec_yaml();
  EXPECT_EQ(submit("named", false).checkpoint_dir(), dir.path() + "/ckpt-named");
  o.checkpoint_root.clear();
  c.reset();  // the store's lock
  c = std::make_unique<Coordinator>(open_sqlite_store(dir.db()), o);
  EXPECT_EQ(submit("no-root", true).checkpoint_dir(), dir.path() + "/ckpt-no-root");
}

// Rank 0's worker holds a rendezvous port per slot: two jobs running there at once get
// different ports, and a port comes free when its job ends (many ended jobs later).
TEST(Coordinator, JobsOnOneWorkerGetDistinctRendezvousPortsAndEndedOnesFreeTheirs) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  v1::RegisterWorkerRequest two = trainer("w", 29500);
  two.mutable_resources()->set_cpu_slots(2);
  two.add_rendezvous_ports(29501);
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(two, &reg).ok());
  auto ports = [&] {
    v1::FetchAssignmentsRequest req;
    req.set_name("w");
    req.set_incarnation(reg.incarnation());
    v1::FetchAssignmentsResponse resp;
    EXPECT_TRUE(c->fetch_assignments(req, &resp).ok());
    std::map<std::string, int32_t> by_job;
    for (const v1::Assignment& a : resp.assignments())
      if (a.action() == v1::Assignment::RUN) by_job[a.job_id()] = a.master_port();
    return by_job;
  };
  auto finish = [&](const std::string& id) {
    ASSERT_TRUE(c->report_event(exited("w", reg.incarnation(), id)).ok());
  };
  std::string held;  // a job that keeps running throughout
  for (int round = 0; round < 6; ++round) {
    v1::SubmitJobResponse sub;
    ASSERT_TRUE(c->submit(submit_request(dir, "r" + std::to_string(round), ""), &sub).ok());
    c->tick_now();
    const std::map<std::string, int32_t> now = ports();
    ASSERT_EQ(now.size(), held.empty() ? 1u : 2u) << round;
    ASSERT_EQ(now.count(sub.job().id()), 1u) << round;
    const std::set<int32_t> distinct = [&] {
      std::set<int32_t> d;
      for (const auto& [id, port] : now) d.insert(port);
      return d;
    }();
    EXPECT_EQ(distinct.size(), now.size()) << round;
    for (int32_t port : distinct) EXPECT_TRUE(port == 29500 || port == 29501) << port;
    if (held.empty()) {
      held = sub.job().id();
    } else {
      finish(sub.job().id());  // its port is free for the next round's job
      c->tick_now();
    }
  }
  v1::JobStatus st;
  ASSERT_TRUE(c->get(held, &st).ok());
  EXPECT_EQ(st.state(), v1::STARTING);
}

// Passes skip a queue they found stable until something changes; what changes meanwhile
// still counts: a job cancelled while stable never starts, the others start in queue
// order (priority, then submit order) as workers come.
TEST(Coordinator, AStableQueueIsSkippedUntilTheClusterChangesAndACancelledJobNeverStarts) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    v1::SubmitJobRequest req = submit_request(dir, "q" + std::to_string(i), "");
    if (i == 3) req.add_set("resources.priority=5");  // submitted last, runs first
    v1::SubmitJobResponse sub;
    ASSERT_TRUE(c->submit(req, &sub).ok());
    ids.push_back(sub.job().id());
    c->tick_now();  // each pass finds the queue stable (no trainer)
  }
  auto state = [&](const std::string& id) {
    v1::JobStatus st;
    EXPECT_TRUE(c->get(id, &st).ok());
    return st.state();
  };
  v1::JobStatus cancelled;
  ASSERT_TRUE(c->cancel(ids[1], &cancelled).ok());
  c->tick_now();
  EXPECT_EQ(state(ids[1]), v1::CANCELLED);
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  std::vector<std::string> started;
  for (int round = 0; round < 3; ++round) {
    c->tick_now();
    std::string running;
    for (const std::string& id : ids)
      if (state(id) == v1::STARTING) running = id;
    ASSERT_FALSE(running.empty()) << "round " << round;
    started.push_back(running);
    ASSERT_TRUE(c->report_event(exited("w", reg.incarnation(), running)).ok());
  }
  EXPECT_EQ(started, (std::vector<std::string>{ids[3], ids[0], ids[2]}));
  c->tick_now();
  EXPECT_EQ(state(ids[1]), v1::CANCELLED);
  for (const std::string& id : {ids[0], ids[2], ids[3]}) EXPECT_EQ(state(id), v1::SUCCEEDED) << id;
}

TEST(Coordinator, JobSkippedAsUnplaceableStartsWhenATrainerJoins) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  v1::SubmitJobResponse first, second;
  ASSERT_TRUE(c->submit(submit_request(dir, "first", ""), &first).ok());
  c->tick_now();
  v1::JobStatus st;
  ASSERT_TRUE(c->get(first.job().id(), &st).ok());
  EXPECT_EQ(st.waiting_reason().rfind("unschedulable:", 0), 0u) << st.waiting_reason();
  // The next passes skip it (nothing changed); a job queued meanwhile is evaluated.
  ASSERT_TRUE(c->submit(submit_request(dir, "second", ""), &second).ok());
  c->tick_now();
  ASSERT_TRUE(c->get(second.job().id(), &st).ok());
  EXPECT_EQ(st.waiting_reason().rfind("unschedulable:", 0), 0u) << st.waiting_reason();
  // A trainer joins: the cluster changed, so both are evaluated again and the first starts.
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w1", 29500), &reg).ok());
  c->tick_now();
  ASSERT_TRUE(c->get(first.job().id(), &st).ok());
  EXPECT_EQ(st.state(), v1::STARTING) << st.waiting_reason();
  ASSERT_EQ(st.placement_size(), 1);
  EXPECT_EQ(st.placement(0), "w1");
  ASSERT_TRUE(c->get(second.job().id(), &st).ok());
  EXPECT_EQ(st.state(), v1::QUEUED);
  EXPECT_EQ(st.waiting_reason().rfind("waiting:", 0), 0u) << st.waiting_reason();
}

// Workers confine the specs they run to their allowed roots (zenflow-worker --allowed-root),
// and advertise them: the coordinator places a job only on a worker whose roots cover every
// path of its spec, says why a job no worker may hold waits, and keeps the roots across a
// restart. An agent that advertises none (older than the field) is taken as unconfined.
// Before, a job with checkpoint.dir outside a worker's roots was placed there and failed.
TEST(Coordinator, AJobIsPlacedOnlyOnAWorkerWhoseAllowedRootsCoverItsPaths) {
  TestDir dir;
  const std::string licenses = "/usr/share/common-licenses", ckpt = dir.path() + "/ckpt-confined";
  auto confined = [&](const std::string& name, int port, std::vector<std::string> roots) {
    v1::RegisterWorkerRequest req = trainer(name, port);
    for (const std::string& r : roots) req.add_allowed_roots(r);
    return req;
  };
  auto status = [](Coordinator& c, const std::string& id) {
    v1::JobStatus st;
    EXPECT_TRUE(c.get(id, &st).ok());
    return st;
  };
  v1::RegisterWorkerResponse reg;
  v1::SubmitJobResponse job;
  {
    auto c = open_coordinator(dir.db());
    ASSERT_TRUE(c->register_worker(confined("narrow", 29500, {"/srv/work", licenses}), &reg).ok());
    ASSERT_TRUE(c->submit(submit_request(dir, "confined", ""), &job).ok());
    c->tick_now();
    const v1::JobStatus st = status(*c, job.job().id());
    EXPECT_EQ(st.state(), v1::QUEUED);
    EXPECT_EQ(
        st.waiting_reason(),
        "unschedulable: needs 1 worker with 1 CPU slot and 1 core; only 0 schedulable workers could ever fit "
        "one; 1 schedulable worker refuses its paths: checkpoint.dir " +
            ckpt + " is outside the allowed roots of narrow (/srv/work, " + licenses + ")");
  }
  auto c = open_coordinator(dir.db());  // restarted: the roots come from the store, the paths from the spec
  v1::ListWorkersResponse listed;
  c->list_workers(&listed);
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_EQ(std::vector<std::string>(listed.workers(0).allowed_roots().begin(),
                                     listed.workers(0).allowed_roots().end()),
            (std::vector<std::string>{"/srv/work", licenses}));
  c->tick_now();
  v1::JobStatus st = status(*c, job.job().id());
  EXPECT_EQ(st.state(), v1::QUEUED);
  EXPECT_NE(st.waiting_reason().find("refuses its paths: checkpoint.dir " + ckpt), std::string::npos)
      << st.waiting_reason();
  // Covering the checkpoint but not the data is not enough; covering both is.
  ASSERT_TRUE(c->register_worker(confined("no-data", 29501, {dir.path()}), &reg).ok());
  c->tick_now();
  st = status(*c, job.job().id());
  EXPECT_EQ(st.state(), v1::QUEUED);
  EXPECT_NE(st.waiting_reason().find("2 schedulable workers refuse its paths"), std::string::npos)
      << st.waiting_reason();
  ASSERT_TRUE(c->register_worker(confined("wide", 29502, {dir.path(), licenses}), &reg).ok());
  c->tick_now();
  st = status(*c, job.job().id());
  EXPECT_EQ(st.state(), v1::STARTING) << st.waiting_reason();
  EXPECT_EQ(std::vector<std::string>(st.placement().begin(), st.placement().end()),
            std::vector<std::string>{"wide"});
  // An agent that advertises no roots takes what the confined ones refuse.
  v1::SubmitJobResponse second;
  ASSERT_TRUE(c->submit(submit_request(dir, "second", ""), &second).ok());
  ASSERT_TRUE(c->register_worker(trainer("older-agent", 29503), &reg).ok());
  c->tick_now();
  st = status(*c, second.job().id());
  EXPECT_EQ(st.state(), v1::STARTING) << st.waiting_reason();
  EXPECT_EQ(std::vector<std::string>(st.placement().begin(), st.placement().end()),
            std::vector<std::string>{"older-agent"});
}

// A spec that leaves checkpoint.dir out means runs/<name> of the directory it is read in.
// The coordinator does not read it anywhere, so it never gives it its own directory: the
// spec is refused (zenflow submit sends the directory it resolved), and nothing is placed.
TEST(Coordinator, ASubmittedSpecWithoutACheckpointDirIsRefusedNotGivenTheCoordinatorsDirectory) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  std::string yaml = dir.spec("no-dir");
  yaml = yaml.substr(0, yaml.find("checkpoint:"));
  v1::SubmitJobRequest req;
  req.set_spec_yaml(yaml);
  req.set_request_id("no-dir");
  v1::SubmitJobResponse resp;
  const grpc::Status s = c->submit(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "checkpoint.dir: must be an absolute path in a submitted spec (zenflow submit resolves relative "
            "paths against its working directory), got \"runs/no-dir\"");
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(c->list(v1::ListJobsRequest(), &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
}

// The roots a worker advertises are checked before anything of the registration is kept:
// absolute, in normal form, printable, bounded; else INVALID_ARGUMENT naming the field.
TEST(Coordinator, RegistrationWithAMalformedAllowedRootIsRefusedNamingTheField) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  auto refusal = [&](const std::vector<std::string>& roots) {
    v1::RegisterWorkerRequest req = trainer("w", 29500);
    for (const std::string& r : roots) req.add_allowed_roots(r);
    v1::RegisterWorkerResponse reg;
    const grpc::Status s = c->register_worker(req, &reg);
    return s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? s.error_message() : describe(s);
  };
  for (const std::string& root : {std::string("relative/dir"), std::string(""), std::string("/a/../b"),
                                  std::string("/a/"), std::string("/a//b"), std::string("/a:b")})
    EXPECT_EQ(refusal({"/shared", root}).rfind("allowed_roots: each an absolute path in normal form", 0), 0u)
        << "\"" << root << "\": " << refusal({"/shared", root});
  for (const std::string& root : {std::string("/tab\there"), std::string("/bell\x07"),
                                  std::string("/\xff\xfe"), "/" + std::string(4096, 'a')})
    EXPECT_EQ(refusal({root}), "allowed_roots: each printable, at most 4096 bytes");
  EXPECT_EQ(refusal(std::vector<std::string>(65, "/shared")), "allowed_roots: at most 64, got 65");
  v1::ListWorkersResponse listed;
  c->list_workers(&listed);
  EXPECT_EQ(listed.workers_size(), 0);
  EXPECT_EQ(refusal({"/", "/shared", "/var/lib/zenflow/work"}), "0: ") << "well-formed roots register";
}

double thread_cpu_us() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e6 + double(t.tv_nsec) / 1e3;
}
double process_cpu_us() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e6 + double(t.tv_nsec) / 1e3;
}

// The coordinator's own cost per call, without gRPC and TLS (the bench measures those), on
// the bench's state: 5,000 leased workers and 1,000 queued jobs no worker can take. And a
// heartbeat's latency while submits and scheduling passes run. Printed, never asserted.
TEST(Coordinator, InProcessFigures) {
  TestDir dir;
  CoordinatorOptions o;
  o.log = [](const std::string&) {};
  o.lease = std::chrono::milliseconds(60'000);
  Coordinator c(open_sqlite_store(dir.db()), o);
  constexpr int kWorkers = 5000, kQueued = 1000;
  std::vector<int64_t> incarnation(kWorkers);
  for (int i = 0; i < kWorkers; ++i) {
    v1::RegisterWorkerRequest req;
    req.set_name("sim-" + std::to_string(i));
    req.set_role(v1::OPTIMIZER);
    req.mutable_resources()->set_host_memory_bytes(int64_t{64} << 30);
    v1::RegisterWorkerResponse resp;
    ASSERT_TRUE(c.register_worker(req, &resp).ok());
    incarnation[static_cast<size_t>(i)] = resp.incarnation();
  }
  std::string first_id;
  for (int i = 0; i < kQueued; ++i) {
    v1::SubmitJobResponse resp;
    ASSERT_TRUE(c.submit(submit_request(dir, "queued-" + std::to_string(i), ""), &resp).ok());
    if (i == 0) first_id = resp.job().id();
  }
  c.tick_now();

  auto heartbeat = [&](int i) {
    v1::HeartbeatRequest req;
    req.set_name("sim-" + std::to_string(i % kWorkers));
    req.set_incarnation(incarnation[static_cast<size_t>(i % kWorkers)]);
    v1::HeartbeatResponse resp;
    return c.heartbeat(req, &resp).ok();
  };
  constexpr int kCalls = 100'000;
  double t0 = thread_cpu_us();
  int ok = 0;
  for (int i = 0; i < kCalls; ++i) ok += heartbeat(i);
  const double hb_us = (thread_cpu_us() - t0) / kCalls;
  EXPECT_EQ(ok, kCalls);
  t0 = thread_cpu_us();
  for (int i = 0; i < kCalls; ++i) {
    v1::JobStatus st;
    ok += c.get(first_id, &st).ok();
  }
  const double get_us = (thread_cpu_us() - t0) / kCalls;

  // Submits as fast as they go, from 4 threads; meanwhile one thread heartbeats and times each.
  constexpr int kSubmitters = 4, kEach = 100;
  std::atomic<bool> submitting{true};
  std::vector<double> hb_latency_us;
  const double p0 = process_cpu_us();
  const auto w0 = std::chrono::steady_clock::now();
  std::thread beater([&] {
    for (int i = 0; submitting.load(); ++i) {
      const auto a = std::chrono::steady_clock::now();
      heartbeat(i);
      hb_latency_us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  std::vector<std::thread> pool;
  for (int t = 0; t < kSubmitters; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        v1::SubmitJobResponse resp;
        (void)c.submit(submit_request(dir, "s" + std::to_string(t) + "-" + std::to_string(i), ""), &resp);
      }
    });
  for (std::thread& th : pool) th.join();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  submitting = false;
  beater.join();
  const double submit_cpu_us = (process_cpu_us() - p0) / (kSubmitters * kEach);
  // A lease check and scheduling pass over the queue (now 1,400 jobs no worker can take).
  std::vector<double> pass_us;
  for (int i = 0; i < 21; ++i) {
    const auto a = std::chrono::steady_clock::now();
    c.tick_now();
    pass_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(pass_us.begin(), pass_us.end());
  std::sort(hb_latency_us.begin(), hb_latency_us.end());
  const auto q = [&](double f) {
    return hb_latency_us[std::min(hb_latency_us.size() - 1,
                                  static_cast<size_t>(f * double(hb_latency_us.size())))];
  };
  std::printf(
      "[figure] coordinator in-process, %d workers, %d queued: heartbeat %.2f us CPU, get %.2f us CPU\n",
      kWorkers, kQueued, hb_us, get_us);
  std::printf(
      "[figure] %d submits from %d threads: %.0f/s, %.0f us process CPU each (commits, passes, "
      "heartbeats included); heartbeat meanwhile p50 %.1f us, p99 %.1f us, max %.1f us (%zu)\n",
      kSubmitters * kEach, kSubmitters, kSubmitters * kEach / wall_s, submit_cpu_us, q(0.5), q(0.99),
      hb_latency_us.back(), hb_latency_us.size());
  std::printf(
      "[figure] tick_now (lease check + scheduling pass) over %d queued jobs: median %.0f us, max %.0f us\n",
      kQueued + kSubmitters * kEach, pass_us[pass_us.size() / 2], pass_us.back());
}

// zenflow_rpc_duration_seconds has a series for every unary method of both services (the
// long poll FetchAssignments and the streams excepted): a method the services time but the
// metrics do not know would be dropped without a word, as UploadProfile and GetJobProfile
// once were.
TEST(CoordinatorMetrics, EveryUnaryRpcIsTimed) {
  metrics::MetricsRegistry registry;
  CoordinatorMetrics m(registry);
  std::vector<std::string> unary;
  for (const char* name : {v1::JobService::service_full_name(), v1::WorkerService::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* method = service->method(i);
      // (HeartbeatStream's beats are timed one by one, as calls of their own.)
      if ((method->client_streaming() || method->server_streaming()) && method->name() != "HeartbeatStream")
        continue;
      if (method->name() == "FetchAssignments") continue;
      unary.push_back(method->name());
      m.observe_rpc(method->name(), 0.002);
    }
  }
  EXPECT_GE(unary.size(), 13u);
  std::map<std::string, uint64_t> counted;
  for (const metrics::FamilySnapshot& f : registry.collect())
    if (f.name == "zenflow_rpc_duration_seconds")
      for (const metrics::SeriesSnapshot& s : f.series) counted[s.label_values.at(0)] = s.histogram.count();
  for (const std::string& method : unary) EXPECT_EQ(counted[method], 1u) << method << " is not timed";
}


// --- faults: fences, restarts, repairs, bounded logs (issue 35) ---

constexpr int64_t kT0 = 1'800'000'000'000;  // a wall clock the tests move themselves

// A coordinator on `now` (ms since the epoch), with the default lease (4 s) and interval (1 s).
std::unique_ptr<Coordinator> clocked_coordinator(const TestDir& dir, std::atomic<int64_t>& now,
                                                 std::vector<std::string>* lines = nullptr,
                                                 std::mutex* lines_mu = nullptr) {
  CoordinatorOptions o;
  o.clock = [&now] { return now.load(); };
  o.issued_ids_path = dir.db() + ".ids";
  o.log = [lines, lines_mu](const std::string& l) {
    if (!lines) return;
    std::lock_guard<std::mutex> lock(*lines_mu);
    lines->push_back(l);
  };
  return std::make_unique<Coordinator>(open_sqlite_store(dir.db()), o);
}

grpc::Status beat(Coordinator& c, const std::string& name, int64_t incarnation) {
  v1::HeartbeatRequest hb;
  hb.set_name(name);
  hb.set_incarnation(incarnation);
  v1::HeartbeatResponse resp;
  return c.heartbeat(hb, &resp);
}

v1::JobStatus status_of(Coordinator& c, const std::string& id) {
  v1::JobStatus st;
  EXPECT_TRUE(c.get(id, &st).ok());
  return st;
}

// A worker that goes silent may be cut off and training on: its job starts elsewhere only
// once the worker's self-fence (fence_ms after its last heartbeat, plus an interval) has
// passed, not when its lease ran out; the wait survives a coordinator restart. Before, the
// job ran on a second worker 4 s after the first went silent, while the first kept its ranks
// for 120 s.
TEST(Coordinator, ASilentWorkersJobStartsElsewhereOnlyAfterItsFenceEvenAcrossARestart) {
  TestDir dir;
  std::atomic<int64_t> now{kT0};
  auto c = clocked_coordinator(dir, now);
  v1::RegisterWorkerRequest a = trainer("a", 29500);
  a.set_fence_ms(10'000);
  v1::RegisterWorkerResponse ra, rb;
  ASSERT_TRUE(c->register_worker(a, &ra).ok());
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(submit_request(dir, "fenced", ""), &sub).ok());
  const std::string id = sub.job().id();
  c->tick_now();
  ASSERT_EQ(status_of(*c, id).placement(0), "a");
  ASSERT_TRUE(c->register_worker(trainer("b", 29501), &rb).ok());
  // b beats every second; a never again (its last heartbeat: its registration, at kT0).
  auto advance_to = [&](Coordinator& co, int64_t t) {
    while (now.load() < t) {
      ASSERT_TRUE(beat(co, "b", rb.incarnation()).ok());
      now.store(std::min(t, now.load() + 1000));
    }
    ASSERT_TRUE(beat(co, "b", rb.incarnation()).ok());
    co.tick_now();
  };
  advance_to(*c, kT0 + 4500);  // past a's lease
  v1::JobStatus st = status_of(*c, id);
  EXPECT_EQ(st.state(), v1::QUEUED);
  EXPECT_EQ(st.attempt(), 1);
  EXPECT_NE(st.last_error().find("worker a lost"), std::string::npos) << st.last_error();
  EXPECT_NE(st.waiting_reason().find("worker a went silent"), std::string::npos) << st.waiting_reason();
  advance_to(*c, kT0 + 7000);
  EXPECT_EQ(status_of(*c, id).state(), v1::QUEUED);
  // A restart keeps the wait (the fence is stored with the job).
  c.reset();
  c = clocked_coordinator(dir, now);
  advance_to(*c, kT0 + 11'999);  // a's fence: kT0 + 10,000, plus the 2 s margin
  st = status_of(*c, id);
  EXPECT_EQ(st.state(), v1::QUEUED) << st.waiting_reason();
  advance_to(*c, kT0 + 12'000);
  st = status_of(*c, id);
  EXPECT_EQ(st.state(), v1::STARTING);
  EXPECT_EQ(st.attempt(), 2);
  ASSERT_EQ(st.placement_size(), 1);
  EXPECT_EQ(st.placement(0), "b");
}

// A silent worker that registers again has no rank left of its previous life (the agent kills
// every rank before it registers; a restarted agent's died with the old one): its job need
// not wait for the fence.
TEST(Coordinator, ASilentWorkerRegisteringAgainEndsTheWaitForItsFence) {
  TestDir dir;
  std::atomic<int64_t> now{kT0};
  auto c = clocked_coordinator(dir, now);
  v1::RegisterWorkerRequest a = trainer("a", 29500);
  a.set_fence_ms(60'000);
  v1::RegisterWorkerResponse ra;
  ASSERT_TRUE(c->register_worker(a, &ra).ok());
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(submit_request(dir, "back", ""), &sub).ok());
  c->tick_now();
  now.store(kT0 + 4500);
  c->tick_now();
  ASSERT_EQ(status_of(*c, sub.job().id()).state(), v1::QUEUED);
  c->tick_now();
  EXPECT_EQ(status_of(*c, sub.job().id()).state(), v1::QUEUED) << "waits for a's fence (60 s)";
  v1::RegisterWorkerResponse again;
  ASSERT_TRUE(c->register_worker(a, &again).ok());
  EXPECT_GT(again.incarnation(), ra.incarnation());
  c->tick_now();
  const v1::JobStatus st = status_of(*c, sub.job().id());
  EXPECT_EQ(st.state(), v1::STARTING);
  EXPECT_EQ(st.attempt(), 2);
}

// An agent long-polls for assignments after the revision it holds. After a restart the
// coordinator's revisions are above every one it handed out before, so the poll answers at
// once with the current set. Before, revisions restarted at 1: the poll waited out its
// timeout, meanwhile the agent acted on its stale set and ran a finished attempt again.
TEST(Coordinator, AssignmentRevisionsAfterARestartAreAboveAnyHandedOutBefore) {
  TestDir dir;
  std::atomic<int64_t> now{kT0};
  auto c = clocked_coordinator(dir, now);
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  auto fetch = [&](Coordinator& co, int64_t after, int64_t wait_ms) {
    v1::FetchAssignmentsRequest req;
    req.set_name("w");
    req.set_incarnation(reg.incarnation());
    req.set_after_revision(after);
    req.set_wait_ms(wait_ms);
    v1::FetchAssignmentsResponse resp;
    const grpc::Status s = co.fetch_assignments(req, &resp);
    EXPECT_TRUE(s.ok()) << describe(s);
    return resp;
  };
  int64_t before = fetch(*c, 0, 0).revision();
  for (int i = 0; i < 5; ++i) {  // a few transitions bump the revision
    v1::SubmitJobResponse sub;
    ASSERT_TRUE(c->submit(submit_request(dir, "r" + std::to_string(i), ""), &sub).ok());
    c->tick_now();
    ASSERT_TRUE(c->report_event(exited("w", reg.incarnation(), sub.job().id())).ok());
  }
  const int64_t last = fetch(*c, before, 0).revision();
  ASSERT_GT(last, before);
  c.reset();
  c = clocked_coordinator(dir, now);
  ASSERT_TRUE(beat(*c, "w", reg.incarnation()).ok()) << "re-attached with its incarnation";
  const auto t0 = std::chrono::steady_clock::now();
  const v1::FetchAssignmentsResponse after = fetch(*c, last, 3000);
  EXPECT_GT(after.revision(), last);
  EXPECT_EQ(after.assignments_size(), 0) << "every job ended before the restart";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2500)) << "it waited out the poll";
}

// Job numbers are reserved in DB.ids before they are issued. A WAL that lost its tail (here:
// cut after a SIGKILL) loses acknowledged jobs: the coordinator says so, naming the numbers,
// and never issues them again. Before, the next submit reused an acknowledged job's id.
TEST(Coordinator, JobIdsAreNeverReissuedAfterTheWalLostItsTail) {
  TestDir dir;
  constexpr int kJobs = 100;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atomic<int64_t> now{kT0};
    auto c = clocked_coordinator(dir, now);
    for (int i = 0; i < kJobs; ++i) {
      v1::SubmitJobResponse resp;
      if (!c->submit(submit_request(dir, "w" + std::to_string(i), ""), &resp).ok()) ::_exit(3);
    }
    ::kill(::getpid(), SIGKILL);  // no checkpoint of the WAL into the database at close
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus)) << "status " << wstatus;
  const std::string wal = dir.db() + "-wal";
  struct stat st {};
  ASSERT_EQ(::stat(wal.c_str(), &st), 0);
  ASSERT_EQ(::truncate(wal.c_str(), st.st_size / 3), 0);
  std::atomic<int64_t> now{kT0};
  std::vector<std::string> lines;
  std::mutex lines_mu;
  auto c = clocked_coordinator(dir, now, &lines, &lines_mu);
  v1::ListJobsRequest lr;
  lr.set_page_size(1000);
  v1::ListJobsResponse list;
  ASSERT_TRUE(c->list(lr, &list).ok());
  ASSERT_LT(list.jobs_size(), kJobs) << "the cut WAL lost nothing: the test proves nothing";
  bool warned = false;
  for (const std::string& l : lines)
    warned |= l.find("may be missing") != std::string::npos && l.find("j-000064") != std::string::npos;
  EXPECT_TRUE(warned) << "no line names the lost jobs";
  v1::SubmitJobResponse fresh;
  ASSERT_TRUE(c->submit(submit_request(dir, "after", ""), &fresh).ok());
  EXPECT_GT(fresh.job().id(), "j-000100") << "an acknowledged job's number was issued again";
}

// Rows a coordinator cannot run as they are (a state no job has; an attempt on a worker the
// store does not know) are repaired at load and named, not loaded silently to stay RUNNING
// forever; the repaired job can be cancelled.
TEST(Coordinator, RowsWithAnUnknownStateOrWorkerAreRepairedAtLoadAndNamed) {
  TestDir dir;
  std::string ok_spec;
  {
    JobRecord weird;
    weird.id = "j-000001";
    weird.name = "weird";
    weird.spec_yaml = to_yaml(parse_job_spec(dir.spec("weird"), {}, ".", SpecSite::kRunsElsewhere));
    weird.state = "ZOMBIE";
    weird.submit_seq = 1;
    weird.revision = 1;
    weird.workers = weird.gpus_per_worker = 1;
    weird.max_restarts = 3;
    weird.checkpoint_dir = dir.path() + "/ckpt-weird";
    JobRecord orphan = weird;
    orphan.id = "j-000002";
    orphan.name = "orphan";
    orphan.state = "RUNNING";
    orphan.submit_seq = 2;
    orphan.attempt = 1;
    orphan.placement = {"ghost"};
    orphan.checkpoint_dir = dir.path() + "/ckpt-orphan";
    StoreBatch b;
    b.jobs = {weird, orphan};
    open_sqlite_store(dir.db())->commit(b);
  }
  std::atomic<int64_t> now{kT0};
  std::vector<std::string> lines;
  std::mutex lines_mu;
  auto c = clocked_coordinator(dir, now, &lines, &lines_mu);
  v1::JobStatus weird = status_of(*c, "j-000001");
  EXPECT_EQ(weird.state(), v1::FAILED);
  EXPECT_NE(weird.last_error().find("stored state \"ZOMBIE\""), std::string::npos) << weird.last_error();
  v1::JobStatus orphan = status_of(*c, "j-000002");
  EXPECT_EQ(orphan.state(), v1::QUEUED);
  EXPECT_NE(orphan.last_error().find("RUNNING on ghost, unknown to the store"), std::string::npos)
      << orphan.last_error();
  int named = 0;
  for (const std::string& l : lines) named += l.rfind("job j-00000", 0) == 0;
  EXPECT_EQ(named, 2);
  v1::JobStatus cancelled;
  ASSERT_TRUE(c->cancel("j-000002", &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::CANCELLED);
}

// What a worker reports reaches protobuf strings as valid UTF-8: invalid bytes in a failure
// message (a rank printing binary) are replaced, and every listing still serializes.
TEST(Coordinator, InvalidUtf8InAReportedFailureIsStoredValid) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(submit_request(dir, "bytes", ""), &sub).ok());
  c->tick_now();
  v1::ReportEventRequest ev = exited("w", reg.incarnation(), sub.job().id());
  ev.mutable_attempt()->set_exit_code(1);
  ev.mutable_attempt()->set_message(std::string("rank 0 said \xff\xfe\xc3 then died"));
  ASSERT_TRUE(c->report_event(ev).ok());
  const v1::JobStatus st = status_of(*c, sub.job().id());
  EXPECT_EQ(st.last_error(), "ranks on w exited with status 1: rank 0 said \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD then died");
  v1::ListJobsResponse list;
  ASSERT_TRUE(c->list(v1::ListJobsRequest(), &list).ok());
  std::string wire;
  EXPECT_TRUE(list.SerializeToString(&wire));
}

// A job's log stops at its cap: later output is counted, the log says where it stopped and
// how much was dropped when the job ends, and an ended job's log takes no more bytes.
TEST(Coordinator, AJobsLogStopsAtItsCapAndClosesWhenTheJobEnds) {
  TestDir dir;
  CoordinatorOptions o;
  o.log = [](const std::string&) {};
  o.max_job_log_bytes = 8192;
  auto c = std::make_unique<Coordinator>(open_sqlite_store(dir.db()), o);
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(submit_request(dir, "chatty", ""), &sub).ok());
  const std::string id = sub.job().id();
  c->tick_now();
  const std::string chunk(4096, '#');
  int64_t offset = 0;
  for (int i = 0; i < 5; ++i) {
    v1::UploadLogsRequest up;
    up.set_name("w");
    up.set_incarnation(reg.incarnation());
    up.mutable_attempt()->set_job_id(id);
    up.mutable_attempt()->set_attempt(1);
    up.set_offset(offset);
    up.set_data(chunk);
    v1::UploadLogsResponse resp;
    ASSERT_TRUE(c->upload_logs(up, &resp).ok());
    offset += 4096;
    EXPECT_EQ(resp.next_offset(), offset) << "dropped bytes are acknowledged too: the agent must not resend them";
  }
  ASSERT_TRUE(c->report_event(exited("w", reg.incarnation(), id)).ok());
  std::string log;
  bool finished = false;
  ASSERT_TRUE(c->read_log(id, 0, 1 << 20, std::chrono::milliseconds(0), &log, &finished).ok());
  EXPECT_TRUE(finished);
  // Up to the cap (the coordinator's own lines come on top), then none of the rest.
  EXPECT_EQ(std::count(log.begin(), log.end(), '#'), 8192) << "two chunks fit under the cap, three did not";
  EXPECT_NE(log.find("reached its cap of 8192 bytes"), std::string::npos);
  EXPECT_NE(log.find("12288 bytes of the job's output dropped"), std::string::npos) << log.substr(log.rfind('#') + 1);
  v1::UploadLogsRequest late;
  late.set_name("w");
  late.set_incarnation(reg.incarnation());
  late.mutable_attempt()->set_job_id(id);
  late.mutable_attempt()->set_attempt(1);
  late.set_offset(offset);
  late.set_data("late bytes\n");
  v1::UploadLogsResponse resp;
  EXPECT_EQ(c->upload_logs(late, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// A worker-side failure (74: the agent cannot write its work dir, a checkpoint lock still
// held) is requeued with its reason and counted against max_restarts, not failed as the job's.
TEST(Coordinator, AWorkerSideFailureIsRequeuedWithItsReason) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(submit_request(dir, "diskfull", ""), &sub).ok());
  c->tick_now();
  v1::ReportEventRequest ev = exited("w", reg.incarnation(), sub.job().id());
  ev.mutable_attempt()->set_exit_code(74);
  ev.mutable_attempt()->set_message("the agent cannot write its work dir /w/jobs: No space left on device");
  ASSERT_TRUE(c->report_event(ev).ok());
  const v1::JobStatus st = status_of(*c, sub.job().id());
  EXPECT_EQ(st.state(), v1::QUEUED);
  EXPECT_EQ(st.restarts(), 1);
  EXPECT_EQ(st.last_error(),
            "ranks on w exited with status 74: the agent cannot write its work dir /w/jobs: No space left on device; "
            "requeued (restart 1 of 3)");
}

// An upload of a profile is checked for its caller (a live incarnation, the current attempt's
// rank 0) before its up to 1 MiB of YAML is parsed: a stale or foreign caller gets
// FAILED_PRECONDITION, not a parse (whose error would also tell it the job exists).
TEST(Coordinator, AProfileFromAStaleCallerIsRefusedBeforeItIsParsed) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(submit_request(dir, "profiled", ""), &sub).ok());
  c->tick_now();
  v1::UploadProfileRequest up;
  up.set_name("w");
  up.set_incarnation(reg.incarnation() + 1);  // not this worker's
  up.mutable_attempt()->set_job_id(sub.job().id());
  up.mutable_attempt()->set_attempt(1);
  up.set_profile_yaml(std::string(1 << 20, '['));  // not YAML at all
  EXPECT_EQ(c->upload_profile(up).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  up.set_incarnation(reg.incarnation());
  up.mutable_attempt()->set_attempt(2);  // not the current attempt
  EXPECT_EQ(c->upload_profile(up).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  up.mutable_attempt()->set_attempt(1);  // the caller is right: now the YAML is judged
  EXPECT_EQ(c->upload_profile(up).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A registration's session proves the caller is that incarnation of that worker: the right
// one passes, none, another worker's or a guessed one is UNAUTHENTICATED, another incarnation
// is told to register again; the coordinator keeps only the digest, and a restart (which
// reads it back from the store) still takes the same session.
TEST(Coordinator, AWorkerSessionNamesOneIncarnationOfOneWorkerAndSurvivesARestart) {
  TestDir dir;
  v1::RegisterWorkerResponse w, v;
  {
    auto c = open_coordinator(dir.db());
    ASSERT_TRUE(c->register_worker(trainer("w", 29500), &w).ok());
    ASSERT_TRUE(c->register_worker(trainer("v", 29501), &v).ok());
    EXPECT_EQ(w.session().size(), 64u);
    EXPECT_NE(w.session(), v.session());
    EXPECT_TRUE(c->check_session("w", w.incarnation(), w.session()).ok());
    EXPECT_EQ(c->check_session("w", w.incarnation(), "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(c->check_session("w", w.incarnation(), v.session()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    std::string guessed = w.session();
    guessed.back() = guessed.back() == '0' ? '1' : '0';
    EXPECT_EQ(c->check_session("w", w.incarnation(), guessed).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(c->check_session("w", v.incarnation(), v.session()).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(c->check_session("nobody", 1, w.session()).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  // The store holds the digest, never the session itself (the database and its journal).
  for (const std::string& file : {dir.db(), dir.db() + "-wal"}) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes.find(w.session()), std::string::npos) << file;
  }
  auto c = open_coordinator(dir.db());
  EXPECT_TRUE(c->check_session("w", w.incarnation(), w.session()).ok());
  EXPECT_TRUE(c->check_session("v", v.incarnation(), v.session()).ok());
  EXPECT_EQ(c->check_session("v", v.incarnation(), w.session()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// optimizer.host.nodes: each attempt gets a secret of its own for its nodes. The agent gets it
// with the assignment; the node placed with the attempt gets it (and only it) with its
// heartbeats, under the key "JOB_ID/ATTEMPT"; another node gets nothing; once the attempt
// ends its grant is gone, and the next attempt's secret is another. After a restart the
// coordinator hands out the same secret for the attempt that goes on.
TEST(Coordinator, EachAttemptGetsANodeSecretOnlyItsNodesHold) {
  TestDir dir;
  auto node = [](const std::string& name, const std::string& address) {
    v1::RegisterWorkerRequest req;
    req.set_name(name);
    req.set_role(v1::OPTIMIZER);
    req.set_address(address);
    req.mutable_resources()->set_host_memory_bytes(int64_t{64} << 30);
    req.mutable_resources()->set_physical_cores(4);
    return req;
  };
  v1::RegisterWorkerResponse w, n1, n2;
  std::string id, first_secret, placed_node;
  auto grants_of = [](Coordinator& c, const std::string& name, const v1::RegisterWorkerResponse& reg) {
    v1::HeartbeatRequest hb;
    hb.set_name(name);
    hb.set_incarnation(reg.incarnation());
    v1::HeartbeatResponse resp;
    EXPECT_TRUE(c.heartbeat(hb, &resp).ok());
    std::map<std::string, std::string> out;
    for (const v1::NodeGrant& g : resp.node_grants()) out[g.key()] = g.secret();
    return out;
  };
  auto assignment = [&](Coordinator& c) {
    v1::FetchAssignmentsRequest f;
    f.set_name("w");
    f.set_incarnation(w.incarnation());
    v1::FetchAssignmentsResponse resp;
    EXPECT_TRUE(c.fetch_assignments(f, &resp).ok());
    return resp.assignments_size() > 0 ? resp.assignments(0) : v1::Assignment{};
  };
  {
    auto c = open_coordinator(dir.db());
    ASSERT_TRUE(c->register_worker(trainer("w", 29500), &w).ok());
    ASSERT_TRUE(c->register_worker(node("n1", "127.0.0.1:7001"), &n1).ok());
    ASSERT_TRUE(c->register_worker(node("n2", "127.0.0.1:7002"), &n2).ok());
    v1::SubmitJobRequest req = submit_request(dir, "noded", "");
    req.add_set("optimizer.host.nodes=1");
    v1::SubmitJobResponse sub;
    ASSERT_TRUE(c->submit(req, &sub).ok()) << sub.DebugString();
    id = sub.job().id();
    c->tick_now();
    const v1::Assignment a = assignment(*c);
    ASSERT_EQ(a.job_id(), id);
    ASSERT_EQ(a.optimizer_addresses_size(), 1);
    first_secret = a.node_secret();
    EXPECT_EQ(first_secret.size(), 64u);
    placed_node = a.optimizer_addresses(0) == "127.0.0.1:7001" ? "n1" : "n2";
    const std::string idle_node = placed_node == "n1" ? "n2" : "n1";
    const std::string key = id + "/" + std::to_string(a.attempt());
    EXPECT_EQ(grants_of(*c, placed_node, placed_node == "n1" ? n1 : n2),
              (std::map<std::string, std::string>{{key, first_secret}}));
    EXPECT_TRUE(grants_of(*c, idle_node, idle_node == "n1" ? n1 : n2).empty());
    EXPECT_TRUE(grants_of(*c, "w", w).empty());  // a trainer holds none
  }
  {  // restarted: the attempt goes on with the same secret, and its node gets it again
    auto c = open_coordinator(dir.db());
    const v1::Assignment a = assignment(*c);
    EXPECT_EQ(a.node_secret(), first_secret);
    EXPECT_EQ(grants_of(*c, placed_node, placed_node == "n1" ? n1 : n2).size(), 1u);
    // The attempt ends (cancelled): its grant is gone.
    v1::JobStatus st;
    ASSERT_TRUE(c->cancel(id, &st).ok());
    v1::ReportEventRequest ev;
    ev.set_name("w");
    ev.set_incarnation(w.incarnation());
    ev.mutable_attempt()->set_job_id(id);
    ev.mutable_attempt()->set_attempt(a.attempt());
    ev.mutable_attempt()->set_exited(true);
    ev.mutable_attempt()->set_exit_code(130);
    ev.mutable_attempt()->set_stopped_by_agent(true);
    ASSERT_TRUE(c->report_event(ev).ok());
    c->tick_now();
    EXPECT_TRUE(grants_of(*c, placed_node, placed_node == "n1" ? n1 : n2).empty());
    // A new job's attempt gets another secret.
    v1::SubmitJobRequest req = submit_request(dir, "noded-2", "");
    req.add_set("optimizer.host.nodes=1");
    v1::SubmitJobResponse sub;
    ASSERT_TRUE(c->submit(req, &sub).ok());
    c->tick_now();
    const v1::Assignment b = assignment(*c);
    ASSERT_EQ(b.job_id(), sub.job().id());
    EXPECT_EQ(b.node_secret().size(), 64u);
    EXPECT_NE(b.node_secret(), first_secret);
  }
}

// A job with optimizer.host.nodes needs a node whose RAM holds its host state: 20 B per
// host-owned element in zenflow mode (master, m, v, two window accumulators), 12 B in offload
// mode, which opens no windows (the node allocates the same). 10^7 elements on a node of
// 200 MB: offload mode's 120 MB (+ 64 MiB of buffers) fit, zenflow's 200 MB do not.
TEST(Coordinator, ANodeHoldsOffloadModesStateAtTwelveBytesPerElementAndZenflowsAtTwenty) {
  for (const std::string mode : {"offload", "zenflow"}) {
    TestDir dir;
    auto c = open_coordinator(dir.db());
    v1::RegisterWorkerResponse w, n;
    ASSERT_TRUE(c->register_worker(trainer("w", 29500), &w).ok());
    v1::RegisterWorkerRequest node;
    node.set_name("n");
    node.set_role(v1::OPTIMIZER);
    node.set_address("127.0.0.1:7001");
    node.mutable_resources()->set_host_memory_bytes(200'000'000);
    node.mutable_resources()->set_physical_cores(4);
    ASSERT_TRUE(c->register_worker(node, &n).ok());
    v1::SubmitJobRequest req = submit_request(dir, "noded-" + mode, "");
    req.add_set("optimizer.host.nodes=1");
    req.add_set("optimizer.mode=" + mode);
    req.set_total_params(10'000'000);
    req.set_split_params(10'000'000);
    v1::SubmitJobResponse sub;
    ASSERT_TRUE(c->submit(req, &sub).ok()) << sub.DebugString();
    c->tick_now();
    v1::JobStatus st;
    ASSERT_TRUE(c->get(sub.job().id(), &st).ok());
    if (mode == "offload") {
      EXPECT_EQ(st.state(), v1::STARTING) << st.waiting_reason();
    } else {
      EXPECT_EQ(st.state(), v1::QUEUED);
      EXPECT_NE(st.waiting_reason().find("host RAM"), std::string::npos) << st.waiting_reason();
    }
  }
}

// A worker's progress report is its word: figures no real run produces are refused (named)
// and never applied. Before, one forged report set a job's loss to NaN, its rate to -1e300 and
// its stall share to 5500%, and the real reports after it were ignored (steps only grow).
TEST(Coordinator, AProgressReportWithImpossibleFiguresIsRefusedAndChangesNothing) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  v1::SubmitJobRequest sreq = submit_request(dir, "honest", "");
  sreq.add_set("train.steps=3000");
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(sreq, &sub).ok());
  c->tick_now();
  auto report = [&](int64_t step, auto&& edit) {
    v1::ReportProgressRequest p;
    p.set_name("w");
    p.set_incarnation(reg.incarnation());
    p.mutable_attempt()->set_job_id(sub.job().id());
    p.mutable_attempt()->set_attempt(1);
    p.set_step(step);
    p.set_total_steps(3000);
    p.set_loss(2.5);
    p.set_tokens_per_second(1000);
    p.set_stall_share(0.1);
    p.set_step_seconds(0.05);
    p.set_eta_seconds(100);
    edit(p);
    return c->report_progress(p);
  };
  ASSERT_TRUE(report(10, [](auto&) {}).ok());
  const std::vector<std::pair<std::string, std::function<void(v1::ReportProgressRequest&)>>> forged = {
      {"loss", [](auto& p) { p.set_loss(std::nan("")); }},
      {"tokens_per_second", [](auto& p) { p.set_tokens_per_second(-1e300); }},
      {"stall_share", [](auto& p) { p.set_stall_share(55.0); }},
      {"step_seconds", [](auto& p) { p.set_step_seconds(std::numeric_limits<double>::infinity()); }},
      {"eta_seconds", [](auto& p) { p.set_eta_seconds(-5); }},
      {"tokens_per_step", [](auto& p) { p.set_tokens_per_step(-1); }},
      {"start_step", [](auto& p) { p.set_start_step(-1); }},
  };
  for (const auto& [field, edit] : forged) {
    const grpc::Status s = report(2999, edit);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_EQ(s.error_message().rfind(field + ": ", 0), 0u) << s.error_message();
  }
  v1::JobStatus st = status_of(*c, sub.job().id());
  EXPECT_EQ(st.step(), 10) << "a refused report moved the job";
  EXPECT_EQ(st.last_loss(), 2.5);
  EXPECT_EQ(st.stall_share(), 0.1);
  ASSERT_TRUE(report(20, [](auto&) {}).ok()) << "the honest reports after it still count";
  EXPECT_EQ(status_of(*c, sub.job().id()).step(), 20);
}

// What a registration offers is bounded and printable before anything of it is kept.
TEST(Coordinator, ARegistrationWithUnboundedOrUnprintableResourcesIsRefused) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  const std::vector<std::pair<std::string, std::function<void(v1::RegisterWorkerRequest&)>>> bad_offers = {
      {"resources.gpus:", [](auto& r) { for (int i = 0; i < 65; ++i) r.mutable_resources()->add_gpus()->set_model("H100"); }},
      {"resources.gpus.model:", [](auto& r) { r.mutable_resources()->add_gpus()->set_model("H100\x1b[2J"); }},
      {"resources.cpu_slots:", [](auto& r) { r.mutable_resources()->set_cpu_slots(1 << 20); }},
      {"resources.host_memory_bytes:", [](auto& r) { r.mutable_resources()->set_host_memory_bytes(int64_t{1} << 60); }},
      {"resources.labels:", [](auto& r) { (*r.mutable_resources()->mutable_labels())["zone"] = "a\x07"; }},
      {"address:", [](auto& r) { r.set_address("10.0.0.1 evil"); }},
      {"rendezvous_ports:", [](auto& r) { r.set_rendezvous_ports(0, 70000); }},
  };
  for (const auto& [field, edit] : bad_offers) {
    v1::RegisterWorkerRequest req = trainer("w", 29500);
    edit(req);
    v1::RegisterWorkerResponse resp;
    const grpc::Status s = c->register_worker(req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_EQ(s.error_message().rfind(field, 0), 0u) << s.error_message();
  }
  v1::ListWorkersResponse workers;
  c->list_workers(&workers);
  EXPECT_EQ(workers.workers_size(), 0);
  v1::RegisterWorkerResponse ok;
  EXPECT_TRUE(c->register_worker(trainer("w", 29500), &ok).ok());
}

// A worker LOST for longer than the retention is forgotten, in memory and in the store (a
// coordinator of a cloud where instances come and go kept every one ever seen); one LOST for
// less is kept, and a forgotten worker that comes back registers as new.
TEST(Coordinator, WorkersLostLongerThanTheRetentionAreForgotten) {
  TestDir dir;
  std::atomic<int64_t> now{kT0};
  auto c = clocked_coordinator(dir, now);
  v1::RegisterWorkerResponse old_reg, recent_reg;
  ASSERT_TRUE(c->register_worker(trainer("old", 29500), &old_reg).ok());
  now.store(kT0 + 3600'000);
  ASSERT_TRUE(c->register_worker(trainer("recent", 29501), &recent_reg).ok());
  now.store(kT0 + 3600'000 + 5000);
  c->tick_now();  // both LOST now (no heartbeat for over a lease)
  auto names = [&] {
    v1::ListWorkersResponse resp;
    c->list_workers(&resp);
    std::vector<std::string> out;
    for (const v1::WorkerStatus& w : resp.workers()) out.push_back(w.name() + ":" + v1::WorkerState_Name(w.state()));
    return out;
  };
  EXPECT_EQ(names(), (std::vector<std::string>{"old:LOST", "recent:LOST"}));
  now.store(kT0 + 24 * 3600'000 + 1000);  // "old" last beat 24 h + 1 s ago, "recent" 23 h ago
  c->tick_now();
  EXPECT_EQ(names(), (std::vector<std::string>{"recent:LOST"}));
  c.reset();
  c = clocked_coordinator(dir, now);
  EXPECT_EQ(names(), (std::vector<std::string>{"recent:LOST"})) << "the store still had it";
  v1::RegisterWorkerResponse again;
  ASSERT_TRUE(c->register_worker(trainer("old", 29500), &again).ok());
  EXPECT_GT(again.incarnation(), recent_reg.incarnation());
  EXPECT_EQ(names(), (std::vector<std::string>{"old:READY", "recent:LOST"}));
  EXPECT_TRUE(beat(*c, "old", again.incarnation()).ok());
  EXPECT_EQ(beat(*c, "old", old_reg.incarnation()).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// The exit of rank 0's worker carries the attempt's last progress, taken with the exit: a job
// ends with its final step and loss even when the report that sent them was lost (a partition,
// a coordinator restart), and an attempt that resumed at the last step and trained none ends
// with the loss it resumed at. Before, such jobs ended SUCCEEDED with the loss of an earlier
// step, or 0 (found by tests/chaos, seed 4).
TEST(Coordinator, AnExitCarriesTheAttemptsLastProgressAndTheJobEndsWithIt) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  v1::SubmitJobRequest sreq = submit_request(dir, "final", "");
  sreq.add_set("train.steps=60");
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(sreq, &sub).ok());
  const std::string id = sub.job().id();
  c->tick_now();
  auto progress = [&](int64_t step, double loss, int64_t start_step, double step_seconds) {
    v1::ReportProgressRequest p;
    p.set_name("w");
    p.set_incarnation(reg.incarnation());
    p.mutable_attempt()->set_job_id(id);
    p.mutable_attempt()->set_attempt(1);
    p.set_step(step);
    p.set_total_steps(60);
    p.set_loss(loss);
    p.set_start_step(start_step);
    p.set_step_seconds(step_seconds);
    p.set_tokens_per_second(step_seconds > 0 ? 640 : 0);
    p.set_stall_share(step_seconds > 0 ? 0.2 : 0);
    return p;
  };
  ASSERT_TRUE(c->report_progress(progress(10, 5.5, 0, 0.05)).ok());  // the last one that got through
  v1::ReportEventRequest ev = exited("w", reg.incarnation(), id);
  *ev.mutable_attempt()->mutable_last_progress() = progress(60, 4.825, 0, 0.05);
  ASSERT_TRUE(c->report_event(ev).ok());
  v1::JobStatus st = status_of(*c, id);
  EXPECT_EQ(st.state(), v1::SUCCEEDED);
  EXPECT_EQ(st.step(), 60);
  EXPECT_EQ(st.last_loss(), 4.825);
  EXPECT_EQ(st.tokens_per_second(), 640);

  // Attempt 2 of a job whose attempt 1 finished unrecorded: it resumes at step 60 and trains
  // nothing; its exit says where it resumed and with which loss.
  v1::SubmitJobRequest again = submit_request(dir, "resumed", "");
  again.add_set("train.steps=60");
  ASSERT_TRUE(c->submit(again, &sub).ok());
  const std::string id2 = sub.job().id();
  c->tick_now();
  v1::ReportEventRequest lost = exited("w", reg.incarnation(), id2);
  lost.mutable_attempt()->set_exit_code(137);  // killed: requeued
  ASSERT_TRUE(c->report_event(lost).ok());
  c->tick_now();
  ASSERT_EQ(status_of(*c, id2).attempt(), 2);
  v1::ReportEventRequest done = exited("w", reg.incarnation(), id2);
  done.mutable_attempt()->set_attempt(2);
  v1::ReportProgressRequest resumed = progress(60, 4.825, 60, 0);
  resumed.mutable_attempt()->set_job_id(id2);
  resumed.mutable_attempt()->set_attempt(2);
  *done.mutable_attempt()->mutable_last_progress() = resumed;
  ASSERT_TRUE(c->report_event(done).ok());
  st = status_of(*c, id2);
  EXPECT_EQ(st.state(), v1::SUCCEEDED);
  EXPECT_EQ(st.last_loss(), 4.825);
  EXPECT_EQ(st.resumed_from_step(), 60);
}

// An attempt its agent stopped on its own (the agent shutting down, or fencing itself when cut
// off: SIGTERM, checkpoint, exit 130) ended for the worker's reason: the job is requeued, not
// failed as if the user had interrupted it.
TEST(Coordinator, AnAttemptItsAgentStoppedIsRequeuedNotFailed) {
  TestDir dir;
  auto c = open_coordinator(dir.db());
  v1::RegisterWorkerResponse reg;
  ASSERT_TRUE(c->register_worker(trainer("w", 29500), &reg).ok());
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(c->submit(submit_request(dir, "stopped", ""), &sub).ok());
  c->tick_now();
  v1::ReportEventRequest ev = exited("w", reg.incarnation(), sub.job().id());
  ev.mutable_attempt()->set_exit_code(130);
  ev.mutable_attempt()->set_stopped_by_agent(true);
  ev.mutable_attempt()->set_message("the agent is shutting down");
  ASSERT_TRUE(c->report_event(ev).ok());
  const v1::JobStatus st = status_of(*c, sub.job().id());
  EXPECT_EQ(st.state(), v1::QUEUED) << st.last_error();
  EXPECT_EQ(st.restarts(), 1);
}

// Under a file-size limit (ulimit -f) the coordinator's first write past it fails with EFBIG,
// which it reports and stops on (exit 1, naming the error). Before, SIGXFSZ killed it with no
// word at all.
TEST(CoordinatorProcess, AFileSizeLimitIsReportedNotASilentSignal) {
  TestDir dir;
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const std::string binary = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow-coordinator";
  const std::string db = dir.db();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::dup2(out[1], 2);
    ::close(out[0]);
    const rlimit small{16 << 10, 16 << 10};  // below the store's first migration
    ::setrlimit(RLIMIT_FSIZE, &small);
    ::execl(binary.c_str(), binary.c_str(), "--listen", "127.0.0.1:0", "--db", db.c_str(), nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_FALSE(WIFSIGNALED(wstatus)) << "killed by signal " << WTERMSIG(wstatus) << "; stderr: " << err;
  EXPECT_EQ(WEXITSTATUS(wstatus), 1) << err;
  EXPECT_NE(err.find("zenflow-coordinator: "), std::string::npos) << err;
  EXPECT_TRUE(err.find("too large") != std::string::npos || err.find("disk I/O error") != std::string::npos ||
              err.find("File too large") != std::string::npos)
      << err;
}

}  // namespace
}  // namespace zenflow::server
