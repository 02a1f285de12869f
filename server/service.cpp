#include "server/service.h"

#include <pthread.h>

#include <functional>

#include "common/rpc/rpc.h"

namespace zenflow::server {
namespace {

using grpc::Status;
using grpc::StatusCode;

// "ipv4:127.0.0.1:53422" -> "ipv4:127.0.0.1": one bucket per client address.
std::string peer_address(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos || colon < 5 ? peer : peer.substr(0, colon);
}

// Runs `work` when the call was admitted; the call's status is the admission's or the
// work's. The handler's time goes to `metrics`.
template <typename Work>
Status answer(const CoordinatorMetrics* metrics, std::string_view method, Status admitted, Work&& work) {
  const auto t0 = std::chrono::steady_clock::now();
  if (admitted.ok()) admitted = work();
  if (metrics) metrics->observe_rpc(method, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return admitted;
}

// One call of an asynchronous method: first an armed request; once a call arrives it arms
// the next request of its method and hands the request to `handle`, whose reply (at once, on
// this thread, or later from another: SubmitJob's comes from the store's committer) sends
// the answer; the call ends when the answer is sent. `request` is the service's RequestX.
template <typename Request, typename Response>
class UnaryCall final : public HotPathServer::Call {
 public:
  using RequestType = Request;
  using ResponseType = Response;
  using RequestFn = std::function<void(grpc::ServerContext*, Request*, grpc::ServerAsyncResponseWriter<Response>*,
                                       grpc::ServerCompletionQueue*, void*)>;
  using Reply = std::function<void(const Status&, const Response&)>;
  using HandleFn = std::function<void(const grpc::ServerContext&, const Request&, Reply)>;
  struct Method {
    RequestFn request;
    HandleFn handle;
  };

  // Arms one request of `m` (m outlives every call: HotPathServer keeps it).
  static void arm(HotPathServer& hot, const Method& m) { new UnaryCall(hot, m); }

  void proceed(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(hot_.guard());
      if (answered_ || !ok || !hot_.open()) {  // sent, a request the shutdown cancelled, or stopping
        delete this;
        return;
      }
      arm(hot_, m_);
    }
    m_.handle(ctx_, req_, [this](const Status& s, const Response& r) { reply(s, r); });
  }

 private:
  UnaryCall(HotPathServer& hot, const Method& m) : hot_(hot), m_(m), writer_(&ctx_) {
    m_.request(&ctx_, &req_, &writer_, hot_.queue(), this);
  }
  void reply(const Status& s, const Response& r) {
    std::lock_guard<std::mutex> lock(hot_.guard());
    if (!hot_.open()) {  // stopped: the queue is shut down and returns nothing for this call
      delete this;
      return;
    }
    resp_ = r;
    answered_ = true;
    if (s.ok()) {
      writer_.Finish(resp_, s, this);
    } else {
      writer_.FinishWithError(s, this);
    }
  }
  HotPathServer& hot_;
  const Method& m_;
  grpc::ServerContext ctx_;
  Request req_;
  Response resp_;
  grpc::ServerAsyncResponseWriter<Response> writer_;
  bool answered_ = false;
};

// A handler that answers at once, as the method's HandleFn.
template <typename Call, typename Handler>
typename Call::HandleFn answering_at_once(Handler handler) {
  return [handler](const grpc::ServerContext& c, const typename Call::RequestType& r, typename Call::Reply reply) {
    typename Call::ResponseType out;
    const Status s = handler(c, r, &out);
    reply(s, out);
  };
}

// One HeartbeatStream: armed like a UnaryCall, then read a beat, answer it, read the next,
// until the worker closes its side (a failed read: the stream is finished OK), a beat is
// refused (finished with that status) or the call dies. Whether the finish reached the
// worker tells a close from a break: a stream that broke after a beat (its finish failed:
// the connection is gone) is reported to the coordinator (WorkerServiceImpl::stream_broken).
// One operation is in flight at a time, so the call is deleted when its finish is back.
// (gRPC's AsyncNotifyWhenDone would say "cancelled" too, but its tag is one more outstanding
// per stream, and Debian's libgrpc checks every completion against a list of the queue's
// outstanding tags: with 5,000 streams that scan was 11% of the coordinator's CPU.)
class HeartbeatStreamCall final : public HotPathServer::Call {
 public:
  using Stream = grpc::ServerAsyncReaderWriter<v1::HeartbeatResponse, v1::HeartbeatRequest>;
  static void arm(HotPathServer& hot, WorkerServiceImpl& workers) { new HeartbeatStreamCall(hot, workers); }

