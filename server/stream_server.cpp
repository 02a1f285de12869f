#include "server/stream_server.h"

#include <pthread.h>

#include <string>
#include <vector>

#include "common/rpc/rpc.h"

namespace zenflow::server {
namespace {

using grpc::Status;
using grpc::StatusCode;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const Status kShuttingDown(StatusCode::UNAVAILABLE, "the coordinator is shutting down; reconnect to its successor");

}  // namespace

// One stream: armed (a request waiting for a caller), then started, then, until it ends,
// either writing (one Write in flight), waiting (nothing to send at the last look: the
// server's `waiting_`) or finishing. Its events come back under the server's lock, on the
// server's thread (or, for drain(), on the caller's). Two events may be outstanding: the
// operation in flight (op_tag_) and, once started, the call's end (done_tag_, from
// AsyncNotifyWhenDone: a client that goes away while its stream waits is noticed at once,
// not at the next write). The call is deleted when neither is.
class StreamServer::Call {
 public:
  virtual ~Call() {
    if (started_) s_.open_.fetch_sub(1);
  }

  void on_event(int kind, bool ok) {
    if (kind == kDone) {
      done_ = true;
      if (state_ == kWaiting) {
        s_.waiting_.erase(this);
        if (s_.serving_) return end(Status(StatusCode::CANCELLED, "the client went away"));
        state_ = kEnded;
      }
      return maybe_delete();
    }
    op_pending_ = false;
    if (!s_.serving_) {  // stopping: start nothing
      state_ = kEnded;
      return maybe_delete();
    }
    switch (state_) {
      case kRequested:
        if (!ok) return maybe_delete();  // never started (the server shut down)
        started_ = true;
        s_.open_.fetch_add(1);
        s_.arm(make_next());
        if (s_.draining_) return end(kShuttingDown);
        if (Status st = s_.jobs_.open_stream(ctx_, &ticket_); !st.ok()) return end(st);
        return step();
      case kWriting:
        if (!ok) return end(Status(StatusCode::CANCELLED, "the client went away"));
        return step();
      case kFinishing:
        state_ = kEnded;
        ticket_ = StreamGate::Ticket();
        return maybe_delete();
      case kWaiting:
      case kEnded:
        return maybe_delete();
    }
  }

  // Called by the server for a waiting call it took off `waiting_`.
  void look() {
    if (s_.draining_) return end(kShuttingDown);
    step();
  }

 protected:
  enum Kind { kOp = 0, kDone = 1 };
  enum class Next { kWriting, kWait, kFinish };
  explicit Call(StreamServer& s) : s_(s), op_tag_{this, kOp}, done_tag_{this, kDone} {}
  // Arms the request; the subclass's constructor calls it.
  void begin() {
    ctx_.AsyncNotifyWhenDone(&done_tag_);
    request();
  }
  virtual void request() = 0;       // the service's RequestX(..., &op_tag_)
  virtual Call* make_next() = 0;    // a new armed call of the same method
  // Looks for something to send: started a Write (tagged op_tag_), nothing yet, or the
  // stream's end (*end).
  virtual Next next(Status* end) = 0;
  virtual void finish(const Status& s) = 0;  // the writer's Finish(s, &op_tag_)
  Coordinator& coordinator() { return s_.jobs_.coordinator(); }
  grpc::ServerCompletionQueue* queue() { return s_.cq_.get(); }

  StreamServer& s_;
  grpc::ServerContext ctx_;
  Tag op_tag_;
  Tag done_tag_;

