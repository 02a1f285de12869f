// ZenFlowOptimizer: device updater, host updater, windows and selection
// (docs/semantics.md, section numbers below refer to it).
#include "worker/engine/zenflow_optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "worker/engine/device_ops.h"
#include "worker/engine/device_streams.h"
#include "worker/engine/engine_scalars.h"
#include "worker/engine/gradient_staging.h"
#include "worker/engine/host_optimizer.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/engine/shard_layout.h"
#include "worker/engine/window_schedule.h"

namespace zenflow::engine {

bool zenflow_splits(at::IntArrayRef shape, int64_t min_split_numel) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return shape.size() == 2 && numel >= min_split_numel;
}

OptimizerMode parse_optimizer_mode(const std::string& s) {
  if (s == "device") return OptimizerMode::kDevice;
  if (s == "offload") return OptimizerMode::kOffload;
  if (s == "zenflow") return OptimizerMode::kZenFlow;
  throw std::invalid_argument("optimizer mode must be device, offload or zenflow, got '" + s + "'");
}

namespace {

at::Tensor index_tensor(const std::vector<int64_t>& v, at::Device device) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t.to(device);
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::string shape_str(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::vector<int64_t> complement(const std::vector<int64_t>& sorted_sel, int64_t n) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n) - sorted_sel.size());
  size_t s = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (s < sorted_sel.size() && sorted_sel[s] == j) {
      ++s;
      continue;
    }
    out.push_back(j);
  }
  return out;
}

GradRef::Type grad_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return GradRef::Type::kF32;
    case at::kBFloat16: return GradRef::Type::kBF16;
    case at::kHalf: return GradRef::Type::kFP16;
    default: throw std::invalid_argument("unsupported gradient dtype");
  }
}

GradRef grad_ref(const at::Tensor& t, int64_t offset) {
  return GradRef{static_cast<const char*>(t.data_ptr()) + offset * static_cast<int64_t>(t.element_size()),
                 grad_type(t.scalar_type())};
}

// The host-owned columns of one matrix that one rank's host updater holds.
struct Part {
  std::vector<int64_t> cols;  // in storage order (slots keep their columns across re-selections)
  at::Tensor idx;             // the same, int64 on the device
  int64_t stage_offset = 0;   // into the all-rank packed staging layout (see relayout)
};

// A parameter whose columns are split between the device and the host updater.
struct SplitParam {
  size_t index = 0;
  at::Tensor w2d;  // detached [out, in] view of the parameter
  int64_t out = 0, in = 0, k = 0;
  bool decay = true;
  double weight_decay = 0;
  std::vector<int64_t> sel_cpu, unsel_cpu;  // sel ascending; unsel: host-owned columns of all ranks,
                                            // rank by rank in storage order
  at::Tensor sel;                           // sel_cpu, int64 on the device
  ColumnRanges ranges;                      // per rank: the columns whose host state it owns
  std::vector<Part> parts;                  // per rank: unsel_cpu within its range
  int me = 0;                               // this rank
  at::Tensor dev_m, dev_v, dev_master;      // [out, k] fp32 on the device
  int64_t host_offset = 0;                  // into this rank's host arenas (capacity out * range)
  int64_t local_offset = 0;                 // into this rank's packed staging (its shard)
  at::Tensor score_acc;                     // this window's column importance, fp32 [in]
  // EngineOptions::columns_streamed: w2d is the host parameter tensor (written only by
  // sync_parameters); the selected columns' weights and this step's gradient of them live
  // here ([out, k] on the device, the weights' dtype), the host-owned ones' in param_out
  // and host_grad. got_grad: a unit gradient arrived this step.
  at::Tensor w_sel, g_sel;
  bool got_grad = false;
  // ... and where every rank's host-owned columns are in the matrix-major buffers (host_grad,
  // the streamed weights): [out, n_host()] at all_offset, columns in unsel_cpu order
  // (`unsel` on the device). With one rank the same as this rank's staging layout.
  at::Tensor unsel;
  int64_t all_offset = 0;
  int64_t n_host() const { return static_cast<int64_t>(unsel_cpu.size()); }
  const Part& own() const { return parts[static_cast<size_t>(me)]; }
  int64_t n_own() const { return static_cast<int64_t>(own().cols.size()); }
  int64_t own_elems() const { return n_own() * out; }
  bool owns(int64_t c) const { return ranges.holds(me, c); }
};

// A parameter updated in full on the device every step.
struct DenseParam {
  size_t index = 0;
  at::Tensor p;  // detached
  at::Tensor m, v, master;
  double weight_decay = 0;
};

// Leaving columns of one matrix whose host slots the in-flight host step still writes
// (it runs on the layout from before a re-selection): their state goes in once it is done.
struct SlotFix {
  size_t split_index = 0;
  at::Tensor slots;     // CPU int64: positions in this rank's host arrays
  at::Tensor state[3];  // CPU fp32 [out, n]: master, m, v
  at::Tensor weights;   // CPU, the weights' dtype [out, n]: the columns' current weights
};

// The host step whose result has not yet been copied to the device.
struct InFlight {
  std::shared_ptr<HostWork> work;  // null after a restore: the result is already in the master
  int buffer = 0;                  // param_out buffer holding its low-precision output
  // Its window's accumulate jobs (the backend runs them before the step): waited with it,
  // so that an error of theirs is not lost.
  std::vector<std::shared_ptr<HostWork>> accumulates;
};

// A parameter (or its gradient) as the [out, in] matrix whose columns the engine splits and
// whose norm it sums column by column: a 2-D one as it is, any other shape one column.
at::Tensor as_columns(const at::Tensor& p) { return p.dim() == 2 ? p : p.reshape({p.numel(), 1}); }

}  // namespace

struct ZenFlowOptimizer::Impl {
  EngineOptions opt;
  StallClock* clock = nullptr;
  std::vector<ParamSpec> params;
  std::vector<SplitParam> split;
  std::vector<DenseParam> dense;
  std::unique_ptr<HostOptimizer> host;
  Collectives* coll = nullptr;  // null: one rank
  int world = 1, me = 0;
  // EngineOptions::parameters_sharded: the group of ranks whose shards make up the model,
  // used for the global gradient norm only (the engine is otherwise a one-rank engine).
  Collectives* norm_group = nullptr;
  StagingLayout staging;  // the packed staging of every rank's host-owned columns (relayout)
  int64_t own_total() const { return staging.shard_size[static_cast<size_t>(me)]; }  // this rank's shard
  // This rank's updated columns packed from the fp32 master (pinned, in the weights'
  // dtype): the source of the H2D on CUDA and of the all-gather with W > 1, so no copy
  // ever reads the master itself. Not allocated for low-precision weights on one rank,
  // where the master is applied only after a restore (then packed into param_out[0]).
  at::Tensor pack_out;
  at::Device device{at::kCPU};
  at::ScalarType split_dtype = at::kFloat;

  // The host arenas (semantics §3: fp32 master, m, v; two window accumulators) belong to
  // the host backend (`host`), in-process or on remote nodes; see host_view.
  // Gradient staging (device dtype): a ring for mid-window steps and one buffer per
  // window parity for the window's last gradient, which the in-flight step still reads.
  at::Tensor ring[2], last_grad[2];
  at::Tensor param_out[2];  // low-precision host output for the H2D copy (non-fp32 weights)
  // A streaming backend (HostOptimizer::gradient_chunk_bytes > 0, remote nodes) reads each
  // gradient from the device-side staging (dev_stage with one rank, the reduce-scattered
  // shard with several) through `stream_ring` (CUDA; the CPU device's staging is sent in
  // place) as it sends (gradient_staging.h): no ring, no last_grad and one param_out, so
  // the worker holds 2 bytes per element of host state (bf16/fp16 weights; none for fp32)
  // plus the ring. stream_busy[slot]: the release of the gradient staged there, waited for
  // before the slot is rewritten two steps later.
  bool streaming = false;
  std::shared_ptr<StagingRing> stream_ring;
  std::shared_ptr<ReleaseLatch> stream_busy[2];
  int stream_slot = 0;
  // The param_out buffer a window's host step writes: one per parity, or the one.
  // Chunked staging keeps one param_out and one ring slot too: a host step writes the
  // buffer once the H2D of the previous window's result out of it is done (it was started
  // before), and a gradient is staged once the previous step's accumulate has read the slot.
  // Offload mode (and zenflow's warm-up, which is offload) uses one of each: its host step
  // is synchronous and opens no window, so it keeps one ring slot, one output buffer, no
  // last-gradient buffers, one device stage and no accumulators (HostStateLayout).
  int out_index(int parity) const { return streaming || chunked || !zenflow() ? 0 : parity; }
  int ring_slots() const { return chunked || !zenflow() ? 1 : 2; }
  // Chunked staging keeps no last-gradient buffers either (24 B per split bf16 element in
  // all): a window's last gradient is accumulated like the others (close_window) and its
  // host step reads the accumulator alone, (acc + last) * (1/len) either way, bit for bit.
  bool last_in_acc() const { return chunked; }
  bool keeps_last_grad() const { return zenflow() && !last_in_acc(); }
  // Host steps write a copy of their result into param_out: low-precision weights, and
  // fp32 weights with a streaming backend where the worker holds a packed fp32 copy of
  // its columns anyway (the H2D source on CUDA, the all-gather's with several ranks):
  // param_out[0] is that copy, and the master comes back into it with the step, during
  // the next window, instead of being read from the nodes at the boundary. (One rank on
  // the CPU device reads it at the boundary and holds no copy.)
  bool out_copy() const {
    return streamed() || split_dtype != at::kFloat || (streaming && (partitioned() || device.is_cuda()));
  }
  // Transfers: dedicated copy streams on CUDA, plain copies on the CPU. Device-side
  // staging (CUDA only) lets the D2H of step t overlap step t+1's compute.
  std::unique_ptr<DeviceStreams> streams;
  at::Tensor dev_stage[2], dev_h2d;
  CopyHandle dev_stage_busy[2];
  // EngineOptions::device_staging_bytes: instead of dev_stage and dev_h2d, kStagingChunks
  // device buffers of a chunk each, used in turn by both directions; `chunks` cuts the
  // packed staging into them (shard_layout.h), recomputed when the layout changes.
  bool chunked = false;
  int64_t chunk_elems = 0;
  std::vector<StagingChunk> chunks;
  at::Tensor dev_chunk[kStagingChunks];
  CopyHandle dev_chunk_d2h[kStagingChunks];  // the last D2H out of each
  int next_chunk = 0;
  // The last H2D out of each host buffer a copy reads: param_out[b] and pack_out. A host
  // buffer is not rewritten before the copy out of it completes; a host step waits only
  // for the copy out of the param_out buffer it writes (never for the one in flight).
  CopyHandle h2d_from_out[3];  // [2]: out of `gathered` (columns_streamed, several ranks)
  CopyHandle h2d_from_pack;
  CopyHandle* staged_h2d = nullptr;  // an H2D of a host result into dev_h2d not yet applied
  int staged_buffer = 0;             // its source (result_buffer numbering)
  int dev_slot = 0;
  std::shared_ptr<HostWork> ring_busy[2];
  std::vector<std::shared_ptr<HostWork>> pending_accumulates;
  int64_t capacity = 0;

  // Progress; engine_scalars.h lists the counters the engine state persists.
  WindowSchedule schedule;  // steps, warm-up, windows, staleness (§4)
  int64_t skipped = 0;
  int64_t device_step = 0;  // device updater's bias-correction count
  int64_t host_step = 0;    // host updater's bias-correction count
  double applied_host_seconds = -1;  // the host step complete_inflight() applied (StepReport)
  SelectionSchedule selection;  // selected yet, re-selection due, re-selections (§2)
  std::unique_ptr<InFlight> inflight;
  std::vector<SlotFix> slot_fixes;  // for the in-flight step's layout change (see SlotFix)
  // During a streamed re-selection that re-packs: per matrix, its selected columns and their
  // weights (CPU) before the moves (repack_staged).
  std::vector<std::pair<std::vector<int64_t>, at::Tensor>> leaving_from;
  double last_lr = 0;
  int64_t capacity_all = 0;  // split elements of all ranks

  bool zenflow() const { return opt.mode == OptimizerMode::kZenFlow; }
  // EngineOptions::columns_streamed: host_grad is this rank's step gradient of every host-owned
  // column (all ranks', matrix-major: all_view; summed over the micro-batches' units), applied_out
  // the param_out buffer that holds the weights of this rank's host columns. One rank streams
  // that buffer. Several: host_grad is reduce-scattered (mean) into grad_shard (this rank's
  // columns, staging layout) at the step, matrix by matrix through the device, and what streams
  // is `gathered`, every rank's host columns' weights matrix-major, all-gathered matrix by matrix
  // from the ranks' param_out[applied_out] whenever one changed (gathered_dirty: at a boundary,
  // a re-selection), before step() returns.
  bool streamed() const { return opt.columns_streamed; }
  at::Tensor host_grad;
  // A unit's host columns' gradients on their way into host_grad (add_unit_gradient), landed
  // one unit later (unit_gradients_coming, unit_gradients_given) so that on CUDA the D2H runs
  // behind the next unit's backward: a matrix's step-first gradient is copied straight into
  // its host_grad view, a later micro-batch's into a staging slot and added there on landing.
  struct UnitGradient {
    at::Tensor into;  // the matrix's view of host_grad
    at::Tensor add;   // undefined: the copy writes `into` itself; else what to add to it
  };
  struct OutgoingUnit {
    std::vector<UnitGradient> parts;
    std::vector<CopyHandle> copies;
    int64_t device_bytes = 0;  // the packed columns the copies hold on a GPU
  };
  OutgoingUnit unit_given;                    // since the last unit_gradients_given()
  std::optional<OutgoingUnit> unit_in_flight;  // the unit before's
  // Staging (pinned on CUDA), two slots (this unit's and the one in flight's), each sized by
  // unit_gradients_coming to the most a unit stages; unit_stage_used: elements of the current
  // slot taken.
  std::array<at::Tensor, 2> unit_stage;
  int unit_slot = 0;
  int64_t unit_stage_used = 0;
  int applied_out = 0;
  at::Tensor grad_shard, gathered;
  bool gathered_dirty = false;
  int64_t all_total = 0;  // elements of the matrix-major buffers
  // The reduced gradient of this rank's host columns (staging layout).
  const at::Tensor& own_grad() const { return partitioned() ? grad_shard : host_grad; }
  // Every rank's host columns of s in a matrix-major buffer: [out, n_host()], unsel order.
  at::Tensor all_view(const at::Tensor& buf, const SplitParam& s) const {
    return buf.narrow(0, s.all_offset, s.n_host() * s.out).view({s.out, s.n_host()});
  }
  // What streams (streamed_columns) and its copy-handle slot (streamed_copy).
  const at::Tensor& streamed_buffer() const { return partitioned() ? gathered : param_out[applied_out]; }
  int streamed_buffer_index() const { return partitioned() ? 2 : applied_out; }
  bool partitioned() const { return world > 1; }
  bool in_warmup() const { return !zenflow() || schedule.warming_up(); }

  void bytes(Direction d, int64_t n) {
    if (clock && !opt.parameters_on_host) clock->add_bytes(d, n);
  }

  // Time accounting (ClockSpan): a measured region counts as device-optimizer time or as a
  // stall — on CUDA what the compute stream spent across it (a host wait that queued work
  // covered costs nothing), on the CPU wall-clock seconds.
  ClockSpan clock_span() const { return ClockSpan(clock, device); }
  template <class Body>
  void stalled(StallCause cause, Body&& body) {
    ClockSpan s = clock_span();
    body();
    s.end(TimeKind::kStall, cause);
  }
  // Waits for a host job; with a remote backend the part of the wait spent on the network
  // is the `network` stall (on the CPU, where the wait is wall time; on CUDA all of it
  // counts as `cause`).
  void wait_for(StallCause cause, const std::shared_ptr<HostWork>& work) {
    ClockSpan s = clock_span();
    const double waited = work->wait();
    const double net = std::min(waited, work->network_wait_seconds());
    if (net > 0 && clock && !device.is_cuda()) {
      s.end(TimeKind::kStall, cause, waited - net);
      clock->add_stall(StallCause::kNetwork, net);
    } else {
      s.end(TimeKind::kStall, cause);
    }
  }

