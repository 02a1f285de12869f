// A rank process as the worker agent runs it: `zenflow run JOB --quiet --report-fd 3
// --lease-fd 4 --lock-wait S`. The JSON lines it reports, the lease that fences its
// checkpoints, the wait for checkpoint.dir's lock; and JsonLinesReporter and Lease alone.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/remove_tree.h"
#include "tests/support/dir_lock_holder.h"
#include "tests/support/scratch.h"
#include "tests/support/shell.h"
#include "tests/support/tiny_job.h"
#include "worker/rank/checkpoint.h"
#include "worker/rank/lease.h"
#include "worker/rank/run_reporter.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A write to a pipe whose reader is gone must fail with EPIPE here, as in `zenflow run`.
[[maybe_unused]] const bool kSigpipeIgnored = [] {
  std::signal(SIGPIPE, SIG_IGN);
  return true;
}();

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("zenflow-rank-" + name + "-" + std::to_string(::getpid()));
  zenflow::remove_tree(d);
  fs::create_directories(d);
  return zenflow::test_support::removed_at_exit(d);
}

// The tiny CLI job with its checkpoints in `dir`/ckpt.
fs::path job(const fs::path& dir, int64_t steps, int64_t every_steps) {
  std::string text = zenflow::test_support::tiny_job_spec("rank-contract", steps);
  text.replace(text.find("checkpoint: {every_steps: 0}"), 28,
               "checkpoint: {every_steps: " + std::to_string(every_steps) +
                   ", keep: 100, dir: " + (dir / "ckpt").string() + "}");
  const fs::path spec = dir / ("job-" + std::to_string(steps) + ".yaml");
  zenflow::test_support::write_file(spec, text);
  return spec;
}

std::vector<int64_t> checkpoint_steps(const fs::path& dir) {
  std::vector<int64_t> out;
  for (const auto& [step, path] : zenflow::list_checkpoints((dir / "ckpt").string())) out.push_back(step);
  return out;
}

// Reads JSON lines from a pipe as they come.
class EventReader {
 public:
  explicit EventReader(int fd = -1) : fd_(fd) {}
  void attach(int fd) { fd_ = fd; }
  // Reads until `done(events)` holds, EOF, or `limit`; returns whether `done` held.
  template <typename Done>
  bool read_until(Done done, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done(events)) {
      if (eof) return false;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) {
        eof = n == 0 || errno != EINTR;
        continue;
      }
      buf_.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = buf_.find('\n')) != std::string::npos; buf_.erase(0, nl + 1)) {
        lines.push_back(buf_.substr(0, nl));
        events.push_back(json::parse(lines.back()));  // throws (fails the test) on a bad line
      }
    }
    return true;
  }
  bool read_to_eof(std::chrono::milliseconds limit) {
    return read_until([&](const std::vector<json>&) { return eof; }, limit) || eof;
  }
  std::vector<json> of(const std::string& kind) const {
    std::vector<json> out;
    for (const json& e : events)
      if (e.at("event") == kind) out.push_back(e);
    return out;
  }

  std::vector<json> events;
  std::vector<std::string> lines;
  bool eof = false;
  std::string rest() const { return buf_; }  // a last line without its newline

 private:
  int fd_;
  std::string buf_;
};

// `zenflow run ARGS` with fd 3 the write end of a report pipe and, with `lease`, fd 4 the
// read end of a lease pipe; stderr to a file, stdout to another. The child holds no other
// end of the pipes, so closing lease_w is the EOF the agent's death would be.
struct RankProcess {
  pid_t pid = -1;
  int report_r = -1;
  int lease_w = -1;
  fs::path out, err;

  // Waits (bounded) for the exit; -1 when it had to be killed. `seconds` is how long it took.
  int wait_exit(std::chrono::seconds limit, double* seconds = nullptr) {
    const auto start = std::chrono::steady_clock::now();
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() - start > limit) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        pid = -1;
        return -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    pid = -1;
    if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void close_lease() {
    if (lease_w >= 0) ::close(lease_w);
    lease_w = -1;
  }
  ~RankProcess() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    close_lease();
    if (report_r >= 0) ::close(report_r);
  }
};

