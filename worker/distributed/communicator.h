// Communicator: one rank's membership of a data-parallel job, on LibTorch's c10d.
//
// Rendezvous: rank 0 hosts a c10d::TCPStore at master_addr:master_port (or, with
// RankInfo::store_external, a StoreServer outside the ranks does — the local launcher's
// default); every rank connects to it, announces itself, and waits (bounded by
// rendezvous_timeout) until all world_size ranks have joined; then a process group is
// built over the store:
//   * CPU tensors  -> c10d::ProcessGroupGloo (TCP transport bound to the local address);
//   * CUDA tensors -> c10d::ProcessGroupNCCL, when this LibTorch has it (USE_C10D_NCCL);
//                     the caller selects the CUDA device before constructing.
// A TCPStore client has no receive timeout, so every store operation that could meet a
// silent endpoint (construction, heartbeat, failure probe, close) runs on a helper thread
// that is waited for with a deadline and let go past it.
//
// Collectives are c10d's, not home-made. Every one is bounded: Gloo's transport timeout
// and each wait are set to RankInfo::timeout. Failure handling: each rank runs a small
// heartbeat thread that bumps the store counter `zenflow/hb/<rank>` every
// heartbeat_interval. When a collective fails or times out (a peer died, hung, or
// diverged), the communicator samples every rank's counter twice, 3 intervals apart,
// and throws std::runtime_error naming the operation, its size, the timeout, the time
// it took and the lost ranks (those whose counter stopped; rank 0 when the store itself
// is unreachable). After a failure the communicator is unusable: every later call throws
// at once with the first failure's message.
//
// Reduce-scatter: Gloo (LibTorch 1.13) has no reduce_scatter, so on Gloo it is an
// all-to-all of the per-owner shards (c10d alltoall_base with split sizes, i.e. Gloo's
// alltoallv) followed by a local sum of the W received pieces; each rank sends
// (W-1)/W of the buffer, what a ring reduce-scatter sends, against 2(W-1)/W for
// allreduce + slice (ReduceScatterAlgo::kAllreduce, kept for comparison). On NCCL it is
// _reduce_scatter_base over equal, zero-padded chunks. All-gather of variable shard
// sizes pads every shard to the largest one (Gloo allgather / NCCL _allgather_base).
//
// bf16 on Gloo: LibTorch 1.13's Gloo has no bf16 reductions or moves, so bf16 buffers
// travel as fp32 (sums then round once); NCCL takes bf16 natively.
//
// Byte counters (stats()): per collective kind and per traffic class (gradients,
// selection scores, parameters, other), counting the logical size S of the collective's
// whole buffer (allreduce: the buffer; reduce_scatter: the full input; all_gather: the
// full output; broadcast: the tensor) — the size nccl-tests call the message size. Bytes
// a rank puts on the wire are about 2(W-1)/W*S for a ring allreduce and (W-1)/W*S for
// reduce_scatter / all_gather.
//
// Wait accounting: KindStats::wait_seconds is the time callers were blocked. On NCCL a
// wait only makes the current CUDA stream wait (the watchdog enforces the timeout), so
// the stall shows on the stream, not here.
//
// Threads: every method may be called from any thread; launches are serialized by one
// mutex, waits happen outside it. Ranks must launch collectives in the same order
// (c10d's rule); callers that launch from several threads must keep that order the
// same on every rank (GradReducer launches its buckets in a fixed order).
// Errors: std::invalid_argument for bad arguments (shapes, shard sizes, devices);
// std::runtime_error for rendezvous, transport and peer failures.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/distributed/rendezvous.h"

namespace zenflow::distributed {

enum class CollectiveKind { kAllreduce = 0, kReduceScatter, kAllGather, kBroadcast, kBarrier };
constexpr int kNumCollectiveKinds = 5;
const char* collective_kind_name(CollectiveKind kind);  // "allreduce", "reduce_scatter", ...

// What a collective carries, for the selection-vs-gradient bytes figure.
enum class Traffic { kGradients = 0, kSelection, kParameters, kOther };
constexpr int kNumTraffic = 4;
const char* traffic_name(Traffic t);  // "gradients", "selection", "parameters", "other"

enum class Reduction { kSum, kMean };
// kNative: Gloo all-to-all + local sum, NCCL reduce_scatter (see above);
// kAllreduce: allreduce of the whole buffer, then the local slice (for comparison).
enum class ReduceScatterAlgo { kNative, kAllreduce };

struct KindStats {
  int64_t calls = 0;
  int64_t bytes = 0;          // logical bytes (see header comment)
  double wait_seconds = 0.0;  // time callers spent blocked waiting for completion
};

struct CommStats {
  std::array<KindStats, kNumCollectiveKinds> by_kind{};
  std::array<int64_t, kNumTraffic> bytes_by_traffic{};
  const KindStats& kind(CollectiveKind k) const { return by_kind[static_cast<int>(k)]; }
  int64_t traffic_bytes(Traffic t) const { return bytes_by_traffic[static_cast<int>(t)]; }
  int64_t total_bytes() const;
};

struct CommunicatorOptions {
  // kCPU -> Gloo; kCUDA -> NCCL (std::invalid_argument when this LibTorch lacks NCCL).
  at::DeviceType device_type = at::kCPU;
  int gloo_threads = 2;  // Gloo worker threads (collectives in flight at once)
  // Bound on the rendezvous (all ranks joining: process start-up included), which may
  // need longer than a collective. 0 = RankInfo::timeout.
  std::chrono::milliseconds rendezvous_timeout{0};
  // 0 = auto: timeout / 10, clamped to [50 ms, 1 s].
  std::chrono::milliseconds heartbeat_interval{0};
  // Rank 0 waits this long at destruction for the other ranks to close, so that the
  // store it hosts outlives their last use of it. 0 = auto: min(timeout, 5 s).
  std::chrono::milliseconds close_grace{0};
  // Rendezvous generation: every store key is under "zenflow/g<N>/" for N > 0. Ranks that
  // join again in the same processes and store (all of them retrying in-process after an
  // optimizer node was lost) use a higher one, so their keys do not meet the last join's.
  int64_t generation = 0;
};

namespace detail {
struct PendingOp;
}

class Communicator;

// A collective in flight (from the *_async calls). The Communicator must outlive it.
class CommWork {
 public:
  CommWork() = default;
  bool valid() const { return op_ != nullptr; }
  // Blocks until the collective completes (bounded by the timeout) and returns the
  // seconds spent blocked. A second call returns 0. Throws std::runtime_error as the
  // synchronous collectives do.
  double wait();
  bool is_completed() const;  // non-blocking

