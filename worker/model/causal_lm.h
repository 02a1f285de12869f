// A decoder-only language model the trainer can run: the contract between models and
// the training loop. Implementations: Llama (llama.h); GPT-2 comes with real-model I/O.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <utility>
#include <string>
#include <vector>

namespace zenflow::model {

struct NamedTensor {
  std::string name;  // Hugging Face tensor name, e.g. "model.layers.0.self_attn.q_proj.weight"
  at::Tensor tensor;
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

 protected:
  bool training_ = true;
  bool checkpoint_layers_ = false;
  std::vector<std::pair<std::string, at::Tensor>> params_;
};

// Mean cross-entropy over positions whose target != -100; logits [B,T,V], targets [B,T].
// Computed in fp32 whatever the logits dtype. NaN when every target is -100 (as PyTorch).
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace zenflow::model
