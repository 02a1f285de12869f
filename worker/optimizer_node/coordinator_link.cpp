// Optimizer-node registration and heartbeats (see coordinator_link.h).
#include "worker/optimizer_node/coordinator_link.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>

#include "common/rpc/heartbeat_stream.h"
#include "common/rpc/rpc.h"
#include "common/version.h"
#include "zenflow/v1/workers.grpc.pb.h"

namespace zenflow::optimizer_node {

CoordinatorLink::CoordinatorLink(CoordinatorLinkOptions options) : o_(std::move(options)) {
  thread_ = std::thread([this] { run(); });
}

CoordinatorLink::~CoordinatorLink() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void CoordinatorLink::run() {
  using std::chrono::milliseconds;
  rpc::ChannelOptions co;
  co.ca_file = o_.ca_file;
  co.keepalive = true;
  auto stub = v1::WorkerService::NewStub(rpc::make_channel(o_.coordinator, co));
  rpc::HeartbeatStream beats(*stub, o_.token);  // a dead node's stream breaks: LOST after one interval
  std::string last_error;
  auto log_once = [&](const std::string& msg) {
    if (msg == last_error) return;
    last_error = msg;
    std::fprintf(stderr, "zenflow-optimizer: %s\n", msg.c_str());
  };
  int64_t interval_ms = 1000;
  std::map<std::string, std::string> granted;  // the last grants handed to on_grants
  auto sleep_for = [&](int64_t ms) {
    for (int64_t slept = 0; slept < ms && !stop_; slept += 20) std::this_thread::sleep_for(milliseconds(20));
  };
  while (!stop_) {
    if (incarnation_ == 0) {
      v1::RegisterWorkerRequest req;
      req.set_name(o_.name);
      req.set_role(v1::OPTIMIZER);
      req.mutable_resources()->set_host_memory_bytes(o_.memory_bytes);
      req.mutable_resources()->set_physical_cores(o_.cores);
      req.set_address(o_.address);
      req.set_version(kVersion);
      v1::RegisterWorkerResponse resp;
      grpc::ClientContext ctx;
      rpc::prepare_call(ctx, o_.token, milliseconds(5000));
      const grpc::Status s = stub->RegisterWorker(&ctx, req, &resp);
      if (!s.ok()) {
        log_once("register with " + o_.coordinator + ": " + rpc::describe(s) + " (retrying)");
        sleep_for(1000);
        continue;
      }
      beats.set_session(resp.session());  // every beat of this incarnation carries it
      incarnation_ = resp.incarnation();
      interval_ms = std::max<int64_t>(50, resp.heartbeat_interval_ms());
      last_error.clear();
      std::fprintf(stderr, "zenflow-optimizer: registered with %s as %s (role optimizer, incarnation %lld)\n",
                   o_.coordinator.c_str(), o_.name.c_str(), static_cast<long long>(resp.incarnation()));
    }
    sleep_for(interval_ms);
    if (stop_) break;
    v1::HeartbeatRequest req;
    req.set_name(o_.name);
    req.set_incarnation(incarnation_);
    v1::HeartbeatResponse resp;
    const grpc::Status s = beats.beat(req, &resp, milliseconds(std::max<int64_t>(2000, 2 * interval_ms)));
    if (s.ok() && o_.on_grants) {
      std::map<std::string, std::string> grants;
      for (const v1::NodeGrant& g : resp.node_grants()) grants[g.key()] = g.secret();
      if (grants != granted) {
        granted = grants;
        o_.on_grants(std::move(grants));
      }
    }
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      const std::string why = "the coordinator no longer leases incarnation " + std::to_string(incarnation_.load()) +
                              " of optimizer node " + o_.name + " (declared LOST)";
      log_once(why + ": dropping every session, registering again");
      if (o_.on_fenced) o_.on_fenced(why);
      if (o_.on_grants && !granted.empty()) o_.on_grants({});  // the jobs moved on: their secrets open nothing
      granted.clear();
      incarnation_ = 0;
    } else if (!s.ok()) {
      log_once("heartbeat to " + o_.coordinator + ": " + rpc::describe(s));
    } else {
      if (resp.heartbeat_interval_ms() > 0) interval_ms = std::max<int64_t>(50, resp.heartbeat_interval_ms());
      last_error.clear();
    }
  }
}

}  // namespace zenflow::optimizer_node