 private:
  friend class Communicator;
  std::shared_ptr<detail::PendingOp> op_;
};

class Communicator {
 public:
  // Rendezvous and process-group creation; blocks until every rank has joined, bounded
  // by rendezvous_timeout + timeout + 2 s in all (a silent store endpoint included).
  // Throws std::invalid_argument for bad info/options and std::runtime_error naming the
  // missing ranks on timeout.
  explicit Communicator(const RankInfo& info, CommunicatorOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int world_size() const;
  std::chrono::milliseconds timeout() const;
  std::chrono::milliseconds heartbeat_interval() const;
  int master_port() const;      // the store's port (the chosen one when 0 was asked)
  std::string backend() const;  // "gloo" | "nccl"
  at::DeviceType device_type() const;

  // In place over all ranks. Any dense tensor on the communicator's device; a
  // non-contiguous one is reduced through a contiguous copy.
  void allreduce_sum_(at::Tensor& t, Traffic traffic = Traffic::kOther);
  void allreduce_mean_(at::Tensor& t, Traffic traffic = Traffic::kOther);
  // A list, coalesced into one flat buffer (one collective); all of one dtype/device.
  void allreduce_sum_(std::vector<at::Tensor>& ts, Traffic traffic = Traffic::kOther);
  void allreduce_mean_(std::vector<at::Tensor>& ts, Traffic traffic = Traffic::kOther);
  // Asynchronous sum of a contiguous tensor, in place: `t` must not be touched until
  // the returned work has been waited for.
  CommWork allreduce_sum_async(const at::Tensor& t, Traffic traffic = Traffic::kOther);

  // Reduces a flat (1-D) buffer over all ranks and returns this rank's shard: elements
  // [offset(rank), offset(rank) + shard_sizes[rank]) of the reduced buffer, where
  // offset(r) = sum(shard_sizes[0..r)). shard_sizes has world_size entries (zeros
  // allowed) summing to flat.numel().
  at::Tensor reduce_scatter(const at::Tensor& flat, const std::vector<int64_t>& shard_sizes,
                            Reduction reduction = Reduction::kSum, Traffic traffic = Traffic::kOther,
                            ReduceScatterAlgo algo = ReduceScatterAlgo::kNative);
  // Inverse layout: every rank passes its shard (shard_sizes[rank] elements); returns
  // the concatenation of all shards in rank order (sum(shard_sizes) elements).
  at::Tensor all_gather(const at::Tensor& shard, const std::vector<int64_t>& shard_sizes,
                        Traffic traffic = Traffic::kOther);
  // The same, asynchronous: `*result` holds all_gather's return value once the returned
  // work has been waited for (an empty work when every shard is empty: `*result` is set
  // at once). `shard` may be reused at once.
  CommWork all_gather_async(const at::Tensor& shard, const std::vector<int64_t>& shard_sizes, Traffic traffic,
                            std::shared_ptr<at::Tensor> result);
  // Copies root's tensor into every rank's `t` (same shape and dtype on every rank).
  void broadcast_(at::Tensor& t, int root, Traffic traffic = Traffic::kOther);
  void barrier();

  // Whether this LibTorch has the process groups (compile-time: USE_C10D_NCCL /
  // USE_C10D_GLOO in Torch's CMake config).
  static bool nccl_available();
  static bool gloo_available();

  // `numel` split into world_size contiguous shards whose sizes differ by at most one.
  static std::vector<int64_t> even_shards(int64_t numel, int world_size);

  CommStats stats() const;
  void reset_stats();
  bool failed() const;
  std::string failure_message() const;  // "" until a failure

 private:
  friend class CommWork;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zenflow::distributed
