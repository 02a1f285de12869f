// Rank identity from the environment, the rendezvous host check, and the external store.
#include "worker/distributed/rendezvous.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace zenflow::distributed {
namespace {

long long parse_integer(const char* name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0' || errno == ERANGE) {
    throw std::invalid_argument(std::string(name) + "='" + text + "' is not an integer");
  }
  return v;
}

const char* required(const std::function<const char*(const char*)>& lookup, const char* name) {
  const char* v = lookup(name);
  if (v == nullptr || *v == '\0') {
    throw std::invalid_argument(std::string(name) +
                                " is not set (a distributed rank needs ZENFLOW_RANK, "
                                "ZENFLOW_WORLD_SIZE, ZENFLOW_MASTER_ADDR and ZENFLOW_MASTER_PORT)");
  }
  return v;
}

}  // namespace

std::chrono::milliseconds parse_timeout_seconds(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const double s = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(s) ||
      s <= 0.0 || s > 1e7) {
    throw std::invalid_argument(what + "='" + text +
                                "' is not a positive number of seconds (e.g. 300 or 0.5)");
  }
  const auto ms = static_cast<long long>(std::llround(s * 1000.0));
  return std::chrono::milliseconds(ms < 1 ? 1 : ms);
}

void RankInfo::validate() const {
  if (world_size < 1) {
    throw std::invalid_argument("world_size (" + std::string(kEnvWorldSize) + ") must be >= 1, got " +
                                std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument("rank (" + std::string(kEnvRank) + ") must be in [0, " +
                                std::to_string(world_size) + "), got " + std::to_string(rank));
  }
  if (master_addr.empty()) {
    throw std::invalid_argument("master_addr (" + std::string(kEnvMasterAddr) + ") is empty");
  }
  if (master_port < 0 || master_port > 65535 || (master_port == 0 && world_size > 1)) {
    throw std::invalid_argument("master_port (" + std::string(kEnvMasterPort) +
                                ") must be in 1..65535 (0 only for a single rank), got " +
                                std::to_string(master_port));
  }
  if (timeout.count() <= 0) {
    throw std::invalid_argument("timeout (" + std::string(kEnvTimeout) + ") must be positive, got " +
                                std::to_string(timeout.count()) + " ms");
  }
}

std::string RankInfo::to_string() const {
  std::ostringstream os;
  os << "rank " << rank << " of " << world_size << ", store " << master_addr << ":" << master_port
     << (store_external ? " (external)" : "") << ", timeout " << static_cast<double>(timeout.count()) / 1000.0
     << " s";
  return os.str();
}

bool distributed_env_present() {
  const char* v = std::getenv(kEnvWorldSize);
  return v != nullptr && *v != '\0';
}

RankInfo rank_info_from_lookup(const std::function<const char*(const char*)>& lookup) {
  RankInfo info;
  const long long world = parse_integer(kEnvWorldSize, required(lookup, kEnvWorldSize));
  if (world < 1 || world > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(std::string(kEnvWorldSize) + "=" + std::to_string(world) + " must be >= 1");
  }
  info.world_size = static_cast<int>(world);
  const long long rank = parse_integer(kEnvRank, required(lookup, kEnvRank));
  if (rank < 0 || rank >= world) {
    throw std::invalid_argument(std::string(kEnvRank) + "=" + std::to_string(rank) + " must be in [0, " +
                                std::to_string(world) + ") (" + kEnvWorldSize + "=" + std::to_string(world) +
                                ")");
  }
  info.rank = static_cast<int>(rank);
  info.master_addr = required(lookup, kEnvMasterAddr);
  const long long port = parse_integer(kEnvMasterPort, required(lookup, kEnvMasterPort));
  if (port < 1 || port > 65535) {
    throw std::invalid_argument(std::string(kEnvMasterPort) + "=" + std::to_string(port) +
                                " must be a TCP port in 1..65535");
  }
  info.master_port = static_cast<int>(port);
  if (const char* t = lookup(kEnvTimeout); t != nullptr && *t != '\0') {
    info.timeout = parse_timeout_seconds(t, kEnvTimeout);
  }
  if (const char* a = lookup(kEnvLocalAddr); a != nullptr) info.local_addr = a;
  if (const char* x = lookup(kEnvStoreExternal); x != nullptr && *x != '\0') {
    const std::string v = x;
    if (v == "1") {
      info.store_external = true;
    } else if (v != "0") {
      throw std::invalid_argument(std::string(kEnvStoreExternal) + "='" + v + "' must be 0 or 1");
    }
  }
  info.validate();
  return info;
}

void resolve_master_addr(const std::string& host, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(100);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc == 0) {
      ::freeaddrinfo(res);
      return;
    }
    const std::string what = std::string(kEnvMasterAddr) + "='" + host + "'";
    bool no_such_name = rc == EAI_NONAME || rc == EAI_FAIL;
#ifdef EAI_NODATA
    no_such_name = no_such_name || rc == EAI_NODATA;
#endif
    if (no_such_name) {
      throw std::invalid_argument(what + ": the rendezvous host cannot be resolved (" + gai_strerror(rc) +
                                  "); set it to rank 0's host name or IP address");
    }
    const auto now = std::chrono::steady_clock::now();
    if (rc != EAI_AGAIN || now >= deadline) {
      throw std::runtime_error(what + ": looking up the rendezvous host failed" +
                               (rc == EAI_AGAIN ? " until the timeout" : "") + ": " + gai_strerror(rc));
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(2000));
  }
}