  void proceed(bool ok) override {
    std::unique_lock<std::mutex> lock(hot_.guard());
    if (!hot_.open() || (state_ == kRequested && !ok)) {  // stopping (no new operation) or never started
      lock.unlock();
      delete this;
      return;
    }
    switch (state_) {
      case kRequested:
        arm(hot_, workers_);
        read();
        return;
      case kReading:
        if (!ok) return finish(Status::OK);  // the worker closed its side, or the call died
        {
          lock.unlock();  // the beat itself takes the coordinator's locks, not the queue's
          const bool check = beats_ == 0 || req_.name() != last_.name() || req_.incarnation() != last_.incarnation();
          const Status s = workers_.stream_beat(ctx_, check, req_, &resp_, id_);
          lock.lock();
          if (!hot_.open()) {
            lock.unlock();
            delete this;
            return;
          }
          ++beats_;
          if (!s.ok()) return finish(s);
          // The worker the stream beats for, as of its latest beat (an agent that registered
          // again may go on on the same stream with its new incarnation).
          if (req_.name() != last_.name()) last_.set_name(req_.name());
          last_.set_incarnation(req_.incarnation());
        }
        state_ = kWriting;
        stream_.Write(resp_, this);
        return;
      case kWriting:
        if (!ok) return finish(Status(StatusCode::CANCELLED, "the heartbeat stream broke"));
        read();
        return;
      case kFinishing:
        lock.unlock();
        if (!ok && beats_ > 0) workers_.stream_broken(last_, id_);  // the finish never reached the worker
        delete this;
        return;
    }
  }

 private:
  HeartbeatStreamCall(HotPathServer& hot, WorkerServiceImpl& workers)
      : hot_(hot), workers_(workers), stream_(&ctx_), id_(next_id_.fetch_add(1) + 1) {
    workers_.RequestHeartbeatStream(&ctx_, &stream_, hot_.queue(), hot_.queue(), this);
  }
  void read() {
    state_ = kReading;
    stream_.Read(&req_, this);
  }
  void finish(const Status& s) {
    state_ = kFinishing;
    stream_.Finish(s, this);
  }