void start_rank(RankProcess& p, const fs::path& dir, const std::vector<std::string>& args, bool lease) {
  int report[2], lease_pipe[2] = {-1, -1};
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  if (lease) {
    ASSERT_EQ(::pipe2(lease_pipe, O_CLOEXEC), 0);
  }
  p.out = dir / "rank.out";
  p.err = dir / "rank.err";
  const std::string bin = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow";
  std::vector<std::string> argv = {bin, "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--quiet", "--report-fd", "3"});
  if (lease) argv.insert(argv.end(), {"--lease-fd", "4"});
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string out = p.out.string(), err = p.err.string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // dup2 clears O_CLOEXEC on the new fds; the pipes' other ends close at exec.
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0 || ::dup2(report[1], 3) < 0) _exit(126);
    if (lease_pipe[0] >= 0 && ::dup2(lease_pipe[0], 4) < 0) _exit(126);
    ::execv(bin.c_str(), cargv.data());
    _exit(127);
  }
  p.pid = pid;
  ::close(report[1]);
  p.report_r = report[0];
  if (lease) {
    ::close(lease_pipe[0]);
    p.lease_w = lease_pipe[1];
  }
}

// Reads `p`'s report to EOF and waits for its exit, both bounded: its exit status (-1 when
// it had to be killed).
int finish_rank(RankProcess& p, EventReader& r) {
  r.read_to_eof(120s);
  return p.wait_exit(30s);
}

// Writes a byte to the lease every 100 ms until stopped (or the reader is gone).
class LeaseRenewer {
 public:
  explicit LeaseRenewer(int fd)
      : thread_([this, fd] {
          while (!stop_.load() && ::write(fd, "r", 1) == 1) std::this_thread::sleep_for(100ms);
        }) {}
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  ~LeaseRenewer() { stop(); }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string stderr_of(const RankProcess& p) { return zenflow::test_support::read_file(p.err); }

int count_of(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + part.size())) ++n;
  return n;
}

bool has_step_events(const std::vector<json>& events) {
  for (const json& e : events)
    if (e.at("event") == "step") return true;
  return false;
}

}  // namespace

