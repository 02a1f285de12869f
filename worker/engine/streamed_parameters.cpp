// Weights in host memory, streamed to the device unit by unit (see streamed_parameters.h).
#include "worker/engine/streamed_parameters.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace zenflow::engine {

StreamedParameters::StreamedParameters(model::CausalLM& model, at::Device device, StallClock* clock,
                                       int64_t by_column_min_split_numel)
    : MaterializedUnits(model.parameters().size()),
      model_(model),
      device_(device),
      by_column_(by_column_min_split_numel >= 0),
      clock_(clock),
      streams_(device) {
  c10::NoGradGuard no_grad;
  const std::vector<model::NamedTensor> params = model.parameters();
  for (const model::NamedTensor& nt : params) {
    const at::Tensor& t = nt.tensor;
    if (t.scalar_type() != params.front().tensor.scalar_type())
      throw std::invalid_argument("train.offload_parameters: parameter '" + nt.name + "' is " +
                                  std::string(c10::toString(t.scalar_type())) + ", the others " +
                                  c10::toString(params.front().tensor.scalar_type()) + " (one dtype is streamed)");
    const Kind kind = !by_column_ ? Kind::kHost
                      : zenflow_splits(t.sizes(), by_column_min_split_numel) ? Kind::kColumns
                                                                             : Kind::kDevice;
    kind_.push_back(kind);
    if (kind == Kind::kDevice) {  // a fresh device leaf (the model was built on the host)
      leaves_.push_back(t.detach().to(device_).clone().requires_grad_(true));
      continue;
    }
    // Pinned straight from the driver on a GPU (DeviceStreams::alloc_host); a fresh copy on
    // the CPU device, so the streamed path is the one that runs. A split matrix's (kColumns)
    // never crosses (its columns stream from the engine's buffers): plain memory.
    at::Tensor leaf = kind == Kind::kColumns ? at::empty(t.sizes(), t.options().device(at::kCPU))
                                             : streams_.alloc_host(t.sizes(), t.scalar_type());
    leaf.copy_(t.detach());
    leaf.requires_grad_(true);
    leaves_.push_back(leaf);
  }
  register_leaves(leaves_, "StreamedParameters");
  model_.replace_parameters(leaves_);
  model_.set_unit_runner(this);
}

StreamedParameters::~StreamedParameters() {
  model_.set_unit_runner(nullptr);
  try {
    if (prefetched_)
      for (CopyHandle& h : prefetched_->copies) h.wait();
    if (outgoing_)
      for (CopyHandle& h : outgoing_->copies) h.wait();
  } catch (const std::exception&) {  // a CUDA error: the run is ending anyway
  }
}

void StreamedParameters::attach(ZenFlowOptimizer* engine) {
  for (size_t i = 0; i < kind_.size(); ++i)
    if ((kind_[i] == Kind::kColumns) != (engine != nullptr && engine->streams_columns(i)))
      throw std::logic_error("StreamedParameters: the engine streams parameter " + std::to_string(i) +
                             (kind_[i] == Kind::kColumns ? " not" : "") + " by column, this runner" +
                             (kind_[i] == Kind::kColumns ? " does" : " does not"));
  engine_ = engine;
}

int64_t StreamedParameters::device_leaf_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < leaves_.size(); ++i)
    if (kind_[i] == Kind::kDevice) b += static_cast<int64_t>(leaves_[i].nbytes());
  return b;
}

void StreamedParameters::begin_step() { reset_uses(); }

int64_t StreamedParameters::ring_bytes() const {
  return 2 * ring_capacity_ * static_cast<int64_t>(leaves_.front().element_size());
}

int64_t StreamedParameters::host_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < leaves_.size(); ++i)
    if (kind_[i] != Kind::kDevice) b += static_cast<int64_t>(leaves_[i].nbytes());
  return b;
}

int64_t StreamedParameters::staging_bytes() const {
  int64_t b = 0;
  for (const at::Tensor& t : stage_)
    if (t.defined()) b += static_cast<int64_t>(t.nbytes());
  return b;
}

