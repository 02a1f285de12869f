// The coordinator's gRPC services: thin classes that authenticate every call (rpc.h),
// rate-limit the admin API per client address, and hand the request to Coordinator.
//
// The calls that come by the thousand per second and take microseconds (Heartbeat,
// ReportProgress, GetJob) use the callback API: the handler runs on the thread that read the
// request, with no hand-off to a thread pool. The sync server spawns and reaps threads under
// such load, which cost 2.5x the handlers themselves at 10,000 heartbeats/s. Every other call
// is synchronous, on the server's thread pool: those that write the store (an fsync), build
// large answers (ListJobs, ListWorkers) or wait (the FetchAssignments long poll, the WatchJob
// and StreamLogs streams, polling the coordinator's waits in slices of at most a second) must
// not hold up a thread the heartbeats are served on.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>

#include "common/rpc/auth.h"
#include "server/coordinator.h"
#include "server/coordinator_metrics.h"
#include "zenflow/v1/jobs.grpc.pb.h"
#include "zenflow/v1/workers.grpc.pb.h"

namespace zenflow::server {

// A token bucket per client address (the peer's IP, not its port): `rate` requests per
// second with bursts of `burst`. rate <= 0: unlimited.
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

using JobServiceBase = v1::JobService::WithCallbackMethod_GetJob<v1::JobService::Service>;
using WorkerServiceBase = v1::WorkerService::WithCallbackMethod_Heartbeat<
    v1::WorkerService::WithCallbackMethod_ReportProgress<v1::WorkerService::Service>>;
using Unary = grpc::ServerUnaryReactor;
using CallbackContext = grpc::CallbackServerContext;

class JobServiceImpl final : public JobServiceBase {
 public:
  // `metrics` (may be null) times each unary call.
  JobServiceImpl(Coordinator& coordinator, const rpc::TokenAuthority& auth, RateLimiter& limiter,
                 const CoordinatorMetrics* metrics = nullptr)
      : c_(coordinator), auth_(auth), limiter_(limiter), metrics_(metrics) {}
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse*) override;
  Unary* GetJob(CallbackContext*, const v1::GetJobRequest*, v1::JobStatus*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::CancelJobResponse*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*, v1::ListWorkersResponse*) override;
  grpc::Status GetJobProfile(grpc::ServerContext*, const v1::GetJobProfileRequest*, v1::JobProfile*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::JobEvent>*) override;
  grpc::Status StreamLogs(grpc::ServerContext*, const v1::StreamLogsRequest*,
                          grpc::ServerWriter<v1::LogChunk>*) override;

 private:
  grpc::Status admit(const grpc::ServerContextBase& ctx);  // token, then rate limit
  Coordinator& c_;
  const rpc::TokenAuthority& auth_;
  RateLimiter& limiter_;
  const CoordinatorMetrics* metrics_;
};

class WorkerServiceImpl final : public WorkerServiceBase {
 public:
  WorkerServiceImpl(Coordinator& coordinator, const rpc::TokenAuthority& auth,
                    const CoordinatorMetrics* metrics = nullptr)
      : c_(coordinator), auth_(auth), metrics_(metrics) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override;
  Unary* Heartbeat(CallbackContext*, const v1::HeartbeatRequest*, v1::HeartbeatResponse*) override;
  Unary* ReportProgress(CallbackContext*, const v1::ReportProgressRequest*,
                        v1::ReportProgressResponse*) override;
  grpc::Status ReportEvent(grpc::ServerContext*, const v1::ReportEventRequest*, v1::ReportEventResponse*) override;
  grpc::Status UploadLogs(grpc::ServerContext*, const v1::UploadLogsRequest*, v1::UploadLogsResponse*) override;
  grpc::Status UploadProfile(grpc::ServerContext*, const v1::UploadProfileRequest*,
                             v1::UploadProfileResponse*) override;
  grpc::Status FetchAssignments(grpc::ServerContext*, const v1::FetchAssignmentsRequest*,
                                v1::FetchAssignmentsResponse*) override;

 private:
  grpc::Status admit(const grpc::ServerContextBase& ctx) const;
  Coordinator& c_;
  const rpc::TokenAuthority& auth_;
  const CoordinatorMetrics* metrics_;
};

}  // namespace zenflow::server
