// UCX transport: message channels between a worker's remote host optimizer and the
// zenflow-optimizer nodes (docs/design.md §10; measurements in docs/benchmarks.md §3).
//
// A Transport is one UCX context and one UCX worker driven by one progress thread
// (UCS_THREAD_MODE_SINGLE: no other thread calls UCX). Every message is a UCP active
// message: a small header (a WireHeader, wire.h, or any bytes up to kMaxHeaderBytes)
// plus an optional payload. Payloads of at least TransportOptions::rndv_bytes go by
// rendezvous (UCP_AM_SEND_FLAG_RNDV) straight from the sender's buffer into the buffer
// the receiver picks for them; smaller ones eagerly. Per channel, messages are delivered
// in the order the rendezvous completed — which is not always the order they were sent:
// protocols name what they expect (counts, sequence numbers), never trust arrival order.
//
// Connections: listen()'s port is not UCX's. It is a plain TCP socket of this transport
// that speaks only the handshake of handshake.h: framed, every length bounded, a deadline
// per connection and a cap on those in progress, and mutual HMAC-SHA256 challenge-response
// over TransportOptions::secret (which never crosses the wire). Only a peer that proved
// the secret gets this side's UCX worker address, and only then does this side create a
// UCX endpoint, from the peer's worker address (UCP_EP_PARAM_FIELD_REMOTE_ADDRESS): no
// byte from an unauthenticated peer reaches UCX through listen()'s port. UCX's sockaddr
// connection manager (ucp_listener, which aborted the process on 16 bytes of 0xff) is not
// used. Each channel is two endpoints, one created by each side, and every message
// carries the receiving side's channel id (a random 64-bit number exchanged in the
// handshake) in front of its header: that, not the endpoint, says which channel it is on.
//
// What the handshake does not protect: after it, messages go over UCX in clear and
// unauthenticated (anyone on the path can read them, or inject with a channel id seen on
// the wire). UCX's own transports keep listening sockets of their own (tcp: one per
// interface in use; TransportOptions::local_host limits them to one interface), and UCX
// 1.13's tcp socket aborts the process on a crafted connection request: those sockets accept
// only addresses that hold an authenticated channel with this process at the time
// (ucx_socket_guard.h), so a stranger's bytes never reach UCX there either.
//
// Threads: send() and close() are safe from any thread (they queue to the progress
// thread and wake it with ucp_worker_signal). Handlers run on the progress thread and
// must not block: hand work to another thread. The progress thread spins about
// `spin_us` after the last event, yielding the core at every turn (a peer that shares
// the core runs at once), then sleeps on the UCX worker's event fd (an idle transport
// uses no CPU). It is named "zf-transport"; a listening transport has a second thread,
// "zf-handshake", for its handshakes.
//
// Failure: endpoints use UCP_ERR_HANDLING_MODE_PEER; a peer that dies or closes fails
// every pending send with its error and calls on_error once; nothing is delivered after.
// Transport::create sets MM_ERROR_HANDLING=y in its UCX context's config when UCX_TLS may
// pick shared memory (which needs it in PEER mode), and TCP_PUT_ENABLE=n when it may pick
// tcp (UCX 1.13's TCP PUT aborts the process on a peer lost mid-transfer), unless the
// environment sets UCX_MM_ERROR_HANDLING / UCX_TCP_PUT_ENABLE. It never changes the
// process environment (setenv races with every other thread's getenv), so Transports may
// be created on several threads at once.
//
// close(false) waits for the channel's sends in flight and says goodbye before the
// endpoint goes (UCX's own flushing close can drop rendezvous sends); the peer's on_error
// then reads "closed by the peer".
//
// Errors: create/listen/connect throw TransportError naming what failed (address,
// UCX status string); connect throws AuthenticationError when the peer does not know this
// side's secret or refused this side's proof of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace zenflow::transport {

class TransportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The handshake's proof of the shared secret failed, on either side.
class AuthenticationError : public TransportError {
 public:
  using TransportError::TransportError;
};

constexpr size_t kMaxHeaderBytes = 256;

