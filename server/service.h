// The coordinator's gRPC services: thin classes that authenticate every call (rpc.h),
// rate-limit the admin API per client address, and hand the request to Coordinator.
//
// The calls that come by the thousand per second and take microseconds (Heartbeat and the
// beats of HeartbeatStream, ReportProgress, GetJob) are asynchronous methods, served by HotPathServer: one
// thread that drives one completion queue, reading each request and answering it in place. SubmitJob is one
// too: checked on that thread, answered by the store's committer once durable, so that no thread waits out a
// commit. (The sync server spawns and reaps threads under such load, which cost 2.5x the handlers themselves
// at 10,000 heartbeats/s; gRPC 1.51's callback API runs handlers on at least two "nexting"
// threads that hand every call between them: 3 context switches per call, a third of the
// coordinator's CPU at that rate.) The WatchJob and StreamLogs streams are asynchronous too,
// on a queue and thread of their own (StreamServer, stream_server.h), so that thousands of
// them hold no thread. Every other call is synchronous, on the server's thread pool: those
// that write the store (an fsync), build large answers (ListJobs, ListWorkers) or wait (the
// FetchAssignments long poll) must not hold up the thread the heartbeats are served on.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/rpc/auth.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/coordinator.h"
#include "server/coordinator_metrics.h"
#include "zenflow/v1/jobs.grpc.pb.h"
#include "zenflow/v1/workers.grpc.pb.h"

namespace zenflow::server {

// A token bucket per caller: `rate` requests per second with bursts of `burst`. The caller is
// the connection (the peer's address and port): every admin holds the same token, and behind
// NAT or kube-proxy every user has the same address, so a bucket per token or per address
// would let one script's flood refuse everybody's calls. rate <= 0: unlimited.
class RateLimiter {
 public:
  RateLimiter(double rate, double burst) : rate_(rate), burst_(burst) {}
  bool allow(const std::string& peer);

 private:
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point last;
  };
  double rate_;
  double burst_;
  std::mutex mu_;
  std::map<std::string, Bucket> buckets_;
};

// Caps the streams open at once, in all and per client address. A stream past a cap is
// refused (RESOURCE_EXHAUSTED, saying which cap) instead of holding memory (WatchJob and
// StreamLogs, served without a thread each: stream_server.h) or a thread of the server's
// pool (health Watch) that the next caller needs.
class StreamGate {
 public:
  StreamGate(int total, int per_client) : total_(total), per_client_(per_client) {}
  // Held while a stream is open; empty (refused, *why says which cap) when a cap is reached.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(StreamGate* gate, std::string client) : gate_(gate), client_(std::move(client)) {}
    Ticket(Ticket&& o) noexcept : gate_(o.gate_), client_(std::move(o.client_)) { o.gate_ = nullptr; }
    Ticket& operator=(Ticket&& o) noexcept {
      if (this != &o) {
        if (gate_) gate_->release(client_);
        gate_ = o.gate_;
        client_ = std::move(o.client_);
        o.gate_ = nullptr;
      }
      return *this;
    }
    ~Ticket() {
      if (gate_) gate_->release(client_);
    }
    explicit operator bool() const { return gate_ != nullptr; }

   private:
    StreamGate* gate_ = nullptr;
    std::string client_;
  };
  Ticket enter(const std::string& client, std::string* why);
  int open() const;

 private:
  void release(const std::string& client);
  const int total_;
  const int per_client_;
  mutable std::mutex mu_;
  int open_ = 0;
  std::map<std::string, int> by_client_;
};

using JobServiceBase = v1::JobService::WithAsyncMethod_GetJob<v1::JobService::WithAsyncMethod_SubmitJob<
    v1::JobService::WithAsyncMethod_WatchJob<v1::JobService::WithAsyncMethod_StreamLogs<v1::JobService::Service>>>>;

// How many WatchJob + StreamLogs streams the coordinator serves at once, in all and per
// client address (zenflow-coordinator --max-streams, --max-streams-per-client).
struct StreamLimits {
  int total = 8192;
  int per_client = 2048;
};
using WorkerServiceBase =
    v1::WorkerService::WithAsyncMethod_Heartbeat<v1::WorkerService::WithAsyncMethod_HeartbeatStream<
        v1::WorkerService::WithAsyncMethod_ReportProgress<v1::WorkerService::Service>>>;

class JobServiceImpl final : public JobServiceBase {
 public:
  // `metrics` (may be null) times each unary call.
  JobServiceImpl(Coordinator& coordinator, const rpc::TokenAuthority& auth, RateLimiter& limiter,
                 const CoordinatorMetrics* metrics = nullptr, StreamLimits limits = {})
      : c_(coordinator), auth_(auth), limiter_(limiter), metrics_(metrics), streams_(limits.total, limits.per_client) {}
  // The asynchronous methods' handlers (HotPathServer calls them). submit_job answers
  // through `answer`, from the committer's thread once the job is durable.
  grpc::Status get_job(const grpc::ServerContext& ctx, const v1::GetJobRequest& req, v1::JobStatus* resp);
  void submit_job(const grpc::ServerContext& ctx, const v1::SubmitJobRequest& req, Coordinator::SubmitAnswer answer);
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::CancelJobResponse*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*, v1::ListWorkersResponse*) override;
  grpc::Status GetJobProfile(grpc::ServerContext*, const v1::GetJobProfileRequest*, v1::JobProfile*) override;
  // A WatchJob or StreamLogs stream's start (StreamServer calls it): the caller is admitted
  // (token, rate limit) and *ticket holds its place under the stream caps while it lasts.
  grpc::Status open_stream(const grpc::ServerContext& ctx, StreamGate::Ticket* ticket);
  Coordinator& coordinator() { return c_; }

 private:
  grpc::Status admit(const grpc::ServerContextBase& ctx);  // token, then rate limit
  Coordinator& c_;
  const rpc::TokenAuthority& auth_;
  RateLimiter& limiter_;
  const CoordinatorMetrics* metrics_;
  StreamGate streams_;
};

