// The remote host-optimizer backend: the engine's host state and host jobs on
// zenflow-optimizer nodes over UCX (docs/design.md §10).
//
// This rank's host state is split over its nodes in contiguous slices, cut at the
// layout's segment offsets (a matrix never straddles two nodes) and balanced by
// elements. A job becomes one op per node holding some of its spans; its gradients
// stream out in chunks from the engine's staging buffers, and the node's low-precision
// output streams back into the job's half_out buffers before the job counts as done.
// Transfers (read/write/columns) go to the node holding the range, in the same op order.
//
// Threads: submit/transfers/drain from the training thread (HostOptimizer's contract).
// A sender thread runs each job's `before` hook and posts its messages, at most
// Welcome::credits ops per node outstanding (back-pressure: a slow node slows the
// sender, memory does not grow). A watchdog pings every node each second.
//
// Failure: a node whose channel fails, that sends ERROR, or from which nothing arrives
// (no pong, no reply, no data) for `lost_after_s` is lost (silence is counted only while
// this process could hear: not while it was paused or its transport thread did not run):
// every pending and later job and transfer fails with an engine::HostBackendLost naming
// it ("optimizer node 127.0.0.1:4000 lost: ..."), with what was last heard from it.
// Nothing is retried here: `zenflow run` resumes from the last committed checkpoint
// (optimizer.host.on_node_loss).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/host_optimizer.h"

namespace zenflow::transport {

struct RemoteHostOptions {
  std::vector<std::string> addresses;  // HOST:PORT, one node per slice
  std::string token;                   // the handshake's secret: the nodes' --token-file, or
  std::string key;                     // a coordinator's grant of this attempt ("JOB_ID/ATTEMPT")
  std::string job = "zenflow";
  uint64_t epoch = 1;                  // the job's attempt; nodes refuse older ones
  // Cores for this backend's threads (transport, sender, watchdog): the host optimizer's
  // reserved cores, so that the copies of the gradient stream stay off the training
  // thread's. Empty: the creating thread's.
  std::vector<int> cores;
  uint64_t chunk_bytes = 8u << 20;
  double connect_timeout_s = 10;
  double ping_interval_s = 1;
  double lost_after_s = 5;
};

// Connects to every node and opens this rank's sessions; throws engine::HostBackendLost
// naming a node that cannot be reached, std::runtime_error naming one that refused the
// session (authentication failed: a wrong token; stale epoch, not enough memory) and why.
std::unique_ptr<engine::HostOptimizer> make_remote_host_optimizer(const RemoteHostOptions& options,
                                                                  const engine::HostStateLayout& layout);

// Slice boundaries: `nodes` + 1 ascending offsets from 0 to layout.elements, each one of
// the layout's segment offsets (or the end), splitting the elements as evenly as the
// segments allow. A node may get an empty slice when there are fewer segments than nodes.
std::vector<int64_t> slice_bounds(const engine::HostStateLayout& layout, size_t nodes);

// "HOST:PORT" -> (host, port); throws std::invalid_argument naming the text.
std::pair<std::string, int> parse_address(const std::string& address);

}  // namespace zenflow::transport
