// The fault-injection harness: its pure parts without processes (the seeded schedule, the
// invariant checker fed synthetic samples, /proc parsing, the partitionable proxy), and
// the service under a few fixed seeds (ChaosRun.*), each about two minutes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>

#include "bench/chaos/attempt_invariants.h"
#include "bench/chaos/chaos_harness.h"
#include "bench/chaos/fault_schedule.h"
#include "bench/chaos/proc_sampler.h"
#include "bench/chaos/tcp_proxy.h"

namespace zenflow::chaos {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------- the schedule

TEST(ChaosSchedule, IsAPureFunctionOfTheSeedAndMinutes) {
  const std::vector<Fault> a = make_schedule(7, 3), b = make_schedule(7, 3), c = make_schedule(8, 3);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(describe(a[i]), describe(b[i]));
  ASSERT_FALSE(a.empty());
  bool differs = a.size() != c.size();
  for (size_t i = 0; !differs && i < a.size(); ++i) differs = describe(a[i]) != describe(c[i]);
  EXPECT_TRUE(differs) << "seeds 7 and 8 gave the same schedule";
}

// The generator is splitmix64, not the standard library's distributions: the same seed
// gives the same faults on every platform. Pinned, so that a change to the schedule is seen
// (the seeds of tests/chaos and of reported runs would stop reproducing).
TEST(ChaosSchedule, SeedOneIsPinned) {
  const std::vector<Fault> s = make_schedule(1, 1);
  ASSERT_GE(s.size(), 3u);
  std::string first3;
  for (size_t i = 0; i < 3; ++i) first3 += describe(s[i]) + "\n";
  EXPECT_EQ(first3,
            "+6.000s rank_kill rank on w3 for 0.000s\n"
            "+9.116s node_kill node-1 for 1.739s\n"
            "+15.066s node_stop node-1 for 2.290s\n");
}

TEST(ChaosSchedule, FaultsDoNotOverlapAndEndInsideThePhase) {
  for (uint64_t seed : {1ULL, 2ULL, 3ULL, 99ULL, 123456789ULL}) {
    const std::vector<Fault> s = make_schedule(seed, 2);
    ASSERT_FALSE(s.empty());
    EXPECT_GE(s.front().at_ms, 6000);
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_LT(s[i].at_ms + s[i].duration_ms, 120'000) << seed << ": " << describe(s[i]);
      EXPECT_GE(s[i].agent, 0);
      EXPECT_LT(s[i].agent, 3);
      if (i > 0) {
        EXPECT_GE(s[i].at_ms, s[i - 1].at_ms + s[i - 1].duration_ms + 2000) << describe(s[i]);
      }
    }
  }
}

TEST(ChaosSchedule, TwelveConsecutiveFaultsHoldEveryKind) {
  const std::vector<Fault> s = make_schedule(5, 10);
  ASSERT_GE(s.size(), 24u);
  for (size_t round = 0; round < 2; ++round) {
    std::set<int> kinds;
    for (size_t i = 0; i < 12; ++i) kinds.insert(static_cast<int>(s[round * 12 + i].kind));
    EXPECT_EQ(kinds.size(), size_t(kFaultKinds)) << "round " << round;
  }
}

// ---------------------------------------------------------------- the invariant checker

RankProcess rank(int pid, const std::string& job, int64_t attempt, char state = 'S') {
  RankProcess p;
  p.pid = pid;
  p.job_id = job;
  p.attempt = attempt;
  p.state = state;
  return p;
}

size_t count(const AttemptInvariants& c, const std::string& kind) {
  size_t n = 0;
  for (const Violation& v : c.violations()) n += v.kind == kind;
  return n;
}

TEST(ChaosInvariants, TwoLiveAttemptsOfOneJobInOneSampleAreFlagged) {
  AttemptInvariants c(8000);
  c.observe_processes(0, {rank(100, "j1", 1)});
  c.observe_processes(50, {rank(100, "j1", 1, 'R'), rank(200, "j1", 2, 'S'), rank(300, "j2", 1)});
  ASSERT_EQ(count(c, "two_live_attempts"), 1u);
  const Violation& v = c.violations()[0];
  EXPECT_EQ(v.job_id, "j1");
  EXPECT_EQ(v.t_ms, 50);
  EXPECT_NE(v.evidence.find("pid 100 (attempt 1"), std::string::npos) << v.evidence;
  EXPECT_NE(v.evidence.find("pid 200 (attempt 2"), std::string::npos) << v.evidence;
  // The same pair again is the same violation, reported once.
  c.observe_processes(100, {rank(100, "j1", 1), rank(200, "j1", 2)});
  EXPECT_EQ(count(c, "two_live_attempts"), 1u);
}

TEST(ChaosInvariants, AStoppedOrZombieOldAttemptBesideANewOneIsNotTwoLive) {
  AttemptInvariants c(8000);
  c.observe_processes(0, {rank(100, "j1", 1, 'T'), rank(200, "j1", 2, 'R')});
  c.observe_processes(50, {rank(100, "j1", 1, 'Z'), rank(200, "j1", 2, 'R')});
  c.observe_processes(100, {rank(100, "j1", 1, 't'), rank(200, "j1", 2, 'D')});
  EXPECT_EQ(count(c, "two_live_attempts"), 0u);
  // Two processes of one attempt (ranks of a gang) are one attempt.
  c.observe_processes(150, {rank(200, "j1", 2), rank(201, "j1", 2)});
  EXPECT_TRUE(c.violations().empty());
}

// A sample that misses an attempt's only process (mid-execve its cmdline reads empty) and the
// next that sees the same pid again: the same process, not a restart. A new pid is one.
TEST(ChaosInvariants, AProcessMissedByOneSampleIsNotARestartButANewOneIs) {
  AttemptInvariants c(8000);
  c.observe_processes(0, {rank(100, "j1", 1)});
  c.observe_processes(50, {});
  c.observe_processes(100, {rank(100, "j1", 1)});
  EXPECT_TRUE(c.violations().empty());
  c.observe_processes(150, {});
  c.observe_processes(200, {rank(100, "j1", 1), rank(101, "j1", 1)});
  ASSERT_EQ(count(c, "finished_attempt_restarted"), 1u);
  EXPECT_NE(c.violations().back().evidence.find("none at +0.150s"), std::string::npos) << c.violations().back().evidence;
}

TEST(ChaosInvariants, AFinishedAttemptThatRunsAgainIsFlagged) {
  AttemptInvariants c(8000);
  c.observe_processes(0, {rank(100, "j1", 1)});
  c.observe_processes(50, {rank(100, "j1", 1)});
  c.observe_processes(100, {});                    // every process of attempt 1 is gone
  c.observe_processes(150, {rank(200, "j1", 2)});  // the next attempt: fine
  EXPECT_TRUE(c.violations().empty());
  c.observe_processes(200, {rank(300, "j1", 1)});  // attempt 1 again, after a coordinator restart
  ASSERT_EQ(count(c, "finished_attempt_restarted"), 1u);
  const Violation& v = c.violations().back();
  EXPECT_EQ(v.t_ms, 200);
  EXPECT_NE(v.evidence.find("attempt 1"), std::string::npos);
  EXPECT_NE(v.evidence.find("none at +0.100s"), std::string::npos) << v.evidence;
  EXPECT_NE(v.evidence.find("pid 300"), std::string::npos) << v.evidence;
  // And it was live beside attempt 2? No: attempt 2 had gone at 200. Only the restart.
  EXPECT_EQ(count(c, "two_live_attempts"), 0u);
}

TEST(ChaosInvariants, AnAttemptStoppedAndContinuedHasNotFinished) {
  AttemptInvariants c(8000);
  c.observe_processes(0, {rank(100, "j1", 1, 'R')});
  c.observe_processes(50, {rank(100, "j1", 1, 'T')});
  c.observe_processes(100, {rank(100, "j1", 1, 'R')});
  EXPECT_TRUE(c.violations().empty());
}

TEST(ChaosInvariants, RunningWithoutALiveRankBeyondTheLimitIsFlagged) {
  AttemptInvariants c(8000);
  c.observe_processes(0, {rank(100, "j1", 1)});
  c.observe_running_jobs(0, {"j1"});
  c.observe_processes(1000, {rank(100, "j1", 1)});
  c.observe_processes(1050, {});  // the rank died at ~1 s
  c.observe_running_jobs(8500, {"j1"});
  EXPECT_EQ(count(c, "running_without_rank"), 0u) << "7.5 s after the last live rank: within the limit";
  c.observe_running_jobs(9001, {"j1"});
  ASSERT_EQ(count(c, "running_without_rank"), 1u);
  EXPECT_NE(c.violations()[0].evidence.find("last live rank process seen at +1.000s"), std::string::npos)
      << c.violations()[0].evidence;
  c.observe_running_jobs(9500, {"j1"});
  EXPECT_EQ(count(c, "running_without_rank"), 1u) << "one report per episode";
}

TEST(ChaosInvariants, RunningIsNotJudgedWhileTheCoordinatorIsUnreachable) {
  AttemptInvariants c(8000);
  c.observe_running_jobs(0, {"j1"});
  c.observe_coordinator_unreachable(1000);
  c.observe_coordinator_unreachable(20000);
  c.observe_running_jobs(21000, {"j1"});  // back: judged from this answer on
  c.observe_running_jobs(28000, {"j1"});
  EXPECT_EQ(count(c, "running_without_rank"), 0u);
  c.observe_running_jobs(29500, {"j1"});
  EXPECT_EQ(count(c, "running_without_rank"), 1u);
  // A stopped (T) rank is not live either.
  AttemptInvariants d(1000);
  d.observe_processes(0, {rank(5, "j2", 1, 'T')});
  d.observe_running_jobs(0, {"j2"});
  d.observe_running_jobs(1500, {"j2"});
  EXPECT_EQ(count(d, "running_without_rank"), 1u);
}

TEST(ChaosInvariants, AnEndingReasonMustSayWhatFailed) {
  EXPECT_TRUE(
      reason_is_actionable("ranks on w2 exited with status 2: rank 0 exited with status 2: zenflow: invalid "
                           "job spec: name: required"));
  EXPECT_TRUE(reason_is_actionable("optimizer node node-1 (127.0.0.1:4000) lost; max_restarts (3) reached"));
  EXPECT_FALSE(reason_is_actionable(""));
  EXPECT_FALSE(reason_is_actionable("exited with status 1"));
  EXPECT_FALSE(reason_is_actionable("ranks on w1 killed by signal 9"));
  EXPECT_FALSE(reason_is_actionable("disk full \xff\xfe"));  // not UTF-8
}

// ---------------------------------------------------------------- /proc parsing

TEST(ChaosProc, ARankIsNamedByItsEnvironment) {
  const std::string env = std::string("PATH=/bin\0ZENFLOW_JOB_ID=j-42\0ZENFLOW_ATTEMPT=3\0HOME=/root", 56);
  const auto p = rank_from_environ(9, env);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->pid, 9);
  EXPECT_EQ(p->job_id, "j-42");
  EXPECT_EQ(p->attempt, 3);
  EXPECT_FALSE(rank_from_environ(9, std::string("ZENFLOW_JOB_ID=j-42\0HOME=/", 26)).has_value());
  EXPECT_FALSE(rank_from_environ(9, std::string("ZENFLOW_JOB_ID=j\0ZENFLOW_ATTEMPT=x1", 35)).has_value());
}