StreamedParameters::Fetch StreamedParameters::launch(const std::vector<size_t>& idx, int slot) {
  if (by_column_ && engine_ == nullptr)
    throw std::logic_error("StreamedParameters: zenflow mode runs a unit before attach()");
  Fetch f;
  f.idx = idx;
  f.slot = slot;
  // The slot holds each streamed weight whole, and behind them (kColumns) where each one's
  // host columns land.
  int64_t need = 0;
  f.columns.resize(idx.size());
  f.landed.resize(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t i = idx[k];
    if (kind_[i] == Kind::kDevice) continue;
    need += leaves_[i].numel();
    if (kind_[i] == Kind::kColumns) {
      f.columns[k] = engine_->streamed_columns(i);
      need += f.columns[k].host_weights.numel();
    }
  }
  if (need == 0) {  // nothing streams: the device tensors themselves
    for (size_t i : idx) f.weights.push_back(leaves_[i]);
    return f;
  }
  // Both slots grow to the largest unit seen (during the first micro-batch), each when next used.
  ring_capacity_ = std::max(ring_capacity_, need);
  at::Tensor& ring = ring_[static_cast<size_t>(slot)];
  if (!ring.defined() || ring.numel() < ring_capacity_)
    ring = at::empty({ring_capacity_}, at::TensorOptions().dtype(leaves_.front().scalar_type()).device(device_));
  int64_t at_ = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    const at::Tensor& leaf = leaves_[idx[k]];
    if (kind_[idx[k]] == Kind::kDevice) {
      f.weights.push_back(leaf);
      continue;
    }
    at::Tensor whole = ring.narrow(0, at_, leaf.numel()).view(leaf.sizes());
    at_ += leaf.numel();
    f.weights.push_back(whole);
    const at::Tensor src = kind_[idx[k]] == Kind::kHost ? leaf.detach() : f.columns[k].host_weights;
    at::Tensor dst = kind_[idx[k]] == Kind::kHost ? whole : ring.narrow(0, at_, src.numel()).view(src.sizes());
    if (kind_[idx[k]] == Kind::kColumns) {
      at_ += src.numel();
      f.landed[k] = dst;
      if (src.numel() == 0) continue;
    }
    f.copies.push_back(streams_.copy_h2d(src, dst));
    if (kind_[idx[k]] == Kind::kColumns) engine_->streamed_copy(f.columns[k].buffer, f.copies.back());
    if (clock_) clock_->add_bytes(Direction::kH2DWeights, static_cast<int64_t>(src.nbytes()));
  }
  return f;
}

std::vector<at::Tensor> StreamedParameters::materialize(const std::vector<size_t>& idx) {
  // CUDA: events around the compute stream's waits for the copies (what it stalled); the
  // CPU: the copies themselves, done here by the training thread.
  ClockSpan span(clock_, device_);
  Fetch now;
  if (prefetched_ && prefetched_->idx == idx) {
    now = std::move(*prefetched_);
  } else {
    // Nothing in flight is needed: the unit before has been enqueued, a prefetch the
    // sequence did not follow is dropped (its slot is taken by copies ordered after it).
    now = launch(idx, prefetched_ ? prefetched_->slot : 0);
  }
  prefetched_.reset();
  // The next unit's weights go out now, into the other slot, behind this unit's compute
  // (the copy waits for the compute enqueued so far, which may still read that slot).
  if (const std::vector<size_t>* next = sequence_.record(idx)) prefetched_ = launch(*next, 1 - now.slot);
  for (const CopyHandle& h : now.copies) h.make_compute_wait();
  span.end(TimeKind::kComputeStall, StallCause::kWeightStream);
  // Zenflow mode: each matrix from its host columns (landed) and its selected ones.
  c10::NoGradGuard no_grad;
  for (size_t k = 0; k < now.idx.size(); ++k) {
    if (kind_[now.idx[k]] != Kind::kColumns) continue;
    const StreamedColumns& c = now.columns[k];
    at::Tensor whole = now.weights[k].view({c.host_weights.size(0), -1});
    if (c.host_columns.numel() > 0) whole.index_copy_(1, c.host_columns, now.landed[k]);
    if (c.selected.numel() > 0) whole.index_copy_(1, c.selected, c.selected_weights);
  }
  return now.weights;
}