struct TransportOptions {
  // Payloads at least this long go by rendezvous; smaller ones eagerly.
  size_t rndv_bytes = 8192;
  // Spin this long after the last event before sleeping on the event fd.
  int spin_us = 20;
  // A name for logs and errors ("worker rank 0", "optimizer node 127.0.0.1:4000").
  std::string name = "zenflow";
  // The secret both ends of a connection prove they know in the handshake (its HMAC key;
  // never sent). Empty is a key like any other: it connects only to peers whose secret is
  // empty too. connect() proves it under the name `key` (handshake.h; "" for a node's own
  // token, "JOB_ID/ATTEMPT" for a coordinator's grant of one job attempt).
  std::string secret;
  std::string key;
  // listen(): the secret this side holds for a key (nullopt: none, the peer is refused,
  // naming the key). Unset: `secret`, for the key "" only.
  std::function<std::optional<std::string>(const std::string& key)> secret_for;
  // Not empty and not a wildcard (0.0.0.0, ::): UCX's network transports use only the
  // interfaces that hold these addresses (comma-separated; and RDMA devices, which listen
  // on no socket), so UCX's own sockets listen nowhere else. It overrides UCX_NET_DEVICES.
  // Throws TransportError from create when no interface holds one of them. A node passes
  // its --listen host; a rank, the addresses it reaches its nodes from
  // (local_address_toward).
  std::string local_host;
  // listen(): a handshake not finished this long after its connection was accepted is
  // dropped, and at most max_handshakes run at once (more wait in the kernel's backlog).
  // An authenticated peer then has this long to send its first UCX message.
  double handshake_timeout_s = 5;
  int max_handshakes = 64;
};

// The local address this host sends from to reach `host` (the kernel's route; no packet is
// sent), as text; "" when `host` does not resolve or no route leads there.
std::string local_address_toward(const std::string& host);

// Bytes moved, counted when a send completes / a payload has landed.
struct ChannelStats {
  int64_t bytes_sent = 0;      // headers + payloads
  int64_t bytes_received = 0;  // headers + payloads
  int64_t messages_sent = 0;
  int64_t messages_received = 0;
};

// Completion of one send: ok, or the error text (peer gone, channel closed).
using SendDone = std::function<void(bool ok, const std::string& error)>;

// What a channel does with what arrives; every callback runs on the progress thread.
struct ChannelHandler {
  // A message's payload of `len` bytes (len > 0) is about to be received: return where it
  // goes (`len` writable bytes that stay valid until on_message), or nullptr to have the
  // transport allocate it. The header is the message's header bytes.
  std::function<void*(const void* header, size_t header_len, size_t len)> place;
  // A whole message: its header and payload (`data` is what place returned, or a transport
  // buffer valid only during this call; nullptr when len == 0).
  std::function<void(const void* header, size_t header_len, void* data, size_t len)> on_message;
  // The channel failed or the peer closed it; called at most once, after which nothing
  // more is delivered and every pending and later send fails.
  std::function<void(const std::string& error)> on_error;
};

// One connection (a UCP endpoint) to a peer.
class Channel {
 public:
  virtual ~Channel() = default;
  // Queues one message: `header` is copied at once (header_len <= kMaxHeaderBytes);
  // `data` is not: keep [data, data + len) alive and unchanged until `done` was called.
  // `done` (may be empty) runs on the progress thread when the send completed or failed.
  virtual void send(const void* header, size_t header_len, const void* data, size_t len, SendDone done) = 0;
  // Closes the endpoint (flushes queued sends first unless `force`); on_error is not called
  // for a close this side asked for. Idempotent.
  virtual void close(bool force = false) = 0;
  virtual bool failed() const = 0;
  virtual std::string peer() const = 0;  // "HOST:PORT"
  virtual ChannelStats stats() const = 0;
};

class Transport {
 public:
  static std::unique_ptr<Transport> create(const TransportOptions& options);
  virtual ~Transport() = default;  // closes every channel (force) and joins the progress thread

  // Listens on host:port (0 = a free port) for the handshake; returns the port bound. Each
  // authenticated connection becomes a Channel handed to `accept` once the peer's first UCX
  // message arrived; `accept` returns its handler (run on the progress thread before any
  // message of that channel is delivered). One listen per transport.
  using Accept = std::function<ChannelHandler(std::shared_ptr<Channel>)>;
  virtual int listen(const std::string& host, int port, Accept accept) = 0;

  // Runs the handshake with host:port, then connects over UCX; throws TransportError when
  // no connection is made within timeout_s (naming the address and what failed), and
  // AuthenticationError when either side's proof of the secret failed. Connects of one
  // transport run one at a time.
  virtual std::shared_ptr<Channel> connect(const std::string& host, int port, ChannelHandler handler,
                                           double timeout_s = 10.0) = 0;

  // Registers [data, data + len) with UCX (ucp_mem_map) so rendezvous sends from it and
  // receives into it skip the registration cache. Optional: unregistered memory works.
  virtual void register_memory(void* data, size_t len) = 0;
  virtual void unregister_memory(void* data) = 0;

  // The transports asked for: the UCX_TLS in effect ("default" when unset: whatever UCX
  // picks). 1.13 cannot report the lanes an endpoint uses (UCX_LOG_LEVEL=info prints them).
  virtual std::string transports() const = 0;

  // Seconds since the progress thread last went round its loop: near 0 while it runs (an
  // idle one wakes at least every 100 ms). More means this side could not hear its peers
  // meanwhile (a handler blocked, or the process was paused), so a peer's silence over
  // that time says nothing about the peer.
  virtual double seconds_since_progress() const = 0;
};

}  // namespace zenflow::transport