  enum State { kRequested, kReading, kWriting, kFinishing };
  static inline std::atomic<int64_t> next_id_{0};
  HotPathServer& hot_;
  WorkerServiceImpl& workers_;
  grpc::ServerContext ctx_;
  Stream stream_;
  const int64_t id_;
  State state_ = kRequested;
  int64_t beats_ = 0;
  v1::HeartbeatRequest req_, last_;
  v1::HeartbeatResponse resp_;
};

using GetJobCall = UnaryCall<v1::GetJobRequest, v1::JobStatus>;
using SubmitJobCall = UnaryCall<v1::SubmitJobRequest, v1::SubmitJobResponse>;
using HeartbeatCall = UnaryCall<v1::HeartbeatRequest, v1::HeartbeatResponse>;
using ReportProgressCall = UnaryCall<v1::ReportProgressRequest, v1::ReportProgressResponse>;

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

StreamGate::Ticket StreamGate::enter(const std::string& client, std::string* why) {
  std::lock_guard<std::mutex> lock(mu_);
  int& mine = by_client_[client];
  if (open_ >= total_ || mine >= per_client_) {
    *why = open_ >= total_ ? std::to_string(open_) + " streams are open, the most this coordinator serves at once"
                           : std::to_string(mine) + " streams of this client are open, the most one client may hold";
    if (mine == 0) by_client_.erase(client);
    return {};
  }
  ++open_;
  ++mine;
  return Ticket(this, client);
}

void StreamGate::release(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  --open_;
  auto it = by_client_.find(client);
  if (it != by_client_.end() && --it->second <= 0) by_client_.erase(it);
}

int StreamGate::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

Status JobServiceImpl::admit(const grpc::ServerContextBase& ctx) {
  if (auth_.has_tokens())
    if (Status s = rpc::check_role(ctx, auth_, rpc::Role::kAdmin); !s.ok()) return s;
  if (!limiter_.allow(ctx.peer()))  // this connection's bucket
    return {StatusCode::RESOURCE_EXHAUSTED,
            "rate limit: too many requests on this connection; retry in a second"};
  return Status::OK;
}

void JobServiceImpl::submit_job(const grpc::ServerContext& ctx, const v1::SubmitJobRequest& req,
                                Coordinator::SubmitAnswer reply) {
  const auto t0 = std::chrono::steady_clock::now();
  Coordinator::SubmitAnswer timed = [this, t0, reply = std::move(reply)](const Status& s,
                                                                        const v1::SubmitJobResponse& r) {
    if (metrics_)
      metrics_->observe_rpc("SubmitJob", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    reply(s, r);
  };
  if (Status s = admit(ctx); !s.ok()) return timed(s, v1::SubmitJobResponse{});
  c_.submit_async(req, std::move(timed));
}

Status JobServiceImpl::get_job(const grpc::ServerContext& ctx, const v1::GetJobRequest& req, v1::JobStatus* resp) {
  return answer(metrics_, "GetJob", admit(ctx), [&] { return c_.get(req.id(), resp); });
}

Status JobServiceImpl::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                v1::ListJobsResponse* resp) {
  return answer(metrics_, "ListJobs", admit(*ctx), [&] { return c_.list(*req, resp); });
}

Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                 v1::CancelJobResponse* resp) {
  return answer(metrics_, "CancelJob", admit(*ctx), [&] { return c_.cancel(req->id(), resp->mutable_job()); });
}

Status JobServiceImpl::open_stream(const grpc::ServerContext& ctx, StreamGate::Ticket* ticket) {
  if (Status s = admit(ctx); !s.ok()) return s;
  std::string why;
  *ticket = streams_.enter(peer_address(ctx.peer()), &why);
  if (!*ticket)
    return {StatusCode::RESOURCE_EXHAUSTED, why + "; close some (zenflow watch / logs -f), or poll GetJob"};
  return Status::OK;
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

Status WorkerServiceImpl::admit(const grpc::ServerContextBase& ctx, const std::string& name,
                                int64_t incarnation) const {
  if (Status s = admit(ctx); !s.ok()) return s;
  const auto& metadata = ctx.client_metadata();
  const auto it = metadata.find(rpc::kSessionMetadata);
  const std::string_view session = it == metadata.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
  return c_.check_session(name, incarnation, session);
}

Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* ctx, const v1::RegisterWorkerRequest* req,
                                         v1::RegisterWorkerResponse* resp) {
  return answer(metrics_, "RegisterWorker", admit(*ctx), [&] { return c_.register_worker(*req, resp); });
}

Status WorkerServiceImpl::heartbeat(const grpc::ServerContext& ctx, const v1::HeartbeatRequest& req,
                                    v1::HeartbeatResponse* resp) {
  return answer(metrics_, "Heartbeat", admit(ctx, req.name(), req.incarnation()),
                [&] { return c_.heartbeat(req, resp); });
}

Status WorkerServiceImpl::stream_beat(const grpc::ServerContext& ctx, bool check,
                                      const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp,
                                      int64_t stream) {
  return answer(metrics_, "HeartbeatStream", check ? admit(ctx, req.name(), req.incarnation()) : Status::OK,
                [&] { return c_.heartbeat(req, resp, stream); });
}

void WorkerServiceImpl::stream_broken(const v1::HeartbeatRequest& last, int64_t stream) {
  c_.heartbeat_stream_broken(last.name(), last.incarnation(), stream);
}

Status WorkerServiceImpl::FetchAssignments(grpc::ServerContext* ctx, const v1::FetchAssignmentsRequest* req,
                                           v1::FetchAssignmentsResponse* resp) {
  if (Status s = admit(*ctx, req->name(), req->incarnation()); !s.ok()) return s;
  return c_.fetch_assignments(*req, resp);
}

Status WorkerServiceImpl::report_progress(const grpc::ServerContext& ctx, const v1::ReportProgressRequest& req) {
  return answer(metrics_, "ReportProgress", admit(ctx, req.name(), req.incarnation()),
                [&] { return c_.report_progress(req); });
}

Status WorkerServiceImpl::ReportEvent(grpc::ServerContext* ctx, const v1::ReportEventRequest* req,
                                      v1::ReportEventResponse*) {
  return answer(metrics_, "ReportEvent", admit(*ctx, req->name(), req->incarnation()),
                [&] { return c_.report_event(*req); });
}

Status WorkerServiceImpl::UploadLogs(grpc::ServerContext* ctx, const v1::UploadLogsRequest* req,
                                     v1::UploadLogsResponse* resp) {
  return answer(metrics_, "UploadLogs", admit(*ctx, req->name(), req->incarnation()),
                [&] { return c_.upload_logs(*req, resp); });
}

Status WorkerServiceImpl::UploadProfile(grpc::ServerContext* ctx, const v1::UploadProfileRequest* req,
                                        v1::UploadProfileResponse*) {
  return answer(metrics_, "UploadProfile", admit(*ctx, req->name(), req->incarnation()),
                [&] { return c_.upload_profile(*req); });
}

bool HealthService::known(const std::string& service) {
  return service.empty() || service == v1::JobService::service_full_name() ||
         service == v1::WorkerService::service_full_name();
}

void HealthService::set_serving(bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (serving_ == serving) return;
  serving_ = serving;
  ++version_;
  changed_.notify_all();
}

void HealthService::shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  changed_.notify_all();
}