// --report-fd: every line is one JSON object; start first (after setup's log lines), steps rising to the last
// one with the summary's final loss, a checkpoint line per checkpoint on disk, finish last. The resumed run
// reports where it started and its "resumed from" line.
TEST(RankReport, LinesAreJsonEventsThatFollowTheRun) {
  const fs::path dir = scratch("report");
  const fs::path spec = job(dir, 12, 4);
  double first_final_loss = 0;
  for (int64_t total : {12, 16}) {
    SCOPED_TRACE("train.steps " + std::to_string(total));
    RankProcess p;
    start_rank(p, dir, {spec.string(), "--json", "--set", "train.steps=" + std::to_string(total)}, false);
    EventReader r(p.report_r);
    ASSERT_EQ(finish_rank(p, r), 0) << stderr_of(p);
    ASSERT_TRUE(r.eof) << "no EOF on the report fd";
    EXPECT_EQ(r.rest(), "");  // no half line
    ASSERT_GE(r.events.size(), 3u);
    for (const std::string& line : r.lines) EXPECT_EQ(line.find('\n'), std::string::npos);

    // Setup's log lines (the resume) come before the start; every other event after it.
    const int64_t start = total == 12 ? 0 : 12;
    size_t first = 0;
    while (first < r.events.size() && r.events[first].at("event") == "log") ++first;
    ASSERT_LT(first, r.events.size());
    EXPECT_EQ(r.events[first], (json{{"event", "start"}, {"start_step", start}, {"total_steps", total}}));
    EXPECT_EQ(r.events.back(), (json{{"event", "finish"}, {"steps", total}, {"interrupted", false}}));

    const auto steps = r.of("step");
    ASSERT_FALSE(steps.empty());
    EXPECT_EQ(steps.front().at("step").get<int64_t>(), start + 1);  // the first step is always written
    for (size_t i = 1; i < steps.size(); ++i)
      EXPECT_GT(steps[i].at("step").get<int64_t>(), steps[i - 1].at("step").get<int64_t>());
    for (const json& s : steps) {
      EXPECT_EQ(s.at("total_steps").get<int64_t>(), total);
      for (const char* k : {"loss", "lr", "step_seconds", "tokens_per_second", "stall_share", "eta_seconds"})
        EXPECT_TRUE(s.at(k).is_number()) << k << " in " << s.dump();
    }
    EXPECT_EQ(steps.back().at("step").get<int64_t>(), total);
    EXPECT_EQ(steps.back().at("eta_seconds").get<double>(), 0.0);
    const json summary = json::parse(zenflow::test_support::read_file(p.out));
    EXPECT_EQ(steps.back().at("loss").get<double>(), summary.at("final_loss").get<double>());

    // every_steps 4 and the final one: 4, 8, 12 (then 16 after the resume).
    std::vector<int64_t> reported;
    for (const json& c : r.of("checkpoint")) {
      reported.push_back(c.at("step").get<int64_t>());
      EXPECT_TRUE(fs::is_directory(c.at("dir").get<std::string>())) << c.dump();
    }
    const std::vector<int64_t> on_disk = checkpoint_steps(dir);
    if (total == 12) {
      EXPECT_EQ(reported, (std::vector<int64_t>{4, 8, 12}));
      EXPECT_EQ(on_disk, (std::vector<int64_t>{4, 8, 12}));
    } else {
      EXPECT_EQ(reported, (std::vector<int64_t>{16}));
      EXPECT_EQ(on_disk, (std::vector<int64_t>{4, 8, 12, 16}));
      bool resumed = false;
      for (const json& l : r.of("log"))
        resumed |= contains(l.at("line").get<std::string>(),
                            "resumed from " + (dir / "ckpt").string() + "/step-00000012 at step 12");
      EXPECT_TRUE(resumed) << "no \"resumed from\" log line";
    }
    if (total == 12) {
      first_final_loss = steps.back().at("loss").get<double>();
      EXPECT_TRUE(r.of("resumed").empty()) << "a fresh run resumed nothing";
    } else {
      // Right after the start: the step resumed at and its loss, the first run's final one
      // (so a resumed attempt that trains nothing still says where the job stands).
      ASSERT_LT(first + 1, r.events.size());
      const json& at = r.events[first + 1];
      EXPECT_EQ(at.at("event"), "resumed") << at.dump();
      EXPECT_EQ(at.at("step").get<int64_t>(), 12);
      EXPECT_EQ(at.at("total_steps").get<int64_t>(), 16);
      EXPECT_EQ(at.at("loss").get<double>(), first_final_loss);
    }
  }
  zenflow::remove_tree(dir);
}

