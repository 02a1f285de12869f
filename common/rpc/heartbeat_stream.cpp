#include "common/rpc/heartbeat_stream.h"

namespace zenflow::rpc {
namespace {
using Clock = std::chrono::steady_clock;
// The stream's operations run one at a time, so a tag only names what was waited for.
int kOp = 0;
void* op_tag() { return &kOp; }

std::chrono::system_clock::time_point wall(Clock::time_point t) {
  return std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                std::max(Clock::duration::zero(), t - Clock::now()));
}
}  // namespace

HeartbeatStream::HeartbeatStream(v1::WorkerService::Stub& stub, std::string token)
    : stub_(stub), token_(std::move(token)) {}

HeartbeatStream::~HeartbeatStream() {
  close();
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
  }
}

HeartbeatStream::Wait HeartbeatStream::wait(void* tag, Clock::time_point deadline) {
  void* got = nullptr;
  bool ok = false;
  switch (cq_.AsyncNext(&got, &ok, wall(deadline))) {
    case grpc::CompletionQueue::GOT_EVENT:
      return got == tag && ok ? kDone : kFailed;
    case grpc::CompletionQueue::TIMEOUT:
      ctx_->TryCancel();  // the operation then completes at once, failed
      cq_.Next(&got, &ok);
      return kTimedOut;
    case grpc::CompletionQueue::SHUTDOWN:
      break;
  }
  return kFailed;
}

grpc::Status HeartbeatStream::end(Wait why, Clock::time_point deadline) {
  grpc::Status status;
  stream_->Finish(&status, op_tag());
  Wait finished = wait(op_tag(), std::max(deadline, Clock::now() + std::chrono::milliseconds(100)));
  stream_.reset();
  ctx_.reset();
  if (why == kTimedOut || finished == kTimedOut)
    return {grpc::StatusCode::DEADLINE_EXCEEDED, "no answer to the heartbeat in time"};
  if (status.ok()) return {grpc::StatusCode::UNAVAILABLE, "the coordinator closed the heartbeat stream"};
  return status;
}

grpc::Status HeartbeatStream::beat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp,
                                   std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  if (!stream_) {
    ctx_ = std::make_unique<grpc::ClientContext>();
    // No deadline: the stream lasts as long as the worker; each beat has its own wait.
    if (!token_.empty()) ctx_->AddMetadata("authorization", "Bearer " + token_);
    if (!session_.empty()) ctx_->AddMetadata(kSessionMetadata, session_);
    stream_ = stub_.PrepareAsyncHeartbeatStream(ctx_.get(), &cq_);
    stream_->StartCall(op_tag());
    if (Wait w = wait(op_tag(), deadline); w != kDone) return end(w, deadline);
  }
  stream_->Write(req, op_tag());
  if (Wait w = wait(op_tag(), deadline); w != kDone) return end(w, deadline);
  stream_->Read(resp, op_tag());
  if (Wait w = wait(op_tag(), deadline); w != kDone) return end(w, deadline);
  return grpc::Status::OK;
}

void HeartbeatStream::set_session(const std::string& session) {
  if (session == session_) return;
  close();
  session_ = session;
}

void HeartbeatStream::close(std::chrono::milliseconds timeout) {
  if (!stream_) return;
  const Clock::time_point deadline = Clock::now() + timeout;
  stream_->WritesDone(op_tag());
  const Wait w = wait(op_tag(), deadline);
  end(w == kTimedOut ? kTimedOut : kDone, deadline);
}

}  // namespace zenflow::rpc
