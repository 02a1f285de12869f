// The host updater: runs accumulate and AdamW window steps on host-resident fp32 state.
//
// The backend owns the host state (master weights, m, v, the two window accumulators);
// the engine owns the staging buffers (gradients in, low-precision parameters out) and
// describes each piece of work as a job over spans of both. A streaming backend (remote
// nodes) reads each gradient through a GradSource instead, chunk by chunk as it sends,
// so the engine keeps no host copy of the gradients for it. A HostOptimizer runs jobs
// off the training thread and returns a HostWork handle per job (c10d's Work idiom):
// wait() is where the training thread spends time waiting, and where the engine
// measures the `host_optimizer` stall.
//
// Ordering: step jobs run in submission order; accumulate jobs run in submission order
// among themselves and may overtake a running step job (between its chunks), because
// the engine guarantees they touch disjoint memory (the next window's accumulator). A
// step job starts only once every accumulate job submitted before it has run.
// Backends: InProcessHostOptimizer (this file, a pinned thread pool on reserved cores);
// the remote backend (zenflow-optimizer nodes over UCX) implements the same interface.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/engine/adamw_kernel.h"
#include "worker/engine/half.h"

namespace zenflow::engine {

class HostThreadPool;

// The machine holding (part of) the host state is gone (a remote node lost): every job
// and transfer of the backend fails with it from then on. The state it held is lost; the
// run can only resume from its last committed checkpoint (optimizer.host.on_node_loss).
class HostBackendLost : public std::runtime_error {
 public:
  // `node`: the lost node's HOST:PORT when one is to blame ("" otherwise).
  // `unreachable_at_start`: the backend never reached it (no connection, no answer to the
  // session's first message) while it was being made: a wrong address or transport is a
  // configuration error, not a loss to recover from.
  explicit HostBackendLost(const std::string& what, std::string node = {}, bool unreachable_at_start = false)
      : std::runtime_error(what), node_(std::move(node)), unreachable_at_start_(unreachable_at_start) {}
  const std::string& node() const { return node_; }
  bool unreachable_at_start() const { return unreachable_at_start_; }