  AdamWCoeffs coeffs(double lr, double weight_decay, int64_t step) const {
    AdamWParams p;
    p.lr = lr;
    p.beta1 = opt.beta1;
    p.beta2 = opt.beta2;
    p.eps = opt.eps;
    p.weight_decay = weight_decay;
    return AdamWCoeffs::make(p, step);
  }

  // This rank's host-owned columns of a parameter in host array b, packed row-major:
  // [out, n_own]. Row-wise gathers and scatters stream through memory; the host kernels
  // see one flat span. In-process this is a view of the array itself; with a remote
  // backend a copy read from it, and a change to it takes host_commit.
  at::Tensor host_view(HostBuf b, const SplitParam& s) const { return host_matrix(b, s, s.n_own(), true); }
  // [out, width] at s's offset in array b: a view in-process; otherwise a copy (`read`) or
  // an uninitialised buffer (!read) that host_commit writes back.
  at::Tensor host_matrix(HostBuf b, const SplitParam& s, int64_t width, bool read) const {
    if (float* d = host->local_data(b)) return at::from_blob(d + s.host_offset, {s.out, width}, at::kFloat);
    at::Tensor t = at::empty({s.out, width}, at::kFloat);
    if (read) host->read(b, s.host_offset, t.numel(), t.data_ptr<float>());
    return t;
  }
  // Writes back a host_view/host_matrix that was changed (nothing to do in-process).
  void host_commit(HostBuf b, const SplitParam& s, const at::Tensor& t) const {
    if (host->local_data(b)) return;
    host->write(b, s.host_offset, t.numel(), t.data_ptr<float>());
  }
  // Column moves of host arrays, made together: a remote backend sends a batch's blocks
  // before it waits for any (one round trip for a re-selection, not one per matrix and
  // array); in-process they are made at once. A batch holds gathers or scatters, carried
  // out by gather() or scatter().
  struct ColumnBatch {
    std::vector<ColumnBlock> blocks;
    std::vector<at::Tensor> staging;                      // CPU float32, alive until carried out
    std::vector<std::pair<at::Tensor, at::Tensor>> into;  // gathers: staging -> destination
  };
  // Columns `idx` (CPU int64, positions in this rank's packed columns of s) of host array b
  // into dst [out, idx.numel()] (any device and type), once the batch is gathered.
  void host_gather(HostBuf b, const SplitParam& s, const at::Tensor& idx, const at::Tensor& dst,
                   ColumnBatch& batch) const {
    if (host->local_data(b)) {
      device_ops::gather_columns(host_view(b, s), idx, dst);
      return;
    }
    const bool direct = dst.device().is_cpu() && dst.scalar_type() == at::kFloat && dst.is_contiguous();
    at::Tensor t = direct ? dst : at::empty({s.out, idx.numel()}, at::kFloat);
    batch.blocks.push_back(
        ColumnBlock{b, s.host_offset, s.out, s.n_own(), to_vector(idx), t.data_ptr<float>()});
    batch.staging.push_back(t);
    if (!direct) batch.into.emplace_back(t, dst);
  }
  // src [out, idx.numel()] into those columns, once the batch is scattered.
  void host_scatter(HostBuf b, const SplitParam& s, const at::Tensor& idx, const at::Tensor& src,
                    ColumnBatch& batch) const {
    if (host->local_data(b)) {
      device_ops::scatter_columns(host_view(b, s), idx, src);
      return;
    }
    const at::Tensor t = src.to(at::kCPU).to(at::kFloat).contiguous();
    batch.blocks.push_back(
        ColumnBlock{b, s.host_offset, s.out, s.n_own(), to_vector(idx), t.data_ptr<float>()});
    batch.staging.push_back(t);
  }
  void gather(ColumnBatch& batch) const {
    if (!batch.blocks.empty()) host->gather_columns(batch.blocks);
    for (auto& [t, dst] : batch.into) dst.copy_(t);
    batch = ColumnBatch{};
  }
  void scatter(ColumnBatch& batch) const {
    if (!batch.blocks.empty()) host->scatter_columns(batch.blocks);
    batch = ColumnBatch{};
  }
  static constexpr HostBuf kStateBufs[3] = {HostBuf::kMaster, HostBuf::kM, HostBuf::kV};
  // Staging buffers hold only host-owned columns, packed over all parameters, rank by
  // rank (rank 0's columns of every matrix, then rank 1's, ...), so each direction is
  // one contiguous copy and each rank's shard is one contiguous range. part_view: rank
  // r's columns of s in an all-rank buffer; own_view: this rank's in a shard buffer.
  at::Tensor part_view(const at::Tensor& buf, const SplitParam& s, int r) const {
    const Part& p = s.parts[static_cast<size_t>(r)];
    const int64_t n = static_cast<int64_t>(p.cols.size());
    return buf.narrow(0, p.stage_offset, n * s.out).view({s.out, n});
  }
  at::Tensor own_view(const at::Tensor& buf, const SplitParam& s) const {
    return buf.narrow(0, s.local_offset, s.own_elems()).view({s.out, s.n_own()});
  }
  // Splits unsel_cpu into the ranks' parts.
  void assign_parts(SplitParam& s) const {
    if (streamed()) s.unsel = index_tensor(s.unsel_cpu, device);
    std::vector<std::vector<int64_t>> by_rank = s.ranges.split(s.unsel_cpu);
    s.parts.assign(static_cast<size_t>(world), Part{});
    for (size_t r = 0; r < s.parts.size(); ++r) {
      s.parts[r].cols = std::move(by_rank[r]);
      s.parts[r].idx = index_tensor(s.parts[r].cols, device);
    }
  }
  // The staging offsets after the parts changed (shard_layout.h).
  void relayout() {
    std::vector<int64_t> rows;
    std::vector<std::vector<int64_t>> widths;
    for (auto& s : split) {
      rows.push_back(s.out);
      widths.emplace_back();
      for (auto& p : s.parts) widths.back().push_back(static_cast<int64_t>(p.cols.size()));
    }
    staging = pack_staging(rows, widths, world);
    all_total = 0;
    for (size_t i = 0; i < split.size(); ++i) {
      SplitParam& s = split[i];
      s.all_offset = all_total;
      all_total += s.out * s.n_host();
      for (size_t r = 0; r < s.parts.size(); ++r) s.parts[r].stage_offset = staging.offset[i][r];
      s.local_offset = staging.local_offset(i, me);
    }
    if (chunked) {
      std::vector<int64_t> own_widths;
      for (auto& s : split) own_widths.push_back(s.n_own());
      chunks = plan_staging_chunks(rows, own_widths, chunk_elems);
    }
  }

  // Chunked device staging: the next of the device chunk buffers, in turn.
  int take_chunk() {
    const int b = next_chunk;
    next_chunk = (next_chunk + 1) % kStagingChunks;
    return b;
  }
  // Rows [p.row, p.row + p.rows) of s's packed host-owned columns in chunk buffer b.
  at::Tensor chunk_view(int b, const StagingPiece& p, const SplitParam& s) const {
    return dev_chunk[b].narrow(0, p.at, p.rows * s.n_own()).view({p.rows, s.n_own()});
  }
  // The gradient's host-owned columns into host `buf` chunk by chunk: gathered on the
  // compute stream into a chunk buffer once that buffer's previous D2H has read it, then
  // copied on the D2H stream. Returns the last copy's handle (the D2H stream runs them in
  // order, so it completes last).
  CopyHandle stage_in_chunks(const std::vector<at::Tensor>& g, const at::Tensor& buf) {
    CopyHandle done;
    for (const StagingChunk& c : chunks) {
      const int b = take_chunk();
      dev_chunk_d2h[b].make_compute_wait();
      for (const StagingPiece& p : c.pieces) {
        const SplitParam& s = split[p.matrix];
        device_ops::gather_columns(g[s.index].view({s.out, s.in}).narrow(0, p.row, p.rows), s.own().idx,
                                   chunk_view(b, p, s));
      }
      done = streams->copy_d2h(dev_chunk[b].narrow(0, 0, c.elems), buf.narrow(0, c.offset, c.elems));
      dev_chunk_d2h[b] = done;
    }
    return done;
  }
  // A host result (result_buffer's numbering) into the weights chunk by chunk: copied on
  // the H2D stream into a chunk buffer (after the compute work so far, and after that
  // buffer's last D2H), then scattered on the compute stream once its copy is done. The
  // copies of the first kStagingChunks chunks start at once; each later one starts once the
  // scatter out of its buffer is enqueued, so up to three copies run under each scatter.
  void apply_in_chunks(int buffer) {
    CopyHandle* from = nullptr;
    const at::Tensor src = packed_result(buffer, &from);
    const size_t n = chunks.size();
    std::vector<CopyHandle> copies(n);
    std::vector<int> buffer_of(n);
    auto start_copy = [&](size_t c) {
      const int b = take_chunk();
      buffer_of[c] = b;
      dev_chunk_d2h[b].make_compute_wait();
      copies[c] = streams->copy_h2d(src.narrow(0, chunks[c].offset, chunks[c].elems),
                                    dev_chunk[b].narrow(0, 0, chunks[c].elems));
    };
    for (size_t c = 0; c < std::min<size_t>(n, kStagingChunks); ++c) start_copy(c);
    for (size_t c = 0; c < n; ++c) {
      copies[c].make_compute_wait();
      for (const StagingPiece& p : chunks[c].pieces) {
        const SplitParam& s = split[p.matrix];
        device_ops::scatter_columns(s.w2d.narrow(0, p.row, p.rows), s.own().idx, chunk_view(buffer_of[c], p, s));
      }
      if (c + kStagingChunks < n) start_copy(c + kStagingChunks);  // into the buffer just scattered from
    }
    // The H2D stream runs the copies in order: the host buffer is not rewritten before the
    // last one out of it is done.
    if (n > 0) *from = copies[n - 1];
  }
  void assign_ranges() {
    std::vector<MatrixShape> shapes;
    for (auto& s : split) shapes.push_back({s.out, s.in});
    std::vector<ColumnRanges> ranges = assign_column_ranges(shapes, world);
    for (size_t i = 0; i < split.size(); ++i) {
      split[i].me = me;
      split[i].ranges = std::move(ranges[i]);
    }
  }

  void validate() {
    if (opt.topk_ratio < 0 || opt.topk_ratio > 1)
      throw std::invalid_argument("topk_ratio must be in [0, 1]");
    if (opt.update_interval < 0) throw std::invalid_argument("update_interval must be >= 0 (0 = auto)");
    if (opt.full_warm_up_rounds < 0) throw std::invalid_argument("full_warm_up_rounds must be >= 0");
    if (opt.select_interval < 0) throw std::invalid_argument("select_interval must be >= 0 (0 = auto)");
    if (opt.select_strategy == SelectStrategy::kStep && opt.select_interval > 0 &&
        opt.update_interval > 0 && opt.select_interval % opt.update_interval != 0)
      throw std::invalid_argument("select_interval must be a positive multiple of update_interval");
    if (opt.max_update_interval < 1) throw std::invalid_argument("max_update_interval must be >= 1");
    if (opt.stream_ring_chunks < 1) throw std::invalid_argument("stream_ring_chunks must be >= 1");
    if (opt.device_staging_bytes < 0) throw std::invalid_argument("device_staging_bytes must be >= 0");
    if (streamed()) {
      if (opt.mode != OptimizerMode::kZenFlow)
        throw std::invalid_argument("columns_streamed is zenflow mode's (offload mode streams with parameters_on_host)");
      if (opt.parameters_sharded || opt.parameters_on_host)
        throw std::invalid_argument("columns_streamed: parameters neither sharded nor on the host, not yet more");
      if (opt.host_backend || opt.device_staging_bytes > 0)
        throw std::invalid_argument("columns_streamed: the in-process host backend with whole staging, not yet more");
    }
    if (opt.mode == OptimizerMode::kOffload) {
      // ZeRO-Offload: everything on the host, one synchronous host step per step.
      opt.topk_ratio = 0;
      opt.update_interval = 1;
      opt.overlap_step = false;
    }
  }

