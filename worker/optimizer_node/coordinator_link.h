// An optimizer node's registration with a zenflow coordinator: RegisterWorker with role
// OPTIMIZER (its UCX address, cores and the memory it offers), then heartbeats at the
// interval the coordinator asks for, so `zenflow workers` lists it and its lease shows
// whether it is alive. A coordinator that no longer knows this incarnation (it declared the
// node LOST) makes it drop its sessions (on_fenced: the jobs moved on to a spare, so a
// node back from a pause serves no stale state) and register again. Runs on a thread of its own; errors are
// logged on stderr once per distinct message, never fatal.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

namespace zenflow::optimizer_node {

struct CoordinatorLinkOptions {
  std::string coordinator;  // HOST:PORT
  std::string token;        // the worker join token
  std::string ca_file;      // TLS: the coordinator's CA (empty: plaintext)
  std::string name;         // unique in the cluster
  std::string address;      // HOST:PORT workers reach this node's UCX listener at
  int64_t cores = 0;
  int64_t memory_bytes = 0;
  // Called on the link's thread when the coordinator no longer leases this incarnation
  // (it declared the node LOST): the node drops every session before registering again.
  std::function<void(const std::string& why)> on_fenced;
  // Called on the link's thread with the job attempts' secrets the coordinator placed on this
  // node ("JOB_ID/ATTEMPT" -> secret), the whole set, whenever it changes; an empty set
  // when the node is fenced.
  std::function<void(std::map<std::string, std::string> grants)> on_grants;
};

class CoordinatorLink {
 public:
  explicit CoordinatorLink(CoordinatorLinkOptions options);
  ~CoordinatorLink();  // stops heartbeating (the coordinator lets the lease lapse)
  bool registered() const { return incarnation_.load() != 0; }
  int64_t incarnation() const { return incarnation_.load(); }

 private:
  void run();
  CoordinatorLinkOptions o_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> incarnation_{0};
  std::thread thread_;
};

}  // namespace zenflow::optimizer_node
