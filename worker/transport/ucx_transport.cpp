// UCX transport (transport.h): one UCP context and worker, driven by one progress thread.
//
// Every UCX call runs on the progress thread; other threads queue Commands and wake it
// with ucp_worker_signal. A channel is this side's UCP endpoint (PEER error mode), created
// from the worker address the handshake (handshake_listener.h) brought, and the id this
// side receives it on: every AM starts with the receiver's 8-byte channel id, which maps it
// to its channel. connect() confirms the connection with an internal HELLO/WELCOME AM pair,
// since ucp_ep_create returns before the peer has been reached; the listening side hands
// the channel to `accept` when that HELLO arrives.
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "worker/transport/handshake_listener.h"
#include "worker/transport/ucx_socket_guard.h"
#include "worker/transport/transport.h"

namespace zenflow::transport {
namespace {

// In front of every AM's header: the receiving side's id of the channel (little-endian).
constexpr size_t kChannelIdBytes = 8;

constexpr unsigned kUserAm = 1;     // application messages
constexpr unsigned kHelloAm = 2;    // client -> server: is the connection up?
constexpr unsigned kWelcomeAm = 3;  // server -> client: yes (consumed here, never delivered)
// A non-forced close: BYE after the last send completed, the peer answers BYE_ACK once it has
// handled everything before it, then the endpoint closes. UCX's own flushing close can
// disconnect before the peer has taken in data that completed locally (shm rendezvous).
constexpr unsigned kByeAm = 4;
constexpr unsigned kByeAckAm = 5;
constexpr auto kByeWait = std::chrono::seconds(2);  // then close without the answer

// Bounded waits: the sleep on the event fd (so shutdown is prompt even without a signal),
// and how long the destructor waits for force-closed endpoints and their requests.
constexpr int kSleepMs = 100;
constexpr auto kShutdownWait = std::chrono::seconds(5);

class UcxTransport;
class UcxChannel;

using Command = std::function<void(UcxTransport&)>;

// What channels and the transport share: the command queue. `open` turns false when the
// transport shuts down; posts after that are refused (nothing runs on a dead worker).
struct CommandQueue {
  std::mutex mu;
  std::deque<Command> commands;
  bool open = true;
  ucp_worker_h worker = nullptr;

  bool post(Command c) {
    std::lock_guard<std::mutex> lock(mu);
    if (!open) return false;
    commands.push_back(std::move(c));
    ucp_worker_signal(worker);  // under the lock: the worker outlives `open`
    return true;
  }
};

// Whether UCX_TLS may select one of the transports `names` (unset, "all", an exclusion list,
// or one of them by name). Only then is an option of theirs set: UCX warns (on stdout) about
// an env variable no loaded transport reads, which would garble a CLI's JSON.
bool may_select(const char* tls, std::initializer_list<const char*> names) {
  if (tls == nullptr || *tls == '\0' || *tls == '^') return true;
  const std::string t = tls;
  for (const char* name : names)
    for (size_t at = t.find(name); at != std::string::npos; at = t.find(name, at + 1)) {
      const size_t end = at + std::strlen(name);
      const bool starts = at == 0 || t[at - 1] == ',';
      const bool ends = end == t.size() || t[end] == ',';
      if (starts && ends) return true;
    }
  return false;
}

void put_channel_id(unsigned char* p, uint64_t id) {
  for (size_t i = 0; i < kChannelIdBytes; ++i) p[i] = static_cast<unsigned char>(id >> (8 * i));
}

// An authenticated peer's address, allowed to reach UCX's own listening sockets.
socket_guard::Allowance allow(const sockaddr_storage& addr) {
  socket_guard::Address a{};
  if (!socket_guard::address_of(reinterpret_cast<const sockaddr*>(&addr), sizeof addr, &a)) return {};
  return socket_guard::Allowance(a);
}

}  // namespace

std::string local_address_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "";
  std::string out;
  for (addrinfo* r = res; r != nullptr && out.empty(); r = r->ai_next) {
    const int fd = ::socket(r->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    // A datagram socket's connect() only picks the route and the source address: no packet.
    if (::connect(fd, r->ai_addr, r->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr = local.ss_family == AF_INET
                             ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr)
                             : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, text, sizeof text) != nullptr) out = text;
    }
    ::close(fd);
  }
  freeaddrinfo(res);
  return out;
}

namespace {

// The interfaces that hold `host`'s address. Throws naming the host when none does.
std::vector<std::string> interfaces_holding(const std::string& host, const std::string& name) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || res == nullptr)
    throw TransportError(name + ": local host " + host + ": cannot resolve it (" + gai_strerror(rc) + ")");
  auto same = [](const sockaddr* a, const sockaddr* b) {
    if (a->sa_family != b->sa_family) return false;
    if (a->sa_family == AF_INET)
      return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
             reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
    return a->sa_family == AF_INET6 &&
           std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, 16) == 0;
  };
  std::vector<std::string> devices;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next)
      for (addrinfo* r = res; i->ifa_addr != nullptr && r != nullptr; r = r->ai_next)
        if (same(i->ifa_addr, r->ai_addr) &&
            std::find(devices.begin(), devices.end(), i->ifa_name) == devices.end())
          devices.push_back(i->ifa_name);
    freeifaddrs(ifs);
  }
  freeaddrinfo(res);
  if (devices.empty()) throw TransportError(name + ": no network interface holds the address of " + host);
  return devices;
}