class WorkerServiceImpl final : public WorkerServiceBase {
 public:
  WorkerServiceImpl(Coordinator& coordinator, const rpc::TokenAuthority& auth,
                    const CoordinatorMetrics* metrics = nullptr)
      : c_(coordinator), auth_(auth), metrics_(metrics) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override;
  // The asynchronous methods' handlers (HotPathServer calls them).
  grpc::Status heartbeat(const grpc::ServerContext& ctx, const v1::HeartbeatRequest& req,
                         v1::HeartbeatResponse* resp);
  // One beat on heartbeat stream `stream` (> 0, unique per stream); `check`: the caller is
  // checked (token and session), as for the stream's first beat and any beat whose worker or
  // incarnation differs from the previous one's (a stream's metadata does not change after,
  // so one identity, once checked, stays checked).
  grpc::Status stream_beat(const grpc::ServerContext& ctx, bool check, const v1::HeartbeatRequest& req,
                           v1::HeartbeatResponse* resp, int64_t stream);
  // The stream whose last beat was `last` broke without the worker closing it.
  void stream_broken(const v1::HeartbeatRequest& last, int64_t stream);
  grpc::Status report_progress(const grpc::ServerContext& ctx, const v1::ReportProgressRequest& req);
  grpc::Status ReportEvent(grpc::ServerContext*, const v1::ReportEventRequest*, v1::ReportEventResponse*) override;
  grpc::Status UploadLogs(grpc::ServerContext*, const v1::UploadLogsRequest*, v1::UploadLogsResponse*) override;
  grpc::Status UploadProfile(grpc::ServerContext*, const v1::UploadProfileRequest*,
                             v1::UploadProfileResponse*) override;
  grpc::Status FetchAssignments(grpc::ServerContext*, const v1::FetchAssignmentsRequest*,
                                v1::FetchAssignmentsResponse*) override;

 private:
  // The token (when the coordinator has tokens): the join token or the admin token.
  grpc::Status admit(const grpc::ServerContextBase& ctx) const;
  // The token, then the session of incarnation `incarnation` of worker `name` (every call but
  // RegisterWorker): whatever the token, a call acts only as the worker whose session it has.
  grpc::Status admit(const grpc::ServerContextBase& ctx, const std::string& name, int64_t incarnation) const;
  Coordinator& c_;
  const rpc::TokenAuthority& auth_;
  const CoordinatorMetrics* metrics_;
};

// grpc.health.v1, synchronous (gRPC 1.51's default health service uses the callback API,
// whose nexting threads would compete with HotPathServer's for the same connections).
// Check answers SERVING or NOT_SERVING for the server ("") and the zenflow services, and
// NOT_FOUND for any other name; Watch sends the status, then every change (SERVICE_UNKNOWN
// for other names), until the client goes or shutdown().
class HealthService final : public grpc::health::v1::Health::Service {
 public:
  void set_serving(bool serving);
  void shutdown();  // ends every Watch
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse*) override;
  grpc::Status Watch(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*) override;

 private:
  static bool known(const std::string& service);
  // Watch is synchronous (a thread each) and needs no token: at most this many at once
  // (a probe uses Check; a Watch is a load balancer's or an operator's).
  static constexpr int kMaxWatches = 64;
  StreamGate watches_{kMaxWatches, kMaxWatches};
  std::mutex mu_;
  std::condition_variable changed_;
  bool serving_ = false;
  bool shutdown_ = false;
  int64_t version_ = 0;  // + 1 on every change
};

// Serves the services' asynchronous methods (GetJob, SubmitJob, Heartbeat, HeartbeatStream,
// ReportProgress) from one thread and one completion queue, keeping `kOutstanding` requests
// of each method armed so that a burst finds a call waiting. Lifecycle, in main's order:
//   HotPathServer hot(builder, jobs, workers);  // before BuildAndStart: adds the queue
//   server = builder.BuildAndStart(); hot.start();
//   ... server->Shutdown(deadline); hot.stop();  // (the destructor stops too)
class HotPathServer {
 public:
  static constexpr int kOutstanding = 16;
  HotPathServer(grpc::ServerBuilder& builder, JobServiceImpl& jobs, WorkerServiceImpl& workers);
  ~HotPathServer();
  HotPathServer(const HotPathServer&) = delete;
  HotPathServer& operator=(const HotPathServer&) = delete;
  void start();
  // Call after the server's Shutdown(): answers nothing more, drains the queue, joins.
  void stop();

  // One armed request of a method, or one call being answered (service.cpp).
  class Call {
   public:
    virtual ~Call() = default;
    virtual void proceed(bool ok) = 0;
  };
  // Whether new requests may be armed and calls answered; false once stop() began. Calls
  // check it and act under guard() (the queue must not be shut down in between).
  bool open() const { return open_; }
  std::mutex& guard() { return mu_; }
  grpc::ServerCompletionQueue* queue() { return cq_.get(); }

 private:
  void arm_all();
  void loop();
  JobServiceImpl& jobs_;
  WorkerServiceImpl& workers_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::vector<std::shared_ptr<void>> methods_;  // what each armed call serves (service.cpp)
  std::mutex mu_;
  bool open_ = false;  // guarded by mu_
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace zenflow::server
