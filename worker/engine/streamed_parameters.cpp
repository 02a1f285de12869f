// Weights in host memory, streamed to the device unit by unit (see streamed_parameters.h).
#include "worker/engine/streamed_parameters.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace zenflow::engine {

namespace {

int64_t numel_of(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const at::Tensor& t : ts) n += t.numel();
  return n;
}

}  // namespace

StreamedParameters::StreamedParameters(model::CausalLM& model, at::Device device, StallClock* clock)
    : MaterializedUnits(model.parameters().size()),
      model_(model),
      device_(device),
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
    // Pinned straight from the driver on a GPU (DeviceStreams::alloc_host); a fresh copy on
    // the CPU device, so the streamed path is the one that runs.
    at::Tensor leaf = streams_.alloc_host(t.sizes(), t.scalar_type());
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

void StreamedParameters::begin_step() { reset_uses(); }

int64_t StreamedParameters::ring_bytes() const {
  return 2 * ring_capacity_ * static_cast<int64_t>(leaves_.front().element_size());
}

int64_t StreamedParameters::host_bytes() const {
  int64_t b = 0;
  for (const at::Tensor& t : leaves_) b += static_cast<int64_t>(t.nbytes());
  return b;
}

int64_t StreamedParameters::staging_bytes() const {
  int64_t b = 0;
  for (const at::Tensor& t : stage_)
    if (t.defined()) b += static_cast<int64_t>(t.nbytes());
  return b;
}

StreamedParameters::Fetch StreamedParameters::launch(const std::vector<size_t>& idx, int slot) {
  Fetch f;
  f.idx = idx;
  f.slot = slot;
  std::vector<at::Tensor> src;
  src.reserve(idx.size());
  for (size_t i : idx) src.push_back(leaves_[i].detach());
  // Both slots grow to the largest unit seen (during the first micro-batch), each when next used.
  ring_capacity_ = std::max(ring_capacity_, numel_of(src));
  at::Tensor& ring = ring_[static_cast<size_t>(slot)];
  if (!ring.defined() || ring.numel() < ring_capacity_)
    ring = at::empty({ring_capacity_}, at::TensorOptions().dtype(src.front().scalar_type()).device(device_));
  int64_t at_ = 0;
  for (const at::Tensor& s : src) {
    at::Tensor dst = ring.narrow(0, at_, s.numel()).view(s.sizes());
    f.copies.push_back(streams_.copy_h2d(s, dst));
    f.weights.push_back(dst);
    at_ += s.numel();
    if (clock_) clock_->add_bytes(Direction::kH2DWeights, static_cast<int64_t>(s.nbytes()));
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
  return now.weights;
}

std::vector<at::Tensor> StreamedParameters::gradients_ready(const std::vector<size_t>& idx,
                                                            const std::vector<at::Tensor>& grads) {
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
