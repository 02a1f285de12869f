// The coordinator's resources under a flood from one client, as real processes: streams
// past their cap are refused at once, the rest of the API keeps answering, and SIGTERM stops
// the coordinator within its grace whatever is open; its open-files limit is raised.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/rpc/rpc.h"
#include "server/service.h"
#include "tests/support/service_cluster.h"
#include "tests/support/tiny_job.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "zenflow/v1/jobs.grpc.pb.h"

namespace zenflow {
namespace {

namespace fs = std::filesystem;
using test_support::Cluster;

// The coordinator's thread count, from the process itself (/proc/PID/status).
int threads_of(pid_t pid) {
  const std::string status = test_support::read_file("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find("\nThreads:");
  return at == std::string::npos ? -1 : std::atoi(status.c_str() + at + 9);
}

// Many WatchJob streams, started asynchronously on `connections` connections of one client.
// Tags: 3i started, 3i+1 a read, 3i+2 the finish.
struct Watchers {
  Watchers(const std::string& address, int connections) {
    rpc::ChannelOptions own;
    own.own_connection = true;
    for (int k = 0; k < connections; ++k) stubs.push_back(v1::JobService::NewStub(rpc::make_channel(address, own)));
  }
  ~Watchers() {
    for (auto& ctx : contexts) ctx->TryCancel();
    cq.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
  }
  void open(const std::string& token, const std::string& job, int64_t after_revision) {
    const size_t i = readers.size();
    v1::WatchJobRequest req;
    req.set_id(job);
    req.set_after_revision(after_revision);
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    rpc::prepare_call(*contexts.back(), token, std::chrono::seconds(120));
    events.emplace_back();
    last.emplace_back();
    statuses.emplace_back();
    ended.push_back(false);
    readers.push_back(stubs[i % stubs.size()]->AsyncWatchJob(contexts.back().get(), req, &cq, tag(i, 0)));
  }
  // Handles events until `enough` says so or `timeout` passes; false on the timeout.
  template <typename Enough>
  bool pump(Enough enough, std::chrono::seconds timeout) {
    const auto deadline = std::chrono::system_clock::now() + timeout;
    while (!enough()) {
      void* raw = nullptr;
      bool ok = false;
      if (cq.AsyncNext(&raw, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) return false;
      const intptr_t t = reinterpret_cast<intptr_t>(raw);
      const size_t i = static_cast<size_t>(t / 3);
      switch (t % 3) {
        case 0:  // started (or failed to): read until the stream ends
        case 1:
          if (t % 3 == 1 && ok) {
            ++events[i];
            ++total_events;
          }
          if (ok) {
            readers[i]->Read(&last[i], tag(i, 1));
          } else {
            readers[i]->Finish(&statuses[i], tag(i, 2));
          }
          break;
        case 2:
          ended[i] = true;
          ++total_ended;
          break;
      }
    }
    return true;
  }
  static void* tag(size_t i, int kind) { return reinterpret_cast<void*>(static_cast<intptr_t>(3 * i + kind)); }

  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientAsyncReader<v1::JobEvent>>> readers;
  std::vector<int> events;
  std::vector<v1::JobEvent> last;
  std::vector<grpc::Status> statuses;
  std::vector<bool> ended;
  int total_events = 0;
  int total_ended = 0;
};

// 2,000 WatchJob streams from one client, on two queued jobs: every one is served, and the
// coordinator holds no thread for them (its thread count, read from /proc, grows by less than
// 16); a unary call still answers within a second; one change (a cancel) reaches the 1,000
// watchers of that job, which then end; SIGTERM with the other 1,000 open stops the
// coordinator within its grace, and they end UNAVAILABLE. Before, each stream took a thread
// of the synchronous pool until it ran out ("Server Threadpool Exhausted" for every
// synchronous call) and SIGTERM hung in grpc_shutdown().
TEST(CoordinatorLimits, TwoThousandStreamsAreServedWithoutAThreadEachAndOneChangeReachesItsWatchers) {
  test_support::ClusterOptions o;
  o.coordinator_flags = {"--admin-rate-limit", "0"};
  Cluster c("streams", o);
  c.start_coordinator();
  const fs::path spec_a = c.dir() / "a.yaml", spec_b = c.dir() / "b.yaml";
  test_support::write_file(spec_a, test_support::tiny_job_spec("watched-a"));
  test_support::write_file(spec_b, test_support::tiny_job_spec("watched-b"));
  const std::string a = c.submit(spec_a), b = c.submit(spec_b);  // no worker: both stay queued
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  // Under ASan (the sanitizer run, whose point is memory errors, not scale) 300 on 2
  // connections: there the coordinator is several times slower, and connections carrying
  // 250 new streams at once lost their handshake.
#ifdef __SANITIZE_ADDRESS__
  constexpr int kStreams = 300, kConnections = 2;
#else
  constexpr int kStreams = 2000, kConnections = 8;
#endif
  const int threads_before = threads_of(c.coordinator().pid());
  ASSERT_GT(threads_before, 0);
  Watchers w(c.address(), kConnections);
  for (int i = 0; i < kStreams; ++i) w.open(c.admin_token(), i % 2 == 0 ? a : b, 0);
  // Each gets the job's status (QUEUED) at once, then waits.
  ASSERT_TRUE(w.pump([&] { return w.total_events >= kStreams || w.total_ended > 0; }, std::chrono::seconds(60)))
      << w.total_events << " of " << kStreams << " streams got their first event";
  ASSERT_EQ(w.total_ended, 0) << [&] {  // which ended, and how
    std::string why;
    for (size_t i = 0; i < w.ended.size(); ++i)
      if (w.ended[i])
        why += "stream " + std::to_string(i) + ": code " + std::to_string(w.statuses[i].error_code()) + " '" +
               w.statuses[i].error_message() + "' after " + std::to_string(w.events[i]) + " events; ";
    return why;
  }();
  EXPECT_EQ(w.total_events, kStreams);
  EXPECT_EQ(w.last[0].job().state(), v1::QUEUED);
  const int threads_open = threads_of(c.coordinator().pid());
  EXPECT_LT(threads_open - threads_before, 16) << threads_before << " threads before, " << threads_open << " with "
                                              << kStreams << " streams open";
  // A unary call meanwhile.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.state(a), "QUEUED");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  // One change: job a cancelled. Its watchers get CANCELLED and end OK; b's stay.
  {
    auto stub = v1::JobService::NewStub(rpc::make_channel(c.address()));
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.admin_token(), std::chrono::seconds(10));
    v1::CancelJobRequest req;
    req.set_id(a);
    v1::CancelJobResponse resp;
    ASSERT_TRUE(stub->CancelJob(&ctx, req, &resp).ok());
  }
  ASSERT_TRUE(w.pump([&] { return w.total_ended >= kStreams / 2; }, std::chrono::seconds(60)))
      << w.total_ended << " of " << kStreams / 2 << " watchers of the cancelled job ended";
  int cancelled_seen = 0, still_open = 0;
  for (int i = 0; i < kStreams; ++i) {
    const size_t k = static_cast<size_t>(i);
    if (i % 2 == 0) {
      cancelled_seen += w.ended[k] && w.statuses[k].ok() && w.events[k] == 2 && w.last[k].job().state() == v1::CANCELLED;
    } else {
      still_open += !w.ended[k] && w.events[k] == 1;
    }
  }
  EXPECT_EQ(cancelled_seen, kStreams / 2);
  EXPECT_EQ(still_open, kStreams / 2);
  // SIGTERM with b's watchers still open: the coordinator ends them and exits within its grace.
  const auto term = std::chrono::steady_clock::now();
  c.coordinator().kill(SIGTERM);
  EXPECT_EQ(c.coordinator().wait_exit(std::chrono::seconds(30)), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - term, std::chrono::seconds(10));
  ASSERT_TRUE(w.pump([&] { return w.total_ended >= kStreams; }, std::chrono::seconds(30)));
  int unavailable = 0;
  for (int i = 1; i < kStreams; i += 2) unavailable += w.statuses[static_cast<size_t>(i)].error_code() == grpc::StatusCode::UNAVAILABLE;
  EXPECT_EQ(unavailable, kStreams / 2) << w.statuses[1].error_message();
  const std::string log = test_support::read_file(c.dir() / "coordinator-1.log");
  EXPECT_NE(log.find("zenflow-coordinator: open files: "), std::string::npos) << log;
}

// Past --max-streams-per-client, a client's streams are refused at once, saying why; and
// past 64 health watches (no token needed: a thread each), those are too.
TEST(CoordinatorLimits, StreamsPastTheCapsAreRefusedSayingWhich) {
  test_support::ClusterOptions o;
  o.coordinator_flags = {"--admin-rate-limit", "0", "--max-streams-per-client", "50"};
  Cluster c("stream-cap", o);
  c.start_coordinator();
  const fs::path spec = c.dir() / "job.yaml";
  test_support::write_file(spec, test_support::tiny_job_spec("watched"));
  const std::string id = c.submit(spec);
  ASSERT_FALSE(id.empty());
  Watchers w(c.address(), 2);
  for (int i = 0; i < 120; ++i) w.open(c.admin_token(), id, 1'000'000'000);  // nothing to send: they wait
  ASSERT_TRUE(w.pump([&] { return w.total_ended >= 70; }, std::chrono::seconds(60))) << w.total_ended;
  int refused = 0;
  std::string why;
  for (size_t i = 0; i < w.ended.size(); ++i) {
    if (!w.ended[i]) continue;
    refused += w.statuses[i].error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    why = w.statuses[i].error_message();
  }
  EXPECT_EQ(refused, 70);
  EXPECT_NE(why.find("50 streams of this client are open"), std::string::npos) << why;
  // Closing some frees their places.
  for (size_t i = 0; i < w.ended.size(); ++i)
    if (!w.ended[i]) {
      w.contexts[i]->TryCancel();
      break;
    }
  ASSERT_TRUE(w.pump([&] { return w.total_ended >= 71; }, std::chrono::seconds(30)));
  // The client's cancel reaches the coordinator a moment later: a new stream is served
  // (it gets the job's status at once) within a few tries.
  int tries = 0;
  for (; tries < 50; ++tries) {
    w.open(c.admin_token(), id, 0);
    ASSERT_TRUE(w.pump([&] { return w.events.back() > 0 || w.ended.back(); }, std::chrono::seconds(30)));
    if (w.events.back() == 1) break;
    EXPECT_EQ(w.statuses.back().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << w.statuses.back().error_message();
  }
  EXPECT_LT(tries, 50) << "no stream was served after one closed: " << w.statuses.back().error_message();

  // Health watches: 80 without a token; 64 served, 16 refused.
  auto health = grpc::health::v1::Health::NewStub(rpc::make_channel(c.address()));
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientAsyncReader<grpc::health::v1::HealthCheckResponse>>> readers;
  std::vector<grpc::health::v1::HealthCheckResponse> first(80);
  std::vector<grpc::Status> statuses(80);
  for (intptr_t i = 0; i < 80; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    readers.push_back(health->AsyncWatch(contexts.back().get(), grpc::health::v1::HealthCheckRequest{}, &cq,
                                         reinterpret_cast<void*>(3 * i)));
  }
  int served = 0, health_refused = 0;
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  while (served + health_refused < 80) {
    void* raw = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&raw, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) break;
    const intptr_t t = reinterpret_cast<intptr_t>(raw);
    const size_t i = static_cast<size_t>(t / 3);
    if (t % 3 == 0) {
      readers[i]->Read(&first[i], reinterpret_cast<void*>(t + 1));
    } else if (t % 3 == 1) {
      if (ok) {
        ++served;  // its first answer: SERVING
      } else {
        readers[i]->Finish(&statuses[i], reinterpret_cast<void*>(3 * static_cast<intptr_t>(i) + 2));
      }
    } else {
      health_refused += statuses[i].error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                        statuses[i].error_message().find("64 health watches are open") != std::string::npos;
    }
  }
  EXPECT_EQ(served, 64);
  EXPECT_EQ(health_refused, 16);
  for (auto& ctx : contexts) ctx->TryCancel();
  c.coordinator().kill(SIGTERM);
  EXPECT_EQ(c.coordinator().wait_exit(std::chrono::seconds(30)), 0);
  cq.Shutdown();
  void* raw = nullptr;
  bool ok = false;
  while (cq.Next(&raw, &ok)) {
  }
}

// Idle connections past the coordinator's open-files limit: gRPC 1.51's listener used to stop
// for good at the first accept4() EMFILE, so that the main port never accepted again, even
// after the connections closed (the health port kept saying SERVING). Now the connections it
// cannot hold are closed at once, it says NOT_SERVING meanwhile, and once they are gone the
// port accepts again. The limit is lowered on the running process (prlimit) to 64 above what
// it holds; 300 connections then exhaust it.
TEST(CoordinatorLimits, IdleConnectionsPastTheFileLimitAreShedAndThePortAcceptsOnceTheyClose) {
  Cluster c("fd-limit");
  c.start_coordinator();
  const pid_t pid = c.coordinator().pid();
  auto open_fds = [&] {
    std::error_code ec;
    int n = 0;
    for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
         !ec && it != fs::directory_iterator(); it.increment(ec))
      ++n;
    return n;
  };
  const int held = open_fds();
  ASSERT_GT(held, 0);
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(held + 64);
  ASSERT_EQ(::prlimit(pid, RLIMIT_NOFILE, &lim, nullptr), 0) << std::strerror(errno);
  auto answers = [&] {  // a unary call on a connection of its own
    rpc::ChannelOptions co;
    co.own_connection = true;
    auto stub = v1::JobService::NewStub(rpc::make_channel(c.address(), co));
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.admin_token(), std::chrono::seconds(1));
    v1::ListJobsResponse resp;
    return stub->ListJobs(&ctx, v1::ListJobsRequest{}, &resp).ok();
  };
  ASSERT_TRUE(answers());

  const int port = std::stoi(c.address().substr(c.address().rfind(':') + 1));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(s, 0);
    idle.push_back(s);
    (void)::connect(s, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);  // completes in the backlog
  }
  const fs::path log_file = c.dir() / "coordinator-1.log";
  const bool said_out = test_support::wait_until(
      [&] { return test_support::read_file(log_file).find("out of file descriptors") != std::string::npos; },
      std::chrono::seconds(10));
  EXPECT_TRUE(said_out) << test_support::read_file(log_file);
  // (Whether one more connection is served meanwhile depends on what else the process closes:
  // under ASan one sometimes was. The defect was the port never accepting again, below.)
  for (int s : idle) ::close(s);
  // Accepting again within seconds of the connections closing, polled (bounded: 10 s), each
  // try on a connection of its own. A try fails at once while the coordinator has not yet
  // seen the closes (its new connection is refused or dropped): ten tries in a row with no
  // wait between them ran out within milliseconds on a loaded machine.
  const auto closed = std::chrono::steady_clock::now();
  const bool again = test_support::wait_until(answers, std::chrono::seconds(10));
  EXPECT_TRUE(again) << "the main port never accepted again";
  EXPECT_LT(std::chrono::steady_clock::now() - closed, std::chrono::seconds(10));
  EXPECT_TRUE(test_support::wait_until(
      [&] { return test_support::read_file(log_file).find("file descriptors free again") != std::string::npos; },
      std::chrono::seconds(10)))
      << test_support::read_file(log_file);
  EXPECT_TRUE(c.coordinator().running());
}

}  // namespace
}  // namespace zenflow