 private:
  enum State { kRequested, kWriting, kWaiting, kFinishing, kEnded };
  void step() {
    if (s_.draining_) return end(kShuttingDown);
    Status st;
    switch (next(&st)) {
      case Next::kWriting:
        state_ = kWriting;
        op_pending_ = true;
        return;
      case Next::kWait:
        state_ = kWaiting;
        s_.waiting_.insert(this);
        return;
      case Next::kFinish:
        return end(st);
    }
  }
  void end(const Status& s) {
    state_ = kFinishing;
    op_pending_ = true;
    finish(s);
  }
  void maybe_delete() {
    if (op_pending_ || (started_ && !done_)) return;
    s_.calls_.erase(this);
    delete this;
  }
  State state_ = kRequested;
  bool started_ = false;
  bool done_ = false;
  bool op_pending_ = true;  // the request, armed
  StreamGate::Ticket ticket_;
};

namespace {

// WatchJob: the job's status whenever its revision passes the last one sent (the state's
// name when it changed, else "step N/M"), until the job is terminal.
class WatchCall final : public StreamServer::Call {
 public:
  explicit WatchCall(StreamServer& s, JobServiceImpl& jobs) : Call(s), jobs_(jobs), writer_(&ctx_) { begin(); }

 private:
  void request() override {
    jobs_.RequestWatchJob(&ctx_, &req_, &writer_, queue(), queue(), &op_tag_);
  }
  Call* make_next() override { return new WatchCall(s_, jobs_); }
  Next next(Status* end) override {
    Coordinator::StreamProbe probe;
    if (*end = coordinator().probe_stream(req_.id(), &probe); !end->ok()) return Next::kFinish;
    const int64_t after = after_ < 0 ? req_.after_revision() : after_;
    if (probe.revision > after) {
      v1::JobStatus st;
      if (*end = coordinator().wait_job(req_.id(), after, std::chrono::milliseconds(0), &st); !end->ok())
        return Next::kFinish;
      ev_.Clear();
      ev_.set_revision(st.revision());
      const std::string state = v1::JobState_Name(st.state());
      ev_.set_message(state != last_state_
                          ? state
                          : "step " + std::to_string(st.step()) + "/" + std::to_string(st.total_steps()));
      last_state_ = state;
      *ev_.mutable_job() = std::move(st);
      after_ = ev_.revision();
      writer_.Write(ev_, &op_tag_);
      return Next::kWriting;
    }
    if (probe.terminal) {
      *end = Status::OK;
      return Next::kFinish;
    }
    return Next::kWait;
  }
  void finish(const Status& s) override { writer_.Finish(s, &op_tag_); }

  JobServiceImpl& jobs_;
  v1::WatchJobRequest req_;
  grpc::ServerAsyncWriter<v1::JobEvent> writer_;
  v1::JobEvent ev_;
  int64_t after_ = -1;  // the revision last sent (-1: none yet, the request's after_revision)
  std::string last_state_;
};

// StreamLogs: the job's log from the request's offset, in chunks of at most
// rpc::kMaxLogChunkBytes; with `follow`, until the job is terminal and its log complete.
class LogsCall final : public StreamServer::Call {
 public:
  explicit LogsCall(StreamServer& s, JobServiceImpl& jobs) : Call(s), jobs_(jobs), writer_(&ctx_) { begin(); }

 private:
  void request() override {
    jobs_.RequestStreamLogs(&ctx_, &req_, &writer_, queue(), queue(), &op_tag_);
  }
  Call* make_next() override { return new LogsCall(s_, jobs_); }
  Next next(Status* end) override {
    if (!positioned_) {
      offset_ = req_.offset();
      positioned_ = true;
    }
    Coordinator::StreamProbe probe;
    if (*end = coordinator().probe_stream(req_.id(), &probe); !end->ok()) return Next::kFinish;
    if (offset_ < probe.log_bytes) {
      std::string data;
      bool finished = false;
      if (*end = coordinator().read_log(req_.id(), offset_, rpc::kMaxLogChunkBytes, std::chrono::milliseconds(0),
                                        &data, &finished);
          !end->ok())
        return Next::kFinish;
      if (!data.empty()) {
        chunk_.Clear();
        chunk_.set_offset(offset_);
        offset_ += static_cast<int64_t>(data.size());
        chunk_.set_data(std::move(data));
        writer_.Write(chunk_, &op_tag_);
        return Next::kWriting;
      }
    }
    if (probe.log_done || !req_.follow()) {
      *end = Status::OK;
      return Next::kFinish;
    }
    return Next::kWait;
  }
  void finish(const Status& s) override { writer_.Finish(s, &op_tag_); }