 private:
  std::string node_;
  bool unreachable_at_start_ = false;
};

// Completion handle of one submitted job. Thread safety: wait()/done() from any thread.
class HostWork {
 public:
  virtual ~HostWork() = default;
  // Blocks until the job has run; returns the seconds spent blocked. Rethrows an
  // exception the job raised.
  virtual double wait() = 0;
  virtual bool done() const = 0;
  // Seconds the job itself ran once done (a step job: from its first kernel to its last,
  // accumulate jobs run between its chunks included); negative when unknown.
  virtual double run_seconds() const { return -1; }
  // Of the seconds the last wait() returned, those spent waiting on the network (a remote
  // backend: the job's results were still in transfer after its node had computed them);
  // the engine books them as the `network` stall, the rest as `host_optimizer`.
  virtual double network_wait_seconds() const { return 0; }
};

// The host state a backend owns: five fp32 arrays of HostStateLayout::elements each.
// Jobs and transfers address them by (buffer, element offset); the engine never holds a
// pointer into them (a remote backend keeps them on another machine).
enum class HostBuf : uint32_t { kMaster = 0, kM = 1, kV = 2, kAcc0 = 3, kAcc1 = 4 };
constexpr int kNumHostBufs = 5;
inline HostBuf acc_buffer(int parity) { return parity == 0 ? HostBuf::kAcc0 : HostBuf::kAcc1; }
const char* host_buf_name(HostBuf b);  // "master", "m", "v", "acc0", "acc1"

// What the engine asks a backend to hold. Every array starts zero-filled.
struct HostStateLayout {
  int64_t elements = 0;  // per array
  bool huge_pages = true;
  int rank = 0;          // data-parallel rank whose shard this is (names, logs)
  int world = 1;
  // false: the engine opens no windows (offload mode) and never addresses kAcc0 or kAcc1;
  // a backend may hold no accumulator arrays (in-process: it holds none, so a job or a
  // transfer that names one is out of range).
  bool accumulators = true;
  // Ascending offsets where a matrix's slots begin (the first is 0). No job span and no
  // transfer crosses one, so a backend may split the arrays between machines there.
  std::vector<int64_t> segments;
};

// A job's gradient as a streaming backend reads it (HostOptimizer::gradient_chunk_bytes
// > 0): the engine keeps the step's packed gradient in its device-side staging and hands
// it out chunk by chunk, through a small ring of pinned host buffers, as the backend
// sends it; the worker never holds a host copy of a whole gradient. The engine reuses
// the staging once the backend has dropped the source and every chunk it took.
// Thread safety: chunk() from one thread at a time (the backend's sender).
class GradSource {
 public:
  virtual ~GradSource() = default;
  // Elements [offset, offset + n) of the packed gradient (the spans' GradRef type), in
  // host memory that stays valid and unchanged while the returned handle lives. Blocks
  // while the ring is full (back-pressure: chunks return as their sends complete).
  // n * element bytes <= gradient_chunk_bytes(). Throws std::runtime_error on a copy error.
  virtual std::shared_ptr<const void> chunk(int64_t offset, int64_t n) = 0;
};

// acc[offset + i] (+)= grad[i] * scale over each span (see accumulate_kernel.h). The
// gradient is the caller's (staging) memory, or with `source` set, elements
// [source_offset, + n) of it; the accumulator is the backend's.
struct AccumulateJob {
  struct Span {
    int64_t offset = 0;  // into `acc`
    GradRef grad;        // with `source`: only the type
    int64_t n = 0;
    int64_t source_offset = -1;
  };
  HostBuf acc = HostBuf::kAcc0;
  std::vector<Span> spans;
  std::shared_ptr<GradSource> source;  // streaming backends only
  float scale = 1.0f;
  bool overwrite = false;
  // Runs on the host updater's thread before the job's data is read, e.g. to wait for the
  // D2H copy that fills the gradient staging buffer. May be empty.
  std::function<void()> before;
};

// One AdamW step per span over master/m/v[offset, offset + n): plain, with `grad` (the
// caller's staging, or `source` from source_offset) as the gradient; window-end fused
// when `acc` is set too (gradient = (acc + grad) * grad_scale); or with the accumulator
// alone as the gradient (has_grad() false: flushing an open window). Each span carries
// its own coefficients (weight decay differs between parameters). `half_out` (caller's
// memory, may be null) receives the low-precision copy of the updated master, or
// `master_out` an fp32 copy (fp32 weights with a remote backend, whose master is on
// another machine: the copy comes back with the step instead of being read at the
// boundary); either is complete when the job's wait() returns. At most one is set.
struct StepJob {
  struct Span {
    int64_t offset = 0;
    int64_t n = 0;
    GradRef grad;  // with `source`: only the type
    uint16_t* half_out = nullptr;
    HalfKind half_kind = HalfKind::kBF16;
    float* master_out = nullptr;
    AdamWCoeffs coeffs;
    int64_t source_offset = -1;
    bool has_grad() const { return grad.data != nullptr || source_offset >= 0; }
  };
  std::vector<Span> spans;
  std::shared_ptr<GradSource> source;  // streaming backends only
  int acc = -1;  // the window accumulator (a HostBuf value), or -1
  float grad_scale = 1.0f;
  std::function<void()> before;
  // In-process backend only (an optimizer node streams each finished chunk's outputs back
  // while the rest of the step runs; others refuse a job that sets it): called on the
  // backend's thread, in order, after each chunk of the step with the finished range
  // [lo, hi) of the spans' elements laid end to end; every output of those elements is
  // written. It must not block; an exception it throws fails the job.
  std::function<void(int64_t lo, int64_t hi)> after_chunk;
};

// Columns `cols` of the row-major [rows, width] matrix at `offset` of host array `buf`,
// and the caller's [rows, cols.size()] array they are gathered into or scattered from.
struct ColumnBlock {
  HostBuf buf = HostBuf::kMaster;
  int64_t offset = 0, rows = 0, width = 0;
  std::vector<int64_t> cols;
  float* data = nullptr;
};

class HostOptimizer {
 public:
  virtual ~HostOptimizer() = default;
  // Submit from the training thread only. The caller keeps every caller-side buffer a job
  // refers to (gradients, half_out) alive and untouched until the job's wait() returned.
  virtual std::shared_ptr<HostWork> submit(AccumulateJob job) = 0;
  virtual std::shared_ptr<HostWork> submit(StepJob job) = 0;
  // Blocks until every submitted job has run; returns seconds blocked.
  virtual double drain() = 0;
  virtual int threads() const = 0;
  // > 0: this backend streams gradients (a remote one): jobs carry a GradSource, read in
  // chunks of at most this many bytes, instead of GradRef memory. 0: jobs read GradRef
  // memory, which the engine stages in full (in-process).
  virtual int64_t gradient_chunk_bytes() const { return 0; }