// The UCX device list that keeps UCX's network transports on the interfaces holding the
// comma-separated `hosts` (plus every RDMA port: they open no socket, and leaving them out
// would leave an InfiniBand node on IPoIB). "" for a wildcard host: every device. Throws
// naming the host when no interface holds it.
std::string net_devices_for(const std::string& hosts, const std::string& name) {
  std::vector<std::string> devices;
  for (size_t at = 0; at <= hosts.size();) {
    const size_t comma = std::min(hosts.find(',', at), hosts.size());
    const std::string host = hosts.substr(at, comma - at);
    at = comma + 1;
    if (host.empty() || host == "0.0.0.0" || host == "::" || host == "*") return "";
    for (std::string& dev : interfaces_holding(host, name))
      if (std::find(devices.begin(), devices.end(), dev) == devices.end()) devices.push_back(std::move(dev));
  }
  if (DIR* d = opendir("/sys/class/infiniband")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string ports_dir = std::string("/sys/class/infiniband/") + e->d_name + "/ports";
      if (DIR* pd = opendir(ports_dir.c_str())) {
        while (dirent* q = readdir(pd))
          if (q->d_name[0] != '.') devices.push_back(std::string(e->d_name) + ":" + q->d_name);
        closedir(pd);
      }
    }
    closedir(d);
  }
  std::string out;
  for (const auto& dev : devices) out += (out.empty() ? "" : ",") + dev;
  return out;
}

struct SendOp {
  std::shared_ptr<UcxChannel> channel;
  unsigned char header[kChannelIdBytes + kMaxHeaderBytes];  // the peer's channel id, then the caller's
  size_t header_len = 0;
  const void* data = nullptr;
  size_t len = 0;
  SendDone done;
};

struct RecvOp {
  std::shared_ptr<UcxChannel> channel;
  unsigned char header[kMaxHeaderBytes];
  size_t header_len = 0;
  void* desc = nullptr;  // the rendezvous descriptor until ucp_am_recv_data_nbx takes it
  void* buffer = nullptr;
  std::unique_ptr<unsigned char[]> owned;  // when place() gave no buffer
  size_t len = 0;
};

class UcxChannel final : public Channel, public std::enable_shared_from_this<UcxChannel> {
 public:
  UcxChannel(UcxTransport* owner, std::shared_ptr<CommandQueue> queue, std::string peer)
      : owner(owner), queue_(std::move(queue)), peer_(std::move(peer)) {}

  void send(const void* header, size_t header_len, const void* data, size_t len, SendDone done) override;
  void close(bool force) override;
  // Queues the endpoint's close whether or not close() was called (a failed endpoint must be closed).
  void post_close(bool force);
  // Closed by this side counts: sends fail from then on.
  bool failed() const override { return failed_.load() || close_requested.load(); }
  std::string peer() const override { return peer_; }
  ChannelStats stats() const override {
    ChannelStats s;
    s.bytes_sent = bytes_sent_.load();
    s.bytes_received = bytes_received_.load();
    s.messages_sent = messages_sent_.load();
    s.messages_received = messages_received_.load();
    return s;
  }

  void count_sent(size_t bytes) {
    bytes_sent_ += static_cast<int64_t>(bytes);
    ++messages_sent_;
  }
  void count_received(size_t bytes) {
    bytes_received_ += static_cast<int64_t>(bytes);
    ++messages_received_;
  }

  // Set by close() on the caller's thread, so an error racing the queued close is not reported.
  std::atomic<bool> close_requested{false};
  std::atomic<bool> failed_{false};

  UcxTransport* const owner;  // dereferenced on the progress thread only, where it is alive

  // Progress-thread state.
  ucp_ep_h ep = nullptr;
  bool ep_closing = false;    // a close ran: new sends fail
  bool close_issued = false;  // ucp_ep_close_nbx was called
  int sends_in_flight = 0;
  bool bye_sent = false, bye_done = false;  // the close handshake (kByeAm)
  std::chrono::steady_clock::time_point
      bye_deadline;  // a non-forced close waits for them (UCX's flush does not wait for rndv)
  bool error_reported = false;
  std::string error_text;  // why sends fail once failed_
  ChannelHandler handler;
  std::shared_ptr<std::promise<std::string>> connecting;  // client: until WELCOME or error
  // Listening side: authenticated, without an endpoint yet, waiting for the peer's HELLO
  // (then its endpoint is created from peer_address and it is handed to accept) until the
  // deadline (then forgotten).
  bool awaiting_accept = false;
  std::string peer_address;
  std::chrono::steady_clock::time_point accept_deadline;
  uint64_t rx_id = 0;  // on this side's messages from the peer
  uint64_t tx_id = 0;  // on this side's messages to the peer
  // The peer's address may reach UCX's own listening sockets while the channel lives
  // (ucx_socket_guard.h): UCX connects over them after the handshake.
  socket_guard::Allowance allowance;

 private:
  std::shared_ptr<CommandQueue> queue_;
  const std::string peer_;
  std::atomic<int64_t> bytes_sent_{0}, bytes_received_{0}, messages_sent_{0}, messages_received_{0};
};

