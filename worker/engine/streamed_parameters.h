// train.offload_parameters: the model's weights live in host memory and travel to the
// device just before each unit (embedding, decoder layer, head) runs (docs/design.md §5.3).
//
// The model's parameter tensors are replaced by host copies in the model's dtype (pinned on
// a GPU): the leaves the optimizer updates, in place, on the host (the engine runs over
// them with EngineOptions::parameters_on_host: its host step writes its result into them and
// nothing goes back to the device). The device holds only a ring of two unit-sized weight
// buffers, the unit in flight's activations and gradients:
//   * before a unit's forward, and again before its backward (every unit recomputes,
//     MaterializedUnits), its weights are copied host->device into a ring slot on the H2D
//     stream, which the compute stream waits for (the `weight_stream` stall: the time it
//     waited). Each copy starts while the unit before computes: the order units ran in the
//     last micro-batch is replayed (UnitSequence) and the next unit's copy goes out as soon
//     as the current one's has.
//   * after a unit's backward its weights' gradients go device->host on the D2H stream into
//     one of two pinned staging buffers, and are added into the leaves' .grad once the next
//     unit's have gone out (finish_backward() adds the last): a leaf's .grad gets one
//     addition per micro-batch of the sum over its uses, as autograd gives a device leaf.
// So the numbers are those of the model trained with its weights on the device and
// train.activation_checkpointing (bit-identical on the CPU device, where the copies are
// memcpys; tests/test_streamed_parameters.cpp).
//
// Bytes: every step streams each unit's weights twice (forward and backward) and its
// gradients once: transfer_bytes h2d_weights and d2h. Device memory: ring_bytes() (2 x the
// largest unit's weights); gradients_in_flight_bytes(); the leaves and their gradients are
// host memory (host_bytes(), staging_bytes()).
//
// Zenflow mode (by_column): the split matrices (zenflow_splits) stream only their host-owned
// columns. Their parameter tensors are host copies that the engine writes only for
// checkpoints (ZenFlowOptimizer::sync_parameters); the engine (EngineOptions::
// columns_streamed, attach()) keeps their selected columns on the device and the others'
// weights in the host step's output buffer. A unit's copy brings those host columns into its
// ring slot, next to which the matrix is assembled on the device from both parts (two
// index_copy_); its gradient goes to the engine (add_unit_gradient), which keeps the selected
// columns' on the device and sends the rest to the host. The other parameters (norms, small
// matrices) stay on the device as the model's own leaves, and autograd gives them their
// gradients. Bytes per micro-batch: 2 x the host-owned columns' weights (h2d_weights) and
// 1 x their gradients (d2h).
//
// Threads: as MaterializedUnits. The StallClock is used by both the training thread and
// autograd's, never at once.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "worker/engine/device_streams.h"
#include "worker/engine/stall_clock.h"
#include "worker/engine/zenflow_optimizer.h"
#include "worker/model/causal_lm.h"
#include "worker/model/materialized_units.h"

namespace zenflow::engine {

class StreamedParameters final : public model::MaterializedUnits {
 public:
  // Replaces `model`'s parameters by host copies (pinned when `device` is CUDA; fresh leaves
  // on the CPU device too) and becomes its unit runner; the units compute on `device`.
  // `clock` (may be null) gets the weight_stream stalls and the bytes. The model must
  // outlive this object, which detaches itself from the model when destroyed. Throws
  // std::invalid_argument when the parameters do not share one dtype.
  // `by_column_min_split_numel` >= 0: zenflow mode, the matrices zenflow_splits with it stream
  // by column (attach() the engine before the model runs), the others stay on the device.
  StreamedParameters(model::CausalLM& model, at::Device device, StallClock* clock,
                     int64_t by_column_min_split_numel = -1);
  ~StreamedParameters() override;  // waits for the copies in flight
  StreamedParameters(const StreamedParameters&) = delete;
  StreamedParameters& operator=(const StreamedParameters&) = delete;

  // Zenflow mode: the engine built over this runner's parameter tensors (their order), which
  // must stream by column exactly the matrices this runner does (std::logic_error otherwise).
  void attach(ZenFlowOptimizer* engine);
  bool by_column() const { return by_column_; }
  // Whether parameter i's tensor gets its gradient in .grad (not when it streams by column).
  bool grad_in_tensor(size_t i) const { return kind_[i] != Kind::kColumns; }
  // Device bytes of the parameter tensors kept on the device (zenflow mode) and of their
  // gradients (allocated or not yet).
  int64_t device_leaf_bytes() const;

  // Before each step's first forward: no use counted, no gradient pending.
  void begin_step();
  // After each backward: the last unit's gradients land in the leaves' .grad.
  void finish_backward();

  // Device bytes of the weight ring: two slots of the largest unit seen (each allocated at
  // that size when next used).
  int64_t ring_bytes() const;
  // The most device bytes of gradients held at once between a unit's backward and its D2H.
  int64_t gradients_in_flight_bytes() const { return grads_in_flight_peak_; }
  // Host bytes of the leaves (the weights) and of the gradient staging (pinned on a GPU).
  int64_t host_bytes() const;
  int64_t staging_bytes() const;

 private:
  // kHost: the whole tensor streams (offload mode); kColumns: its host-owned columns
  // (zenflow mode); kDevice: a device tensor of the model's (zenflow mode).
  enum class Kind { kHost, kColumns, kDevice };
  // A unit's weights on their way to a ring slot.
  struct Fetch {
    std::vector<size_t> idx;
    int slot = 0;
    std::vector<CopyHandle> copies;
    std::vector<at::Tensor> weights;  // views of the slot (kColumns: assembled once the copies are in)
    std::vector<StreamedColumns> columns;  // per weight (kColumns), the parts
    std::vector<at::Tensor> landed;        // per weight (kColumns), where its host columns land
  };
  // A unit's gradients on their way to a staging slot.
  struct Outgoing {
    std::vector<size_t> idx;
    std::vector<at::Tensor> staged;  // views of the staging slot; undefined: no gradient
    std::vector<CopyHandle> copies;
    int64_t device_bytes = 0;
  };

  std::vector<at::Tensor> materialize(const std::vector<size_t>& idx) override;
  std::vector<at::Tensor> gradients_ready(const std::vector<size_t>& idx,
                                          const std::vector<at::Tensor>& grads) override;
  bool recomputes(bool) const override { return true; }
  void forward_begins() override { sequence_.restart(); }

  Fetch launch(const std::vector<size_t>& idx, int slot);
  // Waits for `out`'s copies and adds them into the leaves' gradients.
  void land(Outgoing& out);

  model::CausalLM& model_;
  at::Device device_;
  bool by_column_ = false;
  std::vector<Kind> kind_;  // per parameter
  ZenFlowOptimizer* engine_ = nullptr;
  StallClock* clock_;
  DeviceStreams streams_;
  std::vector<at::Tensor> leaves_;  // the host weights, in the model's parameters() order
  std::array<at::Tensor, 2> ring_;   // device weight slots (flat, the parameters' dtype)
  int64_t ring_capacity_ = 0;        // elements of a slot: the largest unit seen
  std::array<at::Tensor, 2> stage_;  // host gradient staging slots (flat)
  int next_stage_ = 0;
  model::UnitSequence sequence_;
  std::optional<Fetch> prefetched_;
  std::optional<Outgoing> outgoing_;
  int64_t grads_in_flight_peak_ = 0;
};

}  // namespace zenflow::engine