// A rank that resumes a finished run (an attempt requeued after its predecessor finished but
// was not recorded as finished) trains nothing, writes nothing, and still tells the agent
// where the job stands and that it finished: its log line, start, resumed, finish; exit 0.
TEST(RankReport, AFinishedRunReportsItsLastStepAndFinishesWithoutTraining) {
  const fs::path dir = scratch("complete");
  const fs::path spec = job(dir, 6, 0);
  {
    RankProcess p;
    start_rank(p, dir, {spec.string()}, false);
    EventReader r(p.report_r);
    ASSERT_EQ(finish_rank(p, r), 0) << stderr_of(p);
  }
  const std::vector<int64_t> on_disk = checkpoint_steps(dir);
  ASSERT_EQ(on_disk, (std::vector<int64_t>{6}));
  const std::string log_before = zenflow::test_support::read_file(dir / "ckpt" / "steps.jsonl");
  RankProcess p;
  start_rank(p, dir, {spec.string(), "--json"}, true);
  EventReader r(p.report_r);
  LeaseRenewer renew(p.lease_w);
  ASSERT_EQ(finish_rank(p, r), 0) << stderr_of(p);
  const std::string message =
      "already complete at step 6; nothing to do (submit it with another checkpoint.dir to start over)";
  ASSERT_EQ(r.events.size(), 4u) << zenflow::test_support::read_file(p.err);
  EXPECT_EQ(r.events[0], (json{{"event", "log"}, {"line", message}}));
  EXPECT_EQ(r.events[1], (json{{"event", "start"}, {"start_step", 6}, {"total_steps", 6}}));
  EXPECT_EQ(r.events[2].at("event"), "resumed");
  EXPECT_EQ(r.events[2].at("step"), 6);
  EXPECT_TRUE(r.events[2].at("loss").is_number()) << r.events[2].dump();
  EXPECT_EQ(r.events[3], (json{{"event", "finish"}, {"steps", 6}, {"interrupted", false}}));
  EXPECT_EQ(count_of(stderr_of(p), "zenflow: " + message), 1) << stderr_of(p);
  const json out = json::parse(zenflow::test_support::read_file(p.out));
  EXPECT_EQ(out.at("already_complete"), true);
  EXPECT_EQ(out.at("step"), 6);
  EXPECT_EQ(out.at("train_steps"), 6);
  EXPECT_EQ(out.at("message"), message);
  EXPECT_EQ(out.at("final_loss"), r.events[2].at("loss"));
  EXPECT_EQ(checkpoint_steps(dir), on_disk);
  EXPECT_EQ(zenflow::test_support::read_file(dir / "ckpt" / "steps.jsonl"), log_before) << "the run's record changed";
  zenflow::remove_tree(dir);
}

// Starts a long run (no periodic checkpoints) under a lease that is renewed until the run
// reports its first step, and not after (the write end stays open). Whether it got there.
bool train_then_stop_renewing(RankProcess& p, EventReader& r, const fs::path& dir,
                              const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {job(dir, 100000, 0).string()};
  args.insert(args.end(), extra.begin(), extra.end());
  start_rank(p, dir, args, true);
  r.attach(p.report_r);
  LeaseRenewer renew(p.lease_w);
  return r.read_until(has_step_events, 120s);
}

// What a lease's end leaves: exit 75 within `limit`, `line` once on stderr, the checkpoints
// of before, and no checkpoint or finish event.
void expect_ended_by_the_lease(RankProcess& p, EventReader& r, std::chrono::seconds limit,
                               const std::string& line, const fs::path& dir,
                               const std::vector<int64_t>& checkpoints, double* seconds) {
  const int code = p.wait_exit(limit, seconds);
  const std::string err = stderr_of(p);
  EXPECT_EQ(code, 75) << err;
  EXPECT_EQ(count_of(err, line), 1) << err;
  EXPECT_EQ(checkpoint_steps(dir), checkpoints);
  r.read_to_eof(10s);
  EXPECT_TRUE(r.of("checkpoint").empty());
  EXPECT_TRUE(r.of("finish").empty());
}

