// A Hugging Face model's exact shapes (common/model) and the memory one rank of a job on it
// needs, mode by mode: what `zenflow advise --model-config` sizes jobs with, in place of the
// profiled model scaled by a cube root.
//
// rank_memory() follows the engine's allocations as worker/rank/preflight.h counts them
// (weights, gradients, fp32 optimizer state of the device-updated elements, the device
// staging of split gradients, the host updater's buffers), so that an answer the advisor
// says fits is one `zenflow run`'s preflight accepts. Activations are counted tensor by
// tensor from the decoders' forward (worker/model/llama.cpp, gpt2.cpp): what autograd saves
// for backward, with and without activation checkpointing. Pure functions, safe from any
// thread; LibTorch-free.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zenflow::advisor {

// A config.json that cannot be read or describes no model we build. The message names
// the path and, for a bad value, the key ("x/config.json: key 'hidden_size' must be an
// integer, got \"big\"").
class ModelConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ModelShape {
  std::string arch;    // llama | mistral | qwen2 | gpt2
  std::string source;  // the config.json it came from
  int64_t parameters = 0;
  int64_t layers = 0, hidden = 0, intermediate = 0, vocab = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  // 2-D parameters with numel >= engine_defaults::kMinSplitNumel, as [rows, columns]:
  // what zenflow splits by column between the device and the host.
  std::vector<std::pair<int64_t, int64_t>> split_matrices;

  int64_t split_parameters() const;  // the elements of split_matrices
  // The most parameters one unit of the forward holds (the embedding, a decoder layer, the
  // head): what train.shard: parameters gathers at once.
  int64_t largest_unit_parameters() const;
  // The elements of the top-k columns zenflow keeps on the device: per matrix
  // rows x min(columns, max(1, floor(topk_ratio x columns))), as the engine's SplitParam::k.
  int64_t selected_parameters(double topk_ratio) const;
  int64_t attention_width() const { return heads * head_dim; }  // q_proj's output
  // Bytes one token's forward through one decoder layer saves for backward, weights in
  // `dtype_bytes` (see model_memory.cpp for the tensor-by-tensor count); and what the
  // final norm, the LM head and the loss keep per token.
  double layer_activation_bytes_per_token(int64_t dtype_bytes) const;
  double head_activation_bytes_per_token(int64_t dtype_bytes) const;
};

// The shapes of the architecture `config` (a parsed config.json) describes; `where` names it
// in messages. Throws ModelConfigError.
ModelShape model_shape_from_hf(const nlohmann::json& config, const std::string& where);
// `path`: a config.json, or a model directory holding one. Throws ModelConfigError naming
// the path (missing, not a regular file, not JSON, a bad key).
ModelShape load_model_shape(const std::string& path);

// The job one rank runs, as far as memory goes.
struct RankJob {
  std::string mode;   // device | offload | zenflow
  int64_t ranks = 1;  // data-parallel W: the host updater's state is partitioned over them
  int64_t micro_batch = 1, seq_len = 1;
  int64_t grad_accum = 1;  // streamed by column: accumulated unit gradients stage on the host
  double topk_ratio = 0.1;  // zenflow
  bool activation_checkpointing = false;
  bool cuda = true;         // false: the CPU is the device (no device staging of split gradients)
  int64_t dtype_bytes = 2;  // weights and gradients (bf16 on a GPU)
  // train.shard over the `ranks` (worker/distributed/sharded_parameters.h): none; gradients
  // (the gradients and the optimizer state 1/W, the full weights kept beside this rank's
  // shard); parameters (the weights too, a unit's gathered while it runs and the next one's
  // prefetched).
  std::string shard = "none";
  // optimizer.host.device_staging_mib, in bytes: 0 stages whole gradients on the device
  // (two stages and the H2D buffer); > 0 (one rank, or sharded) four chunk buffers of a
  // quarter each, at least a row of the widest matrix.
  double device_staging_bytes = 0;
  // train.offload_parameters (worker/engine/streamed_parameters.h). Offload mode (one GPU):
  // the device holds two of the largest unit's weights and at most two units' gradients, no
  // optimizer state or staging; the host holds the weights, their gradients, two units'
  // gradient staging and the engine's staging (its chunk buffers, if any) beside the host
  // updater. Zenflow mode: the device keeps the selected columns and the unsplit parameters
  // (weights, gradients, AdamW state), a ring of two slots of the largest unit whole and
  // landed, and one unit's gradient; no staging; the host the parameter tensors besides,
  // and on several ranks every rank's host columns' weights and gradients.
  bool offload_parameters = false;
};

// Bytes one rank needs, by kind.
struct RankMemory {
  double weights = 0, gradients = 0;
  double optimizer_state = 0;     // fp32 master, m, v of the device-updated elements
  double transfer_staging = 0;    // device buffers of split gradients (D2H) and results (H2D)
  double collective_buffers = 0;  // W > 1: the flat all-reduce copy and NCCL's buffers
  double activations = 0;         // one micro-batch, at the peak of backward
  double host_optimizer = 0;      // host RAM: the host updater's buffers, this rank's share

  double device_total() const {
    return weights + gradients + optimizer_state + transfer_staging + collective_buffers + activations;
  }
};

// NCCL's own buffers on a GPU with W > 1 (channels x peers x NCCL_BUFFSIZE): assumed.
constexpr double kNcclBufferBytes = 0.5 * (1 << 30);

RankMemory rank_memory(const ModelShape& model, const RankJob& job);

// The device_staging_mib the advisor tries where whole-gradient staging does not fit: four
// 256 MiB chunks, large enough that each copy runs at PCIe speed.
constexpr int64_t kChunkedStagingMib = 1024;

}  // namespace zenflow::advisor