struct MemRegion {
  size_t len = 0;
  ucp_mem_h memh = nullptr;
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportOptions& options);
  ~UcxTransport() override;

  int listen(const std::string& host, int port, Accept accept) override;
  std::shared_ptr<Channel> connect(const std::string& host, int port, ChannelHandler handler,
                                   double timeout_s) override;
  void register_memory(void* data, size_t len) override;
  void unregister_memory(void* data) override;
  std::string transports() const override { return tls_; }
  double seconds_since_progress() const override {
    const auto since = std::chrono::steady_clock::now().time_since_epoch().count() - last_loop_ns_.load();
    return since > 0 ? static_cast<double>(since) / 1e9 : 0.0;
  }

  // Progress-thread entry points (commands and UCX callbacks).
  void submit(SendOp* op);
  void close_ep(const std::shared_ptr<UcxChannel>& ch, bool force);

 private:
  template <typename T>
  T run_on_progress_thread(std::function<T(UcxTransport&)> fn, const char* what);
  bool on_progress_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  void progress_loop();
  bool drain_commands();
  void shutdown_on_progress_thread();
  void start_rndv_receives();

  void complete_send(SendOp* op, bool ok, const std::string& error);
  void finish_recv(RecvOp* r, ucs_status_t status);
  void on_bye(const std::shared_ptr<UcxChannel>& ch);
  // A control message (its header only). `in_flight` (progress thread only), when given,
  // counts the send until its callback runs: incremented here when UCX keeps a request.
  static void send_control(const UcxChannel& ch, unsigned id, int* in_flight = nullptr);
  int shutdown_byes_in_flight_ = 0;  // the BYEs of shutdown_on_progress_thread not yet sent
  // Listener thread: a peer that proved the secret gets a channel awaiting its HELLO.
  bool admit(const handshake::Endpoint& peer, uint64_t own_channel, const std::string& from,
             const sockaddr_storage& from_addr);
  void on_hello(const std::shared_ptr<UcxChannel>& ch);
  bool create_ep(UcxChannel& ch, const std::string& peer_address);
  void forget(ucp_ep_h ep);
  std::shared_ptr<UcxChannel> channel_of(const void* header, size_t header_len);
  ucp_mem_h memh_for(const void* p, size_t len) const;
  ucs_status_t on_user_am(const void* header, size_t header_len, void* data, size_t len,
                          const ucp_am_recv_param_t* param);
  void log(const std::string& text) const {
    std::fprintf(stderr, "zenflow transport (%s): %s\n", options_.name.c_str(), text.c_str());
  }

  static void send_cb(void* request, ucs_status_t status, void* user_data);
  static void recv_cb(void* request, ucs_status_t status, size_t length, void* user_data);
  static void err_cb(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void close_cb(void* request, ucs_status_t status, void* user_data);

  const TransportOptions options_;
  std::string tls_;
  std::string address_;  // this worker's UCX address, sent to authenticated peers
  std::unique_ptr<HandshakeListener> listener_;
  Accept accept_;  // called on the progress thread only
  // UCX pairs the endpoints two workers create to each other in the order they were
  // created: one connect at a time keeps each pair one channel's two ends.
  std::mutex connect_mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::shared_ptr<CommandQueue> queue_ = std::make_shared<CommandQueue>();
  std::atomic<bool> stop_{false};
  // steady_clock ns when the progress loop last went round (seconds_since_progress).
  std::atomic<int64_t> last_loop_ns_{std::chrono::steady_clock::now().time_since_epoch().count()};
  std::thread thread_;

  // Progress-thread state.
  std::unordered_map<ucp_ep_h, std::shared_ptr<UcxChannel>> channels_;
  std::unordered_map<uint64_t, std::shared_ptr<UcxChannel>> by_id_;  // by rx_id
  std::vector<std::shared_ptr<UcxChannel>> awaiting_accept_;
  std::map<uintptr_t, MemRegion> regions_;
  std::vector<RecvOp*> pending_rndv_;
  // The receive start_rndv_receives is handing to ucp_am_recv_data_nbx, and its status when
  // UCX completed it inside that call (recv_cb ran there). Progress thread only.
  RecvOp* receiving_ = nullptr;
  std::optional<ucs_status_t> completed_inside_;
  std::vector<std::shared_ptr<UcxChannel>> awaiting_bye_ack_;
  int64_t requests_in_flight_ = 0;  // sends, receives and closes UCX still owes a callback
  bool stranded_ = false;  // shutdown left requests in flight: the worker is not destroyed
  bool shutting_down_ = false;      // no message is delivered, no on_error called
};

// ---- Channel -----------------------------------------------------------------------

void UcxChannel::send(const void* header, size_t header_len, const void* data, size_t len, SendDone done) {
  if (header_len > kMaxHeaderBytes)
    throw TransportError("send to " + peer_ + ": header of " + std::to_string(header_len) +
                         " bytes exceeds " + std::to_string(kMaxHeaderBytes));
  auto* op = new SendOp;
  op->channel = shared_from_this();
  if (header_len)
    std::memcpy(op->header + kChannelIdBytes, header, header_len);  // the id: on the progress thread
  op->header_len = header_len;
  op->data = len ? data : nullptr;
  op->len = len;
  op->done = std::move(done);
  // A refused post means the transport is gone: no callback may run any more.
  if (!queue_->post([op](UcxTransport& t) { t.submit(op); })) delete op;
}

void UcxChannel::close(bool force) {
  if (close_requested.exchange(true)) return;
  post_close(force);  // sends queued before it still go out (unless force)
}

void UcxChannel::post_close(bool force) {
  auto self = shared_from_this();
  queue_->post([self, force](UcxTransport& t) { t.close_ep(self, force); });
}

// ---- Transport: setup and teardown ------------------------------------------------------