// (a) The agent gone (its end of the lease closed) mid-run: exit 75 at once, one line, and
// no checkpoint beside the one the run resumed from (a SIGTERM would have written one).
// --profile-if-possible (what the agent asks of rank 0): a run long enough to profile writes
// checkpoint.dir/profile.yaml and reports it after the finish line; one too short says so on
// stderr and still exits 0, with no profile line.
TEST(RankReport, ProfileIfPossibleReportsTheProfileAfterTheFinish) {
  const fs::path dir = scratch("profile");
  const fs::path spec = job(dir, 8, 0);
  {
    RankProcess p;
    start_rank(p, dir, {spec.string(), "--fresh", "--profile-if-possible"}, false);
    EventReader r(p.report_r);
    ASSERT_EQ(finish_rank(p, r), 0) << stderr_of(p);
    ASSERT_GE(r.events.size(), 2u);
    const fs::path profile = dir / "ckpt" / "profile.yaml";
    EXPECT_EQ(r.events.back(), (json{{"event", "profile"}, {"path", profile.string()}}));
    EXPECT_EQ(r.events[r.events.size() - 2], (json{{"event", "finish"}, {"steps", 8}, {"interrupted", false}}));
    EXPECT_TRUE(contains(zenflow::test_support::read_file(profile), "zenflow_profile: 1")) << profile;
  }
  {
    RankProcess p;
    start_rank(p, dir, {spec.string(), "--fresh", "--profile-if-possible", "--set", "train.steps=4"}, false);
    EventReader r(p.report_r);
    ASSERT_EQ(finish_rank(p, r), 0) << stderr_of(p);
    for (const json& e : r.events) EXPECT_NE(e.at("event"), "profile") << e.dump();
    EXPECT_TRUE(contains(stderr_of(p), "zenflow: no profile: --profile: train.steps 4 leaves too few steady steps"))
        << stderr_of(p);
  }
}

TEST(RankLease, EofEndsTheRunWithoutACheckpoint) {
  const fs::path dir = scratch("lease-eof");
  {
    RankProcess first;
    start_rank(first, dir, {job(dir, 4, 0).string()}, false);
    EventReader r(first.report_r);
    ASSERT_EQ(finish_rank(first, r), 0) << stderr_of(first);
  }
  ASSERT_EQ(checkpoint_steps(dir), (std::vector<int64_t>{4}));
  RankProcess p;
  EventReader r;
  ASSERT_TRUE(train_then_stop_renewing(p, r, dir)) << stderr_of(p);
  p.close_lease();
  expect_ended_by_the_lease(p, r, 30s, "zenflow: lease lost (agent gone); exiting without a checkpoint\n",
                            dir, {4}, nullptr);
  zenflow::remove_tree(dir);
}

// (b) The agent stopped (its end open, nothing written): the lease expires after
// --lease-timeout, and the run ends with 75 and no checkpoint.
TEST(RankLease, SilenceExpiresTheLeaseAndEndsTheRunWithoutACheckpoint) {
  const fs::path dir = scratch("lease-expiry");
  RankProcess p;
  EventReader r;
  ASSERT_TRUE(train_then_stop_renewing(p, r, dir, {"--lease-timeout", "2"})) << stderr_of(p);
  double seconds = 0;
  expect_ended_by_the_lease(
      p, r, 2s + 30s,
      "zenflow: lease expired (no renewal for 2 s); another attempt may own this job; exiting "
      "without a checkpoint\n",
      dir, {}, &seconds);
  EXPECT_GE(seconds, 1.5);  // it did wait for the lease: 2 s after the last renewal, <= 0.2 s before
  zenflow::remove_tree(dir);
}

// (c) A lease renewed all along: the run ends as without one, with its final checkpoint.
TEST(RankLease, ARenewedLeaseLetsTheRunFinish) {
  const fs::path dir = scratch("lease-renewed");
  RankProcess p;
  start_rank(p, dir, {job(dir, 12, 0).string()}, true);
  LeaseRenewer renew(p.lease_w);
  EventReader r(p.report_r);
  EXPECT_EQ(finish_rank(p, r), 0) << stderr_of(p);
  EXPECT_EQ(checkpoint_steps(dir), (std::vector<int64_t>{12}));
  ASSERT_FALSE(r.events.empty());
  EXPECT_EQ(r.events.back(), (json{{"event", "finish"}, {"steps", 12}, {"interrupted", false}}));
  zenflow::remove_tree(dir);
}

