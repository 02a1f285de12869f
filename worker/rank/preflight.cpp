// Memory estimate, fit check and setting warnings before a job allocates (see preflight.h).
#include "worker/rank/preflight.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>  // c10::AutoGradMode: ATen.h stopped bringing it in LibTorch 2.11
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "common/input_file.h"
#include "worker/engine/shard_layout.h"
#include "worker/engine/zenflow_optimizer.h"  // zenflow_splits
#include "worker/model/causal_lm.h"
#include "worker/model/gpt2.h"
#include "worker/model/hf_model.h"
#include "worker/model/llama.h"

namespace zenflow {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// Byte counts are computed in long double: with the spec's bounds an activation term
// alone can pass 2^63 (65536 x 1048576 tokens x 16 MiB of vocab).
int64_t saturate(long double v) {
  if (!(v < static_cast<long double>(kInt64Max))) return kInt64Max;
  return v <= 0 ? 0 : static_cast<int64_t>(v);
}

// "8.1e11", or the integer below 1e5.
std::string count_text(int64_t n) {
  if (n < 100000) return std::to_string(n);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", static_cast<double>(n));
  std::string s = buf;  // "8.1e+11"
  const auto e = s.find('e');
  std::string exp = s.substr(e + 1);
  if (!exp.empty() && exp[0] == '+') exp.erase(0, 1);
  while (exp.size() > 1 && exp[0] == '0') exp.erase(0, 1);
  return s.substr(0, e) + "e" + exp;
}

// The sizes the activation bound needs, from the config the model is built from.
struct Shape {
  int64_t hidden = 0, layers = 0, heads = 0, intermediate = 0, vocab = 0;
};

Shape shape_of(const model::LoadedModel& d) {
  Shape s;
  if (d.arch == "gpt2") {
    const model::GPT2Config c = model::gpt2_config_from_hf(d.config);
    s = {c.n_embd, c.n_layer, c.n_head, c.inner_size(), c.vocab_size};
  } else {
    const model::LlamaConfig c = model::llama_config_from_hf(d.config);
    s = {c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size, c.vocab_size};
  }
  return s;
}

// The model.config key whose value costs the most parameters: the one that, put back to
// its default, shrinks the model most (a reset that makes the config invalid is skipped).
// "model.from" for a checkpoint directory, "model.config" when no written key explains it.
std::string model_key_of(const JobSpec& spec, const model::LoadedModel& d, int64_t parameters) {
  if (!spec.model.from.empty()) return "model.from";
  std::string best = "model.config";
  int64_t best_count = parameters;
  auto consider = [&](const std::string& key, const std::function<int64_t()>& count_with_default) {
    if (!spec.model.config.count(key)) return;
    try {
      const int64_t n = count_with_default();
      if (n < best_count) {
        best_count = n;
        best = "model.config." + key;
      }
    } catch (const std::invalid_argument&) {
    }
  };
  if (d.arch == "gpt2") {
    const model::GPT2Config c = model::gpt2_config_from_hf(d.config), def;
    auto with = [&](auto field) {
      return [c, def, field] {
        model::GPT2Config x = c;
        x.*field = def.*field;
        return model::gpt2_parameter_count(x);
      };
    };
    consider("hidden_size", with(&model::GPT2Config::n_embd));
    consider("num_hidden_layers", with(&model::GPT2Config::n_layer));
    consider("intermediate_size", with(&model::GPT2Config::n_inner));
    consider("vocab_size", with(&model::GPT2Config::vocab_size));
    consider("max_position_embeddings", with(&model::GPT2Config::n_positions));
  } else {
    const model::LlamaConfig c = model::llama_config_from_hf(d.config), def;
    auto with = [&](auto field) {
      return [c, def, field] {
        model::LlamaConfig x = c;
        x.*field = def.*field;
        return model::llama_parameter_count(x);
      };
    };
    consider("hidden_size", with(&model::LlamaConfig::hidden_size));
    consider("num_hidden_layers", with(&model::LlamaConfig::num_hidden_layers));
    consider("intermediate_size", with(&model::LlamaConfig::intermediate_size));
    consider("vocab_size", with(&model::LlamaConfig::vocab_size));
    consider("num_key_value_heads", with(&model::LlamaConfig::num_key_value_heads));
  }
  return best;
}

// Which key drives a total: the activations' when they are most of it.
std::string key_for(const MemoryEstimate& e, int64_t total, bool includes_activations) {
  if (includes_activations && e.activation_bytes > total - e.activation_bytes) return e.activation_key;
  return e.model_key;
}

[[noreturn]] void fail_fit(const std::string& key, const std::string& kind, int64_t need,
                           const std::string& parts, int64_t available) {
  throw std::invalid_argument(key + ": the job needs an estimated " + format_bytes(need) + " of " + kind +
                              " (" + parts + "), more than the " + format_bytes(available) + " available");
}

// "Error message" of a c10::Error without its C++ backtrace; first line only.
std::string first_line(const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  std::string s = c10e ? c10e->what_without_backtrace() : e.what();
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

// Empty when a tiny llama and a tiny gpt2 train (forward, loss, backward) on the CPU in
// `dtype`; otherwise the first kernel error. Probing beats a version table: the CPU dtype
// coverage differs between LibTorch releases.
std::string cpu_training_failure(at::ScalarType dtype) {
  const c10::AutoGradMode grad(true);  // the caller may be under a NoGradGuard
  try {
    model::LlamaConfig l;
    l.vocab_size = 16;
    l.hidden_size = 8;
    l.num_hidden_layers = 1;
    l.num_attention_heads = 2;
    l.num_key_value_heads = 1;
    l.intermediate_size = 16;
    l.max_position_embeddings = 8;
    model::GPT2Config g;
    g.vocab_size = 16;
    g.n_positions = 8;
    g.n_embd = 8;
    g.n_layer = 1;
    g.n_head = 2;
    std::unique_ptr<model::CausalLM> models[] = {model::make_llama(l, 1), model::make_gpt2(g, 1)};
    const at::Tensor ids = at::arange(8, at::kLong).remainder(16).reshape({2, 4});
    for (auto& lm : models) {
      lm->to(at::kCPU, dtype);
      model::causal_lm_loss(lm->forward(ids), ids).backward();
    }
  } catch (const std::exception& e) {
    return first_line(e);
  }
  return "";
}

// The first integer on the line of `text` that starts with `key`, or -1.
int64_t field_value(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    long long v = -1;
    if (fields >> v) return v;
  }
  return -1;
}

// A small kernel-provided file, or "" when it cannot be read.
std::string read_small(const std::string& path) {
  try {
    return read_regular_file(path, 1 << 20, "a /proc or /sys file");
  } catch (const InputError&) {
    return "";
  }
}

// An integer file (memory.max, memory.current, ...); -1 for "max", missing or unreadable.
int64_t read_number_file(const std::string& path) {
  const std::string text = read_small(path);
  if (text.empty() || text.rfind("max", 0) == 0) return -1;
  try {
    return static_cast<int64_t>(std::stoll(text));
  } catch (const std::exception&) {
    return -1;
  }
}

// The least room left under any cgroup memory limit on the way from `dir` up to `root`.
int64_t cgroup_room(std::filesystem::path dir, const std::filesystem::path& root, const char* limit_file,
                    const char* usage_file) {
  int64_t room = -1;
  for (;;) {
    const int64_t limit = read_number_file((dir / limit_file).string());
    // v1 reports "no limit" as a page-rounded INT64_MAX.
    if (limit >= 0 && limit < (int64_t{1} << 62)) {
      const int64_t used = std::max<int64_t>(0, read_number_file((dir / usage_file).string()));
      const int64_t left = std::max<int64_t>(0, limit - used);
      room = room < 0 ? left : std::min(room, left);
    }
    if (dir == root || !dir.has_relative_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
  return room;
}

}  // namespace

MemoryEstimate estimate_job_memory(const JobSpec& spec, const model::LoadedModel& described,
                                   int64_t world_size, bool device_is_cuda, int weight_dtype_bytes) {
  if (world_size < 1) throw std::invalid_argument("estimate_job_memory: world_size must be >= 1");
  if (weight_dtype_bytes != 2 && weight_dtype_bytes != 4)
    throw std::invalid_argument("estimate_job_memory: weight_dtype_bytes must be 2 or 4");
  using LD = long double;
  const LD e = weight_dtype_bytes;
  const bool low_precision = weight_dtype_bytes != 4;
  const LD state_per_element = 8 + (low_precision ? 4 : 0);  // fp32 m, v (+ master)

  // The architecture on the meta device: exact shapes, no memory.
  std::unique_ptr<model::CausalLM> meta;
  try {
    meta = model::make_hf_architecture(described.config,
                                       at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
  } catch (const std::exception& ex) {
    throw std::invalid_argument(std::string("model.config: ") + ex.what());
  }
  const std::string& mode = spec.optimizer.mode;
  const ZenflowSpec& z = spec.optimizer.zenflow;
  MemoryEstimate est;
  LD split = 0, dense = 0, selected = 0;
  LD score_columns = 0;  // zenflow: each split matrix's column importance, fp32 on the device
  LD widest = 1;  // the longest row of a split matrix (1-D parameters: one column each)
  for (const model::NamedTensor& nt : meta->parameters()) {
    const int64_t n = nt.tensor.numel();
    est.parameters += n;
    const bool to_split =
        mode == "offload" || (mode == "zenflow" && nt.tensor.dim() == 2 && n >= z.min_split_numel);
    if (!to_split) {
      dense += n;
      continue;
    }
    split += n;
    if (nt.tensor.dim() == 2) widest = std::max<LD>(widest, static_cast<LD>(nt.tensor.size(1)));
    if (mode == "zenflow" && z.topk_ratio > 0) {  // as the engine's SplitParam::k
      const int64_t in = nt.tensor.size(1);
      const int64_t k =
          std::min(in, std::max<int64_t>(1, static_cast<int64_t>(std::floor(z.topk_ratio * in))));
      selected += static_cast<LD>(nt.tensor.size(0)) * k;
    }
    if (mode == "zenflow") score_columns += static_cast<LD>(nt.tensor.size(1));
  }
  const LD P = est.parameters;
  const LD W = world_size;
  const bool sharded = world_size > 1 && spec.train.shard != "none";
  const bool params_sharded = sharded && spec.train.shard == "parameters";
  est.weight_bytes = saturate(params_sharded ? P * e / W : (sharded ? P * e + P * e / W : P * e));
  est.gradient_bytes = saturate(sharded ? P * e / W : P * e);

  // Host updater (zenflow_optimizer.cpp build()): this rank's share of the split elements.
  const LD capacity = std::ceil(split / W);
  LD host = 0, staging = 0;
  // Sharded, every rank's engine is a one-rank engine over its own rows. Chunked device
  // staging (one-rank engines) keeps one ring slot, one weight-out buffer and no last
  // gradients on the host, and four chunk buffers of a quarter of the budget (at least a
  // row each) on the device.
  // Offload mode opens no windows: no accumulators, one ring slot, one weight-out buffer, no
  // last gradients and one device stage, as with chunked staging.
  const bool one_rank_engine = world_size <= 1 || sharded;
  const bool windows = mode == "zenflow";
  // train.offload_parameters: in offload mode the engine runs over host leaves, on the CPU
  // device; in zenflow mode (by column) on the device, with no device staging (the runner
  // hands it each unit's gradient) and the weights' output buffers whatever their dtype.
  const bool by_column = spec.train.offload_parameters && mode == "zenflow";
  const bool engine_cuda = device_is_cuda && !spec.train.offload_parameters;
  auto host_bytes = [&](bool chunked) {
    const bool pack_out = !one_rank_engine || ((engine_cuda || chunked) && !low_precision);
    const bool single = chunked || !windows;
    return capacity * ((windows ? 5 : 3) * 4                                 // master, m, v (two accumulators)
                       + (single ? 1 : 4) * e                                // ring slots, last gradients
                       + (low_precision || by_column ? (single ? 1 : 2) * e : 0)  // weight-out buffers
                       + (pack_out && !by_column ? e : 0)                    // (by column: none)
                       + (by_column ? e : 0));                               // the step's host gradient
  };
  auto staging_bytes = [&](LD budget) -> LD {
    if (budget > 0 && one_rank_engine)  // the chunk buffers (on the CPU device too)
      return engine::kStagingChunks * e *
             static_cast<LD>(engine::device_staging_chunk_elems(
                 static_cast<int64_t>(budget), static_cast<int64_t>(e), static_cast<int64_t>(capacity),
                 static_cast<int64_t>(widest)));
    if (engine_cuda)  // two stages (offload: one), the h2d buffer
      return (windows ? 2 : 1) * (sharded ? capacity : split) * e + capacity * e;
    if (world_size > 1 && !sharded) return split * e;                               // the reduce-scatter input
    return 0;
  };
  if (split > 0) {
    const LD budget = static_cast<LD>(spec.optimizer.host.device_staging_mib) * (1 << 20);
    if (budget > 0 && !one_rank_engine)  // as the engine refuses it, before the model loads
      throw std::invalid_argument(engine::device_staging_needs_one_rank(world_size));
    host = host_bytes(budget > 0 && one_rank_engine);
    // By column on several ranks: the step's host gradient is every rank's columns, and beside
    // it are this rank's reduced shard and every rank's columns' weights (what streams).
    if (by_column && !one_rank_engine) host += (split - capacity) * e + capacity * e + split * e;
    staging = staging_bytes(budget);
    if (budget == 0 && one_rank_engine) {
      const LD chunked_budget = static_cast<LD>(kSuggestedStagingMib) * (1 << 20);
      est.chunked_staging_saves_host = saturate(host - host_bytes(true));
      est.chunked_staging_saves_device = saturate(std::max<LD>(0, staging - staging_bytes(chunked_budget)));
    }
  }
  est.host_optimizer_bytes = saturate(host);
  LD device_state = (dense + selected) * state_per_element / (sharded ? W : 1) + score_columns * 4;
  if (spec.train.offload_parameters) {
    // The units in the order they run (the embedding, each layer, the head: the final norm
    // and the output projection, or the embedding read again when tied), as the runner
    // streams them; the engine runs on the host, so its staging is host memory.
    // By column, only the split matrices stream: a unit is what of it streams.
    std::vector<LD> units(1, 0);
    std::map<int64_t, LD> layers;
    LD head = 0, embedding = 0;
    bool untied = false;
    for (const model::NamedTensor& nt : meta->parameters()) {
      const bool streams = !by_column || engine::zenflow_splits(nt.tensor.sizes(), z.min_split_numel);
      const LD n = streams ? static_cast<LD>(nt.tensor.numel()) : 0;
      if (nt.name == "model.embed_tokens.weight" || nt.name == "transformer.wte.weight") {
        embedding = n;
        units[0] += n;
      } else if (nt.name == "transformer.wpe.weight") {
        units[0] += n;
      } else if (nt.name.rfind("model.layers.", 0) == 0 || nt.name.rfind("transformer.h.", 0) == 0) {
        const size_t from = nt.name.find('.', nt.name.find('.') + 1) + 1;
        layers[std::stoll(nt.name.substr(from))] += n;
      } else {
        untied = untied || nt.name == "lm_head.weight";
        head += n;
      }
    }
    for (const auto& [i, n] : layers) units.push_back(n);
    units.push_back(head + (untied ? 0 : embedding));
    LD largest = 0, pair = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      largest = std::max(largest, units[u]);
      pair = std::max(pair, units[u] + (u + 1 < units.size() ? units[u + 1] : 0));
    }
    if (by_column) {
      // The ring: two slots of a unit's matrices whole and their host columns landed (every
      // column during warm-up); the selected columns and the parameters never split stay
      // on the device, with their gradients; a unit's matrices' gradients are whole on the
      // device until the engine has split them, and on a GPU the unit before's host columns
      // until their D2H lands. The host: the parameter tensors (for checkpoints), beside the
      // engine's buffers (host_bytes), and with accumulation where a unit's host columns land
      // to be added to an earlier micro-batch's: two slots of a unit's (every column during
      // warm-up). (A tied embedding's uses reach the engine summed, once.)
      est.weight_bytes = saturate(2 * 2 * largest * e + (selected + dense) * e);
      est.gradient_bytes = saturate((device_is_cuda ? 2 : 1) * largest * e + (selected + dense) * e);
      est.streamed_host_bytes =
          saturate(split * e + (spec.train.grad_accum > 1 ? 2 * largest : 0) * e);
      host += static_cast<LD>(est.streamed_host_bytes);
      staging = 0;
      est.chunked_staging_saves_device = 0;
      est.chunked_staging_saves_host = 0;
    } else {
      est.weight_bytes = saturate(2 * largest * e);
      est.gradient_bytes = saturate(pair * e);
      est.streamed_host_bytes = saturate(2 * P * e + pair * e);
      host += static_cast<LD>(est.streamed_host_bytes) + staging;
      staging = 0;
      est.chunked_staging_saves_device = 0;  // there is no device staging to save
      device_state = 0;
    }
  }
  est.device_optimizer_bytes = saturate(device_state + staging);

  // Activations: a documented rough upper bound (preflight.h), not a measurement.
  const Shape s = shape_of(described);
  const LD B = spec.train.micro_batch, T = spec.train.seq_len;
  const LD per_layer = B * T * (16.0L * s.hidden + 4.0L * s.intermediate) * e;
  const LD logits = B * T * s.vocab * 12.0L;
  // Activation checkpointing keeps each layer's input [B, T, hidden] through the forward
  // and one layer's intermediates at a time, in the backward's recompute.
  const bool checkpointed = spec.train.activation_checkpointing;
  const LD kept_layers = checkpointed ? B * T * s.hidden * e * s.layers + per_layer : per_layer * s.layers;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  const LD attention = 0;  // fused attention keeps no [T, T] matrix
#else
  // Eager attention keeps each layer's probabilities (fp32, plus a cast copy when 16-bit);
  // backward needs one more layer's worth in flight. Checkpointed: one layer's, recomputed.
  const LD probs = B * s.heads * T * T;
  const LD attention = probs * ((4 + (low_precision ? e : 0)) * (checkpointed ? 1 : s.layers) + 8);
#endif
  est.activation_bytes = saturate(kept_layers + logits + attention);
  est.activation_key = attention > (kept_layers + logits) ? "train.seq_len" : "train.micro_batch";
  est.model_key = model_key_of(spec, described, est.parameters);

  if (sharded) {
    const LD embedding = static_cast<LD>(s.vocab) * s.hidden;
    const LD unit = std::max(embedding + s.hidden, s.layers > 0 ? std::max<LD>(0, P - embedding) / s.layers : 0);
    est.shard_buffer_bytes = saturate((params_sharded ? 4 : 1) * unit * e);
  }
  const LD device_total = static_cast<LD>(est.weight_bytes) + static_cast<LD>(est.gradient_bytes) + device_state +
                          staging + static_cast<LD>(est.activation_bytes) + static_cast<LD>(est.shard_buffer_bytes);
  est.total_device_bytes = saturate(device_total);
  est.device_is_cuda = device_is_cuda;
  if (device_is_cuda) {
    // A random init is made on the host in fp32 and moved; it is freed before the
    // optimizer allocates, so the host needs the larger of the two.
    const LD init = spec.model.from.empty() ? P * 4 + (spec.train.offload_parameters ? P * e : 0) : 0;
    est.init_host_bytes = saturate(init);
    est.total_host_bytes = saturate(std::max(host, init));
    est.dominant_key = key_for(est, est.total_device_bytes, true);
  } else {
    est.total_host_bytes = saturate(host + device_total);
    est.dominant_key = key_for(est, est.total_host_bytes, true);
  }
  return est;
}

void check_job_fits(const JobSpec& spec, const MemoryEstimate& est, int64_t available_host_bytes,
                    int64_t available_device_bytes) {
  const bool cpu = !est.device_is_cuda;
  const std::string params = "parameters " + count_text(est.parameters);
  const std::string device_parts = "weights " + format_bytes(est.weight_bytes) + ", gradients " +
                                   format_bytes(est.gradient_bytes) + ", optimizer state " +
                                   format_bytes(est.device_optimizer_bytes) + " on the device";
  const std::string activations = ", activations " + format_bytes(est.activation_bytes);
  // What would fit with optimizer.host.device_staging_mib, when that is all it lacks.
  const bool staging_fits_device =
      cpu || available_device_bytes <= 0 ||
      est.total_device_bytes - est.chunked_staging_saves_device <= available_device_bytes;
  const int64_t host_with_chunks =
      cpu ? est.total_host_bytes - est.chunked_staging_saves_host
          : std::max(est.host_optimizer_bytes - est.chunked_staging_saves_host, est.init_host_bytes);
  const bool staging_fits_host = available_host_bytes <= 0 || host_with_chunks <= available_host_bytes;
  const bool device_short = !cpu && available_device_bytes > 0 && est.total_device_bytes > available_device_bytes;
  const bool host_short = available_host_bytes > 0 && est.total_host_bytes > available_host_bytes;
  if ((device_short || host_short) && staging_fits_device && staging_fits_host &&
      (est.chunked_staging_saves_device > 0 || est.chunked_staging_saves_host > 0)) {
    const std::string mib = std::to_string(kSuggestedStagingMib);
    fail_fit("optimizer.host.device_staging_mib", device_short ? "device memory" : "host memory",
             device_short ? est.total_device_bytes : est.total_host_bytes,
             params + ": staging whole gradients takes " +
                 format_bytes(device_short ? est.chunked_staging_saves_device : est.chunked_staging_saves_host) +
                 " of it that optimizer.host.device_staging_mib: " + mib + " would not (it fits with that)",
             device_short ? available_device_bytes : available_host_bytes);
  }
  if (available_host_bytes > 0 && est.total_host_bytes > available_host_bytes) {
    if (cpu) {
      fail_fit(key_for(est, est.total_host_bytes, true), "host memory", est.total_host_bytes,
               params + ": " + device_parts + " and " + format_bytes(est.host_optimizer_bytes) +
                   " on the host" + activations,
               available_host_bytes);
    }
    const std::string init =
        est.init_host_bytes > est.host_optimizer_bytes
            ? "; the random init is built on the host in fp32 first: " + format_bytes(est.init_host_bytes)
            : "";
    fail_fit(est.model_key, "host memory", est.total_host_bytes,
             params + ": optimizer state " + format_bytes(est.host_optimizer_bytes) + " on the host" + init,
             available_host_bytes);
  }
  if (!cpu && available_device_bytes > 0 && est.total_device_bytes > available_device_bytes) {
    fail_fit(key_for(est, est.total_device_bytes, true), "device memory", est.total_device_bytes,
             params + ": " + device_parts + activations, available_device_bytes);
  }
}

int64_t available_host_memory_bytes() {
  namespace fs = std::filesystem;
  int64_t avail = -1;
  const int64_t kb = field_value(read_small("/proc/meminfo"), "MemAvailable:");
  if (kb >= 0) avail = kb * 1024;
  auto cap = [&](int64_t room) {
    if (room >= 0) avail = avail < 0 ? room : std::min(avail, room);
  };
  // /proc/self/cgroup: "0::/path" (v2) or "N:memory:/path" / "N:...,memory,...:/path" (v1).
  std::istringstream lines(read_small("/proc/self/cgroup"));
  std::string line;
  while (std::getline(lines, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const fs::path rel = fs::path(line.substr(b + 1)).relative_path();
    bool memory_v1 = false;
    std::istringstream names(controllers);
    for (std::string c; std::getline(names, c, ',');) memory_v1 = memory_v1 || c == "memory";
    if (controllers.empty()) {
      const fs::path root = "/sys/fs/cgroup";
      // Inside a container the listed path may not exist under the mount: use the root.
      const fs::path dir = fs::exists(root / rel / "memory.max") ? root / rel : root;
      cap(cgroup_room(dir, root, "memory.max", "memory.current"));
    } else if (memory_v1) {
      const fs::path root = "/sys/fs/cgroup/memory";
      const fs::path dir = fs::exists(root / rel / "memory.limit_in_bytes") ? root / rel : root;
      cap(cgroup_room(dir, root, "memory.limit_in_bytes", "memory.usage_in_bytes"));
    }
  }
  return std::max<int64_t>(0, avail);
}

std::vector<std::string> preflight_warnings(const JobSpec& spec, bool device_is_cuda,
                                            int64_t available_cores) {
  std::vector<std::string> out;
  const HostSpec& h = spec.optimizer.host;
  const bool needs_host = spec.optimizer.mode != "device";
  const int64_t cores = std::max<int64_t>(1, available_cores);
  const std::string have = "this process has " + std::to_string(cores) + (cores == 1 ? " core" : " cores");
  if (!needs_host) {
    if (!h.threads_auto)
      out.push_back("optimizer.host.threads: ignored: optimizer.mode device has no host optimizer");
    if (!h.reserved_cores_auto)
      out.push_back("optimizer.host.reserved_cores: ignored: optimizer.mode device has no host optimizer");
  } else if (!h.threads_auto && !h.reserved_cores_auto) {
    out.push_back("optimizer.host.threads: ignored: optimizer.host.reserved_cores gives the host optimizer " +
                  std::to_string(h.reserved_cores.size()) + " core(s)");
  } else if (!h.threads_auto) {
    // plan_cores (trainer.cpp): at most the process's cores minus one, at least one.
    const int64_t used = std::min(h.threads, std::max<int64_t>(1, cores - 1));
    if (used < h.threads) {
      out.push_back("optimizer.host.threads: " + std::to_string(h.threads) + " requested but " + have +
                    "; using " + std::to_string(used) +
                    (cores == 1 ? ", shared with compute" : " and leaving the rest for compute"));
    }
  }
  if (h.nodes > 0 && h.addresses.empty()) {
    out.push_back("optimizer.host.nodes: " + std::to_string(h.nodes) +
                  " requested, but only a coordinator assigns optimizer nodes (zenflow submit); name them in "
                  "optimizer.host.addresses (the host optimizer runs in this process)");
  }
  if (spec.train.compute_threads > cores) {
    out.push_back("train.compute_threads: " + std::to_string(spec.train.compute_threads) + " requested but " +
                  have + "; the threads will share them");
  }
  if (!device_is_cuda && spec.train.autocast != "none") {
    const std::string dtype = spec.train.dtype == "auto" ? "float32" : spec.train.dtype;
    out.push_back("train.autocast: " + spec.train.autocast +
                  " is ignored on the CPU (autocast is CUDA-only); " +
                  "the CPU computes in the weights' dtype (" + dtype + ")");
  }
  // cost.*: priced by the CLI (zenflow run resolves cost.instance_type in the pricing
  // catalog, common/pricing.h, and warns there when it is not in it), not here.
  // resources.*: a coordinator places the job by them; a local zenflow run cannot. A rank
  // the worker agent started (ZENFLOW_SCHEDULED=1) was placed, so nothing to say.
  const ResourcesSpec& r = spec.resources;
  const char* scheduled = std::getenv("ZENFLOW_SCHEDULED");
  if (scheduled && std::string(scheduled) == "1") return out;
  if (r.workers > 1) {
    out.push_back("resources.workers: " + std::to_string(r.workers) +
                  " requested, but zenflow run starts the ranks of one machine "
                  "(resources.gpus_per_worker, or --nproc); zenflow submit places it on that many workers");
  }
  if (!r.host_memory_gb_auto) {
    out.push_back(
        "resources.host_memory_gb: not enforced by zenflow run (a coordinator places by it); the memory "
        "check uses the memory this machine has available");
  }
  if (r.priority != 0) out.push_back("resources.priority: ignored by zenflow run (a coordinator queues by it)");
  return out;
}

void preflight_errors(const JobSpec& spec, bool device_is_cuda) {
  const std::string& dtype = spec.train.dtype;
  if (device_is_cuda || (dtype != "float16" && dtype != "bfloat16")) return;
  const std::string failure = cpu_training_failure(dtype == "float16" ? at::kHalf : at::kBFloat16);
  if (!failure.empty()) {
    throw std::invalid_argument("train.dtype: " + dtype + " cannot train on the CPU with this LibTorch (" +
                                TORCH_VERSION + "): " + failure +
                                "; use float32 or auto on the CPU, or a GPU");
  }
}

}  // namespace zenflow