  void build() {
    validate();
    schedule.warm_up_rounds = opt.full_warm_up_rounds;
    schedule.update_interval = opt.update_interval;
    schedule.max_update_interval = opt.max_update_interval;
    selection.strategy = opt.select_strategy;
    selection.interval = opt.select_interval;
    selection.threshold = opt.reselect_threshold;
    if (params.empty()) throw std::invalid_argument("ZenFlowOptimizer: no parameters");
    device = params.front().param.device();
    if (streamed()) {  // the split matrices on the host, the rest on the training device
      device = at::kCPU;
      for (const ParamSpec& ps : params)
        if (ps.param.defined() && !zenflow_splits(ps.param.sizes(), opt.min_split_numel)) {
          device = ps.param.device();
          break;
        }
    }
    bool have_split_dtype = false;
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamSpec& ps = params[i];
      if (!ps.param.defined()) throw std::invalid_argument("parameter '" + ps.name + "' is undefined");
      const bool host_side = streamed() && zenflow_splits(ps.param.sizes(), opt.min_split_numel);
      const at::Device want = host_side ? at::Device(at::kCPU) : device;
      if (ps.param.device() != want)
        throw std::invalid_argument("parameter '" + ps.name + "' is on " + ps.param.device().str() + ", expected " +
                                    want.str() + (host_side ? " (columns_streamed: split matrices on the host)" : ""));
      const auto st = ps.param.scalar_type();
      if (st != at::kFloat && st != at::kBFloat16 && st != at::kHalf)
        throw std::invalid_argument("parameter '" + ps.name + "' has unsupported dtype");
      if (!ps.param.is_contiguous())
        throw std::invalid_argument("parameter '" + ps.name + "' must be contiguous");
      at::Tensor p = ps.param.detach();
      const double wd = ps.weight_decay ? ps.weight_decay_value : 0.0;
      bool to_split = false;
      if (opt.mode == OptimizerMode::kOffload) to_split = true;
      if (opt.mode == OptimizerMode::kZenFlow)
        to_split = p.dim() == 2 && (ps.full_numel > 0 ? ps.full_numel : p.numel()) >= opt.min_split_numel;
      if (host_side != (streamed() && to_split))
        throw std::logic_error("engine: columns_streamed and the split rule disagree on '" + ps.name + "'");
      if (to_split) {
        if (have_split_dtype && st != split_dtype)
          throw std::invalid_argument("split parameters must share one dtype ('" + ps.name + "' differs)");
        split_dtype = st;
        have_split_dtype = true;
        SplitParam s;
        s.index = i;
        s.w2d = as_columns(p);
        s.out = s.w2d.size(0);
        s.in = s.w2d.size(1);
        s.weight_decay = wd;
        capacity_all += s.out * s.in;
        s.k = opt.topk_ratio <= 0 ? 0
                                  : std::max<int64_t>(1, static_cast<int64_t>(std::floor(opt.topk_ratio * s.in)));
        s.k = std::min(s.k, s.in);
        split.push_back(std::move(s));
      } else {
        DenseParam d;
        d.index = i;
        d.p = p;
        d.weight_decay = wd;
        auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
        d.m = at::zeros({p.numel()}, f32);
        d.v = at::zeros({p.numel()}, f32);
        if (st != at::kFloat) d.master = p.to(at::kFloat).reshape({p.numel()}).clone();
        dense.push_back(std::move(d));
      }
    }
    if (!split.empty()) {
      // This rank's share of the host state (all of it with one rank).
      assign_ranges();
      for (auto& s : split) {
        s.host_offset = capacity;
        capacity += s.out * s.ranges.width(me);
      }
      HostStateLayout layout;
      layout.elements = capacity;
      layout.huge_pages = opt.huge_pages;
      layout.rank = me;
      layout.world = world;
      layout.accumulators = zenflow();
      for (auto& s : split) layout.segments.push_back(s.host_offset);
      if (opt.host_backend) {
        host = opt.host_backend(layout);
      } else {
        InProcessHostOptions ho;
        ho.threads = std::max(1, opt.host_threads);
        ho.cores = opt.host_cores;
        host = make_in_process_host_optimizer(ho, layout);
      }
      streams = std::make_unique<DeviceStreams>(device);
      streaming = host->gradient_chunk_bytes() > 0;
      if (streaming && device.is_cuda())
        stream_ring = std::make_shared<StagingRing>(*streams, opt.stream_ring_chunks, host->gradient_chunk_bytes());
      if (opt.device_staging_bytes > 0 && partitioned())
        throw std::invalid_argument(device_staging_needs_one_rank(world));
      chunked = opt.device_staging_bytes > 0 && !streaming;
      if (chunked) {
        int64_t widest = 1;
        for (auto& s : split) widest = std::max(widest, s.in);
        chunk_elems = device_staging_chunk_elems(opt.device_staging_bytes,
                                                 static_cast<int64_t>(at::elementSize(split_dtype)), capacity, widest);
        for (at::Tensor& t : dev_chunk)
          t = at::empty({chunk_elems}, at::TensorOptions().dtype(split_dtype).device(device));
      }
      for (int b = 0; b < 2; ++b) {
        if (!streaming) {
          if (b < ring_slots()) ring[b] = streams->alloc_host({capacity}, split_dtype);
          if (keeps_last_grad()) last_grad[b] = streams->alloc_host({capacity}, split_dtype);
        }
        if (out_copy() && out_index(b) == b) param_out[b] = streams->alloc_host({capacity}, split_dtype);
        // Device-side staging: the all-rank layout (the reduce-scatter's input with W > 1;
        // what a streaming backend reads with one rank).
        if (!chunked && !streamed() &&
            ((device.is_cuda() && (b == 0 || zenflow() || streaming)) || (partitioned() && b == 0) ||
             (streaming && !partitioned())))
          dev_stage[b] = at::empty({capacity_all}, at::TensorOptions().dtype(split_dtype).device(device));
      }
      if (device.is_cuda() && !chunked && !streamed())
        dev_h2d = at::empty({capacity}, at::TensorOptions().dtype(split_dtype).device(device));
      if (streamed()) host_grad = streams->alloc_host({capacity_all}, split_dtype);
      if (streamed() && partitioned()) {
        grad_shard = streams->alloc_host({capacity}, split_dtype);
        gathered = streams->alloc_host({capacity_all}, split_dtype);
      }
      // Streaming packs the master (after a restore) into the one param_out; chunked
      // staging copies fp32 results from a packed master too.
      if (!(streaming && out_copy()) && !streamed() &&
          (partitioned() || ((device.is_cuda() || chunked) && split_dtype == at::kFloat)))
        pack_out = streams->alloc_host({capacity}, split_dtype);
      // The host owns every column until the first selection (warm-up = offload).
      for (auto& s : split) {
        s.unsel_cpu.resize(static_cast<size_t>(s.in));
        std::iota(s.unsel_cpu.begin(), s.unsel_cpu.end(), 0);
        s.sel_cpu.clear();
        s.sel = index_tensor(s.sel_cpu, device);
        assign_parts(s);
        const int64_t lo = s.ranges.lo[static_cast<size_t>(me)];
        at::Tensor init = host_matrix(HostBuf::kMaster, s, s.n_own(), false);
        init.copy_(s.w2d.narrow(1, lo, s.n_own()).to(at::kCPU).to(at::kFloat));
        host_commit(HostBuf::kMaster, s, init);
        s.score_acc = at::zeros({s.in}, at::TensorOptions().dtype(at::kFloat).device(device));
        if (streamed()) s.w_sel = at::empty({s.out, 0}, at::TensorOptions().dtype(split_dtype).device(device));
      }
    }
    relayout();  // with nothing split: an empty layout, own_total() 0
    if (streamed()) pack_host_weights();  // every column is the host's until the first selection
  }

  // --- EngineOptions::columns_streamed ---
  // The host-owned columns' weights packed from the parameter tensors into param_out[0]
  // and the selected ones' to the device (construction, a restore); with several ranks every
  // rank's into `gathered` too (each rank's parameter tensors hold the whole model).
  void pack_host_weights() {
    for (auto& s : split) {
      if (s.n_own() > 0) {
        h2d_from_out[0].wait();
        device_ops::gather_columns(s.w2d, index_tensor(s.own().cols, at::kCPU), own_view(param_out[0], s));
      }
      if (partitioned() && s.n_host() > 0) {
        h2d_from_out[2].wait();
        device_ops::gather_columns(s.w2d, index_tensor(s.unsel_cpu, at::kCPU), all_view(gathered, s));
      }
      s.w_sel = s.w2d.index_select(1, index_tensor(s.sel_cpu, at::kCPU)).to(device).contiguous();
    }
    applied_out = 0;
    gathered_dirty = false;
  }
  // Several ranks: `gathered` from the ranks' param_out[applied_out], matrix by matrix (on
  // CUDA: this rank's columns to the device, the all-gather, every rank's back), when a
  // boundary or a re-selection changed them. Every rank calls it at the same points (the end
  // of step(), finish() and a restore), so the collectives match.
  void regather() {
    if (!gathered_dirty) return;
    gathered_dirty = false;
    ClockSpan span = clock_span();
    h2d_from_out[2].wait();
    h2d_from_out[applied_out].wait();
    const int64_t e = static_cast<int64_t>(at::elementSize(split_dtype));
    for (auto& s : split) {
      if (s.n_host() == 0) continue;
      std::vector<int64_t> sizes;
      for (const Part& p : s.parts) sizes.push_back(static_cast<int64_t>(p.cols.size()) * s.out);
      const at::Tensor mine = own_view(param_out[applied_out], s).reshape({-1}).to(device);
      const at::Tensor all = coll->all_gather(mine, sizes, CollectiveTraffic::kParameters).to(at::kCPU);
      const at::Tensor into = all_view(gathered, s);
      int64_t col = 0, off = 0;
      for (size_t r = 0; r < s.parts.size(); ++r) {
        const int64_t n = static_cast<int64_t>(s.parts[r].cols.size());
        if (n > 0) into.narrow(1, col, n).copy_(all.narrow(0, off, n * s.out).view({s.out, n}));
        col += n;
        off += n * s.out;
      }
      bytes(Direction::kH2D, mine.numel() * e);
      bytes(Direction::kD2H, all.numel() * e);
    }
    span.end(TimeKind::kStall, StallCause::kAllreduce);
  }
  const SplitParam* streamed_split(size_t param) const {
    for (const SplitParam& s : split)
      if (s.index == param) return streamed() ? &s : nullptr;
    return nullptr;
  }
  // One unit's gradient of split matrix s: its selected columns into g_sel (the device), the
  // host-owned ones (every rank's) packed and sent to the host into host_grad (on CUDA a D2H
  // that lands one unit later: unit_gradients_given); the first of a step overwrites, the
  // others add, as autograd accumulates a leaf's gradient.
  void add_unit_gradient(SplitParam& s, const at::Tensor& grad) {
    c10::NoGradGuard no_grad;
    const at::Tensor g2d = grad.detach().reshape({s.out, s.in}).contiguous();
    if (g2d.scalar_type() != split_dtype || g2d.device() != device)
      throw std::invalid_argument("engine: a unit gradient of " + params[s.index].name + " is " +
                                  c10::toString(g2d.scalar_type()) + " on " + g2d.device().str() + ", expected " +
                                  c10::toString(split_dtype) + " on " + device.str());
    const bool first = !s.got_grad;
    s.got_grad = true;
    if (s.k > 0 && selection.selected) {
      at::Tensor sel = at::empty({s.out, s.k}, g2d.options());
      device_ops::gather_columns(g2d, s.sel, sel);
      if (first)
        s.g_sel = sel;
      else
        s.g_sel.add_(sel);
    }
    if (s.n_host() == 0) return;
    // Inside the backward (a compute region): the time is the compute's wait.
    ClockSpan span = clock_span();
    // (On the CPU the same path, the copies done at once: what runs here is what runs there.)
    UnitGradient part{all_view(host_grad, s), at::Tensor()};
    at::Tensor packed = at::empty({s.out, s.n_host()}, g2d.options());
    device_ops::gather_columns(g2d, s.unsel, packed);
    if (!first) {
      at::Tensor& slot = unit_stage[static_cast<size_t>(unit_slot)];
      const int64_t n = packed.numel();
      if (!slot.defined() || slot.numel() - unit_stage_used < n) {
        // Not sized by unit_gradients_coming (a caller that did not announce the unit): what
        // this unit staged so far stays where it is (its views hold it) and lands from there.
        slot = streams->alloc_host({unit_stage_used + n}, split_dtype);
      }
      part.add = slot.narrow(0, unit_stage_used, n).view({s.out, s.n_host()});
      unit_stage_used += n;
    }
    // The handle holds `packed` on the device until the copy has landed.
    unit_given.copies.push_back(streams->copy_d2h(packed, part.add.defined() ? part.add : part.into));
    unit_given.parts.push_back(std::move(part));
    if (streams->is_cuda()) unit_given.device_bytes += static_cast<int64_t>(packed.nbytes());
    bytes(Direction::kD2H, s.out * s.n_host() * static_cast<int64_t>(at::elementSize(split_dtype)));
    span.end(TimeKind::kComputeStall, StallCause::kTransferD2H);
  }
  // A unit's gradients are about to be given (its backward is enqueued): the unit before's
  // land now, before this unit's are packed (their copies ran behind this unit's backward; the
  // device then holds one unit's packed columns besides this unit's gradients), and the
  // staging slot grows, at once, to what this unit's later-in-the-step gradients need.
  void unit_gradients_coming(const std::vector<size_t>& param_indices) {
    land_in_flight();
    int64_t staged = 0;
    for (const size_t p : param_indices)
      for (const SplitParam& s : split)
        if (s.index == p && s.got_grad) staged += s.out * s.n_host();
    at::Tensor& slot = unit_stage[static_cast<size_t>(unit_slot)];
    if (staged > 0 && (!slot.defined() || slot.numel() < staged))
      slot = streams->alloc_host({staged}, split_dtype);
  }
  // The unit's gradients have all been given: the unit before's land (if unit_gradients_coming
  // did not), this unit's go in flight, and the next unit stages in the other slot.
  void unit_gradients_given() {
    if (unit_given.parts.empty()) return;
    land_in_flight();
    unit_in_flight = std::move(unit_given);
    unit_given = OutgoingUnit{};
    unit_slot ^= 1;
    unit_stage_used = 0;
  }
  // Every unit gradient given lands in host_grad (the end of a backward, and the step's start).
  void land_unit_gradients() {
    unit_gradients_given();
    land_in_flight();
  }
  void land_in_flight() {
    if (!unit_in_flight) return;
    OutgoingUnit out = std::move(*unit_in_flight);
    unit_in_flight.reset();
    ClockSpan span = clock_span();
    for (CopyHandle& h : out.copies) h.wait();
    for (UnitGradient& part : out.parts)
      if (part.add.defined()) part.into.add_(part.add);
    span.end(TimeKind::kComputeStall, StallCause::kTransferD2H);
  }
  // The step's gradients of the streamed matrices that got none: zero, as zero_grad() makes
  // a parameter's gradient.
  void complete_unit_gradients() {
    land_unit_gradients();
    for (auto& s : split) {
      if (s.got_grad) continue;
      if (s.k > 0 && selection.selected) s.g_sel = at::zeros({s.out, s.k}, s.w_sel.options());
      if (s.n_host() > 0) all_view(host_grad, s).zero_();
      s.got_grad = true;
    }
  }
  // Column scores of a streamed matrix's step gradient (this rank's, before any exchange)
  // added onto `scores` ([in] fp32 on the device), column by column as
  // accumulate_column_scores adds them for the whole gradient: the selected columns' from
  // g_sel, the host-owned ones' (every rank's) on the host.
  void accumulate_streamed_scores(const SplitParam& s, const at::Tensor& scores) const {
    const bool l1 = opt.importance == Importance::kL1;
    if (s.k > 0 && selection.selected) {
      at::Tensor part = scores.index_select(0, s.sel).contiguous();
      device_ops::accumulate_column_scores(s.g_sel, l1, part);
      scores.index_copy_(0, s.sel, part);
    }
    if (s.n_host() > 0) {
      at::Tensor part = scores.index_select(0, s.unsel).to(at::kCPU).contiguous();
      device_ops::accumulate_column_scores(all_view(host_grad, s), l1, part);
      scores.index_copy_(0, s.unsel, part.to(device));
    }
  }
  // This rank's column scores of a streamed matrix's step gradient as scores_of gives them for
  // the whole gradient (the first selection; the exchange of several ranks): from the matrix
  // put together on the host.
  at::Tensor streamed_scores(const SplitParam& s) const {
    at::Tensor full = at::empty({s.out, s.in}, host_grad.options());
    if (s.n_host() > 0) full.index_copy_(1, index_tensor(s.unsel_cpu, at::kCPU), all_view(host_grad, s));
    if (s.k > 0 && selection.selected) full.index_copy_(1, index_tensor(s.sel_cpu, at::kCPU), s.g_sel.to(at::kCPU));
    return column_scores_of(full).to(device);
  }
  std::vector<at::Tensor> grads() {
    std::vector<at::Tensor> out;
    out.reserve(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamSpec& ps = params[i];
      if (streamed_split(i)) {  // unit by unit: g_sel and host_grad
        out.emplace_back();
        continue;
      }
      at::Tensor g = ps.param.grad();
      if (!g.defined()) g = at::zeros_like(ps.param);
      if (g.scalar_type() != ps.param.scalar_type() || g.device() != ps.param.device() ||
          g.sizes() != ps.param.sizes() || !g.is_contiguous()) {
        auto describe = [](const at::Tensor& t) {
          std::ostringstream os;
          os << c10::toString(t.scalar_type()) << " " << t.sizes() << " on " << t.device()
             << (t.is_contiguous() ? "" : " (not contiguous)");
          return os.str();
        };
        throw std::invalid_argument("engine: the gradient of " + ps.name + " is " + describe(g) +
                                    ", the parameter " + describe(ps.param) +
                                    ": gradients must match their parameter's dtype, shape and device");
      }
      out.push_back(g.detach());
    }
    return out;
  }

  // Packs every rank's host-owned gradient columns into `buf` (all-rank layout).
  void gather_parts(const std::vector<at::Tensor>& g, const at::Tensor& buf) const {
    for (auto& s : split)
      for (int r = 0; r < world; ++r)
        if (!s.parts[static_cast<size_t>(r)].cols.empty())
          device_ops::gather_columns(g[s.index].view({s.out, s.in}), s.parts[static_cast<size_t>(r)].idx,
                                     part_view(buf, s, r));
  }

  // --- D2H: unselected gradient columns into a host staging buffer ---
  // One rank: gathered from the gradients. Several: `shard`, this rank's reduce-scattered
  // columns (sync_split_gradients). Returns the copy's handle: the host job that reads
  // `buf` waits for it.
  CopyHandle stage_gradients(const std::vector<at::Tensor>& g, const at::Tensor& shard, const at::Tensor& buf) {
    if (streamed()) {  // already on the host, where add_unit_gradient (and the exchange) put it
      buf.narrow(0, 0, own_total()).copy_(own_grad().narrow(0, 0, own_total()));
      return CopyHandle();
    }
    ClockSpan span = clock_span();
    CopyHandle done;
    if (partitioned()) {
      done = streams->copy_d2h(shard, buf.narrow(0, 0, own_total()));
    } else if (chunked) {
      done = stage_in_chunks(g, buf);
    } else if (!device.is_cuda()) {
      gather_parts(g, buf);
    } else {
      const int slot = dev_slot;
      if (dev_stage[1].defined()) dev_slot ^= 1;  // offload mode keeps one
      dev_stage_busy[slot].make_compute_wait();  // its previous D2H has read it
      gather_parts(g, dev_stage[slot]);
      done = streams->copy_d2h(dev_stage[slot].narrow(0, 0, staging.total), buf.narrow(0, 0, staging.total));
      dev_stage_busy[slot] = done;
    }
    bytes(Direction::kD2H, own_total() * buf.element_size());
    span.end(TimeKind::kStall, StallCause::kTransferD2H);
    return done;
  }

  // A streaming backend: the gradient stays in device-side staging and leaves through
  // stream_ring as the backend sends it. Waits (stall `network`) while the backend still
  // reads the gradient staged in the same slot two steps ago.
  std::shared_ptr<GradSource> stream_gradients(const std::vector<at::Tensor>& g, const at::Tensor& shard) {
    const int slot = stream_slot;
    stream_slot ^= 1;
    if (stream_busy[slot] && !stream_busy[slot]->is_open())
      stalled(StallCause::kNetwork, [&] { stream_busy[slot]->wait(); });
    ClockSpan span = clock_span();
    at::Tensor staged;
    if (partitioned()) {
      staged = shard.contiguous().view({-1});
    } else {
      gather_parts(g, dev_stage[slot]);
      staged = dev_stage[slot].narrow(0, 0, staging.total);
    }
    stream_busy[slot] = std::make_shared<ReleaseLatch>();
    auto source = make_staged_gradient(*streams, stream_ring, staged, streams->mark_compute(), stream_busy[slot]);
    bytes(Direction::kD2H, own_total() * at::elementSize(split_dtype));
    span.end(TimeKind::kStall, StallCause::kTransferD2H);
    return source;
  }

  // --- Several ranks: make every rank see what its updaters need (see the header) ---
  struct SyncedGradients {
    at::Tensor shard;           // this rank's host-owned columns, mean over ranks
    at::Tensor scores;          // summed column scores of all split matrices, fp32 (when asked)
    at::Tensor replicated_sq;   // squared norm of the selected columns (identical on all ranks)
    at::Tensor shards_sq;       // squared norm of all ranks' shards
  };
  // The selected columns' gradients of every split matrix, all-reduced (mean) in one buffer:
  // `pack(s, view)` writes s's [out, k] into its view of it, `unpack(s, view)` takes the mean
  // back. Returns their squared norm (fp32, identical on every rank).
  template <class Pack, class Unpack>
  at::Tensor allreduce_selected(Pack&& pack, Unpack&& unpack) {
    at::Tensor sq = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
    if (!selection.selected) return sq;
    int64_t n = 0;
    for (auto& s : split) n += s.k * s.out;
    if (n == 0) return sq;
    at::Tensor buf = at::empty({n}, at::TensorOptions().dtype(split_dtype).device(device));
    auto views = [&](auto&& each) {
      int64_t off = 0;
      for (auto& s : split) {
        if (s.k == 0) continue;
        each(s, buf.narrow(0, off, s.k * s.out).view({s.out, s.k}));
        off += s.k * s.out;
      }
    };
    views(pack);
    coll->allreduce_sum_(buf, CollectiveTraffic::kGradients);
    buf.div_(world);
    views(unpack);
    return buf.to(at::kFloat).pow(2).sum();
  }
  SyncedGradients sync_split_gradients(const std::vector<at::Tensor>& g, bool want_scores) {
    ClockSpan span = clock_span();
    SyncedGradients out;
    // Local scores first: the all-reduce below overwrites the selected columns.
    std::vector<at::Tensor> parts;
    if (want_scores)
      for (auto& s : split) parts.push_back(scores_of(g[s.index], s));
    // Selected columns: all-reduced (mean), written back into the gradients.
    out.replicated_sq = allreduce_selected(
        [&](const SplitParam& s, const at::Tensor& v) {
          device_ops::gather_columns(g[s.index].view({s.out, s.in}), s.sel, v);
        },
        [&](SplitParam& s, const at::Tensor& v) { device_ops::scatter_columns(g[s.index].view({s.out, s.in}), s.sel, v); });
    // Host-owned columns: reduce-scattered (mean) to their owners.
    gather_parts(g, dev_stage[0]);
    out.shard = coll->reduce_scatter_mean(dev_stage[0].narrow(0, 0, staging.total), staging.shard_size,
                                          CollectiveTraffic::kGradients);
    reduce_scores_and_norm(out, std::move(parts), want_scores);
    span.end(TimeKind::kStall, StallCause::kAllreduce);
    return out;
  }
  // One small all-reduce: the ranks' column scores (`parts`, when wanted) and the squared
  // norms of their shards (out.shard).
  void reduce_scores_and_norm(SyncedGradients& out, std::vector<at::Tensor> parts, bool want_scores) {
    parts.push_back(out.shard.to(at::kFloat).pow(2).sum().reshape({1}).to(device));
    at::Tensor small = at::cat(parts);
    coll->allreduce_sum_(small, CollectiveTraffic::kSelection);
    out.shards_sq = small[small.numel() - 1];
    if (want_scores) out.scores = small.narrow(0, 0, small.numel() - 1);
  }

  // The same for streamed columns: the selected columns' gradients are g_sel, every rank's
  // host-owned columns' are host_grad, reduce-scattered matrix by matrix (on CUDA through the
  // device: a matrix's host columns up, this rank's down) into grad_shard. The same values
  // and the same sums as sync_split_gradients.
  SyncedGradients sync_streamed_gradients(bool want_scores) {
    ClockSpan span = clock_span();
    SyncedGradients out;
    std::vector<at::Tensor> parts;
    if (want_scores)
      for (auto& s : split) parts.push_back(streamed_scores(s));
    out.replicated_sq = allreduce_selected([](const SplitParam& s, const at::Tensor& v) { v.copy_(s.g_sel); },
                                           [](SplitParam& s, const at::Tensor& v) { s.g_sel.copy_(v); });
    const int64_t e = static_cast<int64_t>(at::elementSize(split_dtype));
    for (auto& s : split) {
      if (s.n_host() == 0) continue;
      const at::Tensor local = all_view(host_grad, s);
      at::Tensor flat = at::empty({s.out * s.n_host()}, at::TensorOptions().dtype(split_dtype).device(device));
      std::vector<int64_t> sizes;
      int64_t col = 0;
      for (const Part& p : s.parts) {
        const int64_t w = static_cast<int64_t>(p.cols.size());
        if (w > 0)
          flat.narrow(0, col * s.out, w * s.out).view({s.out, w}).copy_(local.narrow(1, col, w));
        sizes.push_back(w * s.out);
        col += w;
      }
      const at::Tensor mine = coll->reduce_scatter_mean(flat, sizes, CollectiveTraffic::kGradients);
      if (s.n_own() > 0) own_view(grad_shard, s).copy_(mine.view({s.out, s.n_own()}));
      bytes(Direction::kH2D, flat.numel() * e);
      bytes(Direction::kD2H, mine.numel() * e);
    }
    out.shard = grad_shard.narrow(0, 0, own_total());
    reduce_scores_and_norm(out, std::move(parts), want_scores);
    span.end(TimeKind::kStall, StallCause::kAllreduce);
    return out;
  }

  // --- H2D: updated host-owned columns back into the device weights ---
  // The buffer a host result is copied from: param_out[out_buffer] holds the host step's
  // output (out_copy()); -1 is the fp32 master (fp32 weights in-process, or after a restore).
  int result_buffer(int out_buffer) const { return out_copy() && out_buffer >= 0 ? out_buffer : -1; }

  // CUDA: starts the H2D of a host result (result_buffer's numbering) into dev_h2d, on the
  // copy stream; the apply that follows makes the compute stream wait for it.
  void stage_h2d(int buffer) {
    CopyHandle* from = nullptr;
    const at::Tensor src = packed_result(buffer, &from);
    *from = streams->copy_h2d(src, dev_h2d.narrow(0, 0, own_total()));
    staged_h2d = from;
    staged_buffer = buffer;
  }

  // CUDA: the staged H2D (stage_h2d, now or earlier) as the compute stream's next input.
  void wait_staged_h2d(int buffer) {
    if (staged_h2d == nullptr) stage_h2d(buffer);
    if (staged_buffer != buffer)  // only the in-flight step's result is ever staged early
      throw std::logic_error("engine: staged H2D of buffer " + std::to_string(staged_buffer) + ", applying " +
                             std::to_string(buffer));
    staged_h2d->make_compute_wait();
    staged_h2d = nullptr;
  }

  // CUDA with a step in flight: once the host step is done, its result starts for the
  // device at once, under the compute of the window's remaining steps; the boundary then
  // only scatters it into the weights (still applied at the boundary, §4).
  void prefetch_inflight() {
    if (!device.is_cuda() || chunked || streamed() || !inflight || !inflight->work || staged_h2d != nullptr ||
        !inflight->work->done())
      return;
    apply_slot_fixes();
    stage_h2d(result_buffer(inflight->buffer));
  }

  void apply_host_result(int out_buffer) {
    const int buffer = result_buffer(out_buffer);
    if (streamed()) {  // its output buffer becomes what streams: nothing to copy (a restore: the master)
      if (buffer < 0) {
        CopyHandle* from = nullptr;
        (void)packed_result(-1, &from);  // into param_out[0]
      }
      applied_out = buffer < 0 ? 0 : buffer;
      gathered_dirty = partitioned();
      return;
    }
    bytes(Direction::kH2D, own_total() * at::elementSize(split_dtype));
    if (partitioned()) {
      apply_partitioned(buffer);
      return;
    }
    ClockSpan span = clock_span();
    if (!device.is_cuda() && buffer < 0 && !host->local_data(HostBuf::kMaster)) {
      apply_remote_master();
    } else if (chunked) {
      apply_in_chunks(buffer);
    } else if (!device.is_cuda()) {
      for (auto& s : split) {
        if (s.n_own() == 0) continue;
        device_ops::scatter_columns(s.w2d, s.own().idx,
                                    buffer >= 0 ? own_view(param_out[buffer], s) : host_view(HostBuf::kMaster, s));
      }
    } else {
      // One H2D of every host-owned column from pinned memory, then device-side scatters.
      wait_staged_h2d(buffer);
      for (auto& s : split)
        if (s.n_own() > 0) device_ops::scatter_columns(s.w2d, s.own().idx, own_view(dev_h2d, s));
    }
    // Host leaves (EngineOptions::parameters_on_host): a memory copy, the host updater's
    // work, not a transfer.
    span.end(TimeKind::kStall, opt.parameters_on_host ? StallCause::kHostOptimizer : StallCause::kTransferH2D);
  }

  // The CPU device's weights from a master on other machines (one rank, fp32 weights: no
  // packed copy, out_copy()): each matrix's host-owned columns are read into a temporary
  // and scattered into the weights as they land, with up to kApplyReadBytes of reads in
  // flight, so the nodes' copies and the network overlap the scatters and the round trips
  // overlap each other (a read per matrix, one at a time, was the boundary's cost).
  static constexpr int64_t kApplyReadBytes = 64 << 20;
  void apply_remote_master() {
    struct Read {
      const SplitParam* s;
      at::Tensor t;
      std::shared_ptr<HostWork> work;
    };
    std::deque<Read> reads;
    int64_t in_flight = 0;
    auto apply_oldest = [&] {
      const Read r = std::move(reads.front());
      reads.pop_front();
      in_flight -= static_cast<int64_t>(r.t.nbytes());
      r.work->wait();
      device_ops::scatter_columns(r.s->w2d, r.s->own().idx, r.t);
    };
    try {
      for (const auto& s : split) {
        if (s.n_own() == 0) continue;
        const int64_t bytes = s.out * s.n_own() * static_cast<int64_t>(sizeof(float));
        while (!reads.empty() && in_flight + bytes > kApplyReadBytes) apply_oldest();
        at::Tensor t = at::empty({s.out, s.n_own()}, at::kFloat);
        reads.push_back(
            {&s, t, host->start_read(HostBuf::kMaster, s.host_offset, t.numel(), t.data_ptr<float>())});
        in_flight += bytes;
      }
      while (!reads.empty()) apply_oldest();
    } catch (...) {
      for (const Read& r : reads) {  // their targets stay alive until no node writes them
        try {
          r.work->wait();
        } catch (...) {
        }
      }
      throw;
    }
  }

  // The host result to copy, packed in pinned memory: param_out[out_buffer] (the host
  // step's low-precision output), or (-1) the master, packed in the weights' dtype into
  // pack_out (param_out[0] without one) once the previous copy out of it has completed.
  // *from: the handle that the copy out of the returned buffer is to be kept in.
  at::Tensor packed_result(int out_buffer, CopyHandle** from) {
    if (out_buffer >= 0) {
      *from = &h2d_from_out[out_buffer];
      return param_out[out_buffer].narrow(0, 0, own_total());
    }
    const bool own_pack = pack_out.defined();
    *from = own_pack ? &h2d_from_pack : &h2d_from_out[0];
    (*from)->wait();
    const at::Tensor buf = own_pack ? pack_out : param_out[0];
    for (auto& s : split)
      if (s.n_own() > 0) own_view(buf, s).copy_(host_view(HostBuf::kMaster, s));
    return buf.narrow(0, 0, own_total());
  }

  // Several ranks: this rank's updated columns (the host step's low-precision output, or
  // the fp32 master) go to the device and are all-gathered into every rank's weights.
  // The all-gather is stall `allreduce`, the rest `transfer_h2d` (`host_optimizer` for
  // host leaves: memory copies).
  void apply_partitioned(int out_buffer) {
    const StallCause local = opt.parameters_on_host ? StallCause::kHostOptimizer : StallCause::kTransferH2D;
    at::Tensor src;
    stalled(local, [&] {
      if (device.is_cuda()) {
        wait_staged_h2d(out_buffer);
        src = dev_h2d.narrow(0, 0, own_total());
      } else {
        CopyHandle* from = nullptr;
        src = packed_result(out_buffer, &from);
      }
    });
    at::Tensor all;
    stalled(StallCause::kAllreduce,
            [&] { all = coll->all_gather(src, staging.shard_size, CollectiveTraffic::kParameters); });
    stalled(local, [&] {
      for (auto& s : split)
        for (int r = 0; r < world; ++r)
          if (!s.parts[static_cast<size_t>(r)].cols.empty())
            device_ops::scatter_columns(s.w2d, s.parts[static_cast<size_t>(r)].idx, part_view(all, s, r));
    });
  }

  // Builds the host AdamW job over every host-owned column. `last` holds this window's
  // final gradient; `window_acc` (or null) the sum of the earlier ones.
  // `last` undefined: the gradient is `window_acc` alone (flushing an open window).
  // `window_acc`: the parity of the window accumulator, or -1.
  // `source` (streaming backends) replaces `last`.
  StepJob make_step_job(double lr, const at::Tensor& last, int window_acc, float grad_scale, int out_buffer,
                        std::shared_ptr<GradSource> source = nullptr) {
    StepJob job;
    job.grad_scale = grad_scale;
    job.acc = window_acc >= 0 ? static_cast<int>(acc_buffer(window_acc)) : -1;
    ++host_step;
    for (auto& s : split) {
      if (s.n_own() == 0) continue;
      StepJob::Span sp;
      sp.offset = s.host_offset;
      sp.n = s.own_elems();
      if (source) {
        sp.grad.type = grad_type(split_dtype);
        sp.source_offset = s.local_offset;
      } else if (last.defined()) {
        sp.grad = grad_ref(last, s.local_offset);
      }  // else: the accumulator alone
      if (split_dtype == at::kFloat && out_copy()) {
        sp.master_out = param_out[out_buffer].data_ptr<float>() + s.local_offset;
      } else if (split_dtype != at::kFloat) {
        sp.half_out = reinterpret_cast<uint16_t*>(param_out[out_buffer].data_ptr()) + s.local_offset;
        sp.half_kind = split_dtype == at::kBFloat16 ? HalfKind::kBF16 : HalfKind::kFP16;
      }
      sp.coeffs = coeffs(lr, s.weight_decay, host_step);
      job.spans.push_back(sp);
    }
    job.source = std::move(source);
    return job;
  }

  // From `staged` (host staging), or from `source` (streaming backends) when set.
  AccumulateJob make_accumulate_job(const at::Tensor& staged, int parity, bool overwrite,
                                    std::shared_ptr<GradSource> source = nullptr) {
    AccumulateJob job;
    job.acc = acc_buffer(parity);
    job.overwrite = overwrite;
    for (auto& s : split) {
      if (s.n_own() == 0) continue;
      if (source)
        job.spans.push_back({s.host_offset, GradRef{nullptr, grad_type(split_dtype)}, s.own_elems(), s.local_offset});
      else
        job.spans.push_back({s.host_offset, grad_ref(staged, s.local_offset), s.own_elems()});
    }
    job.source = std::move(source);
    return job;
  }

  // Waits for the in-flight host step and copies its result to the device.
  void complete_inflight() {
    if (!inflight) return;
    if (inflight->work) wait_for(StallCause::kHostOptimizer, inflight->work);
    for (auto& w : inflight->accumulates) wait_for(StallCause::kHostOptimizer, w);
    const int buf = inflight->work ? inflight->buffer : -1;
    if (inflight->work) applied_host_seconds = inflight->work->run_seconds();
    apply_slot_fixes();
    inflight.reset();
    apply_host_result(buf);
    schedule.window_applied();
  }

  // Writes the leaving columns' state into the host slots the finished in-flight step
  // wrote garbage into (the entering columns' old slots), and their weights into its
  // low-precision output, which the next H2D copies.
  void apply_slot_fixes() {
    const int buf = inflight && inflight->work ? inflight->buffer : -1;
    ColumnBatch batch;
    for (auto& f : slot_fixes) {
      SplitParam& sp = split[f.split_index];
      for (int i = 0; i < 3; ++i) host_scatter(kStateBufs[i], sp, f.slots, f.state[i], batch);
      if (buf >= 0 && out_copy())
        device_ops::scatter_columns(own_view(param_out[buf], sp), f.slots, f.weights);
    }
    scatter(batch);
    slot_fixes.clear();
  }

  // `timed` false: the waits are booked by the caller (state_dict: the checkpoint's time).
  void wait_accumulates(bool timed = true) {
    for (auto& w : pending_accumulates) {
      if (timed)
        wait_for(StallCause::kHostOptimizer, w);
      else
        w->wait();
    }
    pending_accumulates.clear();
    ring_busy[0].reset();
    ring_busy[1].reset();
  }

  // --- Selection (§2) ---
  at::Tensor scores_of(const at::Tensor& g, const SplitParam& s) const {
    if (const at::Tensor& given = params[s.index].column_scores; given.defined()) return given;  // sharded
    return device_ops::column_scores(g.view({s.out, s.in}), opt.importance == Importance::kL1);
  }

  std::vector<int64_t> top_k(const at::Tensor& scores, int64_t k) const {
    if (k <= 0) return {};
    at::Tensor idx = std::get<1>(at::topk(scores, k, /*dim=*/0, /*largest=*/true, /*sorted=*/true));
    std::vector<int64_t> out = to_vector(idx);
    std::sort(out.begin(), out.end());
    return out;
  }

  // Moves master/m/v of columns whose owner changes (§3 "one set of moments per
  // column"): only entering and leaving columns cross between device and host; the host
  // arrays are re-packed in place by the backend (HostOptimizer::repack_columns, one row
  // at a time: no model-sized copy). Requires no host work in flight and no open window.
  // Several ranks: a leaving column goes to the rank whose range holds it (the device
  // state is replicated, so that is a local copy); an entering column's state is
  // all-reduced from its owner (every other rank contributes zeros) to every rank.
  // `enter_ready` ([3, out, n_entering] on the device: master, m, v): the entering
  // columns' state, already brought up to date (enter_window_step) — not read from the
  // host. `defer_host`: a host step on the old layout is in flight; leaving columns take
  // their slots when it is done (SlotFix; requires slot-for-slot orders).
  void migrate(SplitParam& s, const std::vector<int64_t>& new_sel, const at::Tensor& enter_ready = at::Tensor(),
               bool defer_host = false) {
    using device_ops::scatter_columns;
    if (new_sel == s.sel_cpu) return;
    const auto f32cpu = at::TensorOptions().dtype(at::kFloat);
    const ColumnMoves moves = column_moves(s.sel_cpu, new_sel);
    const std::vector<int64_t>& entering = moves.entering;
    std::vector<int64_t> leaving_own;
    for (int64_t c : moves.leaving)
      if (s.owns(c)) leaving_own.push_back(c);
    // Every rank's new storage order (all ranks compute all of them: the staging layout
    // depends on them); this rank's is new_own.
    std::vector<int64_t> new_unsel;
    for (int r = 0; r < world; ++r) {
      const std::vector<int64_t> order = part_order_after(s.ranges, r, s.parts[static_cast<size_t>(r)].cols, moves);
      new_unsel.insert(new_unsel.end(), order.begin(), order.end());
    }
    const std::vector<int64_t> new_own = part_order_after(s.ranges, me, s.own().cols, moves);
    // Positions of each column in this rank's old packed host arrays and the old device arrays.
    const std::vector<int64_t>& old_own = s.own().cols;
    std::vector<int64_t> host_pos(static_cast<size_t>(s.in), -1), dev_pos(static_cast<size_t>(s.in), -1);
    for (size_t j = 0; j < old_own.size(); ++j) host_pos[static_cast<size_t>(old_own[j])] = static_cast<int64_t>(j);
    for (size_t j = 0; j < s.sel_cpu.size(); ++j) dev_pos[static_cast<size_t>(s.sel_cpu[j])] = static_cast<int64_t>(j);
    const int64_t n_old = s.n_own(), n_leave = static_cast<int64_t>(leaving_own.size());
    const int64_t n_enter = static_cast<int64_t>(entering.size());

    // Leaving columns this rank owns: device state -> host (small D2H).
    at::Tensor dmaster = s.dev_master.defined() || s.sel_cpu.empty() ? s.dev_master
                         : streamed()                                ? s.w_sel.to(at::kFloat)
                                                                     : s.w2d.index_select(1, s.sel).to(at::kFloat);
    // Streamed: the weights of the columns leaving the device, for the host's buffers.
    at::Tensor leave_weights;
    if (streamed() && n_leave > 0) {
      std::vector<int64_t> lpos;
      for (int64_t c : leaving_own) lpos.push_back(dev_pos[static_cast<size_t>(c)]);
      leave_weights = s.w_sel.index_select(1, index_tensor(lpos, device)).to(at::kCPU).contiguous();
    }
    at::Tensor leave_state[3];
    if (n_leave > 0) {
      std::vector<int64_t> lpos;
      for (int64_t c : leaving_own) lpos.push_back(dev_pos[static_cast<size_t>(c)]);
      at::Tensor lidx = index_tensor(lpos, device);
      const at::Tensor dev_state[3] = {dmaster, s.dev_m, s.dev_v};
      for (int i = 0; i < 3; ++i) leave_state[i] = dev_state[i].index_select(1, lidx).to(at::kCPU).contiguous();
    }
    // Entering columns: host state -> device (small H2D), read before the re-pack.
    at::Tensor enter_state[3];
    if (n_enter > 0 && enter_ready.defined()) {
      for (int i = 0; i < 3; ++i) enter_state[i] = enter_ready[i];
    } else if (n_enter > 0) {
      std::vector<int64_t> epos, eslot;  // for the entering columns this rank owns
      for (size_t e = 0; e < entering.size(); ++e) {
        if (host_pos[static_cast<size_t>(entering[e])] < 0) continue;
        epos.push_back(host_pos[static_cast<size_t>(entering[e])]);
        eslot.push_back(static_cast<int64_t>(e));
      }
      at::Tensor all = at::zeros({3, s.out, n_enter}, f32cpu);
      if (!epos.empty()) {
        at::Tensor eidx = index_tensor(epos, at::kCPU);
        const bool every = static_cast<int64_t>(epos.size()) == n_enter;
        at::Tensor tmp =
            every ? at::Tensor() : at::empty({3, s.out, static_cast<int64_t>(epos.size())}, f32cpu);
        ColumnBatch batch;
        for (int i = 0; i < 3; ++i) host_gather(kStateBufs[i], s, eidx, every ? all[i] : tmp[i], batch);
        gather(batch);
        if (!every)
          for (int i = 0; i < 3; ++i) all[i].index_copy_(1, index_tensor(eslot, at::kCPU), tmp[i]);
      }
      all = all.to(device);
      if (partitioned()) coll->allreduce_sum_(all, CollectiveTraffic::kParameters);
      for (int i = 0; i < 3; ++i) enter_state[i] = all[i];
    }
    // New device arrays: kept columns from the old ones, entering ones from the host.
    {
      std::vector<int64_t> src;  // index into [old device columns | entering columns]
      size_t e = 0;
      for (int64_t c : new_sel) {
        if (dev_pos[static_cast<size_t>(c)] >= 0) {
          src.push_back(dev_pos[static_cast<size_t>(c)]);
        } else {
          while (entering[e] != c) ++e;
          src.push_back(static_cast<int64_t>(s.sel_cpu.size() + e));
        }
      }
      at::Tensor sidx = index_tensor(src, device);
      auto combine = [&](const at::Tensor& old_cols, const at::Tensor& enter) {
        at::Tensor base = old_cols.defined() ? old_cols : at::empty({s.out, 0}, enter.defined() ? enter.options() : at::TensorOptions().dtype(at::kFloat).device(device));
        at::Tensor all = enter.defined() ? at::cat({base, enter}, 1) : base;
        return all.index_select(1, sidx).contiguous();
      };
      at::Tensor new_master = combine(dmaster, enter_state[0]);
      s.dev_m = combine(s.dev_m, enter_state[1]);
      s.dev_v = combine(s.dev_v, enter_state[2]);
      s.dev_master = split_dtype != at::kFloat ? new_master : at::Tensor();
      // Entering columns' device copies take their master value.
      if (streamed())
        s.w_sel = combine(s.w_sel, n_enter > 0 ? enter_state[0].to(split_dtype) : at::Tensor());
      else if (n_enter > 0)
        scatter_columns(s.w2d, index_tensor(entering, device), enter_state[0]);
    }
    if (static_cast<int64_t>(new_own.size()) == n_old) {
      // Slot for slot: each leaving column is written where a column that moved to the
      // device was (part_order_after); nothing else moves.
      std::vector<int64_t> slots;
      for (size_t q = 0; q < new_own.size(); ++q)
        if (host_pos[static_cast<size_t>(new_own[q])] < 0) slots.push_back(static_cast<int64_t>(q));
      if (!slots.empty()) {
        const at::Tensor sidx = index_tensor(slots, at::kCPU);
        if (defer_host) {
          SlotFix f;
          f.split_index = static_cast<size_t>(&s - split.data());
          f.slots = sidx;
          for (int i = 0; i < 3; ++i) f.state[i] = leave_state[i];
          if (streamed())
            f.weights = leave_weights;
          else if (out_copy())
            f.weights = s.w2d.index_select(1, index_tensor(leaving_own, device)).to(at::kCPU).contiguous();
          slot_fixes.push_back(std::move(f));
        } else {
          ColumnBatch batch;
          for (int i = 0; i < 3; ++i) host_scatter(kStateBufs[i], s, sidx, leave_state[i], batch);
          scatter(batch);
        }
        // Streamed: what streams next holds the leaving columns' weights in their slots now.
        if (streamed()) {
          h2d_from_out[applied_out].wait();
          device_ops::scatter_columns(own_view(param_out[applied_out], s), sidx, leave_weights);
        }
      }
    } else {
      if (defer_host) throw std::logic_error("migrate: a re-pack while a host step is in flight");
      if (streamed() && n_leave > 0 && !partitioned())  // one rank re-packs only at its first selection
        throw std::logic_error("migrate: a streamed re-pack with columns leaving the device");
      // Re-pack this rank's host arrays: [old packed | leaving] -> new packed, row by row.
      std::vector<int64_t> src;
      size_t l = 0;
      for (int64_t c : new_own) {
        if (host_pos[static_cast<size_t>(c)] >= 0) {
          src.push_back(host_pos[static_cast<size_t>(c)]);
        } else {
          while (leaving_own[l] != c) ++l;
          src.push_back(n_old + static_cast<int64_t>(l));
        }
      }
      // The backend re-packs its own arrays (a remote one: only the leaving columns travel).
      for (int i = 0; i < 3; ++i) {
        const at::Tensor leaving = n_leave > 0 ? leave_state[i] : at::empty({s.out, 0}, f32cpu);
        host->repack_columns(kStateBufs[i], s.host_offset, s.out, n_old, src, leaving.data_ptr<float>(), n_leave);
      }
    }
    s.sel_cpu = new_sel;
    s.unsel_cpu = new_unsel;
    s.sel = index_tensor(s.sel_cpu, device);
    assign_parts(s);
  }

  // A re-selection decided at a boundary: per matrix, the fresh top-k when it differs.
  struct Reselection {
    bool due = false;  // some matrix was due (resets the selection counters)
    bool changed = false;
    std::vector<std::vector<int64_t>> fresh;  // per matrix; empty when unchanged
    std::vector<ColumnMoves> moves;           // per matrix: from the current set to fresh
    std::vector<at::Tensor> ready;            // per matrix: enter_window_step's result
  };

  Reselection plan_reselection(int64_t epoch) {
    Reselection p;
    p.fresh.resize(split.size());
    p.moves.resize(split.size());
    p.ready.resize(split.size());
    const std::vector<bool> due = reselection_due(epoch);
    for (size_t i = 0; i < split.size(); ++i) {
      if (!due[i]) continue;
      p.due = true;
      std::vector<int64_t> fresh = top_k(split[i].score_acc, split[i].k);
      if (fresh == split[i].sel_cpu) continue;
      p.moves[i] = column_moves(split[i].sel_cpu, fresh);
      p.fresh[i] = std::move(fresh);
      p.changed = true;
    }
    return p;
  }

  // Carries out a planned re-selection (null: planned now, with nothing in flight). With a
  // host step in flight on the current layout: when every rank's moves are slot for slot
  // (always with one rank) they leave it running (SlotFix); otherwise it is waited for and
  // its low-precision output re-packed with the host arrays.
  void reselect(int64_t epoch, StepReport& rep, Reselection* plan) {
    Reselection local;
    if (plan == nullptr) {
      local = plan_reselection(epoch);
      plan = &local;
    }
    if (!plan->due) return;
    ClockSpan span = clock_span();
    if (plan->changed) {
      const bool in_flight = inflight && inflight->work;
      bool in_place = true;  // every matrix's moves slot for slot
      for (size_t i = 0; i < split.size(); ++i)
        if (!plan->fresh[i].empty() && !slot_for_slot(split[i].ranges, plan->moves[i])) in_place = false;
      std::vector<std::vector<int64_t>> old_cols;
      std::vector<int64_t> old_offset;
      if (in_flight && !in_place) wait_for(StallCause::kHostOptimizer, inflight->work);
      if (!in_place && (in_flight || streamed())) {
        for (auto& sp : split) {
          old_cols.push_back(sp.own().cols);
          old_offset.push_back(sp.local_offset);
        }
      }
      // Streamed, several ranks: the columns leaving the device have their weights in w_sel
      // only; the re-packs below take them from before the moves.
      leaving_from.clear();
      if (streamed() && !in_place)
        for (auto& sp : split) leaving_from.emplace_back(sp.sel_cpu, sp.w_sel.to(at::kCPU));
      for (size_t i = 0; i < split.size(); ++i)
        if (!plan->fresh[i].empty()) migrate(split[i], plan->fresh[i], plan->ready[i], in_flight && in_place);
      relayout();
      if (in_flight && !in_place && out_copy()) repack_staged(param_out[inflight->buffer], old_cols, old_offset);
      if (streamed() && !in_place) {  // the weights that stream next
        h2d_from_out[applied_out].wait();
        repack_staged(param_out[applied_out], old_cols, old_offset);
      }
      leaving_from.clear();
      gathered_dirty = partitioned() && streamed();
      ++selection.reselections;
    }
    selection.restart(epoch);
    rep.reselected = plan->changed;
    span.end(TimeKind::kDeviceOptimizer);
  }

  // What enter_window_step reads from the host for one matrix: the entering columns this
  // rank owns, their slots among `entering`, and their pre-step master, m, v and (windows
  // of several steps) window accumulator, [4, out, n] on the CPU once `batch` is gathered.
  // All matrices' reads go in one batch: one round trip to a remote backend.
  struct EnterReads {
    std::vector<int64_t> epos, eslot, ecols;  // position in this rank's host columns, slot, column
    at::Tensor state;
  };
  EnterReads read_entering(const SplitParam& s, const std::vector<int64_t>& entering, int64_t len, int parity,
                           ColumnBatch& batch) const {
    EnterReads r;
    std::vector<int64_t> host_pos(static_cast<size_t>(s.in), -1);
    for (size_t q = 0; q < s.own().cols.size(); ++q)
      host_pos[static_cast<size_t>(s.own().cols[q])] = static_cast<int64_t>(q);
    for (size_t e = 0; e < entering.size(); ++e) {
      if (host_pos[static_cast<size_t>(entering[e])] < 0) continue;
      r.epos.push_back(host_pos[static_cast<size_t>(entering[e])]);
      r.eslot.push_back(static_cast<int64_t>(e));
      r.ecols.push_back(entering[e]);
    }
    if (r.epos.empty()) return r;
    const at::Tensor pos_cpu = index_tensor(r.epos, at::kCPU);
    const bool acc = len > 1 || last_in_acc();
    r.state = at::empty({acc ? 4 : 3, s.out, static_cast<int64_t>(r.epos.size())}, at::kFloat);
    for (int i = 0; i < 3; ++i) host_gather(kStateBufs[i], s, pos_cpu, r.state[i], batch);
    if (acc) host_gather(acc_buffer(parity), s, pos_cpu, r.state[3], batch);
    return r;
  }

  // This window's host step for the columns about to enter the device, run on the device
  // (the same AdamW formula, bit for bit; the host updater's step count and learning
  // rate) before the window is handed over: returns their updated [3, out, n_entering]
  // master, m, v. Takes their pre-step state and window accumulator from `r` (read from
  // the host once the window's accumulate jobs were done) and their last gradient from
  // the device: `g` with one rank, this rank's reduce-scattered `shard` with several
  // (whose owners compute; the result is all-reduced).
  at::Tensor enter_window_step(SplitParam& s, const std::vector<int64_t>& entering, const EnterReads& r,
                               const std::vector<at::Tensor>& g, const at::Tensor& shard, int64_t len,
                               const AdamWCoeffs& c) {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    const int64_t n_enter = static_cast<int64_t>(entering.size());
    at::Tensor all = at::zeros({3, s.out, n_enter}, f32);
    if (r.state.defined()) {
      const at::Tensor state = r.state.to(device);
      at::Tensor w = state[0], mm = state[1], vv = state[2];
      at::Tensor grad;
      if (last_in_acc()) {
        grad = state[3];  // the window's sum, its last gradient included (close_window)
      } else {
        at::Tensor last =
            streamed()      ? own_view(own_grad(), s).index_select(1, index_tensor(r.epos, at::kCPU)).to(device)
            : partitioned() ? own_view(shard, s).index_select(1, index_tensor(r.epos, device))
                            : g[s.index].view({s.out, s.in}).index_select(1, index_tensor(r.ecols, device));
        grad = last.to(at::kFloat);
        if (len > 1) grad = state[3].add_(grad);  // (acc + last) * (1/len), as the host kernel
      }
      device_ops::dense_adamw(w, grad.contiguous(), at::Tensor(), mm, vv, c, 1.0f / static_cast<float>(len));
      const at::Tensor slot_idx = index_tensor(r.eslot, device);
      all[0].index_copy_(1, slot_idx, w);
      all[1].index_copy_(1, slot_idx, mm);
      all[2].index_copy_(1, slot_idx, vv);
    }
    if (partitioned()) coll->allreduce_sum_(all, CollectiveTraffic::kParameters);
    return all;
  }

  // Re-pack of a buffer in the staging layout after a re-pack of the host arrays (several
  // ranks, uneven moves: the in-flight step's low-precision output; streamed, the first
  // selection: the streamed weights and the step's host gradient). `old_cols` / `old_offset`
  // per matrix describe its layout before; columns new to the host (leaving the device) get
  // their current weights, which only the weights' buffers may be asked for.
  void repack_staged(const at::Tensor& buf, const std::vector<std::vector<int64_t>>& old_cols,
                     const std::vector<int64_t>& old_offset) {
    h2d_from_pack.wait();  // pack_out is the scratch here (a temporary when streaming)
    at::Tensor out = pack_out.defined() && pack_out.scalar_type() == buf.scalar_type()
                         ? pack_out
                         : at::empty({own_total()}, buf.options());
    for (size_t i = 0; i < split.size(); ++i) {
      SplitParam& sp = split[i];
      const int64_t n_old = static_cast<int64_t>(old_cols[i].size());
      const at::Tensor old_view = buf.narrow(0, old_offset[i], n_old * sp.out).view({sp.out, n_old});
      std::vector<int64_t> pos(static_cast<size_t>(sp.in), -1);
      for (size_t q = 0; q < old_cols[i].size(); ++q) pos[static_cast<size_t>(old_cols[i][q])] = static_cast<int64_t>(q);
      std::vector<int64_t> src, leaving;
      for (int64_t c : sp.own().cols) {
        if (pos[static_cast<size_t>(c)] >= 0) {
          src.push_back(pos[static_cast<size_t>(c)]);
        } else {
          src.push_back(n_old + static_cast<int64_t>(leaving.size()));
          leaving.push_back(c);
        }
      }
      if (src.empty()) continue;
      at::Tensor combined = old_view;
      if (!leaving.empty()) {
        at::Tensor weights;
        if (streamed()) {  // the columns the device held were in w_sel (leaving_from), not w2d
          if (leaving_from.size() != split.size())
            throw std::logic_error("engine: a streamed re-pack with columns leaving the device");
          const auto& [sel_before, w_before] = leaving_from[i];
          std::vector<int64_t> at;
          for (int64_t c : leaving)
            at.push_back(std::lower_bound(sel_before.begin(), sel_before.end(), c) - sel_before.begin());
          weights = w_before.index_select(1, index_tensor(at, at::kCPU));
        } else {
          weights = sp.w2d.index_select(1, index_tensor(leaving, device)).to(at::kCPU);
        }
        combined = at::cat({old_view, weights}, 1);
      }
      device_ops::gather_columns(combined.contiguous(), index_tensor(src, at::kCPU), own_view(out, sp));
    }
    buf.narrow(0, 0, own_total()).copy_(out.narrow(0, 0, own_total()));
  }

  // `step_scores`: this step's all-reduced scores of all matrices (several ranks);
  // undefined: computed from g.
  void select_all(const std::vector<at::Tensor>& g, const at::Tensor& step_scores, int64_t epoch) {
    if (streamed()) {
      select_all_streamed(step_scores, epoch);
      return;
    }
    int64_t off = 0;
    for (auto& s : split) {
      const at::Tensor sc = step_scores.defined() ? step_scores.narrow(0, off, s.in) : scores_of(g[s.index], s);
      off += s.in;
      migrate(s, top_k(sc, s.k));
    }
    relayout();
    selection.first_selection_made(epoch);
  }

  // The first selection with streamed columns: every column is the host's, so the scores
  // (`step_scores`, all-reduced, with several ranks) and this step's gradient of the newly
  // selected columns come from host_grad; then the host's buffers (the weights that stream,
  // the step's gradient) are re-packed without them.
  void select_all_streamed(const at::Tensor& step_scores, int64_t epoch) {
    std::vector<std::vector<int64_t>> old_cols, old_unsel;
    std::vector<int64_t> old_offset, old_all_offset;
    int64_t off = 0;
    for (auto& s : split) {
      old_cols.push_back(s.own().cols);
      old_offset.push_back(s.local_offset);
      old_unsel.push_back(s.unsel_cpu);
      old_all_offset.push_back(s.all_offset);
      const at::Tensor host = all_view(host_grad, s);  // every column
      const at::Tensor sc = step_scores.defined() ? step_scores.narrow(0, off, s.in)
                                                  : streamed_scores(s);
      off += s.in;
      const std::vector<int64_t> fresh = top_k(sc, s.k);
      std::vector<int64_t> pos(static_cast<size_t>(s.in), -1);
      for (size_t q = 0; q < s.unsel_cpu.size(); ++q) pos[static_cast<size_t>(s.unsel_cpu[q])] = static_cast<int64_t>(q);
      std::vector<int64_t> at_pos;
      for (int64_t c : fresh) at_pos.push_back(pos[static_cast<size_t>(c)]);
      const at::Tensor chosen = host.index_select(1, index_tensor(at_pos, at::kCPU)).to(device).contiguous();
      migrate(s, fresh);
      s.g_sel = chosen;
    }
    relayout();
    h2d_from_out[applied_out].wait();
    repack_staged(param_out[applied_out], old_cols, old_offset);
    repack_host_columns(host_grad, old_unsel, old_all_offset);
    gathered_dirty = partitioned();
    selection.first_selection_made(epoch);
  }
  // A matrix-major buffer (all_view) re-packed after columns left the host (the first
  // selection): `old_unsel` / `old_offset` per matrix describe it before. Matrix by matrix in
  // order: each one's new place ends where the next one's old place begins, or before.
  void repack_host_columns(const at::Tensor& buf, const std::vector<std::vector<int64_t>>& old_unsel,
                           const std::vector<int64_t>& old_offset) {
    for (size_t i = 0; i < split.size(); ++i) {
      const SplitParam& sp = split[i];
      const int64_t n_old = static_cast<int64_t>(old_unsel[i].size());
      std::vector<int64_t> pos(static_cast<size_t>(sp.in), -1);
      for (size_t q = 0; q < old_unsel[i].size(); ++q) pos[static_cast<size_t>(old_unsel[i][q])] = static_cast<int64_t>(q);
      std::vector<int64_t> src;
      for (int64_t c : sp.unsel_cpu) {
        if (pos[static_cast<size_t>(c)] < 0)
          throw std::logic_error("engine: a re-pack of host columns with columns new to the host");
        src.push_back(pos[static_cast<size_t>(c)]);
      }
      if (src.empty()) continue;
      const at::Tensor old_view = buf.narrow(0, old_offset[i], n_old * sp.out).view({sp.out, n_old});
      const at::Tensor moved = old_view.index_select(1, index_tensor(src, at::kCPU));
      all_view(buf, sp).copy_(moved);
    }
  }
  at::Tensor column_scores_of(const at::Tensor& grad2d) const {
    return device_ops::column_scores(grad2d, opt.importance == Importance::kL1);
  }

  // Per matrix: the masses of this window's scores; `fresh` (or null): per matrix, the
  // mass of the top-k by them.
  std::vector<WindowMass> window_masses(std::vector<double>* fresh) {
    const bool with_fresh = fresh != nullptr;
    std::vector<at::Tensor> parts;
    for (auto& s : split) {
      at::Tensor sel_mass = s.k > 0 ? s.score_acc.index_select(0, s.sel).sum() : at::zeros({}, s.score_acc.options());
      parts.push_back(sel_mass);
      parts.push_back(s.score_acc.sum());
      if (with_fresh)
        parts.push_back(s.k > 0 ? std::get<0>(at::topk(s.score_acc, s.k)).sum() : at::zeros({}, s.score_acc.options()));
    }
    at::Tensor all = at::stack(parts).to(at::kCPU).to(at::kDouble);
    const double* a = all.data_ptr<double>();
    std::vector<WindowMass> out;
    const size_t stride = with_fresh ? 3 : 2;
    for (size_t i = 0; i < split.size(); ++i) {
      out.push_back({a[i * stride], a[i * stride + 1], split[i].k, split[i].n_host()});
      if (with_fresh) fresh->push_back(a[i * stride + 2]);
    }
    return out;
  }

  // Zen-auto (§4): is the open window's mass ready for the host step?
  bool zen_auto_window_ready() { return zen_auto_ready(window_masses(nullptr), schedule.position, opt.auto_ratio); }

  // Which matrices to re-select at this boundary (none, all, or those that drifted).
  std::vector<bool> reselection_due(int64_t epoch) {
    if (selection.all_due(epoch)) return std::vector<bool>(split.size(), true);
    std::vector<bool> due(split.size(), false);
    if (!selection.drift_decides()) return due;
    std::vector<double> fresh;
    const std::vector<WindowMass> masses = window_masses(&fresh);
    for (size_t i = 0; i < split.size(); ++i) due[i] = selection_drifted(masses[i], fresh[i], selection.threshold);
    return due;
  }

  // --- The step ---
  StepReport step(const StepContext& ctx) {
    applied_host_seconds = -1;
    StepReport rep = step_work(ctx);
    regather();  // several ranks, streamed: what the next step streams
    prefetch_inflight();  // after this step's work: the copy waits for no compute still to come
    rep.host_step_seconds = applied_host_seconds;
    return rep;
  }

  // One step, section by section of docs/semantics.md.
  StepReport step_work(const StepContext& ctx) {
    StepReport rep = staleness_report();  // §4: what this step's gradient did not see
    std::vector<at::Tensor> g = grads();
    if (streamed()) complete_unit_gradients();
    SyncedGradients synced = exchange_gradients(g, ctx.epoch);  // §9 (several ranks)
    ClockSpan dev_span = clock_span();
    rep.grad_norm = global_norm(g, synced);  // §5
    if (!std::isfinite(rep.grad_norm)) {
      ++skipped;
      rep.skipped = true;
      dev_span.end(TimeKind::kDeviceOptimizer);
      return rep;
    }
    schedule.note_staleness(rep.staleness_windows);
    clip(g, synced, rep.grad_norm);  // §5
    const bool warm = in_warmup();
    last_lr = ctx.lr;
    // §2: first selection, on the first step after warm-up, from this step's gradient.
    if (zenflow() && !warm && !selection.selected) select_all(g, synced.scores, ctx.epoch);
    update_on_device(g, ctx.lr);  // §3 device updater
    if (zenflow() && !warm) accumulate_scores(g, synced);  // §2: the window's summed scores
    dev_span.end(TimeKind::kDeviceOptimizer);
    schedule.step_taken();
    if (split.empty()) return rep;
    if (warm) {
      host_step_now(g, synced.shard, ctx.lr);  // §4 warm-up (and offload mode)
      return rep;
    }
    const int64_t pos = schedule.add_to_window();
    selection.step_in_window();
    if (!schedule.closes_window([&] { return zen_auto_window_ready(); })) {
      accumulate_on_host(g, synced.shard, pos);  // §3 host updater, mid-window
      return rep;
    }
    rep.boundary = true;  // §4 boundary: hand the window over, apply, re-select
    WindowHandover w = close_window(g, synced.shard, ctx.lr);
    if (opt.overlap_step)
      pipeline_window(std::move(w), g, synced.shard, ctx, rep);
    else
      run_window_now(std::move(w), ctx.epoch, rep);
    for (auto& s : split) s.score_acc.zero_();
    return rep;
  }

  // --- The step's sections ---
  StepReport staleness_report() const {
    StepReport rep;
    if (zenflow() && selection.selected) {
      rep.staleness_windows = schedule.stale_windows();
      rep.staleness_steps = schedule.stale_steps();
    }
    return rep;
  }

  bool exchanges_gradients() const { return partitioned() && !split.empty(); }

  // Several ranks: the first selection comes before the gradients are exchanged, so that
  // this step's exchange already follows it (top-k is unaffected by clipping's uniform
  // scale; a non-finite score means a skipped step, which selects nothing); then the
  // split gradients are exchanged (sync_split_gradients). One rank: nothing.
  SyncedGradients exchange_gradients(const std::vector<at::Tensor>& g, int64_t epoch) {
    if (!exchanges_gradients()) return SyncedGradients{};
    if (zenflow() && !in_warmup() && !selection.selected) {
      at::Tensor sc;
      stalled(StallCause::kAllreduce, [&] {
        std::vector<at::Tensor> parts;
        for (auto& s : split) parts.push_back(streamed() ? streamed_scores(s) : scores_of(g[s.index], s));
        sc = at::cat(parts);
        coll->allreduce_sum_(sc, CollectiveTraffic::kSelection);
      });
      if (std::isfinite(sc.sum().item<double>())) select_all(g, sc, epoch);
    }
    return streamed() ? sync_streamed_gradients(zenflow() && !in_warmup())
                      : sync_split_gradients(g, zenflow() && !in_warmup());
  }

  // §5: the global L2 norm of the (averaged) gradient, before clipping.
  double global_norm(const std::vector<at::Tensor>& g, const SyncedGradients& synced) const {
    std::vector<at::Tensor> norms;
    norms.reserve(g.size() + 2);
    // fp32 norms; on CUDA a low-precision gradient is read as it is (accumulated in fp32),
    // without an fp32 copy of it.
    auto norm32 = [](const at::Tensor& x) {
      if (x.scalar_type() == at::kFloat) return x.norm();
      if (x.is_cuda()) return at::linalg_vector_norm(x, 2, at::OptionalIntArrayRef{}, false, at::kFloat);
      return x.to(at::kFloat).norm();
    };
    if (norm_group) {
      // This rank's shards of every parameter: the squares summed over the group.
      for (auto& x : g) norms.push_back(norm32(x));
      at::Tensor sq = norms.empty() ? at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device))
                                    : at::stack(norms).pow(2).sum().reshape({1});
      norm_group->allreduce_sum_(sq, CollectiveTraffic::kGradients);
      return sq.sqrt().item<double>();
    }
    // A parameter's norm is summed column by column (matrix_norm) over the [out, in] it is
    // split as (as_columns), so that it is the same number in every mode and wherever its
    // columns are: one tensor, split, or streamed (the selected columns' on the device and the
    // others' on the host).
    if (!exchanges_gradients()) {  // in the parameters' order, whichever updater has them
      std::vector<at::Tensor> by_param(params.size());
      for (auto& d : dense) by_param[d.index] = matrix_norm(as_columns(g[d.index]));
      for (auto& s : split) by_param[s.index] = split_norm(g, s);
      for (auto& n : by_param)
        if (n.defined()) norms.push_back(n);
    } else {
      // Split parameters' local gradients are not the averaged ones: their norm is the
      // selected columns' (replicated) plus every rank's shard.
      for (auto& d : dense) norms.push_back(matrix_norm(as_columns(g[d.index])));
      norms.push_back(synced.replicated_sq.sqrt());
      norms.push_back(synced.shards_sq.to(at::kFloat).sqrt());
    }
    return at::stack(norms).norm().item<double>();
  }

  // The fp32 L2 norm of a matrix's gradient [out, in]: the sum of its columns' sums of squares
  // (column_squares), in column order.
  static at::Tensor matrix_norm(const at::Tensor& g2d) { return column_squares(g2d).sum().sqrt(); }
  // fp32 [in] on g2d's device: each column's sum of squares, summed row by row
  // (device_ops::accumulate_column_scores): on the CPU a column's bits do not depend on the
  // columns beside it.
  static at::Tensor column_squares(const at::Tensor& g2d) {
    at::Tensor x = g2d.is_cuda() || g2d.scalar_type() == at::kFloat ? g2d : g2d.to(at::kFloat);
    at::Tensor sums = at::zeros({x.size(1)}, x.options().dtype(at::kFloat));
    device_ops::accumulate_column_scores(x.contiguous(), /*l1=*/false, sums);
    return sums;
  }
  // A split matrix's (one rank's) step gradient norm, as matrix_norm gives it. Streamed, the
  // selected columns' sums come from g_sel and the host-owned ones' from host_grad: the bits
  // the whole gradient's columns give, so clipping is the same with and without
  // train.offload_parameters.
  at::Tensor split_norm(const std::vector<at::Tensor>& g, const SplitParam& s) const {
    if (!streamed()) return matrix_norm(g[s.index].view({s.out, s.in}));
    at::Tensor columns = at::zeros({s.in}, at::TensorOptions().dtype(at::kFloat).device(device));
    if (s.k > 0 && selection.selected) columns.index_copy_(0, s.sel, column_squares(s.g_sel));
    if (s.n_host() > 0) columns.index_copy_(0, s.unsel, column_squares(all_view(host_grad, s)).to(device));
    return columns.sum().sqrt();
  }

  // §5: clipping, once, to the whole gradient before the split (and to the exchanged
  // shard and scores with several ranks).
  void clip(std::vector<at::Tensor>& g, SyncedGradients& synced, double norm) const {
    if (opt.grad_clip > 0) {
      const double coef = opt.grad_clip / (norm + 1e-6);
      if (coef < 1.0) {
        for (auto& x : g)
          if (x.defined()) x.mul_(coef);
        if (streamed()) {
          for (auto& s : split)
            if (s.k > 0 && selection.selected) s.g_sel.mul_(coef);
          if (!exchanges_gradients()) host_grad.narrow(0, 0, own_total()).mul_(coef);  // else synced.shard
        }
        for (auto& s : split)  // sharded: the given scores are of the unclipped gradients
          if (const at::Tensor& given = params[s.index].column_scores; given.defined())
            given.mul_(opt.importance == Importance::kL1 ? coef : coef * coef);
        if (exchanges_gradients()) {
          synced.shard.mul_(coef);
          if (synced.scores.defined()) synced.scores.mul_(opt.importance == Importance::kL1 ? coef : coef * coef);
        }
      }
    }
  }

  // §3 device updater: always-device parameters and selected columns.
  void update_on_device(const std::vector<at::Tensor>& g, double lr) {
    ++device_step;
    for (auto& d : dense)
      device_ops::dense_adamw(d.p, g[d.index], d.master, d.m, d.v, coeffs(lr, d.weight_decay, device_step),
                              1.0f);
    if (selection.selected && streamed()) {  // the selected columns are a matrix of their own
      for (auto& s : split)
        if (s.k > 0)
          device_ops::dense_adamw(s.w_sel, s.g_sel, s.dev_master, s.dev_m, s.dev_v,
                                  coeffs(lr, s.weight_decay, device_step), 1.0f);
    } else if (selection.selected) {
      for (auto& s : split)
        if (s.k > 0)
          device_ops::selected_adamw(s.w2d, g[s.index].view({s.out, s.in}), s.sel, s.dev_master, s.dev_m,
                                     s.dev_v, coeffs(lr, s.weight_decay, device_step), 1.0f);
    }
  }

  // §2: this step's column scores into the window's (all-reduced with several ranks).
  void accumulate_scores(const std::vector<at::Tensor>& g, const SyncedGradients& synced) {
    int64_t off = 0;
    for (auto& s : split) {
      if (exchanges_gradients())
        s.score_acc.add_(synced.scores.narrow(0, off, s.in));
      else if (const at::Tensor& given = params[s.index].column_scores; given.defined())
        s.score_acc.add_(given);  // sharded: the whole matrix's scores
      else if (streamed())
        accumulate_streamed_scores(s, s.score_acc);
      else
        device_ops::accumulate_column_scores(g[s.index].view({s.out, s.in}),
                                             opt.importance == Importance::kL1, s.score_acc);
      off += s.in;
    }
  }

  // Warm-up and offload mode: one synchronous host step over every host column.
  void host_step_now(const std::vector<at::Tensor>& g, const at::Tensor& shard, double lr) {
    // Warm-up comes before any window and offload mode has none: no accumulate reads ring[0].
    if (ring_busy[0] && !ring_busy[0]->done())
      throw std::logic_error("engine: a synchronous host step while an accumulate still reads the gradient ring");
    StepJob job;
    if (streaming) {
      job = make_step_job(lr, at::Tensor(), -1, 1.0f, 0, stream_gradients(g, shard));
      job.before = [h2d = h2d_from_out[0]]() mutable { h2d.wait(); };
    } else {
      job = make_step_job(lr, ring[0], -1, 1.0f, 0);
      job.before = [d2h = stage_gradients(g, shard, ring[0]), h2d = h2d_from_out[0]]() mutable {
        d2h.wait();
        h2d.wait();
      };
    }
    auto work = host->submit(std::move(job));
    wait_for(StallCause::kHostOptimizer, work);
    applied_host_seconds = work->run_seconds();
    apply_host_result(0);
  }

  // Mid-window (`pos`: the step's position in it): the host-owned gradient columns go to
  // the host and are added to the window's accumulator (overwriting it at position 1).
  void accumulate_on_host(const std::vector<at::Tensor>& g, const at::Tensor& shard, int64_t pos) {
    const int parity = schedule.parity();
    if (streaming) {
      pending_accumulates.push_back(
          host->submit(make_accumulate_job(at::Tensor(), parity, pos == 1, stream_gradients(g, shard))));
      return;
    }
    // Staged into a ring buffer the accumulate job has released.
    const int r = static_cast<int>((pos - 1) % ring_slots());
    if (ring_busy[r]) wait_for(StallCause::kHostOptimizer, ring_busy[r]);
    AccumulateJob job = make_accumulate_job(ring[r], parity, pos == 1);
    job.before = [d2h = stage_gradients(g, shard, ring[r])]() mutable { d2h.wait(); };
    auto work = host->submit(std::move(job));
    ring_busy[r] = work;
    pending_accumulates.push_back(work);
  }

  // A closed window's host step, built but not yet submitted (submit_window).
  struct WindowHandover {
    StepJob job;
    CopyHandle d2h;  // the D2H of the window's last gradient (none when streaming)
    int parity = 0;  // the window's accumulator
    int out = 0;     // the param_out buffer the step writes
    int64_t len = 0;  // the window's steps
    std::vector<std::shared_ptr<HostWork>> accumulates;  // the window's accumulate jobs
  };

  // Boundary (§4): stages the window's last gradient, builds the host step over the
  // window's mean gradient (the host updater's next step count; the learning rate of the
  // window's last step) and closes the window.
  WindowHandover close_window(const std::vector<at::Tensor>& g, const at::Tensor& shard, double lr) {
    WindowHandover w;
    w.parity = schedule.parity();
    std::shared_ptr<GradSource> source;
    if (streaming)
      source = stream_gradients(g, shard);
    else if (last_in_acc())
      accumulate_on_host(g, shard, schedule.position);
    else
      w.d2h = stage_gradients(g, shard, last_grad[w.parity]);
    w.len = schedule.position;
    w.accumulates = std::move(pending_accumulates);
    pending_accumulates.clear();
    w.out = out_index(w.parity);
    const bool from_acc = streaming || last_in_acc();
    w.job = make_step_job(lr, from_acc ? at::Tensor() : last_grad[w.parity],
                          w.len > 1 || last_in_acc() ? w.parity : -1, 1.0f / static_cast<float>(w.len), w.out,
                          std::move(source));
    schedule.close_window();
    selection.window_closed();
    return w;
  }

  // Before the host step reads and writes: its last D2H and the H2D out of the param_out
  // buffer it writes (two windows ago; streaming: the one buffer, whose H2D of window
  // k-1 was started before) must have completed — so this is called after window k-1 was
  // applied. The window's accumulates run before it by the HostOptimizer ordering rule;
  // waiting for them here would cost a remote backend a round trip at every boundary,
  // so they are waited for with the step.
  std::shared_ptr<HostWork> submit_window(WindowHandover& w) {
    w.job.before = [d2h = w.d2h, h2d = h2d_from_out[w.out]]() mutable {
      d2h.wait();
      h2d.wait();
    };
    return host->submit(std::move(w.job));
  }

  // overlap_step false: the window's host step runs now and reaches the device before
  // the next step; then the re-selection, if one is due.
  void run_window_now(WindowHandover w, int64_t epoch, StepReport& rep) {
    auto work = submit_window(w);
    wait_for(StallCause::kHostOptimizer, work);
    for (auto& a : w.accumulates) wait_for(StallCause::kHostOptimizer, a);
    apply_host_result(w.out);
    schedule.window_applied();
    reselect(epoch, rep, nullptr);
  }

  // overlap_step true, the one-deep pipeline: window k-1's host step is waited for and
  // applied, window k's goes to the host to run during window k+1. Re-selection (§4) is
  // decided at the boundary from this window's scores, before window k is handed over:
  // the columns that enter the device get this window's host step on the device now,
  // the others keep their slots, and window k runs on the host like any other — no
  // pipeline drain. The plan reads only the scores (its device-to-host read waits for
  // this step's device work, not for the H2D that applying window k-1 enqueues next).
  void pipeline_window(WindowHandover w, const std::vector<at::Tensor>& g, const at::Tensor& shard,
                       const StepContext& ctx, StepReport& rep) {
    Reselection plan = plan_reselection(ctx.epoch);
    complete_inflight();  // window k-1: waits (stall host_optimizer), then H2D
    if (plan.changed) {
      for (auto& a : w.accumulates) wait_for(StallCause::kHostOptimizer, a);
      ClockSpan span = clock_span();
      std::vector<EnterReads> reads(split.size());
      ColumnBatch batch;
      for (size_t i = 0; i < split.size(); ++i)
        if (!plan.moves[i].entering.empty())
          reads[i] = read_entering(split[i], plan.moves[i].entering, w.len, w.parity, batch);
      gather(batch);
      for (size_t i = 0; i < split.size(); ++i)
        if (!plan.moves[i].entering.empty())
          plan.ready[i] = enter_window_step(split[i], plan.moves[i].entering, reads[i], g, shard, w.len,
                                            coeffs(ctx.lr, split[i].weight_decay, host_step));
      span.end(TimeKind::kDeviceOptimizer);
    }
    // Streamed: the weights that stream during window k+1 are those before window k's step,
    // which must not write them: the first window after warm-up (or a restore) would (the
    // warm-up's output is in the buffer of its parity); they move to the other buffer once.
    if (streamed() && applied_out == w.out) {
      const int other = 1 - w.out;
      h2d_from_out[other].wait();
      h2d_from_out[w.out].wait();
      param_out[other].narrow(0, 0, own_total()).copy_(param_out[w.out].narrow(0, 0, own_total()));
      applied_out = other;
    }
    auto work = submit_window(w);
    inflight.reset(new InFlight{std::move(work), w.out, std::move(w.accumulates)});
    reselect(ctx.epoch, rep, &plan);
  }

  // Applies the in-flight host step, then closes an open window early so that no
  // accumulated gradient is lost at the end of training.
  void finish() {
    wait_accumulates();
    complete_inflight();
    if (schedule.position == 0 || split.empty()) return;
    const int parity = schedule.parity();
    const int out = out_index(parity);
    const int64_t len = schedule.position;
    StepJob job = make_step_job(last_lr, at::Tensor(), parity, 1.0f / static_cast<float>(len), out);
    job.before = [h2d = h2d_from_out[out]]() mutable { h2d.wait(); };
    auto work = host->submit(std::move(job));
    wait_for(StallCause::kHostOptimizer, work);
    apply_host_result(out);
    schedule.close_window();
    schedule.window_applied();
    for (auto& s : split) s.score_acc.zero_();
  }
};