// --lock-wait: a second attempt waits for the first one's processes to let go of
// checkpoint.dir, then trains; without a release it exits 74 after the wait (the worker's
// fault: the coordinator requeues it, it does not fail the job), naming the owner.
TEST(RankLockWait, WaitsForTheOwnerThenTrainsAndFailsAfterTheWaitWithoutARelease) {
  const fs::path dir = scratch("lock-wait");
  const fs::path spec = job(dir, 3, 0);
  const std::string ckpt = (dir / "ckpt").string();
  {
    zenflow::test_support::DirLockHolder owner(ckpt);  // the previous attempt, until released
    ASSERT_GT(owner.pid(), 0);
    RankProcess p;
    start_rank(p, dir, {spec.string(), "--lock-wait", "120"}, false);
    EventReader r(p.report_r);
    const std::string waiting = "is in use by zenflow pid " + std::to_string(owner.pid());
    ASSERT_TRUE(r.read_until(
        [&](const std::vector<json>& events) {
          for (const json& e : events)
            if (e.at("event") == "log" && contains(e.at("line").get<std::string>(), waiting)) return true;
          return false;
        },
        60s))
        << "no log line about the wait; stderr:\n"
        << stderr_of(p);
    EXPECT_TRUE(contains(r.of("log").back().at("line").get<std::string>(), "waiting up to 120 s"));
    EXPECT_TRUE(checkpoint_steps(dir).empty());
    owner.release();
    EXPECT_EQ(finish_rank(p, r), 0) << stderr_of(p);
    EXPECT_EQ(checkpoint_steps(dir), (std::vector<int64_t>{3}));
  }
  {
    zenflow::test_support::DirLockHolder owner(ckpt);
    ASSERT_GT(owner.pid(), 0);
    RankProcess p;
    start_rank(p, dir, {spec.string(), "--set", "train.steps=6", "--lock-wait", "1.5"}, false);
    double seconds = 0;
    const int code = p.wait_exit(60s, &seconds);
    const std::string err = stderr_of(p);
    EXPECT_EQ(code, 74) << err;
    EXPECT_TRUE(contains(err, "zenflow: error: checkpoint.dir " + ckpt + " is in use by zenflow pid " +
                                  std::to_string(owner.pid())))
        << err;
    EXPECT_GE(seconds, 1.5);  // it waited before giving up
    EXPECT_EQ(checkpoint_steps(dir), (std::vector<int64_t>{3}));
  }
  zenflow::remove_tree(dir);
}

// Flags that cannot work are refused before anything runs (exit 2), naming the flag.
TEST(RankFlags, UnusableDescriptorsAndLauncherRanksAreRefused) {
  const fs::path dir = scratch("flags");
  const std::string bin = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow run " + job(dir, 3, 0).string();
  std::string out;
  EXPECT_EQ(zenflow::test_support::run(bin + " --lease-fd 987 2>&1", &out), 2) << out;
  EXPECT_TRUE(contains(out, "zenflow: --lease-fd 987: not an open file descriptor")) << out;
  EXPECT_EQ(zenflow::test_support::run(bin + " --report-fd 987 2>&1", &out), 2) << out;
  EXPECT_TRUE(contains(out, "zenflow: --report-fd 987: not an open file descriptor")) << out;
  EXPECT_EQ(zenflow::test_support::run(bin + " --report-fd 3 3</dev/null 2>&1", &out), 2) << out;
  EXPECT_TRUE(contains(out, "--report-fd 3: open for reading only")) << out;
  EXPECT_EQ(zenflow::test_support::run(bin + " --lease-timeout 2 2>&1", &out), 2) << out;
  EXPECT_TRUE(contains(out, "--lease-timeout requires --lease-fd")) << out;
  EXPECT_EQ(zenflow::test_support::run(bin + " --nproc 2 --report-fd 3 3>/dev/null 2>&1", &out), 2) << out;
  EXPECT_TRUE(contains(out, "--report-fd and --lease-fd belong to one rank process")) << out;
  EXPECT_TRUE(checkpoint_steps(dir).empty());
  zenflow::remove_tree(dir);
}

