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
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/rpc/rpc.h"
#include "server/service.h"
#include "tests/support/service_cluster.h"
#include "tests/support/tiny_job.h"
#include "zenflow/v1/jobs.grpc.pb.h"

namespace zenflow {
namespace {

namespace fs = std::filesystem;
using test_support::Cluster;

// 2,000 WatchJob streams from one client (its rate limit off): the first kMaxStreamsPerClient are served, every one
// past that is refused with RESOURCE_EXHAUSTED saying why; a unary call still answers within
// a second meanwhile; SIGTERM then stops the coordinator within its grace. Before, each
// stream took a thread of its own until the pool ran out ("Server Threadpool Exhausted" for
// every synchronous call) and SIGTERM hung in grpc_shutdown().
TEST(CoordinatorLimits, StreamsPastTheCapAreRefusedAndTheRestOfTheApiAnswers) {
  test_support::ClusterOptions o;
  o.coordinator_flags = {"--admin-rate-limit", "0"};  // every refusal is the stream cap's
  Cluster c("limits", o);
  c.start_coordinator();
  const fs::path spec = c.dir() / "job.yaml";
  test_support::write_file(spec, test_support::tiny_job_spec("watched"));
  const std::string id = c.submit(spec);  // no worker: it stays queued, its watchers wait
  ASSERT_FALSE(id.empty());
  // One client (one address) on 8 connections of 250 streams each. Under ASan (the
  // sanitizer run, whose point is memory errors, not scale) 300: there the coordinator is
  // several times slower, and connections carrying 250 new streams at once lost their
  // handshake (half the streams failed before reaching the cap).
#ifdef __SANITIZE_ADDRESS__
  constexpr int kStreams = 300, kConnections = 2;
#else
  constexpr int kStreams = 2000, kConnections = 8;
#endif
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
  rpc::ChannelOptions own;
  own.own_connection = true;
  for (int k = 0; k < kConnections; ++k) stubs.push_back(v1::JobService::NewStub(rpc::make_channel(c.address(), own)));
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientAsyncReader<v1::JobEvent>>> readers;
  std::vector<grpc::Status> statuses(kStreams);
  v1::WatchJobRequest req;
  req.set_id(id);
  req.set_after_revision(1'000'000'000);  // nothing to send: every accepted stream just waits
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    rpc::prepare_call(*contexts.back(), c.admin_token(), std::chrono::seconds(60));
    readers.push_back(stubs[static_cast<size_t>(i % kConnections)]->AsyncWatchJob(contexts.back().get(), req, &cq, reinterpret_cast<void*>(intptr_t{2 * i})));
  }
  // Each stream: started (tag 2i), then Finish (tag 2i+1) completes only once it ended.
  int started = 0, ended = 0, refused = 0;
  std::string why;
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  while (ended < kStreams - server::JobServiceImpl::kMaxStreamsPerClient && std::chrono::system_clock::now() < deadline) {
    void* tag = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&tag, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) break;
    const intptr_t t = reinterpret_cast<intptr_t>(tag);
    const int i = static_cast<int>(t / 2);
    if (t % 2 == 0) {
      ++started;
      readers[static_cast<size_t>(i)]->Finish(&statuses[static_cast<size_t>(i)], reinterpret_cast<void*>(t + 1));
    } else {
      ++ended;
      const grpc::Status& st = statuses[static_cast<size_t>(i)];
      if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
          st.error_message().find("streams of this client are open") != std::string::npos)
        ++refused;
      why = st.error_message();
    }
  }
  EXPECT_EQ(refused, kStreams - server::JobServiceImpl::kMaxStreamsPerClient) << "started " << started << ", ended " << ended;
  EXPECT_NE(why.find("64 streams of this client are open"), std::string::npos) << why;
  // A unary call meanwhile.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.state(id), "QUEUED");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  // SIGTERM with the served streams still open: the coordinator ends them and exits.
  const auto term = std::chrono::steady_clock::now();
  c.coordinator().kill(SIGTERM);
  EXPECT_EQ(c.coordinator().wait_exit(std::chrono::seconds(30)), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - term, std::chrono::seconds(10));
  for (auto& ctx : contexts) ctx->TryCancel();
  for (;;) {  // drain what the cancels complete
    void* tag = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(5)) !=
        grpc::CompletionQueue::GOT_EVENT)
      break;
    const intptr_t t = reinterpret_cast<intptr_t>(tag);
    if (t % 2 == 0) readers[static_cast<size_t>(t / 2)]->Finish(&statuses[static_cast<size_t>(t / 2)],
                                                                reinterpret_cast<void*>(t + 1));
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  const std::string log = test_support::read_file(c.dir() / "coordinator-1.log");
  EXPECT_NE(log.find("zenflow-coordinator: open files: "), std::string::npos) << log;
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
  // Accepting again within seconds of the connections closing (bounded: 10 s of 1 s calls).
  const auto closed = std::chrono::steady_clock::now();
  bool again = false;
  for (int i = 0; i < 10 && !again; ++i) again = answers();
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