  JobServiceImpl& jobs_;
  v1::StreamLogsRequest req_;
  grpc::ServerAsyncWriter<v1::LogChunk> writer_;
  v1::LogChunk chunk_;
  bool positioned_ = false;
  int64_t offset_ = 0;
};

}  // namespace

StreamServer::StreamServer(grpc::ServerBuilder& builder, JobServiceImpl& jobs)
    : jobs_(jobs), cq_(builder.AddCompletionQueue()) {}

StreamServer::~StreamServer() { stop(); }

void StreamServer::arm(Call* call) { calls_.insert(call); }

void StreamServer::start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    serving_ = true;
    for (int i = 0; i < kOutstanding; ++i) {
      arm(new WatchCall(*this, jobs_));
      arm(new LogsCall(*this, jobs_));
    }
    tick_alarm_.Set(cq_.get(), std::chrono::system_clock::now() + kIdleScan, &tick_tag_);
  }
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_open_ = true;
  }
  jobs_.coordinator().set_change_listener([this] { wake(); });
  thread_ = std::thread([this] { loop(); });
  pthread_setname_np(thread_.native_handle(), "zf-co-streams");
}

void StreamServer::wake() {
  if (wake_pending_.exchange(true)) return;  // a look is already due
  std::lock_guard<std::mutex> lock(wake_mu_);
  if (!wake_open_) return;
  // At most one look per kMinScanInterval: a burst of changes shares one.
  const int64_t due_ns = last_scan_ns_.load() + std::chrono::nanoseconds(kMinScanInterval).count() - now_ns();
  wake_alarm_.Set(cq_.get(), std::chrono::system_clock::now() + std::chrono::nanoseconds(std::max<int64_t>(0, due_ns)),
                  &wake_tag_);
}

void StreamServer::on_alarm(int kind, bool ok) {
  if (kind == wake_tag_.kind) {
    wake_pending_.store(false);  // a change from now on sets the alarm again
    if (!ok || !serving_) return;
    scan();
    return;
  }
  if (!serving_) return;
  if (ok && jobs_.coordinator().change_seq() != scanned_seq_) scan();  // a wake missed (none should be)
  tick_alarm_.Set(cq_.get(), std::chrono::system_clock::now() + kIdleScan, &tick_tag_);
}

void StreamServer::scan() {
  last_scan_ns_.store(now_ns());
  scanned_seq_ = jobs_.coordinator().change_seq();  // read first: a change during the look is looked at again
  const std::vector<Call*> waiting(waiting_.begin(), waiting_.end());
  waiting_.clear();
  for (Call* c : waiting) c->look();
}

void StreamServer::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!serving_ || draining_) return;
  draining_ = true;
  const std::vector<Call*> waiting(waiting_.begin(), waiting_.end());
  waiting_.clear();
  for (Call* c : waiting) c->look();  // each ends (UNAVAILABLE); writing ones end after their write
}

void StreamServer::loop() {
  void* raw = nullptr;
  bool ok = false;
  while (cq_->Next(&raw, &ok)) {
    const Tag* tag = static_cast<const Tag*>(raw);
    std::lock_guard<std::mutex> lock(mu_);
    if (tag->call == nullptr) {
      on_alarm(tag->kind, ok);
    } else {
      tag->call->on_event(tag->kind, ok);
    }
  }
}

void StreamServer::stop() {
  if (stopped_) return;
  stopped_ = true;
  jobs_.coordinator().set_change_listener(nullptr);
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_open_ = false;  // no wake() sets the alarm from now on
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    serving_ = false;  // no event handler starts an operation or sets the tick from now on
  }
  wake_alarm_.Cancel();
  tick_alarm_.Cancel();
  {
    std::lock_guard<std::mutex> lock(mu_);
    cq_->Shutdown();
  }
  if (thread_.joinable()) {
    thread_.join();
  } else {  // never started: drain here
    loop();
  }
  // The queue is empty: no event will come for any call left (armed requests the server's
  // shutdown dropped, calls whose end came before their last operation's).
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<Call*> left(calls_.begin(), calls_.end());
  calls_.clear();
  for (Call* c : left) delete c;
}

}  // namespace zenflow::server