UcxTransport::UcxTransport(const TransportOptions& options) : options_(options) {
  // Before UCX opens a socket: from now on its listeners hear authenticated peers only.
  socket_guard::enable();
  const char* tls = std::getenv("UCX_TLS");
  tls_ = tls && *tls ? tls : "default";
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) throw TransportError(options_.name + ": ucp_config_read: " + ucs_status_string(s));
  // Defaults for this context only, where the environment sets nothing: set on the config,
  // never with setenv, which is not thread-safe (another thread's getenv, UCX's own reading
  // of the environment in a second Transport being created, walks an array setenv frees).
  // UCX 1.13 keeps a name that no UCP option has and applies it to every transport config
  // that has it, named as in that transport's table: tcp's PUT_ENABLE (its prefix TCP_
  // left out), the mm sub-table's MM_ERROR_HANDLING (test_transport's lane check and UCX's
  // "apply UCT configuration" debug line show both applied; "TCP_PUT_ENABLE" is not).
  auto set_default = [&](const char* name, const char* env, const char* value) {
    if (std::getenv(env) != nullptr) return;
    s = ucp_config_modify(config, name, value);
    if (s != UCS_OK)
      throw TransportError(options_.name + ": ucp_config_modify " + name + "=" + value + ": " +
                           ucs_status_string(s));
  };
  try {
    // Shared memory refuses PEER error mode without it (UCX 1.13, docs/benchmarks.md §3).
    if (may_select(tls, {"all", "sm", "shm", "mm", "posix", "sysv", "xpmem"}))
      set_default("MM_ERROR_HANDLING", "UCX_MM_ERROR_HANDLING", "y");
    // UCX 1.13's TCP PUT (the zero-copy lane its rendezvous uses over tcp) aborts the process
    // when the peer dies mid-transfer (tcp_ep.c:939, `ep->flags & UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK`):
    // CI saw a training process die of SIGABRT, instead of resuming, when its node was killed
    // mid-gradient-stream. Without it the bytes go as active-message fragments, as fast here
    // (bench transport, tcp, 4 MiB / 64 MiB chunks: 4.67 / 4.14 GB/s with PUT, 4.75 / 4.05 without).
    if (may_select(tls, {"all", "tcp"})) set_default("PUT_ENABLE", "UCX_TCP_PUT_ENABLE", "n");
    // A peer process that dies is seen by a failing socket over tcp, but over shared memory
    // only by UCX's keepalive (it checks the peer's process), every 20 s by default.
    set_default("KEEPALIVE_INTERVAL", "UCX_KEEPALIVE_INTERVAL", "1s");
    // UCX's tcp transport listens on every interface it uses: only the one given.
    if (const std::string devices = net_devices_for(options_.local_host, options_.name); !devices.empty()) {
      s = ucp_config_modify(config, "NET_DEVICES", devices.c_str());
      if (s != UCS_OK)
        throw TransportError(options_.name + ": ucp_config_modify NET_DEVICES=" + devices + ": " +
                             ucs_status_string(s));
    }
  } catch (...) {
    ucp_config_release(config);
    throw;
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = options_.name.c_str();
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) throw TransportError(options_.name + ": ucp_init: " + ucs_status_string(s));

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(context_, &wparams, &worker_);
  if (s == UCS_OK) s = ucp_worker_get_efd(worker_, &efd_);
  for (unsigned id : {kUserAm, kHelloAm, kWelcomeAm, kByeAm, kByeAckAm}) {
    if (s != UCS_OK) break;
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.arg = this;
    switch (id) {
      case kUserAm:
        hp.cb = [](void* arg, const void* header, size_t header_len, void* data, size_t len,
                   const ucp_am_recv_param_t* param) {
          return static_cast<UcxTransport*>(arg)->on_user_am(header, header_len, data, len, param);
        };
        break;
      case kHelloAm:
        hp.cb = [](void* arg, const void* header, size_t header_len, void*, size_t,
                   const ucp_am_recv_param_t*) {
          auto* t = static_cast<UcxTransport*>(arg);
          if (auto ch = t->channel_of(header, header_len)) t->on_hello(ch);
          return UCS_OK;
        };
        break;
      case kWelcomeAm:
        hp.cb = [](void* arg, const void* header, size_t header_len, void*, size_t,
                   const ucp_am_recv_param_t*) {
          if (auto ch = static_cast<UcxTransport*>(arg)->channel_of(header, header_len);
              ch && ch->connecting) {
            ch->connecting->set_value("");
            ch->connecting.reset();
          }
          return UCS_OK;
        };
        break;
      case kByeAm:
        hp.cb = [](void* arg, const void* header, size_t header_len, void*, size_t,
                   const ucp_am_recv_param_t*) {
          if (auto ch = static_cast<UcxTransport*>(arg)->channel_of(header, header_len))
            static_cast<UcxTransport*>(arg)->on_bye(ch);
          return UCS_OK;
        };
        break;
      default:  // kByeAckAm
        hp.cb = [](void* arg, const void* header, size_t header_len, void*, size_t,
                   const ucp_am_recv_param_t*) {
          if (auto ch = static_cast<UcxTransport*>(arg)->channel_of(header, header_len);
              ch && ch->bye_sent && !ch->bye_done) {
            ch->bye_done = true;
            ch->post_close(/*force=*/false);  // not from inside UCX's callback
          }
          return UCS_OK;
        };
        break;
    }
    s = ucp_worker_set_am_recv_handler(worker_, &hp);
  }
  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  if (s == UCS_OK) s = ucp_worker_get_address(worker_, &address, &address_len);
  if (s == UCS_OK) {
    address_.assign(reinterpret_cast<const char*>(address), address_len);
    ucp_worker_release_address(worker_, address);
    if (address_len > handshake::kMaxAddressBytes) s = UCS_ERR_EXCEEDS_LIMIT;
  }
  if (s != UCS_OK) {
    if (worker_) ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    throw TransportError(options_.name + ": UCX worker setup: " + ucs_status_string(s) +
                         (address_len > handshake::kMaxAddressBytes
                              ? " (a worker address of " + std::to_string(address_len) + " bytes)"
                              : ""));
  }
  queue_->worker = worker_;
  thread_ = std::thread([this] { progress_loop(); });
  pthread_setname_np(thread_.native_handle(), "zf-transport");
}

UcxTransport::~UcxTransport() {
  listener_.reset();  // no more channels are admitted
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    ucp_worker_signal(worker_);
  }
  thread_.join();
  // UCX 1.13 asserts (aborting the process) when a worker is destroyed with a request still
  // on one of its endpoints: one that did not complete within kShutdownWait (a loaded host,
  // a peer that stopped answering) leaves the worker and its context to the process's end.
  if (stranded_) return;
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

// ---- The progress thread ---------------------------------------------------------------

bool UcxTransport::drain_commands() {
  std::deque<Command> batch;
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    batch.swap(queue_->commands);
  }
  for (auto& c : batch) c(*this);
  return !batch.empty();
}