zenflow::StepProgress progress(int64_t step, int64_t total, double loss) {
  zenflow::StepProgress p;
  p.step = step;
  p.total = total;
  p.loss = loss;
  return p;
}

// The reporter alone: whole lines, the first and the last step through the rate limit, the
// held-back last step of an interrupted run before its finish, null for a non-finite loss.
TEST(JsonLinesReporter, WritesWholeLinesAndAlwaysTheLastStep) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  EventReader r(fds[0]);
  std::thread reader([&] { r.read_to_eof(60s); });
  {
    zenflow::JsonLinesReporter rep(fds[1], std::chrono::hours(1));
    rep.on_start(0, 10);
    for (int64_t s = 1; s <= 10; ++s) rep.on_step(progress(s, 10, 1.0 / static_cast<double>(s)));
    rep.on_checkpoint(10, "/ckpt/step-00000010");
    const std::string long_line(100000, 'x');  // beyond a pipe's buffer: still one line
    rep.on_log(long_line);
    rep.on_log("bad utf-8 \xff here");
    rep.on_finish(10, false);

    zenflow::JsonLinesReporter interrupted(fds[1], std::chrono::hours(1));
    for (int64_t s = 1; s <= 5; ++s) interrupted.on_step(progress(s, 10, 2.0));
    interrupted.on_finish(5, true);
    EXPECT_TRUE(rep.writing());
  }
  ::close(fds[1]);
  reader.join();
  ::close(fds[0]);
  ASSERT_TRUE(r.eof);
  std::vector<std::string> kinds;
  std::vector<int64_t> steps;
  for (const json& e : r.events) {
    kinds.push_back(e.at("event"));
    if (e.at("event") == "step") steps.push_back(e.at("step"));
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"start", "step", "step", "checkpoint", "log", "log", "finish",
                                             "step", "step", "finish"}));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 10, 1, 5}));
  EXPECT_EQ(r.events[2].at("loss").get<double>(), 0.1);
  EXPECT_EQ(r.events[4].at("line").get<std::string>().size(), 100000u);
  EXPECT_EQ(r.events[5].at("line").get<std::string>(), "bad utf-8 \xef\xbf\xbd here");
  EXPECT_EQ(r.events[6], (json{{"event", "finish"}, {"steps", 10}, {"interrupted", false}}));
  EXPECT_EQ(r.events[9], (json{{"event", "finish"}, {"steps", 5}, {"interrupted", true}}));
  EXPECT_EQ(r.lines[0], R"({"event":"start","start_step":0,"total_steps":10})");  // "event" first

  // Every step passes when the interval is 0; a NaN loss is null.
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  {
    zenflow::JsonLinesReporter all(fds[1], 0ms);
    for (int64_t s = 1; s <= 4; ++s) all.on_step(progress(s, 4, s == 3 ? std::nan("") : 1.0));
  }
  ::close(fds[1]);
  EventReader r2(fds[0]);
  r2.read_to_eof(10s);
  ::close(fds[0]);
  ASSERT_EQ(r2.events.size(), 4u);
  EXPECT_TRUE(r2.events[2].at("loss").is_null());
}

// A reader gone (EPIPE) turns the reporter off; the process lives on (SIGPIPE ignored).
TEST(JsonLinesReporter, AReaderGoneTurnsItOff) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  ::close(fds[0]);
  zenflow::JsonLinesReporter rep(fds[1]);
  EXPECT_TRUE(rep.writing());
  rep.on_start(0, 3);
  EXPECT_FALSE(rep.writing());
  rep.on_step(progress(1, 3, 1.0));
  rep.on_finish(1, false);
  EXPECT_FALSE(rep.writing());
  ::close(fds[1]);
}

