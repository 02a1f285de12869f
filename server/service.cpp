#include "server/service.h"

#include "common/rpc/rpc.h"

namespace zenflow::server {
namespace {

using grpc::Status;
using grpc::StatusCode;
constexpr std::chrono::milliseconds kStreamSlice{1000};

// "ipv4:127.0.0.1:53422" -> "ipv4:127.0.0.1": one bucket per client address.
std::string peer_address(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos || colon < 5 ? peer : peer.substr(0, colon);
}

// Runs `work` when the call was admitted, and finishes the call (on its default reactor)
// with the admission's or the work's status; the handler's time goes to `metrics`.
// The synchronous counterpart: the call's status.
template <typename Work>
Status answer(const CoordinatorMetrics* metrics, std::string_view method, Status admitted, Work&& work) {
  const auto t0 = std::chrono::steady_clock::now();
  if (admitted.ok()) admitted = work();
  if (metrics) metrics->observe_rpc(method, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return admitted;
}

template <typename Work>
grpc::ServerUnaryReactor* serve(grpc::CallbackServerContext* ctx, const CoordinatorMetrics* metrics,
                                std::string_view method, Status admitted, Work&& work) {
  const auto t0 = std::chrono::steady_clock::now();
  if (admitted.ok()) admitted = work();
  if (metrics) metrics->observe_rpc(method, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(admitted);
  return r;
}

}  // namespace

bool RateLimiter::allow(const std::string& peer) {
  if (rate_ <= 0) return true;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = buckets_.try_emplace(peer);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = burst_;
  } else {
    b.tokens = std::min(burst_, b.tokens + rate_ * std::chrono::duration<double>(now - b.last).count());
  }
  b.last = now;
  if (buckets_.size() > 65536) buckets_.clear();  // bounded memory under address churn
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

Status JobServiceImpl::admit(const grpc::ServerContextBase& ctx) {
  if (auth_.has_tokens())
    if (Status s = rpc::check_role(ctx, auth_, rpc::Role::kAdmin); !s.ok()) return s;
  if (!limiter_.allow(peer_address(ctx.peer())))
    return {StatusCode::RESOURCE_EXHAUSTED,
            "rate limit: too many requests from this client; retry in a second"};
  return Status::OK;
}

Status JobServiceImpl::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                 v1::SubmitJobResponse* resp) {
  return answer(metrics_, "SubmitJob", admit(*ctx), [&] { return c_.submit(*req, resp); });
}

Unary* JobServiceImpl::GetJob(CallbackContext* ctx, const v1::GetJobRequest* req, v1::JobStatus* resp) {
  return serve(ctx, metrics_, "GetJob", admit(*ctx), [&] { return c_.get(req->id(), resp); });
}

Status JobServiceImpl::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                v1::ListJobsResponse* resp) {
  return answer(metrics_, "ListJobs", admit(*ctx), [&] { return c_.list(*req, resp); });
}

Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                 v1::CancelJobResponse* resp) {
  return answer(metrics_, "CancelJob", admit(*ctx), [&] { return c_.cancel(req->id(), resp->mutable_job()); });
}

Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                grpc::ServerWriter<v1::JobEvent>* writer) {
  if (Status s = admit(*ctx); !s.ok()) return s;
  int64_t after = req->after_revision();
  std::string last_state;
  for (;;) {
    v1::JobStatus st;
    if (Status s = c_.wait_job(req->id(), after, kStreamSlice, &st); !s.ok()) return s;
    if (ctx->IsCancelled()) return {StatusCode::CANCELLED, "watch cancelled"};
    const bool done = st.state() == v1::SUCCEEDED || st.state() == v1::FAILED || st.state() == v1::CANCELLED;
    if (st.revision() > after) {
      v1::JobEvent ev;
      ev.set_revision(st.revision());
      const std::string state = v1::JobState_Name(st.state());
      ev.set_message(state != last_state
                         ? state
                         : "step " + std::to_string(st.step()) + "/" + std::to_string(st.total_steps()));
      last_state = state;
      *ev.mutable_job() = std::move(st);
      if (!writer->Write(ev)) return {StatusCode::CANCELLED, "client went away"};
      after = ev.revision();
    }
    if (done) return Status::OK;
  }
}