std::vector<std::pair<std::string, at::Tensor>> ZenFlowOptimizer::state_dict() {
  Impl& i = *impl_;
  // Its caller times it (the trainer's `checkpoint` stall): waits booked here too counted twice.
  i.wait_accumulates(false);
  if (i.inflight && i.inflight->work) i.inflight->work->wait();
  i.apply_slot_fixes();  // the host arrays must hold the leaving columns' state
  std::vector<std::pair<std::string, at::Tensor>> out;
  const EngineScalars scalars{i.schedule,    i.selection, i.skipped,
                              i.device_step, i.host_step, i.inflight != nullptr};
  out.emplace_back("engine/scalars", index_tensor(scalars.to_vector(), at::kCPU));
  out.emplace_back("engine/last_lr", at::full({1}, i.last_lr, at::kDouble));
  out.emplace_back("engine/partition", index_tensor({i.me, i.world}, at::kCPU));
  auto cpu = [](const at::Tensor& x) { return x.to(at::kCPU).clone(); };
  const int parity = i.schedule.parity();
  for (auto& s : i.split) {
    const std::string p = "split/" + i.params[s.index].name + "/";
    out.emplace_back(p + "sel", index_tensor(s.sel_cpu, at::kCPU));
    // This rank's shard of the host state: the columns host_cols, in that order.
    out.emplace_back(p + "host_cols", index_tensor(s.own().cols, at::kCPU));
    out.emplace_back(p + "host_master", i.host_view(HostBuf::kMaster, s).clone());
    out.emplace_back(p + "host_m", i.host_view(HostBuf::kM, s).clone());
    out.emplace_back(p + "host_v", i.host_view(HostBuf::kV, s).clone());
    if (i.schedule.position > 0) out.emplace_back(p + "acc", i.host_view(acc_buffer(parity), s).clone());
    out.emplace_back(p + "score_acc", cpu(s.score_acc));
    if (s.dev_m.defined()) {
      out.emplace_back(p + "dev_m", cpu(s.dev_m));
      out.emplace_back(p + "dev_v", cpu(s.dev_v));
    }
    if (s.dev_master.defined()) out.emplace_back(p + "dev_master", cpu(s.dev_master));
  }
  for (auto& d : i.dense) {
    const std::string p = "dense/" + i.params[d.index].name + "/";
    out.emplace_back(p + "m", cpu(d.m));
    out.emplace_back(p + "v", cpu(d.v));
    if (d.master.defined()) out.emplace_back(p + "master", cpu(d.master));
  }
  return out;
}