void UcxTransport::progress_loop() {
  using Clock = std::chrono::steady_clock;
  const auto spin = std::chrono::microseconds(options_.spin_us);
  auto last_event = Clock::now();
  while (!stop_) {
    bool worked = drain_commands();
    while (ucp_worker_progress(worker_) != 0) worked = true;
    if (!pending_rndv_.empty()) {
      start_rndv_receives();
      worked = true;
    }
    const auto now = Clock::now();
    last_loop_ns_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
    for (size_t i = 0; i < awaiting_bye_ack_.size();) {
      auto ch = awaiting_bye_ack_[i];
      if (ch->bye_done || ch->close_issued || now >= ch->bye_deadline) {
        awaiting_bye_ack_.erase(awaiting_bye_ack_.begin() + static_cast<long>(i));
        if (!ch->bye_done) {
          ch->bye_done = true;  // no answer: close anyway
          close_ep(ch, /*force=*/false);
        }
      } else {
        ++i;
      }
    }
    for (size_t i = 0; i < awaiting_accept_.size();) {
      auto ch = awaiting_accept_[i];
      if (ch->awaiting_accept && now < ch->accept_deadline) {
        ++i;
        continue;
      }
      awaiting_accept_.erase(awaiting_accept_.begin() + static_cast<long>(i));
      if (ch->awaiting_accept) {  // authenticated, but its UCX connection never came up
        ch->awaiting_accept = false;
        by_id_.erase(ch->rx_id);
        log("connection from " + ch->peer() + ": no UCX message within " +
            std::to_string(options_.handshake_timeout_s) + " s of the handshake; dropped");
      }
    }
    if (worked) {
      last_event = now;
      continue;
    }
    // Spinning, or events arrived since the last progress (busy): progress again, but let
    // a peer that shares this core (a node on the same machine) run first. A spin that
    // kept the core held every fragment of a transfer up for a whole spin, or until the
    // scheduler preempted it: a 1 MiB round trip over shared memory took 16 ms instead
    // of 0.2 ms. With nothing else to run on the core, sched_yield returns at once.
    const ucs_status_t s = now - last_event < spin ? UCS_ERR_BUSY : ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) {
      sched_yield();
      continue;
    }
    {
      // A command posted before the arm signalled an unarmed worker: do not sleep on it.
      std::lock_guard<std::mutex> lock(queue_->mu);
      if (!queue_->commands.empty()) continue;
    }
    if (s != UCS_OK) log(std::string("ucp_worker_arm: ") + ucs_status_string(s));
    pollfd pfd{efd_, POLLIN, 0};
    poll(&pfd, 1, kSleepMs);
  }
  shutdown_on_progress_thread();
}

void UcxTransport::shutdown_on_progress_thread() {
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    queue_->open = false;
  }
  shutting_down_ = true;
  drain_commands();  // queued sends fail below with the force-closed endpoints
  for (RecvOp* r : pending_rndv_) {
    ucp_am_data_release(worker_, r->desc);
    delete r;
  }
  pending_rndv_.clear();
  std::vector<std::shared_ptr<UcxChannel>> all;
  for (auto& kv : channels_) all.push_back(kv.second);
  // A peer over shared memory has nothing that fails when this worker goes while its
  // process lives on (its keepalive checks the process): tell it, then force the close.
  // The BYE may queue behind sends still in flight on its endpoint (a force close would drop
  // it, and the peer would never hear): progress until every BYE has left, for kByeWait.
  // No handler runs once the transport is being destroyed (the objects they call may be
  // gone already): every channel counts as closed by its user before the worker progresses.
  for (auto& ch : all) ch->close_requested = true;
  for (auto& ch : all)
    if (!ch->failed_ && !ch->ep_closing) send_control(*ch, kByeAm, &shutdown_byes_in_flight_);
  const auto bye_deadline = std::chrono::steady_clock::now() + kByeWait;
  for (int i = 0; i < 16 || (shutdown_byes_in_flight_ > 0 && std::chrono::steady_clock::now() < bye_deadline); ++i)
    ucp_worker_progress(worker_);
  for (auto& ch : all) close_ep(ch, /*force=*/true);
  awaiting_accept_.clear();
  const auto deadline = std::chrono::steady_clock::now() + kShutdownWait;
  while ((requests_in_flight_ > 0 || !channels_.empty()) && std::chrono::steady_clock::now() < deadline) {
    drain_commands();
    ucp_worker_progress(worker_);
  }
  if (requests_in_flight_ > 0 || !channels_.empty()) {
    stranded_ = true;
    log("shutdown: " + std::to_string(requests_in_flight_) + " UCX requests and " +
        std::to_string(channels_.size()) + " endpoints still open after " +
        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kShutdownWait).count()) +
        " s; the UCX worker is left to the process's end");
    return;  // its memory registrations stay with it
  }
  for (auto& kv : regions_) ucp_mem_unmap(context_, kv.second.memh);
  regions_.clear();
}

template <typename T>
T UcxTransport::run_on_progress_thread(std::function<T(UcxTransport&)> fn, const char* what) {
  if (on_progress_thread()) return fn(*this);
  auto promise = std::make_shared<std::promise<T>>();
  auto future = promise->get_future();
  const bool posted = queue_->post([promise, fn](UcxTransport& t) {
    try {
      promise->set_value(fn(t));
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  });
  if (!posted) throw TransportError(options_.name + ": " + what + ": the transport is shutting down");
  return future.get();
}

// ---- Listen and connect -----------------------------------------------------------------

int UcxTransport::listen(const std::string& host, int port, Accept accept) {
  if (listener_) throw TransportError(options_.name + ": listen: this transport listens already");
  accept_ = std::move(accept);  // read on the progress thread only after a channel was admitted
  ListenerOptions lo;
  lo.secret_for = options_.secret_for ? options_.secret_for : handshake::only_secret(options_.secret);
  lo.address = address_;
  lo.timeout_s = options_.handshake_timeout_s;
  lo.max_in_progress = options_.max_handshakes;
  lo.name = options_.name;
  listener_ = std::make_unique<HandshakeListener>(
      host, port, lo,
      [this](const handshake::Endpoint& peer, uint64_t own, const std::string& from, const sockaddr_storage& addr) {
        return admit(peer, own, from, addr);
      });
  return listener_->port();
}

bool UcxTransport::create_ep(UcxChannel& ch, const std::string& peer_address) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = err_cb;
  p.err_handler.arg = &ch;
  const ucs_status_t s = ucp_ep_create(worker_, &p, &ch.ep);
  if (s != UCS_OK) {
    ch.ep = nullptr;
    ch.failed_ = true;
    ch.error_text = "channel to " + ch.peer() + ": ucp_ep_create: " + ucs_status_string(s);
    return false;
  }
  channels_[ch.ep] = ch.shared_from_this();
  by_id_[ch.rx_id] = channels_[ch.ep];
  return true;
}