Status HealthService::Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* req,
                            grpc::health::v1::HealthCheckResponse* resp) {
  if (!known(req->service())) return {StatusCode::NOT_FOUND, "unknown service '" + req->service() + "'"};
  std::lock_guard<std::mutex> lock(mu_);
  resp->set_status(serving_ ? grpc::health::v1::HealthCheckResponse::SERVING
                            : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  return Status::OK;
}

Status HealthService::Watch(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                            grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) {
  using grpc::health::v1::HealthCheckResponse;
  std::string why;
  const StreamGate::Ticket ticket = watches_.enter("", &why);
  if (!ticket)
    return {StatusCode::RESOURCE_EXHAUSTED,
            std::to_string(kMaxWatches) + " health watches are open, the most served at once; use Check"};
  int64_t sent = -1;
  for (;;) {
    HealthCheckResponse resp;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait_for(lock, std::chrono::seconds(1), [&] { return shutdown_ || version_ != sent; });
      if (version_ == sent) {  // a change is sent even when shutdown follows it at once
        if (shutdown_) return Status::OK;
        if (ctx->IsCancelled()) return {StatusCode::CANCELLED, "watch cancelled"};
        continue;
      }
      sent = version_;
      resp.set_status(!known(req->service()) ? HealthCheckResponse::SERVICE_UNKNOWN
                      : serving_             ? HealthCheckResponse::SERVING
                                             : HealthCheckResponse::NOT_SERVING);
    }
    if (!writer->Write(resp)) return {StatusCode::CANCELLED, "client went away"};
  }
}