void ZenFlowOptimizer::load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  load_state_shards({state});
}

void ZenFlowOptimizer::load_state_shards(
    const std::vector<std::vector<std::pair<std::string, at::Tensor>>>& shards) {
  Impl& i = *impl_;
  if (shards.empty()) throw std::runtime_error("engine state: no shards");
  i.wait_accumulates();
  if (i.inflight && i.inflight->work) i.inflight->work->wait();
  i.inflight.reset();
  i.staged_h2d = nullptr;
  i.slot_fixes.clear();
  for (auto& h : i.h2d_from_out) h.wait();
  i.h2d_from_pack.wait();
  std::vector<std::map<std::string, at::Tensor>> maps;
  for (const auto& sh : shards) maps.emplace_back(sh.begin(), sh.end());
  auto find = [&](size_t shard, const std::string& key) -> const at::Tensor* {
    auto it = maps[shard].find(key);
    return it == maps[shard].end() ? nullptr : &it->second;
  };
  auto where = [&](size_t shard) {
    return shards.size() > 1 ? " (shard of rank " + std::to_string(shard) + ")" : std::string();
  };
  auto get_from = [&](size_t shard, const std::string& key, at::IntArrayRef shape) -> at::Tensor {
    const at::Tensor* t = find(shard, key);
    if (!t) throw std::runtime_error("engine state: missing '" + key + "'" + where(shard));
    if (t->sizes() != shape)
      throw std::runtime_error("engine state: '" + key + "'" + where(shard) + " has shape " + shape_str(t->sizes()) +
                               ", expected " + shape_str(shape) + " (options or model differ?)");
    return *t;
  };
  // Everything but the host state is replicated: rank 0's shard has it.
  auto get = [&](const std::string& key, at::IntArrayRef shape) { return get_from(0, key, shape); };
  const EngineScalars scalars = EngineScalars::from_vector(
      to_vector(get("engine/scalars", {static_cast<int64_t>(EngineScalars::kCount)})), i.schedule, i.selection);
  i.schedule = scalars.schedule;
  i.selection = scalars.selection;
  i.skipped = scalars.skipped;
  i.device_step = scalars.device_step;
  i.host_step = scalars.host_step;
  if (scalars.pending_apply) i.inflight.reset(new InFlight{nullptr, -1, {}});
  i.last_lr = get("engine/last_lr", {1}).item<double>();
  if (!i.zenflow() && i.schedule.position > 0)
    throw std::runtime_error("engine state: a window is open (zenflow mode, checkpointed mid-window); offload mode "
                             "has no window to resume it into");
  const int parity = i.schedule.parity();
  for (auto& s : i.split) {
    const std::string p = "split/" + i.params[s.index].name + "/";
    const at::Tensor* sel_t = find(0, p + "sel");
    if (!sel_t) throw std::runtime_error("engine state: missing '" + p + "sel'");
    std::vector<int64_t> sel = to_vector(*sel_t);
    if (static_cast<int64_t>(sel.size()) != (i.selection.selected ? s.k : 0))
      throw std::runtime_error("engine state: '" + p + "sel' has " + std::to_string(sel.size()) +
                               " columns, expected " + std::to_string(i.selection.selected ? s.k : 0));
    s.sel_cpu = sel;
    s.unsel_cpu = complement(sel, s.in);
    s.sel = index_tensor(s.sel_cpu, i.device);
    i.assign_parts(s);
    // The host state of this rank's columns, from whichever shards hold them. A shard
    // without host_cols (one rank) holds every host-owned column.
    std::vector<std::string> names = {"host_master", "host_m", "host_v"};
    std::vector<HostBuf> into = {HostBuf::kMaster, HostBuf::kM, HostBuf::kV};
    if (i.schedule.position > 0) {
      names.push_back("acc");
      into.push_back(acc_buffer(parity));
    }
    std::vector<at::Tensor> to(into.size());  // host_view per array, written back below
    for (size_t n = 0; n < into.size(); ++n) to[n] = i.host_view(into[n], s);
    std::vector<int64_t> pos(static_cast<size_t>(s.in), -1);  // column -> position in this rank's arrays
    for (size_t q = 0; q < s.own().cols.size(); ++q) pos[static_cast<size_t>(s.own().cols[q])] = static_cast<int64_t>(q);
    int64_t found = 0;
    for (size_t sh = 0; sh < shards.size(); ++sh) {
      const at::Tensor* cols_t = find(sh, p + "host_cols");
      const std::vector<int64_t> cols = cols_t ? to_vector(*cols_t) : s.unsel_cpu;
      std::vector<int64_t> src, dst;
      for (size_t q = 0; q < cols.size(); ++q) {
        const int64_t c = cols[q];
        if (c < 0 || c >= s.in) throw std::runtime_error("engine state: '" + p + "host_cols'" + where(sh) + " names column " + std::to_string(c));
        if (pos[static_cast<size_t>(c)] < 0) continue;
        src.push_back(static_cast<int64_t>(q));
        dst.push_back(pos[static_cast<size_t>(c)]);
        pos[static_cast<size_t>(c)] = -1;  // taken
      }
      found += static_cast<int64_t>(src.size());
      if (src.empty()) continue;
      const bool same = src.size() == cols.size() && static_cast<int64_t>(src.size()) == s.n_own() &&
                        std::is_sorted(dst.begin(), dst.end()) && dst.front() == 0;
      for (size_t n = 0; n < names.size(); ++n) {
        at::Tensor from = get_from(sh, p + names[n], {s.out, static_cast<int64_t>(cols.size())});
        if (same)
          to[n].copy_(from);
        else
          to[n].index_copy_(1, index_tensor(dst, at::kCPU), from.index_select(1, index_tensor(src, at::kCPU)).to(at::kFloat));
      }
    }
    for (size_t n = 0; n < into.size(); ++n) i.host_commit(into[n], s, to[n]);
    if (found != s.n_own())
      throw std::runtime_error("engine state: " + std::to_string(s.n_own() - found) + " host-owned columns of '" +
                               i.params[s.index].name + "' are in no shard (a rank's engine state is missing?)");
    s.score_acc.copy_(get(p + "score_acc", {s.in}));
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(i.device);
    if (i.selection.selected) {
      // Copies, never aliases of the caller's tensors (copy = true).
      s.dev_m = get(p + "dev_m", {s.out, s.k}).to(f32, false, true);
      s.dev_v = get(p + "dev_v", {s.out, s.k}).to(f32, false, true);
      s.dev_master = i.split_dtype != at::kFloat ? get(p + "dev_master", {s.out, s.k}).to(f32, false, true) : at::Tensor();
    } else {
      s.dev_m = s.dev_v = s.dev_master = at::Tensor();
    }
  }
  i.relayout();
  // Streamed: the weights come from the parameter tensors, which hold the checkpoint's (a
  // pending host step's result then comes from the master, when it is applied).
  if (i.streamed()) i.pack_host_weights();
  for (auto& d : i.dense) {
    const std::string p = "dense/" + i.params[d.index].name + "/";
    d.m.copy_(get(p + "m", d.m.sizes()));
    d.v.copy_(get(p + "v", d.v.sizes()));
    if (d.master.defined()) d.master.copy_(get(p + "master", d.master.sizes()));
  }
  // A host step in flight when the state was saved is applied at the next boundary (§4).
  // Resumed without overlap there is no pipeline to carry it: it is applied now, so the
  // run continues with no stale column.
  if (i.inflight && !i.opt.overlap_step) i.complete_inflight();
  i.regather();
}