TEST(ChaosProc, TheStateFollowsTheLastParenthesis) {
  EXPECT_EQ(state_from_stat("123 (zenflow) S 1 2 3"), 'S');
  EXPECT_EQ(state_from_stat("123 (a) b (c)) T 1 2 3"), 'T');
  EXPECT_EQ(state_from_stat("garbage"), '?');
}

// ---------------------------------------------------------------- the proxy

// A one-connection echo server on 127.0.0.1.
class Echo {
 public:
  Echo() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 8);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[256];
        ssize_t n;
        while ((n = ::recv(c, buf, sizeof buf, 0)) > 0) ::send(c, buf, size_t(n), MSG_NOSIGNAL);
        ::close(c);
      }
    });
  }
  ~Echo() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  int fd_ = -1, port_ = 0;
  std::thread thread_;
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval t{0, 300'000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// What comes back for `msg`: "" when nothing does within 300 ms, "RESET" on ECONNRESET.
std::string round_trip(int fd, const std::string& msg) {
  if (::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL) < 0)
    return errno == ECONNRESET || errno == EPIPE ? "RESET" : "";
  char buf[64];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  if (n < 0 && errno == ECONNRESET) return "RESET";
  if (n == 0) return "EOF";
  return n > 0 ? std::string(buf, size_t(n)) : "";
}