HotPathServer::HotPathServer(grpc::ServerBuilder& builder, JobServiceImpl& jobs, WorkerServiceImpl& workers)
    : jobs_(jobs), workers_(workers), cq_(builder.AddCompletionQueue()) {}

HotPathServer::~HotPathServer() { stop(); }

void HotPathServer::start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
  }
  arm_all();
  thread_ = std::thread([this] { loop(); });
  pthread_setname_np(thread_.native_handle(), "zf-co-hotpath");
}

void HotPathServer::arm_all() {
  auto get = std::make_shared<GetJobCall::Method>(GetJobCall::Method{
      [this](grpc::ServerContext* c, v1::GetJobRequest* r, grpc::ServerAsyncResponseWriter<v1::JobStatus>* w,
             grpc::ServerCompletionQueue* q, void* tag) { jobs_.RequestGetJob(c, r, w, q, q, tag); },
      answering_at_once<GetJobCall>(
          [this](const grpc::ServerContext& c, const v1::GetJobRequest& r, v1::JobStatus* out) {
            return jobs_.get_job(c, r, out);
          })});
  auto submit = std::make_shared<SubmitJobCall::Method>(SubmitJobCall::Method{
      [this](grpc::ServerContext* c, v1::SubmitJobRequest* r,
             grpc::ServerAsyncResponseWriter<v1::SubmitJobResponse>* w, grpc::ServerCompletionQueue* q,
             void* tag) { jobs_.RequestSubmitJob(c, r, w, q, q, tag); },
      [this](const grpc::ServerContext& c, const v1::SubmitJobRequest& r, SubmitJobCall::Reply reply) {
        jobs_.submit_job(c, r, std::move(reply));
      }});
  auto heartbeat = std::make_shared<HeartbeatCall::Method>(HeartbeatCall::Method{
      [this](grpc::ServerContext* c, v1::HeartbeatRequest* r, grpc::ServerAsyncResponseWriter<v1::HeartbeatResponse>* w,
             grpc::ServerCompletionQueue* q, void* tag) { workers_.RequestHeartbeat(c, r, w, q, q, tag); },
      answering_at_once<HeartbeatCall>(
          [this](const grpc::ServerContext& c, const v1::HeartbeatRequest& r, v1::HeartbeatResponse* out) {
            return workers_.heartbeat(c, r, out);
          })});
  auto progress = std::make_shared<ReportProgressCall::Method>(ReportProgressCall::Method{
      [this](grpc::ServerContext* c, v1::ReportProgressRequest* r,
             grpc::ServerAsyncResponseWriter<v1::ReportProgressResponse>* w, grpc::ServerCompletionQueue* q,
             void* tag) { workers_.RequestReportProgress(c, r, w, q, q, tag); },
      answering_at_once<ReportProgressCall>(
          [this](const grpc::ServerContext& c, const v1::ReportProgressRequest& r, v1::ReportProgressResponse*) {
            return workers_.report_progress(c, r);
          })});
  methods_ = {get, submit, heartbeat, progress};
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < kOutstanding; ++i) {
    GetJobCall::arm(*this, *get);
    SubmitJobCall::arm(*this, *submit);
    HeartbeatCall::arm(*this, *heartbeat);
    HeartbeatStreamCall::arm(*this, workers_);
    ReportProgressCall::arm(*this, *progress);
  }
}

void HotPathServer::loop() {
  void* tag = nullptr;
  bool ok = false;
  while (cq_->Next(&tag, &ok)) static_cast<Call*>(tag)->proceed(ok);
}

void HotPathServer::stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
    cq_->Shutdown();  // under mu_: no call is between its open() check and its Finish
  }
  if (thread_.joinable()) {
    thread_.join();
  } else {  // never started: drain the armed requests here
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) static_cast<Call*>(tag)->proceed(ok);
  }
}

}  // namespace zenflow::server