bool UcxTransport::admit(const handshake::Endpoint& peer, uint64_t own_channel, const std::string& from,
                         const sockaddr_storage& from_addr) {
  auto ch = std::make_shared<UcxChannel>(this, queue_, from);
  ch->allowance = allow(from_addr);  // before ACCEPT: the peer's UCX connects right after it
  ch->rx_id = own_channel;
  ch->tx_id = peer.channel;
  auto created = std::make_shared<std::promise<bool>>();
  auto future = created->get_future();
  ch->peer_address = peer.address;
  // Its endpoint waits for the peer's HELLO: created after the peer's endpoint reached this
  // worker, it is the one UCX made for it (UCX pairs the endpoints two workers create to
  // each other in the order they were created), and an authenticated peer that never
  // comes leaves nothing in UCX behind.
  const bool posted = queue_->post([ch, created](UcxTransport& t) {
    if (t.shutting_down_) {
      created->set_value(false);
      return;
    }
    t.by_id_[ch->rx_id] = ch;
    ch->awaiting_accept = true;
    ch->accept_deadline =
        std::chrono::steady_clock::now() +
        std::chrono::microseconds(static_cast<int64_t>(t.options_.handshake_timeout_s * 1e6));
    t.awaiting_accept_.push_back(ch);
    created->set_value(true);
  });
  // Before ACCEPT goes out, so that the peer's HELLO finds the channel.
  return posted && future.get();
}

void UcxTransport::on_hello(const std::shared_ptr<UcxChannel>& ch) {
  if (ch->awaiting_accept) {
    ch->awaiting_accept = false;  // the progress loop drops it from awaiting_accept_
    const std::string address = std::move(ch->peer_address);
    if (!create_ep(*ch, address)) {
      by_id_.erase(ch->rx_id);
      log("accept from " + ch->peer() + ": " + ch->error_text);
      return;
    }
    try {
      ch->handler = accept_(ch);
    } catch (const std::exception& e) {
      log("accept from " + ch->peer() + " threw: " + e.what() + "; closing it");
      ch->close_requested = true;
      close_ep(ch, /*force=*/true);
      return;
    }
  }
  if (!ch->ep_closing) send_control(*ch, kWelcomeAm);
}

std::shared_ptr<Channel> UcxTransport::connect(const std::string& host, int port, ChannelHandler handler,
                                               double timeout_s) {
  const std::string where = host + ":" + std::to_string(port);
  if (on_progress_thread())
    throw TransportError("connect to " + where +
                         ": called from a handler (it would block the progress thread)");
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, timeout_s) * 1e6));
  std::lock_guard<std::mutex> one_at_a_time(connect_mu_);
  auto ch = std::make_shared<UcxChannel>(this, queue_, where);
  ch->handler = std::move(handler);
  ch->rx_id = handshake::random_channel_id();
  handshake::Endpoint peer;
  sockaddr_storage peer_addr{};
  try {
    peer = client_handshake(host, port, options_.secret, options_.key, {address_, ch->rx_id}, timeout_s,
                            &peer_addr);
  } catch (const AuthenticationError& e) {
    throw AuthenticationError(std::string(e.what()) + " (" + options_.name + ")");
  } catch (const TransportError& e) {
    throw TransportError(std::string(e.what()) + " (" + options_.name + ")");
  }
  ch->tx_id = peer.channel;
  ch->allowance = allow(peer_addr);  // before HELLO: the peer's UCX connects when it has it
  auto answer = std::make_shared<std::promise<std::string>>();
  auto future = answer->get_future();
  // The endpoint is created before connect_mu_ is released (the command runs while this
  // thread waits for its answer), which keeps UCX's pairing in order.
  const bool posted = queue_->post([ch, answer, address = peer.address](UcxTransport& t) {
    if (!t.create_ep(*ch, address)) {
      answer->set_value(ch->error_text);
      return;
    }
    ch->connecting = answer;
    send_control(*ch, kHelloAm);  // WELCOME (or err_cb) answers the connect
  });
  if (!posted) throw TransportError("connect to " + where + ": the transport is shutting down");
  std::string error;
  if (future.wait_until(deadline) != std::future_status::ready) {
    error = "no answer over UCX within " + std::to_string(timeout_s) + " s of the handshake";
  } else {
    error = future.get();
  }
  if (!error.empty()) {
    ch->close_requested = true;
    queue_->post([ch](UcxTransport& t) {
      ch->connecting.reset();
      t.close_ep(ch, /*force=*/true);
    });
    throw TransportError("connect to " + where + " (" + options_.name + "): " + error);
  }
  return ch;
}

// ---- Endpoint failure and close ------------------------------------------------------------

void UcxTransport::err_cb(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* ch = static_cast<UcxChannel*>(arg);
  // The channel stays in channels_ until its endpoint is closed, so `ch` is alive here.
  std::shared_ptr<UcxChannel> self = ch->shared_from_this();
  // Failing the channel here keeps on_error ahead of anything delivered after it.
  ch->failed_ = true;
  if (ch->error_text.empty())
    ch->error_text = "channel to " + ch->peer() + " failed: " + ucs_status_string(status);
  if (ch->connecting) {
    ch->connecting->set_value(ucs_status_string(status));
    ch->connecting.reset();
    ch->close_requested = true;
  }
  if (!ch->close_requested && !ch->error_reported) {
    ch->error_reported = true;
    if (ch->handler.on_error) {
      try {
        ch->handler.on_error(ch->error_text);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "zenflow transport: on_error for %s threw: %s\n", ch->peer().c_str(), e.what());
      }
    }
  }
  // A failed endpoint can only be force-closed; do it outside UCX's callback.
  self->post_close(/*force=*/true);
}

void UcxTransport::close_ep(const std::shared_ptr<UcxChannel>& ch, bool force) {
  if (!ch->ep || ch->close_issued) return;
  if (!ch->ep_closing) {
    ch->ep_closing = true;
    ch->failed_ = true;  // nothing more is delivered
    if (ch->error_text.empty()) ch->error_text = "channel to " + ch->peer() + " was closed by this side";
  }
  // UCX 1.13's flushing close disconnects before pending rendezvous sends complete (their
  // callbacks then fail), so it waits here until the channel's last send completed.
  if (!force && ch->sends_in_flight > 0) return;  // send_cb closes it
  if (!force && !ch->bye_sent) {
    ch->bye_sent = true;
    ch->bye_deadline = std::chrono::steady_clock::now() + kByeWait;
    send_control(*ch, kByeAm);
    awaiting_bye_ack_.push_back(ch);
    return;  // the BYE_ACK handler (or the deadline) closes it
  }
  if (!force && !ch->bye_done) return;
  ch->close_issued = true;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (force) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  }
  p.cb.send = close_cb;
  auto* closing = new std::pair<UcxTransport*, ucp_ep_h>(this, ch->ep);
  p.user_data = closing;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ch->ep, &p);
  if (UCS_PTR_IS_PTR(r)) {
    ++requests_in_flight_;
    return;  // close_cb erases the channel
  }
  delete closing;
  forget(ch->ep);
}

