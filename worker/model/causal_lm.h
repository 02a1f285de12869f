// A decoder-only language model the trainer can run: the contract between models and
// the training loop. Implementations: Llama (llama.h); GPT-2 comes with real-model I/O.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "worker/model/layer_checkpoint.h"  // LayerBody

namespace zenflow::model {

struct NamedTensor {
  std::string name;  // Hugging Face tensor name, e.g. "model.layers.0.self_attn.q_proj.weight"
  at::Tensor tensor;
};

// The parts a model's forward is made of, each a function of its input and its weights
// (LayerBody): the token embedding (input: the token ids), every decoder layer (input: the
// hidden state) and the head (the final norm and the vocabulary projection).
enum class UnitKind { kEmbedding, kLayer, kHead };

// What runs a model's units when one is set (CausalLM::set_unit_runner): the hook through
// which data-parallel sharding gathers each unit's weights just before it runs
// (worker/distributed/sharded_parameters.h). `weights` are the model's parameter tensors as
// they are at the time; `checkpoint` says the model would checkpoint this unit
// (train.activation_checkpointing, decoder layers only).
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  virtual at::Tensor run(UnitKind kind, const LayerBody& body, const at::Tensor& x,
                         const std::vector<at::Tensor>& weights, bool checkpoint) = 0;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  // input_ids: [B, T] int64 on the model's device. Returns logits [B, T, vocab] (fp32 or
  // the model dtype). Runs with autograd when grad mode is on.
  virtual at::Tensor forward(const at::Tensor& input_ids) = 0;
  // Trainable parameters in a stable order (the order the optimizer and checkpoints use).
  virtual std::vector<NamedTensor> parameters() = 0;
  virtual int64_t vocab_size() const = 0;
  virtual void to(at::Device device, at::ScalarType dtype) = 0;
  virtual void train(bool on) = 0;
  // Activation checkpointing of every decoder layer (layer_checkpoint.h): forward keeps
  // each layer's input only and backward recomputes the layer. Off by default.
  virtual void set_activation_checkpointing(bool on) = 0;
  // Units run through `runner` (not owned; null: directly, or checkpointed) from now on.
  virtual void set_unit_runner(UnitRunner* runner) = 0;
  // Replaces every parameter tensor, in parameters() order (same count; any shapes): what
  // the units receive as their weights from then on (sharding hands them its shards).
  virtual void replace_parameters(const std::vector<at::Tensor>& tensors) = 0;
};

// The parameter bookkeeping the decoder models share: named leaf tensors in a stable
// order, moved or cast in place by to(). Subclasses append to params_ while building and
// must not let it grow afterwards (they keep pointers into it).
class NamedParameterModel : public CausalLM {
 public:
  std::vector<NamedTensor> parameters() override;
  void to(at::Device device, at::ScalarType dtype) override;
  void train(bool on) override { training_ = on; }  // no dropout: nothing changes
  void set_activation_checkpointing(bool on) override { checkpoint_layers_ = on; }
  void set_unit_runner(UnitRunner* runner) override { runner_ = runner; }
  void replace_parameters(const std::vector<at::Tensor>& tensors) override;

 protected:
  // One unit of the forward: through the runner when one is set, else checkpointed (a
  // decoder layer with activation checkpointing on) or plainly body(x, weights).
  at::Tensor run_unit(UnitKind kind, const LayerBody& body, const at::Tensor& x,
                      const std::vector<at::Tensor>& weights) const;

  UnitRunner* runner_ = nullptr;
  bool training_ = true;
  bool checkpoint_layers_ = false;
  std::vector<std::pair<std::string, at::Tensor>> params_;
};

// Mean cross-entropy over positions whose target != -100; logits [B,T,V], targets [B,T].
// Computed in fp32 whatever the logits dtype. NaN when every target is -100 (as PyTorch).
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace zenflow::model