ZenFlowOptimizer::ZenFlowOptimizer(std::vector<ParamSpec> params, const EngineOptions& options,
                                   StallClock* clock, Collectives* collectives)
    : impl_(new Impl) {
  impl_->opt = options;
  impl_->clock = clock;
  if (collectives && collectives->world_size() > 1 && options.parameters_sharded) {
    impl_->norm_group = collectives;
  } else if (collectives && collectives->world_size() > 1) {
    impl_->coll = collectives;
    impl_->world = collectives->world_size();
    impl_->me = collectives->rank();
  }
  impl_->params = std::move(params);
  impl_->build();
}

ZenFlowOptimizer::~ZenFlowOptimizer() {
  if (!impl_) return;
  // Unit gradients still in flight (a backward that threw): their copies write into host
  // memory freed below.
  for (auto* unit : {&impl_->unit_given, impl_->unit_in_flight ? &*impl_->unit_in_flight : nullptr})
    if (unit)
      for (CopyHandle& h : unit->copies) {
        try {
          h.wait();
        } catch (const std::exception&) {  // a CUDA error: nothing more to wait for
        }
      }
  if (!impl_->host) return;
  impl_->host->drain();
  impl_->host.reset();  // before the streams and the staging its sender may still read
}

void ZenFlowOptimizer::zero_grad() {
  impl_->land_unit_gradients();  // none pending after a backward the runner finished
  for (auto& s : impl_->split) s.got_grad = false;  // columns_streamed: the next unit's overwrites
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    ParamSpec& ps = impl_->params[i];
    if (impl_->streamed_split(i)) continue;  // unit by unit
    at::Tensor& g = ps.param.mutable_grad();
    if (g.defined())
      g.zero_();
    else
      g = at::zeros_like(ps.param);
  }
}