struct StoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreServer::StoreServer(const std::string& host, int port, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  if (port < 0 || port > 65535) throw std::invalid_argument("StoreServer: port must be in 0..65535");
  // The store's own client connects to `host`, retrying a failed lookup until the timeout.
  resolve_master_addr(host, timeout);
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = timeout;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host, so);
  } catch (const std::exception& e) {
    const auto* ce = dynamic_cast<const c10::Error*>(&e);
    throw std::runtime_error("zenflow distributed: cannot host a rendezvous store on " + host + ":" +
                             std::to_string(port) + ": " + (ce ? ce->what_without_backtrace() : e.what()));
  }
}

StoreServer::~StoreServer() = default;

int StoreServer::port() const { return impl_->store->getPort(); }

RankInfo rank_info_from_env() {
  return rank_info_from_lookup([](const char* name) { return std::getenv(name); });
}

LocalPlacement local_placement_from_env() {
  return local_placement_from_lookup([](const char* name) { return std::getenv(name); });
}

WorkerRanks worker_ranks_from_env() {
  return worker_ranks_from_lookup([](const char* name) { return std::getenv(name); });
}

WorkerRanks worker_ranks_from_lookup(const std::function<const char*(const char*)>& lookup) {
  WorkerRanks w;
  const char* rank_text = lookup(kEnvRank);
  if (rank_text == nullptr || *rank_text == '\0') return w;
  const int64_t rank = parse_integer(kEnvRank, rank_text);
  const char* first = lookup(kEnvWorkerFirstRank);
  const char* count = lookup(kEnvWorkerRanks);
  if (first != nullptr && *first != '\0' && count != nullptr && *count != '\0') {
    w.first = static_cast<int>(parse_integer(kEnvWorkerFirstRank, first));
    w.count = static_cast<int>(parse_integer(kEnvWorkerRanks, count));
  } else {
    const LocalPlacement p = local_placement_from_lookup(lookup);
    w.first = static_cast<int>(rank) - p.rank;
    w.count = p.world_size;
  }
  if (w.first < 0 || w.count < 1 || !w.holds(rank))
    throw std::invalid_argument(std::string(kEnvRank) + "=" + std::to_string(rank) + " is not among this worker's ranks [" +
                                std::to_string(w.first) + ", " + std::to_string(w.first + w.count) + ") (" +
                                kEnvWorkerFirstRank + ", " + kEnvWorkerRanks + ", or the local placement)");
  return w;
}

LocalPlacement local_placement_from_lookup(const std::function<const char*(const char*)>& lookup) {
  LocalPlacement p;
  const char* rank = lookup(kEnvLocalRank);
  const char* world = lookup(kEnvLocalWorldSize);
  if (world != nullptr && *world != '\0') p.world_size = static_cast<int>(parse_integer(kEnvLocalWorldSize, world));
  if (rank != nullptr && *rank != '\0') p.rank = static_cast<int>(parse_integer(kEnvLocalRank, rank));
  if (p.world_size < 1 || p.rank < 0 || p.rank >= p.world_size)
    throw std::invalid_argument(std::string(kEnvLocalRank) + "=" + std::to_string(p.rank) + " is not a rank of " +
                                kEnvLocalWorldSize + "=" + std::to_string(p.world_size));
  return p;
}

}  // namespace zenflow::distributed