Status JobServiceImpl::StreamLogs(grpc::ServerContext* ctx, const v1::StreamLogsRequest* req,
                                  grpc::ServerWriter<v1::LogChunk>* writer) {
  if (Status s = admit(*ctx); !s.ok()) return s;
  int64_t offset = req->offset();
  for (;;) {
    std::string data;
    bool finished = false;
    const auto wait = req->follow() ? kStreamSlice : std::chrono::milliseconds(0);
    if (Status s = c_.read_log(req->id(), offset, rpc::kMaxLogChunkBytes, wait, &data, &finished); !s.ok())
      return s;
    if (ctx->IsCancelled()) return {StatusCode::CANCELLED, "log stream cancelled"};
    if (!data.empty()) {
      v1::LogChunk chunk;
      chunk.set_offset(offset);
      offset += static_cast<int64_t>(data.size());
      chunk.set_data(std::move(data));
      if (!writer->Write(chunk)) return {StatusCode::CANCELLED, "client went away"};
      continue;
    }
    if (finished || !req->follow()) return Status::OK;
  }
}

Status JobServiceImpl::ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                                   v1::ListWorkersResponse* resp) {
  return answer(metrics_, "ListWorkers", admit(*ctx), [&] {
    c_.list_workers(resp);
    return Status::OK;
  });
}

Status JobServiceImpl::GetJobProfile(grpc::ServerContext* ctx, const v1::GetJobProfileRequest* req,
                                     v1::JobProfile* resp) {
  return answer(metrics_, "GetJobProfile", admit(*ctx), [&] { return c_.get_profile(req->id(), resp); });
}

Status WorkerServiceImpl::admit(const grpc::ServerContextBase& ctx) const {
  if (!auth_.has_tokens()) return Status::OK;
  return rpc::check_role(ctx, auth_, rpc::Role::kWorker);
}

Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* ctx, const v1::RegisterWorkerRequest* req,
                                         v1::RegisterWorkerResponse* resp) {
  return answer(metrics_, "RegisterWorker", admit(*ctx), [&] { return c_.register_worker(*req, resp); });
}

Unary* WorkerServiceImpl::Heartbeat(CallbackContext* ctx, const v1::HeartbeatRequest* req,
                                    v1::HeartbeatResponse* resp) {
  return serve(ctx, metrics_, "Heartbeat", admit(*ctx), [&] { return c_.heartbeat(*req, resp); });
}

Status WorkerServiceImpl::FetchAssignments(grpc::ServerContext* ctx, const v1::FetchAssignmentsRequest* req,
                                           v1::FetchAssignmentsResponse* resp) {
  if (Status s = admit(*ctx); !s.ok()) return s;
  return c_.fetch_assignments(*req, resp);
}

Unary* WorkerServiceImpl::ReportProgress(CallbackContext* ctx, const v1::ReportProgressRequest* req,
                                         v1::ReportProgressResponse*) {
  return serve(ctx, metrics_, "ReportProgress", admit(*ctx), [&] { return c_.report_progress(*req); });
}

Status WorkerServiceImpl::ReportEvent(grpc::ServerContext* ctx, const v1::ReportEventRequest* req,
                                      v1::ReportEventResponse*) {
  return answer(metrics_, "ReportEvent", admit(*ctx), [&] { return c_.report_event(*req); });
}

Status WorkerServiceImpl::UploadLogs(grpc::ServerContext* ctx, const v1::UploadLogsRequest* req,
                                     v1::UploadLogsResponse* resp) {
  return answer(metrics_, "UploadLogs", admit(*ctx), [&] { return c_.upload_logs(*req, resp); });
}

Status WorkerServiceImpl::UploadProfile(grpc::ServerContext* ctx, const v1::UploadProfileRequest* req,
                                        v1::UploadProfileResponse*) {
  return answer(metrics_, "UploadProfile", admit(*ctx), [&] { return c_.upload_profile(*req); });
}

}  // namespace zenflow::server
