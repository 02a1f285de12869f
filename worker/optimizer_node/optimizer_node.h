// zenflow-optimizer: a dedicated CPU optimizer node (docs/design.md §10, docs/operations.md §7).
//
// It listens for connections from workers' remote host optimizers: its port speaks the
// transport's handshake (transport.h), in which both sides prove they know the node's
// token, or the secret of a job attempt a coordinator placed on it, before any byte
// reaches UCX, and UCX's own sockets use only the interface of
// NodeOptions::host. Each authenticated connection that says HELLO becomes a session
// holding one slice of one rank's
// host state (master, m, v, two accumulators) and running its jobs with the engine's own
// in-process host optimizer (same kernels, chunking and order as on the worker) on this
// node's pinned threads. Sessions are fenced by job epoch: a HELLO for a job with an older
// epoch than this node has seen is refused, and a newer one ends the older sessions.
// A session whose state does not fit --memory-limit is refused naming both sizes.
//
// Threads: one transport progress thread and its handshake thread; per session an op
// thread and two completion threads. start()/stop()/stats() from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zenflow::optimizer_node {

struct NodeOptions {
  std::string host = "127.0.0.1";
  int port = 0;               // 0: a free port
  int threads = 1;            // compute threads per session
  std::vector<int> cores;     // pin them here; empty = unpinned
  int64_t memory_limit = 0;   // bytes of session state; 0 = unlimited
  std::string token;          // the handshake's secret for key "" (workers given this node's address)
  // With no token: whether key "" is still served (an empty secret: workers without a token,
  // on loopback). A node registered with a coordinator and no --token-file serves only the
  // attempts the coordinator granted it.
  bool tokenless_sessions = true;
  // The secret of a coordinator's grant ("JOB_ID/ATTEMPT" -> the attempt's node secret),
  // nullopt when this node holds none for the key: a worker proving it is that attempt's
  // rank. Called on the handshake's thread. Unset: only the token (key "") is accepted.
  std::function<std::optional<std::string>(const std::string& key)> grant_for;
  uint32_t credits = 4;       // ops with data a worker may have outstanding per session
  std::string name;           // for errors and logs; default HOST:PORT
  // Told the seconds of every window step a session ran (its completion thread; must not
  // block), e.g. a histogram's observe.
  std::function<void(double seconds)> on_step;
  // Fault injection for the failure tests (--die-at KIND:N): the node SIGKILLs itself at
  // the N-th (1-based, all sessions together) event of one kind:
  //   grad     a gradient chunk arrives (mid-gradient stream: its op is incomplete)
  //   step     a window step starts (mid-window step: no PARAMS sent yet)
  //   save     a whole-buffer state read starts (mid-save: a checkpoint streams the state)
  //   between  a window step's DONE has been sent (between windows)
  std::string die_at_kind;  // "" = never
  int64_t die_at_count = 0;
};

// "step:3" -> {"step", 3}; throws std::invalid_argument naming the text.
std::pair<std::string, int64_t> parse_die_at(const std::string& text);

struct NodeStats {
  int sessions = 0;
  int64_t memory_used = 0;  // bytes of session state allocated
  int64_t bytes_received = 0, bytes_sent = 0;  // all sessions', ended ones included
  int64_t sessions_refused = 0;
  int64_t ops = 0;
};

class OptimizerNode {
 public:
  explicit OptimizerNode(NodeOptions options);
  ~OptimizerNode();  // stops
  OptimizerNode(const OptimizerNode&) = delete;
  OptimizerNode& operator=(const OptimizerNode&) = delete;

  // Listens; returns the port bound. Throws transport::TransportError.
  int start();
  void stop();
  // Ends every session (its state is dropped, the worker gets an ERROR naming `why`): the
  // coordinator fenced this node (its lease lapsed), so the jobs it served have moved on.
  // Returns the sessions ended.
  int drop_all_sessions(const std::string& why);
  NodeStats stats() const;
  const std::string& name() const;

  struct Impl;  // in the .cpp, with the sessions

 private:
  std::unique_ptr<Impl> impl_;
};

// "64G", "512M", "1.5T", "1000000" (bytes) -> bytes; throws std::invalid_argument naming the text.
int64_t parse_bytes(const std::string& text);

}  // namespace zenflow::optimizer_node