std::vector<at::Tensor> StreamedParameters::gradients_ready(const std::vector<size_t>& idx,
                                                            const std::vector<at::Tensor>& grads) {
  if (by_column_) {
    // Zenflow mode: streamed matrices' gradients to the engine (which keeps its selected
    // columns and sends the rest to the host); the device tensors' to autograd.
    std::vector<at::Tensor> to_tensors(idx.size());
    std::vector<size_t> streamed;
    for (size_t k = 0; k < idx.size(); ++k)
      if (grads[k].defined() && kind_[idx[k]] != Kind::kDevice) streamed.push_back(idx[k]);
    // The unit before's packed host columns (on a GPU, held by their D2H) were on the device
    // through this unit's backward, beside its gradients.
    int64_t in_flight = engine_->unit_gradients_in_flight_bytes();
    engine_->unit_gradients_coming(streamed);
    for (size_t k = 0; k < idx.size(); ++k) {
      if (!grads[k].defined()) continue;
      if (kind_[idx[k]] == Kind::kDevice) {
        to_tensors[k] = grads[k];
      } else {
        in_flight += static_cast<int64_t>(grads[k].nbytes());
        engine_->add_unit_gradient(idx[k], grads[k]);
      }
    }
    engine_->unit_gradients_given();
    grads_in_flight_peak_ = std::max(grads_in_flight_peak_, in_flight);
    return to_tensors;
  }
  Outgoing out;
  out.idx = idx;
  int64_t need = 0;
  for (const at::Tensor& g : grads)
    if (g.defined()) need += g.numel();
  const int slot = next_stage_;
  next_stage_ = 1 - next_stage_;
  at::Tensor& stage = stage_[static_cast<size_t>(slot)];
  if (need > 0 && (!stage.defined() || stage.numel() < need))  // this slot's last copies have landed
    stage = streams_.alloc_host({need}, leaves_[idx.front()].scalar_type());
  int64_t at_ = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    const at::Tensor& g = grads[k];
    if (!g.defined()) {
      out.staged.emplace_back();
      continue;
    }
    const at::Tensor src = g.detach().contiguous();
    at::Tensor dst = stage.narrow(0, at_, src.numel()).view(src.sizes());
    out.copies.push_back(streams_.copy_d2h(src, dst));
    out.staged.push_back(dst);
    out.device_bytes += static_cast<int64_t>(src.nbytes());
    at_ += src.numel();
    if (clock_) clock_->add_bytes(Direction::kD2H, static_cast<int64_t>(src.nbytes()));
  }
  // The unit before's gradients, copied while this unit's backward computed, land now.
  int64_t in_flight = out.device_bytes;
  if (outgoing_) {
    in_flight += outgoing_->device_bytes;
    land(*outgoing_);
  }
  grads_in_flight_peak_ = std::max(grads_in_flight_peak_, in_flight);
  outgoing_ = std::move(out);
  return std::vector<at::Tensor>(idx.size());  // the leaves get them from land(), on the host
}

void StreamedParameters::finish_backward() {
  if (by_column_) engine_->land_unit_gradients();
  if (!outgoing_) return;
  land(*outgoing_);
  outgoing_.reset();
}

void StreamedParameters::land(Outgoing& out) {
  {
    // CUDA: how long the compute stream ran dry while the host waited (usually not at all:
    // the next unit's backward is queued). The CPU: the copies were done when made.
    ClockSpan span(clock_, device_);
    for (CopyHandle& h : out.copies) h.wait();
    span.end(TimeKind::kComputeStall, StallCause::kTransferD2H);
  }
  c10::NoGradGuard no_grad;
  for (size_t k = 0; k < out.idx.size(); ++k) {
    if (!out.staged[k].defined()) continue;
    at::Tensor& leaf = leaves_[out.idx[k]];
    if (!leaf.grad().defined()) leaf.mutable_grad() = at::zeros_like(leaf);
    leaf.mutable_grad().add_(out.staged[k]);
  }
  out.copies.clear();
}

}  // namespace zenflow::engine