  // --- Transfers of the host state (training thread) ---
  // Each sees the effect of every job submitted before it. The caller guarantees that no
  // job still running or queued writes what a transfer touches, or reads what it writes
  // (the engine orders them so: re-selection, restore and checkpoint run between jobs).
  // Errors (a remote node lost) are thrown as std::runtime_error naming the backend.
  virtual void read(HostBuf b, int64_t offset, int64_t n, float* dst) = 0;
  virtual void write(HostBuf b, int64_t offset, int64_t n, const float* src) = 0;
  // read(), started: dst holds the data once the returned work's wait() has returned (it
  // throws what read() would), and the caller keeps dst alive until then, even after an
  // error. A remote backend posts it and returns, so that reads started together overlap
  // each other and the caller's work; the base class reads at once.
  virtual std::shared_ptr<HostWork> start_read(HostBuf b, int64_t offset, int64_t n, float* dst);
  // Columns of host matrices (ColumnBlock), gathered into or scattered from each block's
  // data. A remote backend sends every block before it waits for any, so that a
  // re-selection's moves cost one round trip, not one per matrix and array; it returns
  // (or throws the first error) only once no block's data is still in use.
  virtual void gather_columns(const std::vector<ColumnBlock>& blocks) = 0;
  virtual void scatter_columns(const std::vector<ColumnBlock>& blocks) = 0;
  // Re-packs the row-major [rows, width] matrix at `offset` in place: it becomes [rows,
  // src.size()], column j taken from column src[j] of [the matrix | appended], appended
  // being the caller's [rows, n_appended] (a re-selection's columns leaving the device). A
  // remote backend sends only the appended columns: the matrix never crosses the network.
  virtual void repack_columns(HostBuf b, int64_t offset, int64_t rows, int64_t width,
                              const std::vector<int64_t>& src, const float* appended, int64_t n_appended) = 0;
  // The array itself when it lives in this process (the in-process backend), else null:
  // the engine then reads and writes in place instead of through copies.
  virtual float* local_data(HostBuf) { return nullptr; }
  // Bytes of host state (the five arrays) this process holds: all of it in-process,
  // none with remote nodes.
  virtual int64_t resident_state_bytes() const = 0;
  // Bytes moved to and from other machines so far (0 in-process).
  virtual int64_t network_bytes_sent() const { return 0; }
  virtual int64_t network_bytes_received() const { return 0; }
  // Where the state lives, for logs and the run summary ("in-process", "node 127.0.0.1:4000, …").
  virtual std::string describe() const = 0;
};

// Builds the backend for one engine: EngineOptions::host_backend. Called once, from the
// engine's constructor, with the layout of this rank's host state.
using HostOptimizerFactory = std::function<std::unique_ptr<HostOptimizer>(const HostStateLayout&)>;

struct InProcessHostOptions {
  int threads = 1;
  std::vector<int> cores;  // pin the pool here; empty = unpinned
  // Step jobs are cut into chunks of about this many elements; accumulate jobs that
  // arrive meanwhile run between chunks.
  int64_t chunk_elements = 1 << 20;
  // Touch the arrays from the pool's own (pinned) threads at construction, so their pages
  // sit on those threads' NUMA node (the optimizer node does; the engine lets them fault).
  bool first_touch = false;
};

// A driver thread that takes jobs from two queues (accumulate first) and runs their
// kernels across a HostThreadPool.
// Allocates `layout`'s arrays in this process.
std::unique_ptr<HostOptimizer> make_in_process_host_optimizer(const InProcessHostOptions& options,
                                                              const HostStateLayout& layout);

// Column copies within a row-major [rows, width] fp32 matrix (what the backends'
// gather_columns/scatter_columns do to their arrays).
void host_gather_columns(const float* matrix, int64_t rows, int64_t width, const std::vector<int64_t>& cols,
                         float* dst);
void host_scatter_columns(float* matrix, int64_t rows, int64_t width, const std::vector<int64_t>& cols,
                          const float* src);
// repack_columns on an array: row by row through a one-row copy, in the order in which no
// row is overwritten before it was read (ascending when the matrix narrows, else descending).
void host_repack_columns(float* matrix, int64_t rows, int64_t width, const std::vector<int64_t>& src,
                         const float* appended, int64_t n_appended);

}  // namespace zenflow::engine