StepReport ZenFlowOptimizer::step(const StepContext& ctx) { return impl_->step(ctx); }

bool ZenFlowOptimizer::streams_columns(size_t param) const { return impl_->streamed_split(param) != nullptr; }

StreamedColumns ZenFlowOptimizer::streamed_columns(size_t param) const {
  const Impl& i = *impl_;
  const SplitParam* s = i.streamed_split(param);
  if (!s) throw std::invalid_argument("engine: parameter " + std::to_string(param) + " does not stream by column");
  StreamedColumns c;
  if (i.gathered_dirty) throw std::logic_error("engine: the streamed weights of several ranks were not gathered");
  c.selected_weights = s->w_sel;
  c.selected = s->sel;
  c.host_weights = i.all_view(i.streamed_buffer(), *s);
  c.host_columns = s->unsel;
  c.buffer = i.streamed_buffer_index();
  return c;
}

void ZenFlowOptimizer::streamed_copy(int buffer, const CopyHandle& copy) {
  if (buffer < 0 || buffer > 2) throw std::out_of_range("engine: output buffer " + std::to_string(buffer));
  impl_->h2d_from_out[buffer] = copy;
}

void ZenFlowOptimizer::add_unit_gradient(size_t param, const at::Tensor& grad) {
  Impl& i = *impl_;
  if (!i.streamed_split(param))
    throw std::invalid_argument("engine: parameter " + std::to_string(param) + " does not stream by column");
  for (SplitParam& s : i.split)
    if (s.index == param) i.add_unit_gradient(s, grad);
}