namespace {
// A lease on a fresh pipe whose end is recorded instead of exiting.
struct LeaseFixture {
  int fds[2] = {-1, -1};
  std::atomic<int> ends{0};
  std::atomic<int> why{-1};
  std::unique_ptr<zenflow::Lease> lease;
  explicit LeaseFixture(std::chrono::milliseconds timeout) {
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    lease = std::make_unique<zenflow::Lease>(fds[0], timeout, [this](zenflow::LeaseEnd w) {
      why.store(static_cast<int>(w));
      ends.fetch_add(1);
    });
  }
  // publish_if_held with a publish that records it ran: whether it did (and was said to).
  bool publishes() {
    bool ran = false;
    EXPECT_EQ(lease->publish_if_held([&] { ran = true; }), ran);
    return ran;
  }
  bool wait_end(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (ends.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    return ends.load() > 0;
  }
  ~LeaseFixture() {
    lease.reset();
    if (fds[0] >= 0) ::close(fds[0]);
    if (fds[1] >= 0) ::close(fds[1]);
  }
};
}  // namespace

TEST(Lease, EveryByteRenewsIt) {
  LeaseFixture f(300ms);
  for (int i = 0; i < 20; ++i) {  // 1 s, three times the timeout
    ASSERT_EQ(::write(f.fds[1], "x", 1), 1);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(f.lease->held());
  EXPECT_TRUE(f.publishes());
  EXPECT_EQ(f.ends.load(), 0);
}

TEST(Lease, EofEndsItAsLost) {
  LeaseFixture f(10s);
  ::close(f.fds[1]);
  f.fds[1] = -1;
  ASSERT_TRUE(f.wait_end(5s));
  EXPECT_EQ(f.why.load(), static_cast<int>(zenflow::LeaseEnd::kLost));
  EXPECT_FALSE(f.publishes());
  f.lease->expire();  // ended already: on_end does not run again
  EXPECT_EQ(f.ends.load(), 1);
}

TEST(Lease, SilenceExpiresItAndNothingIsPublishedAfter) {
  LeaseFixture f(200ms);
  ASSERT_TRUE(f.wait_end(5s));
  EXPECT_EQ(f.why.load(), static_cast<int>(zenflow::LeaseEnd::kExpired));
  EXPECT_FALSE(f.lease->held());
  ASSERT_EQ(::write(f.fds[1], "x", 1), 1);  // too late: the end is final
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(f.publishes());
  EXPECT_EQ(f.ends.load(), 1);
}

// The race the fence exists for: the lease runs out while a checkpoint is being published.
// The end waits for the publish; once declared, nothing more is published.
TEST(Lease, ItsEndWaitsForAPublishInProgress) {
  LeaseFixture f(300ms);
  int ends_during_publish = -1;
  EXPECT_TRUE(f.lease->publish_if_held([&] {
    std::this_thread::sleep_for(900ms);  // three timeouts: the thread sees the deadline pass
    ends_during_publish = f.ends.load();
  }));
  EXPECT_EQ(ends_during_publish, 0);
  ASSERT_TRUE(f.wait_end(5s));
  EXPECT_EQ(f.why.load(), static_cast<int>(zenflow::LeaseEnd::kExpired));
  EXPECT_FALSE(f.publishes());
}

// A publish that had to wait past the deadline (behind another one) is refused, whether
// the clock or the thread's declaration refuses it; expire() after that runs on_end once.
TEST(Lease, APublishWaitingPastTheDeadlineIsRefused) {
  LeaseFixture f(200ms);
  std::atomic<bool> refused{false};
  std::thread second([&] {
    std::this_thread::sleep_for(50ms);
    refused.store(!f.lease->publish_if_held([] {}));
  });
  EXPECT_TRUE(f.lease->publish_if_held([] { std::this_thread::sleep_for(500ms); }));
  second.join();
  EXPECT_TRUE(refused.load());
  f.lease->expire();
  ASSERT_TRUE(f.wait_end(5s));
  EXPECT_EQ(f.ends.load(), 1);
}
