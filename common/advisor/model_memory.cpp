// Model shapes from config.json and the memory one rank needs (see model_memory.h).
#include "common/advisor/model_memory.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/engine_defaults.h"
#include "common/input_file.h"
#include "common/json_error.h"
#include "common/model/hf_config.h"
#include "common/model/model_shapes.h"

namespace zenflow::advisor {
namespace {

// The fp32 state AdamW keeps per device-updated element with 16-bit weights: master, m, v
// (preflight.cpp's state_per_element; fp32 weights need no master).
double optimizer_state_per_element(int64_t dtype_bytes) { return dtype_bytes == 4 ? 8.0 : 12.0; }

// fp32 logits, their log-softmax and its gradient per vocabulary entry (preflight.h's bound).
constexpr double kLossBytesPerVocabEntry = 12;

}  // namespace

int64_t ModelShape::split_parameters() const {
  int64_t n = 0;
  for (const auto& [rows, cols] : split_matrices) n += rows * cols;
  return n;
}

int64_t ModelShape::selected_parameters(double topk_ratio) const {
  if (topk_ratio <= 0) return 0;
  int64_t n = 0;
  for (const auto& [rows, cols] : split_matrices) {
    const int64_t k = std::min(
        cols, std::max<int64_t>(1, static_cast<int64_t>(std::floor(topk_ratio * static_cast<double>(cols)))));
    n += rows * k;
  }
  return n;
}

// Per token, what autograd keeps for backward of one layer, tensor by tensor (e = weight
// dtype bytes, H hidden, A = heads x head_dim, I intermediate). Attention is LibTorch 2.x's
// fused scaled_dot_product_attention (a GPU build): it keeps q, k, v, its output and an fp32
// logsumexp per head, never the [T, T] probabilities.
//
// Llama (llama.cpp's forward), per layer:
//   2 RMSNorms       each the fp32 copy of its input (pow's input, 4H), the normalised
//                    16-bit tensor the weight multiplies (eH) and its output, the input of
//                    the q/k/v or gate/up projections (eH)              2 x (4 + 2e) H
//   attention        q after RoPE, k and v repeated to all heads (repeat_kv makes copies),
//                    SDPA's output (4eA), its logsumexp (4 x heads), and o_proj's input,
//                    the transposed output made contiguous (eA)         5eA + 4 heads
//   SwiGLU           gate's output (silu's input), silu's output and up's output (the
//                    product's inputs), and the product (down_proj's input)   4eI
// RoPE's multiplications keep only cos and sin ([T, head_dim], shared); the residual adds
// keep nothing.
//
// GPT-2 (gpt2.cpp's forward), per layer: ln_1's and ln_2's inputs (2eH + 2 x 8 for mean and
// rstd), c_attn's and c_fc's inputs (2eH), the fused qkv SDPA reads (3eH), its output and
// c_proj's contiguous input (2eH), the logsumexp, the activation's input and output (2eI).
double ModelShape::layer_activation_bytes_per_token(int64_t e_bytes) const {
  const double e = static_cast<double>(e_bytes), H = static_cast<double>(hidden),
               A = static_cast<double>(attention_width()), I = static_cast<double>(intermediate),
               lse = 4.0 * static_cast<double>(heads);
  if (arch == "gpt2") return 9 * e * H + 16 + lse + 2 * e * I;
  return 2 * (4 + 2 * e) * H + 5 * e * A + lse + 4 * e * I;
}

// The final norm (as one of a layer's) and the loss over the vocabulary.
double ModelShape::head_activation_bytes_per_token(int64_t e_bytes) const {
  const double e = static_cast<double>(e_bytes), H = static_cast<double>(hidden);
  const double norm = arch == "gpt2" ? e * H + 8 + e * H : (4 + 2 * e) * H;
  return norm + kLossBytesPerVocabEntry * static_cast<double>(vocab);
}

ModelShape model_shape_from_hf(const nlohmann::json& config, const std::string& where) {
  ModelShape m;
  m.source = where;
  std::vector<model::ParameterShape> shapes;
  try {
    m.arch = model::hf_model_type(config, where);
    if (m.arch == "gpt2") {
      const model::GPT2Config c = model::gpt2_config_from_hf(config, where);
      m.layers = c.n_layer, m.hidden = c.n_embd, m.intermediate = c.inner_size(), m.vocab = c.vocab_size;
      m.heads = m.kv_heads = c.n_head, m.head_dim = c.n_embd / c.n_head;
      shapes = model::gpt2_parameter_shapes(c);
    } else {
      const model::LlamaConfig c = model::llama_config_from_hf(config, where);
      m.layers = c.num_hidden_layers, m.hidden = c.hidden_size, m.intermediate = c.intermediate_size;
      m.vocab = c.vocab_size, m.heads = c.num_attention_heads, m.kv_heads = c.num_key_value_heads;
      m.head_dim = c.resolved_head_dim();
      shapes = model::llama_parameter_shapes(c);
    }
  } catch (const std::invalid_argument& e) {  // check_*_config: "LlamaConfig: ..."
    throw ModelConfigError(where + ": " + e.what());
  } catch (const std::runtime_error& e) {  // the parsers name `where` and the key
    throw ModelConfigError(e.what());
  }
  for (const model::ParameterShape& p : shapes) {
    m.parameters += p.numel();
    if (p.shape.size() == 2 && p.numel() >= engine_defaults::kMinSplitNumel)
      m.split_matrices.emplace_back(p.shape[0], p.shape[1]);
  }
  return m;
}

ModelShape load_model_shape(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool dir = fs::is_directory(path, ec);
  const std::string file = dir ? (fs::path(path) / "config.json").string() : path;
  nlohmann::json config;
  try {
    if (dir) {
      config = model::read_hf_config(path);
    } else {
      config = nlohmann::json::parse(read_regular_file(path, kMaxConfigBytes, "a config.json"));
      if (!config.is_object()) throw ModelConfigError(path + ": not a JSON object");
    }
  } catch (const nlohmann::json::parse_error& e) {
    throw ModelConfigError(path + ": not valid JSON: " + json_error_text(e));
  } catch (const ModelConfigError&) {
    throw;
  } catch (const std::runtime_error& e) {  // InputError and read_hf_config's: "<path>: ..."
    throw ModelConfigError(e.what());
  }
  return model_shape_from_hf(config, file);
}

int64_t ModelShape::largest_unit_parameters() const {
  const int64_t embedding = vocab * hidden;
  const int64_t layer = layers > 0 ? std::max<int64_t>(0, parameters - embedding) / layers : 0;
  return std::max(embedding + hidden, layer);  // the head: the final norm and a vocabulary projection
}

RankMemory rank_memory(const ModelShape& m, const RankJob& job) {
  const double e = static_cast<double>(job.dtype_bytes);
  const double W = static_cast<double>(std::max<int64_t>(1, job.ranks));
  const bool sharded = job.ranks > 1 && job.shard != "none";
  const bool params_sharded = sharded && job.shard == "parameters";
  const double unit = static_cast<double>(m.largest_unit_parameters()) * e;
  const double P = static_cast<double>(m.parameters);
  // What the host updater owns (preflight.cpp: offload every parameter, zenflow the split
  // matrices) and what AdamW updates on the device.
  double split = 0, device_updated = P;
  if (job.mode == "offload") {
    split = P, device_updated = 0;
  } else if (job.mode == "zenflow") {
    split = static_cast<double>(m.split_parameters());
    device_updated = P - split + static_cast<double>(m.selected_parameters(job.topk_ratio));
  }
  RankMemory r;
  // gradients: every rank keeps the full weights and its updated shard of them.
  r.weights = params_sharded ? P * e / W : (sharded ? P * e * (1 + 1 / W) : P * e);
  r.gradients = sharded ? P * e / W : P * e;
  r.optimizer_state = device_updated * optimizer_state_per_element(job.dtype_bytes) / (sharded ? W : 1);
  if (split > 0) {
    // zenflow_optimizer.cpp build(): the host owns every column of a split matrix until the
    // first selection, so all of them are allocated (this rank's 1/W share); fp32 master,
    // m, v and two accumulators, two gradient rings and two last gradients, two weight-out
    // buffers with 16-bit weights, and the packed output with a partitioned engine (several
    // unsharded ranks) or fp32 weights on a GPU. Sharded, every rank runs a one-rank engine
    // on its own rows. Chunked device staging (one-rank engines only) keeps one ring slot,
    // one weight-out buffer and no last gradients.
    // Offload mode opens no windows: no accumulators, one ring slot and one weight-out
    // buffer, no last gradients, one device stage. Streamed offload mode's engine runs on the
    // CPU device (no device staging); streamed zenflow's on the GPU, staging nothing there,
    // with weight-out buffers in any dtype and the step's host gradient.
    const double capacity = std::ceil(split / W);
    const bool low_precision = job.dtype_bytes != 4;
    const bool one_rank_engine = W <= 1 || sharded;
    const bool windows = job.mode == "zenflow";
    const bool by_column = job.offload_parameters && windows;
    const bool engine_cuda = job.cuda && !(job.offload_parameters && job.mode == "offload");
    const bool chunked = job.device_staging_bytes > 0 && one_rank_engine;
    const bool single = chunked || !windows;
    const bool pack_out = !by_column && (!one_rank_engine || ((engine_cuda || chunked) && !low_precision));
    const double slots = single ? 1 : 2;
    r.host_optimizer = capacity * ((windows ? 5 : 3) * 4 + (single ? 1 : 4) * e +
                                   (low_precision || by_column ? slots * e : 0) + (pack_out ? e : 0) +
                                   (by_column ? e : 0));
    if (chunked)  // four chunk buffers of a quarter, at most the split's (zenflow_optimizer.cpp; the CPU device too)
      r.transfer_staging =
          4 * e *
          std::max(static_cast<double>(std::max(m.hidden, m.intermediate)),
                   std::min(std::floor(job.device_staging_bytes / 4 / e), std::ceil(capacity / 4)));
    else if (engine_cuda && !by_column)  // two stages (offload: one), the H2D buffer
      r.transfer_staging = (windows ? 2 : 1) * (sharded ? capacity : split) * e + capacity * e;
    else if (W > 1 && !sharded)
      r.transfer_staging = split * e;  // the reduce-scatter's input
  }
  if (W > 1 && job.cuda) {
    // Gradients all-reduced on the device go through one flat buffer (zenflow: the selected
    // columns; device mode: an upper bound, every gradient at once). Sharded: one unit's
    // gradients reduce-scattered at a time and, with parameters, its gathered weights, their
    // flat buffer and the next unit's prefetched one.
    const double reduced = job.mode == "offload" ? 0 : device_updated;
    r.collective_buffers = (sharded ? (params_sharded ? 4 : 1) * unit : reduced * e) + kNcclBufferBytes;
  }
  if (job.offload_parameters && job.mode == "offload") {
    r.weights = 2 * unit;
    r.gradients = 2 * unit;
    r.optimizer_state = 0;
    r.host_optimizer += r.transfer_staging + 2 * P * e + 2 * unit;  // the engine runs over the host weights
    r.transfer_staging = 0;
  } else if (job.offload_parameters && job.mode == "zenflow") {
    // The selected columns and the unsplit parameters stay; a ring of two slots of the
    // largest unit whole and its host columns landed (all of them in warm-up); that unit's
    // gradient whole until the engine splits it, and on a GPU the unit before's host columns
    // until their D2H lands. The parameter tensors stay on the host.
    r.weights = device_updated * e + 4 * unit;  // device_updated: the unsplit and the selected
    r.gradients = device_updated * e + (job.cuda ? 2 : 1) * unit;
    r.host_optimizer += split * e + (job.grad_accum > 1 ? 2 * unit : 0);
    // Several unsharded ranks (preflight.cpp): the step's host gradient is every rank's
    // columns, not this rank's share; beside it this rank's reduced shard and every rank's
    // columns' weights (what streams). No reduce-scatter staging on the device.
    if (W > 1 && !sharded) {
      r.host_optimizer += (split - std::ceil(split / W)) * e + std::ceil(split / W) * e + split * e;
      r.transfer_staging = 0;
    }
  }
  const double tokens = static_cast<double>(job.micro_batch) * static_cast<double>(job.seq_len);
  const double layer = m.layer_activation_bytes_per_token(job.dtype_bytes) * tokens;
  const double head = m.head_activation_bytes_per_token(job.dtype_bytes) * tokens;
  const double layers = static_cast<double>(m.layers);
  if (job.activation_checkpointing) {
    // Each layer's input [B, T, H] is kept; backward recomputes one layer at a time and holds
    // its intermediates until that layer's backward is done.
    r.activations = layers * tokens * static_cast<double>(m.hidden) * e + layer + head;
  } else {
    r.activations = layers * layer + head;
  }
  return r;
}

}  // namespace zenflow::advisor