TEST(ChaosProxy, ForwardsBlackholesAndResets) {
  Echo echo;
  TcpProxy proxy(echo.port());
  const int a = connect_to(proxy.port());
  EXPECT_EQ(round_trip(a, "one"), "one");
  proxy.set_mode(LinkMode::kBlackhole);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(round_trip(a, "two"), "") << "a blackholed link forwarded";
  proxy.set_mode(LinkMode::kForward);  // healed: what was sent meanwhile arrives
  char buf[64];
  timeval t{2, 0};
  ::setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
  const ssize_t n = ::recv(a, buf, sizeof buf, 0);
  EXPECT_EQ(std::string(buf, size_t(std::max<ssize_t>(n, 0))), "two");
  proxy.set_mode(LinkMode::kReset);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(round_trip(a, "three"), "RESET");
  ::close(a);
  const int b = connect_to(proxy.port());  // a new connection is reset as well
  EXPECT_EQ(round_trip(b, "four"), "RESET");
  ::close(b);
  proxy.set_mode(LinkMode::kForward);
  const int c = connect_to(proxy.port());
  EXPECT_EQ(round_trip(c, "five"), "five");
  ::close(c);
  EXPECT_GE(proxy.resets(), 2);
}

// ---------------------------------------------------------------- the service under faults