void UcxTransport::forget(ucp_ep_h ep) {
  auto it = channels_.find(ep);
  if (it == channels_.end()) return;
  by_id_.erase(it->second->rx_id);
  channels_.erase(it);
}

void UcxTransport::send_control(const UcxChannel& ch, unsigned id, int* in_flight) {
  // The header must outlive the send (1.13 has no UCP_AM_SEND_FLAG_COPY_HEADER, and a send
  // queued until the endpoint is connected reads it later): freed by the callback.
  struct Control {
    unsigned char header[kChannelIdBytes];
    int* in_flight;
  };
  auto* c = new Control{{}, in_flight};
  put_channel_id(c->header, ch.tx_id);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  p.cb.send = [](void* request, ucs_status_t, void* user_data) {
    auto* done = static_cast<Control*>(user_data);
    if (done->in_flight) --*done->in_flight;
    delete done;
    ucp_request_free(request);
  };
  p.user_data = c;
  ucs_status_ptr_t r = ucp_am_send_nbx(ch.ep, id, c->header, kChannelIdBytes, nullptr, 0, &p);
  if (!UCS_PTR_IS_PTR(r)) {
    delete c;  // done (or failed) already: no callback
  } else if (in_flight) {
    ++*in_flight;
  }
}

// The peer closes: everything it sent before has been handled (same endpoint, in order).
void UcxTransport::on_bye(const std::shared_ptr<UcxChannel>& ch) {
  if (!ch->close_issued) {
    send_control(*ch, kByeAckAm);
    // This side's endpoint is its own (the peer's close does not close it): close it after
    // the BYE_ACK, without a BYE of its own.
    ch->bye_sent = ch->bye_done = true;
    if (!ch->ep_closing) {
      ch->ep_closing = true;
      ch->post_close(/*force=*/false);
    }
  }
  ch->failed_ = true;
  if (ch->error_text.empty()) ch->error_text = "channel to " + ch->peer() + " was closed by the peer";
  if (ch->close_requested || ch->error_reported) return;
  ch->error_reported = true;
  if (ch->handler.on_error) {
    try {
      ch->handler.on_error(ch->error_text);
    } catch (const std::exception& e) {
      log("on_error for " + ch->peer() + " threw: " + e.what());
    }
  }
}

void UcxTransport::close_cb(void* request, ucs_status_t, void* user_data) {
  auto* closing = static_cast<std::pair<UcxTransport*, ucp_ep_h>*>(user_data);
  UcxTransport* t = closing->first;
  --t->requests_in_flight_;
  t->forget(closing->second);
  delete closing;
  ucp_request_free(request);
}

// ---- Sends ----------------------------------------------------------------------------

ucp_mem_h UcxTransport::memh_for(const void* p, size_t len) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return nullptr;
  --it;
  return a + len <= it->first + it->second.len ? it->second.memh : nullptr;
}

void UcxTransport::submit(SendOp* op) {
  UcxChannel& ch = *op->channel;
  if (ch.failed_ || ch.ep_closing || !ch.ep || shutting_down_) {
    complete_send(op, false,
                  ch.error_text.empty() ? "channel to " + ch.peer() + " is closed" : ch.error_text);
    return;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = send_cb;
  p.user_data = op;
  const bool rndv = op->len > 0 && op->len >= options_.rndv_bytes;
  p.flags = rndv ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER;
  if (op->len > 0) {
    if (ucp_mem_h memh = memh_for(op->data, op->len)) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = memh;
    }
  }
  // 1.13 has no UCP_AM_SEND_FLAG_COPY_HEADER: op->header lives until the callback.
  put_channel_id(op->header, ch.tx_id);
  ucs_status_ptr_t r =
      ucp_am_send_nbx(ch.ep, kUserAm, op->header, kChannelIdBytes + op->header_len, op->data, op->len, &p);
  if (r == nullptr) {
    complete_send(op, true, "");
  } else if (UCS_PTR_IS_ERR(r)) {
    complete_send(op, false, "send to " + ch.peer() + ": " + ucs_status_string(UCS_PTR_STATUS(r)));
  } else {
    ++requests_in_flight_;
    ++ch.sends_in_flight;
  }
}

void UcxTransport::send_cb(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SendOp*>(user_data);
  const std::shared_ptr<UcxChannel> ch = op->channel;
  UcxTransport* t = ch->owner;
  ucp_request_free(request);
  --t->requests_in_flight_;
  --ch->sends_in_flight;
  std::string error;
  if (status != UCS_OK)
    error =
        ch->error_text.empty() ? "send to " + ch->peer() + ": " + ucs_status_string(status) : ch->error_text;
  t->complete_send(op, status == UCS_OK, error);
  if (ch->ep_closing && !ch->close_issued && ch->sends_in_flight == 0) t->close_ep(ch, /*force=*/false);
}

void UcxTransport::complete_send(SendOp* op, bool ok, const std::string& error) {
  if (ok) op->channel->count_sent(op->header_len + op->len);
  if (op->done) {
    try {
      op->done(ok, error);
    } catch (const std::exception& e) {
      log("a send's completion handler threw: " + std::string(e.what()));
    }
  }
  delete op;
}

// ---- Receives ------------------------------------------------------------------------

