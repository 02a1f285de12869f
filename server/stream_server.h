// Serves the WatchJob and StreamLogs streams asynchronously, from one thread and one
// completion queue of their own (not HotPathServer's: a log chunk read from the store must
// not delay a heartbeat). A stream holds no thread while it waits: it holds its call's
// memory and its place under the stream caps (StreamLimits), nothing else. Before, each
// stream held a thread of the synchronous pool for its whole life, so that 760 open streams
// starved every synchronous call ("Server Threadpool Exhausted") and SIGTERM hung.
//
// How a waiting stream learns that it has something to send: the coordinator calls
// wake() on every change a waiter would care about (Coordinator::set_change_listener);
// wake() sets an alarm on this queue, and the thread then looks at every waiting stream
// (Coordinator::probe_stream: one lock, no copy) and writes to those with news. Changes
// closer together than kMinScanInterval share one look; a look every kIdleScan catches
// anything else (and is what a stream waits at most, were a wake ever missed).
//
// Lifecycle, in main's order:
//   StreamServer streams(builder, jobs);   // before BuildAndStart: adds the queue
//   server = builder.BuildAndStart(); streams.start();
//   ... streams.drain();                  // ends every stream (UNAVAILABLE) before...
//   server->Shutdown(deadline); streams.stop();  // (the destructor stops too)
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "server/service.h"

namespace zenflow::server {

class StreamServer {
 public:
  static constexpr int kOutstanding = 8;  // requests of each method armed at once
  static constexpr std::chrono::milliseconds kMinScanInterval{20};
  static constexpr std::chrono::milliseconds kIdleScan{1000};

  StreamServer(grpc::ServerBuilder& builder, JobServiceImpl& jobs);
  ~StreamServer();
  StreamServer(const StreamServer&) = delete;
  StreamServer& operator=(const StreamServer&) = delete;
  void start();
  // Ends every open stream with UNAVAILABLE ("the coordinator is shutting down") and refuses
  // new ones, so that the server's Shutdown need not wait for them. Returns at once.
  void drain();
  // Call after the server's Shutdown(): drains the queue, joins, frees every call.
  void stop();
  // Streams open now (started and not yet ended).
  int open_streams() const { return open_.load(); }

  // One stream (stream_server.cpp). Its events come back tagged with one of its Tags.
  class Call;
  struct Tag {
    Call* call;  // null: the server's own alarms
    int kind;
  };

 private:
  friend class Call;
  void wake();   // any thread: something changed
  void scan();   // the thread: look at every waiting stream
  void loop();
  void arm(Call* call);  // under mu_: `call` (just armed) is alive
  void on_alarm(int kind, bool ok);
  JobServiceImpl& jobs_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  // Guards starting any operation on the queue against its shutdown: the thread handles
  // every event under it; stop() shuts the queue down under it.
  std::mutex mu_;
  bool serving_ = false;  // under mu_: new operations may start
  bool draining_ = false;  // under mu_: end streams, accept none
  std::set<Call*> calls_;    // under mu_: every call alive (armed or started)
  std::set<Call*> waiting_;  // under mu_: started, nothing to send at the last look
  std::atomic<int> open_{0};
  // wake(): from the coordinator's threads, under its lock, so it takes only wake_mu_.
  std::mutex wake_mu_;
  bool wake_open_ = false;  // under wake_mu_
  std::atomic<bool> wake_pending_{false};
  std::atomic<int64_t> last_scan_ns_{0};
  grpc::Alarm wake_alarm_;
  Tag wake_tag_{nullptr, 0};
  grpc::Alarm tick_alarm_;
  Tag tick_tag_{nullptr, 1};
  int64_t scanned_seq_ = -1;  // the coordinator's change_seq() at the last look
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace zenflow::server
