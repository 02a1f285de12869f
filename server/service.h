// The coordinator's gRPC services: thin classes that authenticate every call (rpc.h),
// rate-limit the admin API per client address, and hand the request to Coordinator.
// Streams (WatchJob, StreamLogs) poll the coordinator's waits in slices of at most a
// second and end when the client cancels or the server shuts down.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>

#include "common/rpc/auth.h"
#include "server/coordinator.h"
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

class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(Coordinator& coordinator, const rpc::TokenAuthority& auth, RateLimiter& limiter)
      : c_(coordinator), auth_(auth), limiter_(limiter) {}
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::JobStatus*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::CancelJobResponse*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*, grpc::ServerWriter<v1::JobEvent>*) override;
  grpc::Status StreamLogs(grpc::ServerContext*, const v1::StreamLogsRequest*,
                          grpc::ServerWriter<v1::LogChunk>*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*, v1::ListWorkersResponse*) override;

 private:
  grpc::Status admit(grpc::ServerContext* ctx);  // token, then rate limit
  Coordinator& c_;
  const rpc::TokenAuthority& auth_;
  RateLimiter& limiter_;
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  WorkerServiceImpl(Coordinator& coordinator, const rpc::TokenAuthority& auth) : c_(coordinator), auth_(auth) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*, v1::HeartbeatResponse*) override;
  grpc::Status FetchAssignments(grpc::ServerContext*, const v1::FetchAssignmentsRequest*,
                                v1::FetchAssignmentsResponse*) override;
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ReportProgressRequest*,
                              v1::ReportProgressResponse*) override;
  grpc::Status ReportEvent(grpc::ServerContext*, const v1::ReportEventRequest*, v1::ReportEventResponse*) override;
  grpc::Status UploadLogs(grpc::ServerContext*, const v1::UploadLogsRequest*, v1::UploadLogsResponse*) override;

 private:
  grpc::Status admit(grpc::ServerContext* ctx) const;
  Coordinator& c_;
  const rpc::TokenAuthority& auth_;
};

}  // namespace zenflow::server