std::shared_ptr<UcxChannel> UcxTransport::channel_of(const void* header, size_t header_len) {
  if (header_len < kChannelIdBytes) return nullptr;
  uint64_t id = 0;
  for (size_t i = 0; i < kChannelIdBytes; ++i)
    id |= uint64_t{static_cast<const unsigned char*>(header)[i]} << (8 * i);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

ucs_status_t UcxTransport::on_user_am(const void* full_header, size_t full_len, void* data, size_t len,
                                      const ucp_am_recv_param_t* param) {
  const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  std::shared_ptr<UcxChannel> ch = channel_of(full_header, full_len);
  if (!ch || ch->awaiting_accept || ch->failed_ || ch->close_requested || shutting_down_ ||
      full_len - kChannelIdBytes > kMaxHeaderBytes)
    return rndv ? UCS_ERR_CANCELED : UCS_OK;  // dropped; a dropped rendezvous fails the sender's send
  const void* header = static_cast<const unsigned char*>(full_header) + kChannelIdBytes;
  const size_t header_len = full_len - kChannelIdBytes;
  const ChannelHandler& h = ch->handler;
  void* dst = nullptr;
  if (len > 0 && h.place) {
    try {
      dst = h.place(header, header_len, len);
    } catch (const std::exception& e) {
      log("place() for a message from " + ch->peer() + " threw: " + e.what() + "; message dropped");
      return rndv ? UCS_ERR_CANCELED : UCS_OK;
    }
  }
  if (rndv) {
    auto* r = new RecvOp;
    r->channel = ch;
    std::memcpy(r->header, header, header_len);
    r->header_len = header_len;
    r->desc = data;
    r->len = len;
    r->buffer = dst;
    if (!dst) {
      r->owned.reset(new (std::nothrow) unsigned char[len]);
      if (!r->owned) {
        log("no memory for a " + std::to_string(len) + "-byte message from " + ch->peer() + "; rejected");
        delete r;
        return UCS_ERR_NO_MEMORY;  // fails the sender's send
      }
      r->buffer = r->owned.get();
    }
    pending_rndv_.push_back(r);  // received after ucp_worker_progress returns
    return UCS_INPROGRESS;
  }
  if (dst && len > 0) std::memcpy(dst, data, len);
  ch->count_received(header_len + len);
  if (h.on_message) {
    try {
      h.on_message(header, header_len, len ? (dst ? dst : data) : nullptr, len);
    } catch (const std::exception& e) {
      log("on_message for " + ch->peer() + " threw: " + e.what());
    }
  }
  return UCS_OK;
}

void UcxTransport::start_rndv_receives() {
  std::vector<RecvOp*> batch;
  batch.swap(pending_rndv_);
  for (RecvOp* r : batch) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = recv_cb;
    p.user_data = r;
    if (ucp_mem_h memh = memh_for(r->buffer, r->len)) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = memh;
    }
    // UCX owns the descriptor once asked, whatever the outcome. It may also complete the
    // receive inside the call and run recv_cb there (a peer failing at that moment: seen with
    // sm under ASan, a use after free when recv_cb deleted r): recv_cb then only records the
    // status, and the receive is finished here, once, whatever the call returned.
    void* desc = r->desc;
    r->desc = nullptr;
    receiving_ = r;
    completed_inside_.reset();
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(worker_, desc, r->buffer, r->len, &p);
    receiving_ = nullptr;
    if (completed_inside_) {
      finish_recv(r, *completed_inside_);
    } else if (req == nullptr) {
      finish_recv(r, UCS_OK);
    } else if (UCS_PTR_IS_ERR(req)) {
      finish_recv(r, UCS_PTR_STATUS(req));
    } else {
      ++requests_in_flight_;
    }
  }
}

void UcxTransport::recv_cb(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* r = static_cast<RecvOp*>(user_data);
  UcxTransport* t = r->channel->owner;
  ucp_request_free(request);
  if (t->receiving_ == r) {  // inside ucp_am_recv_data_nbx: start_rndv_receives finishes it
    t->completed_inside_ = status;
    return;
  }
  --t->requests_in_flight_;
  t->finish_recv(r, status);
}

void UcxTransport::finish_recv(RecvOp* r, ucs_status_t status) {
  UcxChannel& ch = *r->channel;
  if (status == UCS_OK && !ch.failed_ && !ch.close_requested && !shutting_down_) {
    ch.count_received(r->header_len + r->len);
    if (ch.handler.on_message) {
      try {
        ch.handler.on_message(r->header, r->header_len, r->buffer, r->len);
      } catch (const std::exception& e) {
        log("on_message for " + ch.peer() + " threw: " + e.what());
      }
    }
  }
  delete r;
}

// ---- Memory registration ------------------------------------------------------------------

void UcxTransport::register_memory(void* data, size_t len) {
  if (data == nullptr || len == 0)
    throw TransportError(options_.name + ": register_memory of an empty range");
  run_on_progress_thread<int>(
      [data, len](UcxTransport& t) {
        const auto key = reinterpret_cast<uintptr_t>(data);
        if (t.regions_.count(key))
          throw TransportError(t.options_.name + ": register_memory: already registered");
        ucp_mem_map_params_t p{};
        p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        p.address = data;
        p.length = len;
        ucp_mem_h memh = nullptr;
        const ucs_status_t s = ucp_mem_map(t.context_, &p, &memh);
        if (s != UCS_OK)
          throw TransportError(t.options_.name + ": ucp_mem_map of " + std::to_string(len) +
                               " bytes: " + ucs_status_string(s));
        t.regions_[key] = MemRegion{len, memh};
        return 0;
      },
      "register_memory");
}

void UcxTransport::unregister_memory(void* data) {
  run_on_progress_thread<int>(
      [data](UcxTransport& t) {
        auto it = t.regions_.find(reinterpret_cast<uintptr_t>(data));
        if (it == t.regions_.end())
          throw TransportError(t.options_.name + ": unregister_memory: not registered");
        ucp_mem_unmap(t.context_, it->second.memh);
        t.regions_.erase(it);
        return 0;
      },
      "unregister_memory");
}

}  // namespace

std::unique_ptr<Transport> Transport::create(const TransportOptions& options) {
  return std::make_unique<UcxTransport>(options);
}

}  // namespace zenflow::transport
