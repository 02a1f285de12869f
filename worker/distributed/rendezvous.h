// Rank identity and rendezvous address of one rank process of a data-parallel job.
//
// A rank process learns who it is from explicit inputs, never from the local launcher
// alone: `zenflow run --nproc N` (launcher.h) sets these environment variables for the
// ranks it starts on this machine, and the coordinator's worker agents (a later issue)
// pass the same values with each assignment on other machines.
//
//   ZENFLOW_RANK            required  integer in [0, world_size)
//   ZENFLOW_WORLD_SIZE      required  integer >= 1
//   ZENFLOW_MASTER_ADDR     required  host or IPv4 address of rank 0, which hosts the
//                                     rendezvous TCPStore
//   ZENFLOW_MASTER_PORT     required  TCP port of that store, 1..65535
//   ZENFLOW_DIST_TIMEOUT_S  optional  seconds (may be fractional, > 0) bounding the
//                                     rendezvous and every collective; default 300
//   ZENFLOW_LOCAL_ADDR      optional  address this rank's Gloo transport binds to;
//                                     default: 127.0.0.1 when the master address is a
//                                     loopback address, else this host's name
//   ZENFLOW_STORE_EXTERNAL  optional  "1": the store at master_addr:master_port is
//                                     hosted outside the ranks (the local launcher, a
//                                     worker agent: a StoreServer below) and rank 0
//                                     only connects to it; "0" or unset: rank 0 hosts it
//
// Errors: std::invalid_argument naming the variable, its value and what was expected.
// Thread safety: pure functions (rank_info_from_env reads the environment).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace zenflow::distributed {

inline constexpr const char* kEnvRank = "ZENFLOW_RANK";
inline constexpr const char* kEnvWorldSize = "ZENFLOW_WORLD_SIZE";
inline constexpr const char* kEnvMasterAddr = "ZENFLOW_MASTER_ADDR";
inline constexpr const char* kEnvMasterPort = "ZENFLOW_MASTER_PORT";
inline constexpr const char* kEnvTimeout = "ZENFLOW_DIST_TIMEOUT_S";
inline constexpr const char* kEnvLocalAddr = "ZENFLOW_LOCAL_ADDR";
inline constexpr const char* kEnvStoreExternal = "ZENFLOW_STORE_EXTERNAL";
inline constexpr const char* kEnvLocalRank = "ZENFLOW_LOCAL_RANK";
inline constexpr const char* kEnvLocalWorldSize = "ZENFLOW_LOCAL_WORLD_SIZE";
inline constexpr const char* kEnvWorkerFirstRank = "ZENFLOW_WORKER_FIRST_RANK";
inline constexpr const char* kEnvWorkerRanks = "ZENFLOW_WORKER_RANKS";
inline constexpr std::chrono::milliseconds kDefaultDistTimeout{300'000};

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 only for world_size == 1 (rank 0 then picks a free port)
  std::chrono::milliseconds timeout = kDefaultDistTimeout;
  std::string local_addr;       // "" = auto (see above)
  bool store_external = false;  // true: no rank hosts the store (see above)

  // Throws std::invalid_argument when a field is out of range (naming the field).
  void validate() const;
  std::string to_string() const;  // "rank 1 of 2, store 127.0.0.1:29500, timeout 5 s"
};

// True when ZENFLOW_WORLD_SIZE is set: this process is a rank of a distributed job.
bool distributed_env_present();

// Reads and validates the variables above.
RankInfo rank_info_from_env();

// Same, reading through `lookup` (returns nullptr when a variable is unset); for tests
// and for callers that hold the values in another map.
RankInfo rank_info_from_lookup(const std::function<const char*(const char*)>& lookup);

// Parses seconds ("5", "0.5") into milliseconds; throws std::invalid_argument naming
// `what` when the text is not a positive finite number.
std::chrono::milliseconds parse_timeout_seconds(const std::string& text, const std::string& what);

// Resolves the rendezvous host `host` (ZENFLOW_MASTER_ADDR) before any store connection:
// c10d's TCPStore client retries a failed name lookup until its timeout, so a mistyped
// host would otherwise cost the whole timeout (300 s by default) and end in a message
// that does not say the name is wrong. A name that does not exist (EAI_NONAME, EAI_FAIL,
// EAI_NODATA) throws std::invalid_argument at once, naming ZENFLOW_MASTER_ADDR and the
// host; a temporary failure (EAI_AGAIN) is retried until `timeout`, then throws
// std::runtime_error naming them; any other lookup error throws std::runtime_error at once.
void resolve_master_addr(const std::string& host, std::chrono::milliseconds timeout);

// A rendezvous store hosted outside the ranks: a c10d::TCPStore server that lives as
// long as this object. The local launcher runs one (bound before any rank starts, so the
// port cannot be taken in between, and alive when rank 0 dies, so that the survivors'
// heartbeats name it); ranks then get ZENFLOW_STORE_EXTERNAL=1. Port 0 picks a free
// port (port() tells which). Throws std::runtime_error when the port cannot be bound,
// and resolve_master_addr's errors for a host that cannot be resolved.
// Thread safety: construct and destroy on one thread; port() from any.
class StoreServer {
 public:
  explicit StoreServer(const std::string& host = "127.0.0.1", int port = 0,
                       std::chrono::milliseconds timeout = kDefaultDistTimeout);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// This process's place among the ranks started on its machine (ZENFLOW_LOCAL_RANK of
// ZENFLOW_LOCAL_WORLD_SIZE, set by the local launcher and the worker agents): it picks the
// GPU and the slice of the machine's cores. Rank 0 of 1 when unset; std::invalid_argument
// naming the variable when malformed.
struct LocalPlacement {
  int rank = 0;
  int world_size = 1;
};
LocalPlacement local_placement_from_lookup(const std::function<const char*(const char*)>& lookup);
LocalPlacement local_placement_from_env();

// The ranks of this job that run on this process's worker, and so share its disk (a staging
// directory, a cache): [first, first + count). The worker agent says so
// (ZENFLOW_WORKER_FIRST_RANK, ZENFLOW_WORKER_RANKS: its slots, the local placement above,
// are the machine's GPUs, not this job's ranks); otherwise ranks are placed as a local
// launcher places them, [rank - local rank, + local world size); without the rendezvous
// variables, {0, 1}. std::invalid_argument naming the variable when malformed or when the
// rank is not among them.
struct WorkerRanks {
  int first = 0;
  int count = 1;
  bool holds(int64_t rank) const { return rank >= first && rank < first + count; }
};
WorkerRanks worker_ranks_from_lookup(const std::function<const char*(const char*)>& lookup);
WorkerRanks worker_ranks_from_env();

}  // namespace zenflow::distributed
