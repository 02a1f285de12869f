// The worker side of WorkerService.HeartbeatStream: liveness beats on one long-lived
// stream, for the agent's and the optimizer node's pulse threads. Each beat waits for its
// answer until a deadline; a beat that fails (the coordinator away, the stream broken or
// refused) ends the stream, and the next beat opens a new one. One thread at a time.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/rpc/rpc.h"
#include "zenflow/v1/workers.grpc.pb.h"

namespace zenflow::rpc {

class HeartbeatStream {
 public:
  HeartbeatStream(v1::WorkerService::Stub& stub, std::string token);
  ~HeartbeatStream();  // closes the stream as the worker does (close())
  HeartbeatStream(const HeartbeatStream&) = delete;
  HeartbeatStream& operator=(const HeartbeatStream&) = delete;

  // Sends `req` (no attempts) and waits for the answer for at most `timeout`, opening the
  // stream first when none is open. A failure is the stream's final status (FAILED_PRECONDITION:
  // the incarnation is no longer leased), or DEADLINE_EXCEEDED when no answer came in time;
  // the stream is then gone, and the next beat opens a new one.
  grpc::Status beat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp,
                    std::chrono::milliseconds timeout);
  // The worker session the next stream opens with (RegisterWorkerResponse.session): a new
  // one (the worker registered again) closes the open stream, whose metadata holds the old.
  void set_session(const std::string& session);
  // Closes the stream the way a worker that stops on purpose does (its side first), so that
  // the coordinator does not take it for a dead worker. Waits at most `timeout`.
  void close(std::chrono::milliseconds timeout = std::chrono::milliseconds(500));
  bool open() const { return stream_ != nullptr; }

 private:
  enum Wait { kDone, kFailed, kTimedOut };
  Wait wait(void* tag, std::chrono::steady_clock::time_point deadline);
  grpc::Status end(Wait why, std::chrono::steady_clock::time_point deadline);  // Finish; forget the stream

  v1::WorkerService::Stub& stub_;
  std::string token_;
  std::string session_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>> stream_;
};

}  // namespace zenflow::rpc