bool mounted_under(const fs::path& dir) {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);)
    if (line.find(dir.string()) != std::string::npos) return true;
  return false;
}

// Processes whose command line names `dir` (the run's coordinator, agents, node, ranks).
std::vector<int> processes_under(const fs::path& dir) {
  std::vector<int> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(dir.string() + "/") != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

void run_seed(uint64_t seed) {
  ChaosOptions o;
  o.seed = seed;
  o.minutes = 1.0;
  o.drain_timeout_s = 60;
  // ZENFLOW_CHAOS_BIN_DIR: another build's binaries (to bisect a violation, or to run these
  // seeds against a known-good build while the tree is being rebuilt).
  const char* bin = std::getenv("ZENFLOW_CHAOS_BIN_DIR");
  o.bin_dir = bin && *bin ? fs::path(bin) : fs::path(ZENFLOW_BINARY_DIR) / "bin";
  // Under the build directory (a real disk, as tests/support/disk_dir.h); a failing run's
  // directory stays there with its logs and database.
  o.dir = fs::path(ZENFLOW_BINARY_DIR) / "chaos-runs" /
          ("seed-" + std::to_string(seed) + "-" + std::to_string(::getpid()));
  const ChaosReport r = run_chaos(o);
  std::cout << r.to_json().dump(2) << std::endl;
  EXPECT_FALSE(mounted_under(r.dir)) << "a tmpfs of the run is still mounted";
  EXPECT_TRUE(processes_under(r.dir).empty()) << "processes of the run outlived it";
  EXPECT_GT(r.jobs_submitted, 0);
  int injected = 0;
  for (const InjectedFault& f : r.injected) injected += !f.skipped;
  EXPECT_GE(injected, 4) << r.reproduction();
  EXPECT_TRUE(r.ok()) << r.reproduction();
  if (r.ok() && !::testing::Test::HasFailure()) {
    std::error_code ec;
    fs::remove_all(r.dir, ec);
  }
}

// Three fixed seeds, each ~2 minutes (1 minute of faults, the reference runs, the start,
// the drain). Together their schedules hold every fault kind: seed 3 kills and stops every
// process and blackholes a link, seed 4 adds resets and a coordinator restart during a
// partition, seed 5 a full disk (`zenflow bench chaos --schedule-only --seed N` lists them).
TEST(ChaosRun, Seed3) { run_seed(3); }
TEST(ChaosRun, Seed4) { run_seed(4); }
TEST(ChaosRun, Seed5) { run_seed(5); }

}  // namespace
}  // namespace zenflow::chaos