void ZenFlowOptimizer::unit_gradients_coming(const std::vector<size_t>& params) {
  impl_->unit_gradients_coming(params);
}

void ZenFlowOptimizer::unit_gradients_given() { impl_->unit_gradients_given(); }

void ZenFlowOptimizer::land_unit_gradients() { impl_->land_unit_gradients(); }

int64_t ZenFlowOptimizer::unit_gradients_in_flight_bytes() const {
  return impl_->unit_in_flight ? impl_->unit_in_flight->device_bytes : 0;
}

void ZenFlowOptimizer::sync_parameters() {
  Impl& i = *impl_;
  if (!i.streamed()) return;
  c10::NoGradGuard no_grad;
  for (SplitParam& s : i.split) {
    if (s.k > 0 && i.selection.selected)
      device_ops::scatter_columns(s.w2d, index_tensor(s.sel_cpu, at::kCPU), s.w_sel.to(at::kCPU));
    if (s.n_host() > 0)
      device_ops::scatter_columns(s.w2d, index_tensor(s.unsel_cpu, at::kCPU), i.all_view(i.streamed_buffer(), s));
  }
}
void ZenFlowOptimizer::finish() {
  impl_->finish();
  impl_->regather();
}
const EngineOptions& ZenFlowOptimizer::options() const { return impl_->opt; }
int64_t ZenFlowOptimizer::steps() const { return impl_->schedule.steps; }
int64_t ZenFlowOptimizer::skipped_steps() const { return impl_->skipped; }
int64_t ZenFlowOptimizer::host_steps() const { return impl_->host_step; }
int64_t ZenFlowOptimizer::windows_completed() const { return impl_->schedule.windows; }
int64_t ZenFlowOptimizer::max_staleness_windows() const { return impl_->schedule.max_staleness; }
bool ZenFlowOptimizer::at_boundary() const { return impl_->schedule.position == 0; }
int64_t ZenFlowOptimizer::reselections() const { return impl_->selection.reselections; }

std::vector<int64_t> ZenFlowOptimizer::selected_columns(const std::string& name) const {
  for (auto& s : impl_->split)
    if (impl_->params[s.index].name == name) return s.sel_cpu;
  return {};
}

bool ZenFlowOptimizer::is_split(const std::string& name) const {
  for (auto& s : impl_->split)
    if (impl_->params[s.index].name == name) return true;
  return false;
}

int64_t ZenFlowOptimizer::pinned_host_bytes() const {
  return impl_->streams ? impl_->streams->pinned_bytes() : 0;
}

int64_t ZenFlowOptimizer::split_elements() const { return impl_->capacity_all; }
int ZenFlowOptimizer::world_size() const { return impl_->world; }
const HostOptimizer* ZenFlowOptimizer::host_optimizer() const { return impl_->host.get(); }

void ZenFlowOptimizer::check_host_backend() {
  if (!impl_->host || impl_->capacity == 0) return;
  float master = 0;
  impl_->host->read(HostBuf::kMaster, 0, 1, &master);
}

std::vector<int64_t> ZenFlowOptimizer::owned_host_columns(const std::string& name) const {
  for (auto& s : impl_->split)
    if (impl_->params[s.index].name == name) return s.own().cols;
  return {};
}

double ZenFlowOptimizer::selected_ratio() const {
  int64_t sel = 0;
  for (auto& s : impl_->split) sel += static_cast<int64_t>(s.sel_cpu.size()) * s.out;
  return impl_->capacity_all > 0 ? static_cast<double>(sel) / static_cast<double>(impl_->capacity_all) : 0.0;
}

int64_t ZenFlowOptimizer::host_state_bytes() const {
  const HostMemoryBytes b = host_memory_bytes();
  return b.master + b.moments + b.accumulators + b.transfer_buffers;
}

HostMemoryBytes ZenFlowOptimizer::host_memory_bytes() const {
  const Impl& i = *impl_;
  HostMemoryBytes b;
  // The arrays count where they live: here in-process, not at all with remote nodes.
  const int64_t resident = i.host && i.host->resident_state_bytes() > 0 ? i.capacity * 4 : 0;
  b.master = resident;            // master
  b.moments = 2 * resident;       // m, v
  b.accumulators = i.zenflow() ? 2 * resident : 0;  // acc[0], acc[1]; offload mode opens no windows
  for (int k = 0; k < 2; ++k) {
    if (i.ring[k].defined()) b.transfer_buffers += i.ring[k].nbytes();
    if (i.last_grad[k].defined()) b.transfer_buffers += i.last_grad[k].nbytes();
    if (i.param_out[k].defined()) b.transfer_buffers += i.param_out[k].nbytes();
  }
  if (i.pack_out.defined()) b.transfer_buffers += i.pack_out.nbytes();
  for (const at::Tensor* t : {&i.host_grad, &i.grad_shard, &i.gathered})  // columns_streamed
    if (t->defined()) b.transfer_buffers += t->nbytes();
  for (const at::Tensor& t : i.unit_stage)
    if (t.defined()) b.transfer_buffers += t.nbytes();
  if (i.stream_ring) b.transfer_buffers += i.stream_ring->bytes();
  return b;
}

EngineDeviceBytes ZenFlowOptimizer::device_bytes() const {
  const Impl& i = *impl_;
  EngineDeviceBytes b;
  auto add = [](int64_t& to, const at::Tensor& t) {
    if (t.defined()) to += static_cast<int64_t>(t.nbytes());
  };
  for (const SplitParam& s : i.split) {
    add(b.optimizer_state, s.dev_master);
    add(b.optimizer_state, s.dev_m);
    add(b.optimizer_state, s.dev_v);
    add(b.optimizer_state, s.score_acc);
    add(b.selected_weights, s.w_sel);
    add(b.selected_gradients, s.g_sel);
  }
  for (const DenseParam& d : i.dense) {
    add(b.optimizer_state, d.master);
    add(b.optimizer_state, d.m);
    add(b.optimizer_state, d.v);
  }
  for (const at::Tensor& t : i.dev_stage) add(b.buffers, t);
  add(b.buffers, i.dev_h2d);
  for (const at::Tensor& t : i.dev_chunk) add(b.buffers, t);
  return b;
}

}  // namespace zenflow::engine
