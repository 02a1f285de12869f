// Hugging Face model directories: config.json parsing, validated memory-mapped loading, export.
#include "worker/model/hf_model.h"

#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/input_file.h"
#include "common/json_error.h"
#include "common/remove_tree.h"
#include "worker/model/safetensors.h"

namespace zenflow::model {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string shape_string(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------
// config.json fields. `where` names the file in messages ("config.json" or a path).

[[noreturn]] void config_fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

// The value of `key`, or nullptr when absent or null (HF writes null for "use default").
const json* field(const json& c, const char* key) {
  const auto it = c.find(key);
  if (it == c.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t get_int(const json& c, const char* key, int64_t fallback, const std::string& where,
                bool required = false) {
  const json* v = field(c, key);
  if (!v) {
    if (required) config_fail(where, std::string("required key '") + key + "' is missing");
    return fallback;
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
  }
  config_fail(where, std::string("key '") + key + "' must be an integer, got " + v->dump());
}

double get_double(const json& c, const char* key, double fallback, const std::string& where) {
  const json* v = field(c, key);
  if (!v) return fallback;
  if (v->is_number()) return v->get<double>();
  config_fail(where, std::string("key '") + key + "' must be a number, got " + v->dump());
}

bool get_bool(const json& c, const char* key, bool fallback, const std::string& where) {
  const json* v = field(c, key);
  if (!v) return fallback;
  if (v->is_boolean()) return v->get<bool>();
  config_fail(where, std::string("key '") + key + "' must be true or false, got " + v->dump());
}

std::string get_string(const json& c, const char* key, const std::string& fallback,
                       const std::string& where) {
  const json* v = field(c, key);
  if (!v) return fallback;
  if (v->is_string()) return v->get<std::string>();
  config_fail(where, std::string("key '") + key + "' must be a string, got " + v->dump());
}

std::string model_type_of(const json& c, const std::string& where) {
  if (!c.is_object()) config_fail(where, "not a JSON object");
  const std::string type = get_string(c, "model_type", "", where);
  if (!type.empty()) {
    if (type == "llama" || type == "mistral" || type == "qwen2" || type == "gpt2") return type;
    config_fail(where, "model_type '" + type + "' is not supported (supported: llama, mistral, qwen2, gpt2)");
  }
  const json* archs = field(c, "architectures");
  if (!archs || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    config_fail(where, "no model_type and no architectures: cannot tell which model this is");
  const std::string a = (*archs)[0].get<std::string>();
  if (a == "LlamaForCausalLM") return "llama";
  if (a == "MistralForCausalLM") return "mistral";
  if (a == "Qwen2ForCausalLM") return "qwen2";
  if (a == "GPT2LMHeadModel" || a == "GPT2Model") return "gpt2";
  config_fail(where, "architecture '" + a +
                         "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                         "Qwen2ForCausalLM, GPT2LMHeadModel)");
}

RopeScaling rope_scaling_from(const json& r, const std::string& where) {
  if (!r.is_object()) config_fail(where, "rope_scaling must be an object or null, got " + r.dump());
  RopeScaling s;
  s.rope_type = get_string(r, "rope_type", get_string(r, "type", "default", where), where);
  if (s.rope_type != "default" && s.rope_type != "linear" && s.rope_type != "llama3")
    config_fail(where, "rope_scaling type '" + s.rope_type + "' is not supported (default, linear, llama3)");
  if (s.rope_type == "default") return s;
  const bool llama3 = s.rope_type == "llama3";
  if (!field(r, "factor")) config_fail(where, "rope_scaling." + s.rope_type + " needs 'factor'");
  s.factor = get_double(r, "factor", 1.0, where);
  if (llama3) {
    for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!field(r, k)) config_fail(where, std::string("rope_scaling.llama3 needs '") + k + "'");
    s.low_freq_factor = get_double(r, "low_freq_factor", 1.0, where);
    s.high_freq_factor = get_double(r, "high_freq_factor", 4.0, where);
    s.original_max_position_embeddings = get_int(r, "original_max_position_embeddings", 8192, where);
  }
  return s;
}

LlamaConfig llama_config_from(const json& c, const std::string& where) {
  const std::string type = model_type_of(c, where);
  if (type == "gpt2") config_fail(where, "model_type gpt2 is not a Llama-family model");
  LlamaConfig l;
  l.vocab_size = get_int(c, "vocab_size", 0, where, true);
  l.hidden_size = get_int(c, "hidden_size", 0, where, true);
  l.intermediate_size = get_int(c, "intermediate_size", 0, where, true);
  l.num_hidden_layers = get_int(c, "num_hidden_layers", 0, where, true);
  l.num_attention_heads = get_int(c, "num_attention_heads", 0, where, true);
  l.num_key_value_heads = get_int(c, "num_key_value_heads", l.num_attention_heads, where);
  // Defaults of LlamaConfig / MistralConfig / Qwen2Config in transformers.
  const int64_t default_max_pos = type == "llama" ? 2048 : type == "mistral" ? 4096 * 32 : 32768;
  l.max_position_embeddings = get_int(c, "max_position_embeddings", default_max_pos, where);
  l.rms_norm_eps = get_double(c, "rms_norm_eps", 1e-6, where);
  l.initializer_range = get_double(c, "initializer_range", 0.02, where);
  l.tie_word_embeddings = get_bool(c, "tie_word_embeddings", false, where);
  l.head_dim = get_int(c, "head_dim", 0, where);
  if (l.head_dim > 0 && l.head_dim * l.num_attention_heads == l.hidden_size) l.head_dim = 0;
  const std::string act = get_string(c, "hidden_act", "silu", where);
  if (act != "silu" && act != "swish")
    config_fail(where, "hidden_act '" + act + "' is not supported for " + type + " (only silu)");

  l.rope_theta = get_double(c, "rope_theta", 10000.0, where);
  if (const json* r = field(c, "rope_scaling")) l.rope_scaling = rope_scaling_from(*r, where);
  if (const json* p = field(c, "rope_parameters")) {  // transformers 5
    l.rope_theta = get_double(*p, "rope_theta", l.rope_theta, where);
    l.rope_scaling = rope_scaling_from(*p, where);
  }

  if (type == "llama") {
    l.qkv_bias = l.o_bias = get_bool(c, "attention_bias", false, where);
    l.mlp_bias = get_bool(c, "mlp_bias", false, where);
  } else if (type == "qwen2") {
    l.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without
    if (get_bool(c, "use_sliding_window", false, where))
      config_fail(where, "use_sliding_window true is not supported for qwen2");
  } else {  // mistral
    l.sliding_window = get_int(c, "sliding_window", 4096, where);
  }
  try {
    llama_parameter_count(l);  // runs the config checks
  } catch (const std::invalid_argument& e) {
    config_fail(where, e.what());
  }
  return l;
}

GPT2Config gpt2_config_from(const json& c, const std::string& where) {
  if (model_type_of(c, where) != "gpt2") config_fail(where, "not a gpt2 config");
  GPT2Config g;
  // The n_* names, or the aliases of GPT2Config.attribute_map.
  auto sized = [&](const char* key, const char* alias, int64_t fallback) {
    return get_int(c, key, get_int(c, alias, fallback, where), where);
  };
  g.vocab_size = get_int(c, "vocab_size", 0, where, true);
  g.n_positions = sized("n_positions", "max_position_embeddings", 1024);
  g.n_embd = sized("n_embd", "hidden_size", 768);
  g.n_layer = sized("n_layer", "num_hidden_layers", 12);
  g.n_head = sized("n_head", "num_attention_heads", 12);
  g.n_inner = get_int(c, "n_inner", 0, where);
  g.layer_norm_epsilon = get_double(c, "layer_norm_epsilon", 1e-5, where);
  g.activation_function = get_string(c, "activation_function", "gelu_new", where);
  g.initializer_range = get_double(c, "initializer_range", 0.02, where);
  g.tie_word_embeddings = get_bool(c, "tie_word_embeddings", true, where);
  g.scale_attn_weights = get_bool(c, "scale_attn_weights", true, where);
  g.scale_attn_by_inverse_layer_idx = get_bool(c, "scale_attn_by_inverse_layer_idx", false, where);
  try {
    gpt2_parameter_count(g);
  } catch (const std::invalid_argument& e) {
    config_fail(where, e.what());
  }
  return g;
}

std::unique_ptr<CausalLM> make_architecture(const json& config, const at::TensorOptions& options,
                                            std::string* arch, const std::string& where) {
  const std::string type = model_type_of(config, where);
  if (arch) *arch = type == "gpt2" ? "gpt2" : "llama";
  if (type == "gpt2") return make_gpt2_uninitialized(gpt2_config_from(config, where), options);
  return make_llama_uninitialized(llama_config_from(config, where), options);
}

json read_config(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  std::string text;
  try {
    text = read_regular_file(path.string(), kMaxConfigBytes, "a config.json");
  } catch (const InputError&) {
    std::error_code ec;
    // A missing config.json most often means the path is not a model directory at all.
    if (!fs::exists(fs::symlink_status(path, ec)))
      throw InputError(path.string(), "no such file or directory (is '" + dir.string() + "' a model directory?)");
    throw;
  }
  json c;
  try {
    c = json::parse(text);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(path.string() + ": not valid JSON: " + json_error_text(e));
  }
  if (!c.is_object()) throw std::runtime_error(path.string() + ": not a JSON object");
  return c;
}

// ---------------------------------------------------------------------------------
// Loading

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Tensors a checkpoint may hold besides the parameters: buffers older transformers
// saved, and the duplicate output head of a tied model.
bool known_buffer(const std::string& name, const std::string& arch, bool tied) {
  if (ends_with(name, ".rotary_emb.inv_freq")) return true;
  if (arch == "gpt2" && (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"))) return true;
  return tied && name == "lm_head.weight";
}

bool loadable_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble;
}

// Maps the pages of [begin, end) in one call before they are read (one fault per page
// costs far more on virtual machines); best effort: kernels before 5.14 lack it.
void populate_pages(const SafetensorsFile& file, const SafetensorsEntry& e) {
#ifdef MADV_POPULATE_READ
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<uintptr_t>(file.mapped_data());
  const uintptr_t begin = (base + e.begin) / page * page;
  const uintptr_t end = base + e.end;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
#else
  (void)file;
  (void)e;
#endif
}

// Returns the mapping's pages under [begin, end) to the kernel (they are re-read from
// the file if touched again), so a model's load never keeps the whole file resident.
void drop_pages(const SafetensorsFile& file, const SafetensorsEntry& e) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<uintptr_t>(file.mapped_data());
  const uintptr_t begin = (base + e.begin + page - 1) / page * page;
  const uintptr_t end = (base + e.end) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// Validates config + weights of `dir`; loads them when `load`.
LoadedModel open_model(const std::string& dir, bool load, const HfLoadOptions& options) {
  LoadedModel out;
  out.source_dir = dir;
  out.config = read_config(dir);
  const std::string where = (fs::path(dir) / "config.json").string();
  out.model_type = model_type_of(out.config, where);
  const auto meta = make_architecture(out.config, at::TensorOptions().device(at::kMeta).dtype(at::kFloat),
                                      &out.arch, where);
  const bool tied = out.arch == "gpt2" ? gpt2_config_from(out.config, where).tie_word_embeddings
                                       : llama_config_from(out.config, where).tie_word_embeddings;

  const SafetensorsIndex index(dir);
  const std::string& file = index.path();
  // Original GPT-2 checkpoints name tensors without the "transformer." prefix.
  std::string strip;
  if (out.arch == "gpt2" && !index.contains("transformer.wte.weight") && index.contains("wte.weight"))
    strip = "transformer.";
  auto source_name = [&](const std::string& name) {
    return !strip.empty() && name.rfind(strip, 0) == 0 ? name.substr(strip.size()) : name;
  };

  const std::vector<NamedTensor> expected = meta->parameters();
  std::set<std::string> used;
  for (const NamedTensor& p : expected) {
    const std::string src = source_name(p.name);
    if (!index.contains(src))
      throw std::runtime_error(file + ": tensor '" + src + "' (shape " + shape_string(p.tensor.sizes()) +
                               ") is missing");
    const SafetensorsEntry& e = index.info(src);
    if (e.dtype == at::ScalarType::Undefined || !loadable_dtype(e.dtype))
      throw std::runtime_error(file + ": tensor '" + src + "' has dtype " + e.dtype_name +
                               ", expected a floating dtype (F32, BF16, F16, F64)");
    if (at::IntArrayRef(e.shape) != p.tensor.sizes())
      throw std::runtime_error(file + ": tensor '" + src + "' has shape " + shape_string(e.shape) +
                               ", expected " + shape_string(p.tensor.sizes()));
    used.insert(src);
  }
  for (const std::string& name : index.names())
    if (!used.count(name) && !known_buffer(name, out.arch, tied))
      throw std::runtime_error(file + ": unexpected tensor '" + name + "' (not a parameter of this " +
                               out.model_type + " config)");
  out.checkpoint_dtype = index.info(source_name(expected.front().name)).dtype;
  if (!load) return out;

  const at::ScalarType dtype =
      options.dtype == at::ScalarType::Undefined ? out.checkpoint_dtype : options.dtype;
  out.model =
      make_architecture(out.config, at::TensorOptions().device(options.device).dtype(dtype), nullptr, where);
  c10::NoGradGuard no_grad;
  for (NamedTensor& p : out.model->parameters()) {
    const std::string src = source_name(p.name);
    const SafetensorsFile& f = index.file_of(src);
    populate_pages(f, f.info(src));
    p.tensor.copy_(f.tensor(src));
    drop_pages(f, f.info(src));
  }
  return out;
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(p.string() + ": cannot open to fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error(p.string() + ": fsync failed: " + std::strerror(err));
}

void write_text_file(const fs::path& path, const std::string& text) {
  {
    std::ofstream f(path, std::ios::binary);
    f << text;
    f.close();
    if (!f) throw std::runtime_error(path.string() + ": cannot write");
  }
  fsync_path(path, false);
}

}  // namespace

// ---------------------------------------------------------------------------------
// Public API

std::string hf_model_type(const nlohmann::json& config) { return model_type_of(config, "config.json"); }

LlamaConfig llama_config_from_hf(const nlohmann::json& config) {
  return llama_config_from(config, "config.json");
}

GPT2Config gpt2_config_from_hf(const nlohmann::json& config) {
  return gpt2_config_from(config, "config.json");
}

std::unique_ptr<CausalLM> make_hf_architecture(const nlohmann::json& config, const at::TensorOptions& options,
                                               std::string* arch) {
  return make_architecture(config, options, arch, "config.json");
}

nlohmann::json hf_config_json(const LlamaConfig& c, const std::string& model_type) {
  llama_parameter_count(c);  // validates
  json j;
  if (model_type == "llama") {
    if (c.qkv_bias != c.o_bias)
      throw std::invalid_argument(
          "hf_config_json: a llama config has biases on all of q/k/v/o_proj or on none");
    j["architectures"] = {"LlamaForCausalLM"};
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = c.mlp_bias;
  } else if (model_type == "qwen2") {
    if (!c.qkv_bias || c.o_bias || c.mlp_bias)
      throw std::invalid_argument("hf_config_json: qwen2 has q/k/v biases only");
    j["architectures"] = {"Qwen2ForCausalLM"};
    j["use_sliding_window"] = false;
  } else if (model_type == "mistral") {
    if (c.qkv_bias || c.o_bias || c.mlp_bias)
      throw std::invalid_argument("hf_config_json: mistral has no biases");
    j["architectures"] = {"MistralForCausalLM"};
  } else {
    throw std::invalid_argument("hf_config_json: model_type '" + model_type +
                                "' is not llama, mistral or qwen2");
  }
  if (model_type != "mistral" && c.sliding_window > 0)
    throw std::invalid_argument("hf_config_json: sliding_window is a mistral setting");
  j["model_type"] = model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.resolved_head_dim();
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.rope_type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    json r = {{"rope_type", c.rope_scaling.rope_type}, {"factor", c.rope_scaling.factor}};
    if (c.rope_scaling.rope_type == "llama3") {
      r["low_freq_factor"] = c.rope_scaling.low_freq_factor;
      r["high_freq_factor"] = c.rope_scaling.high_freq_factor;
      r["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = r;
  }
  if (model_type == "mistral")
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["initializer_range"] = c.initializer_range;
  j["torch_dtype"] = "float32";
  return j;
}

nlohmann::json hf_config_json(const GPT2Config& c) {
  gpt2_parameter_count(c);  // validates
  json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.n_positions;
  j["n_ctx"] = c.n_positions;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_inner"] = c.n_inner > 0 ? json(c.n_inner) : json(nullptr);
  j["layer_norm_epsilon"] = c.layer_norm_epsilon;
  j["activation_function"] = c.activation_function;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["scale_attn_weights"] = c.scale_attn_weights;
  j["scale_attn_by_inverse_layer_idx"] = c.scale_attn_by_inverse_layer_idx;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["torch_dtype"] = "float32";
  return j;
}

LoadedModel load_hf_model(const std::string& dir, const HfLoadOptions& options) {
  return open_model(dir, /*load=*/true, options);
}

LoadedModel describe_hf_model(const std::string& dir) { return open_model(dir, /*load=*/false, {}); }

at::ScalarType hf_dtype_from_name(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  throw std::invalid_argument("dtype '" + name + "' is not one of float32, bfloat16, float16");
}

std::string hf_dtype_name(at::ScalarType dtype) {
  if (dtype == at::kFloat) return "float32";
  if (dtype == at::kBFloat16) return "bfloat16";
  if (dtype == at::kHalf) return "float16";
  throw std::invalid_argument(std::string("dtype ") + c10::toString(dtype) +
                              " is not float32, bfloat16 or float16");
}

void export_hf_model(const std::vector<NamedTensor>& tensors, const nlohmann::json& config,
                     const std::string& out_dir, at::ScalarType dtype, const std::string& tokenizer_source) {
  fs::path out = fs::path(out_dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "DIR/" names DIR
  auto fail = [&](const std::string& what) { throw std::runtime_error(out.string() + ": " + what); };
  std::string dtype_name;
  try {
    dtype_name = hf_dtype_name(dtype);
  } catch (const std::invalid_argument& e) {
    fail(std::string("cannot export: ") + e.what());
  }

  // The tensors must be exactly the architecture's parameters.
  const auto meta = make_architecture(config, at::TensorOptions().device(at::kMeta).dtype(at::kFloat),
                                      nullptr, "export config");
  std::map<std::string, const at::Tensor*> given;
  for (const NamedTensor& t : tensors)
    if (!given.emplace(t.name, &t.tensor).second) fail("tensor '" + t.name + "' is given twice");
  std::vector<std::pair<std::string, at::Tensor>> ordered;
  for (const NamedTensor& p : meta->parameters()) {
    const auto it = given.find(p.name);
    if (it == given.end()) fail("cannot export: tensor '" + p.name + "' is missing");
    if (it->second->sizes() != p.tensor.sizes())
      fail("cannot export: tensor '" + p.name + "' has shape " + shape_string(it->second->sizes()) +
           ", expected " + shape_string(p.tensor.sizes()));
    ordered.emplace_back(p.name, *it->second);
    given.erase(it);
  }
  if (!given.empty())
    fail("cannot export: tensor '" + given.begin()->first + "' is not a parameter of this config");

  // Tokenizer files to copy: (source, name in the output).
  std::vector<std::pair<fs::path, std::string>> copies;
  if (!tokenizer_source.empty()) {
    const fs::path src(tokenizer_source);
    std::error_code ec;
    fs::path src_dir = src;
    if (fs::is_regular_file(src, ec)) {
      src_dir = src.parent_path();
      copies.emplace_back(src, "tokenizer.json");
    } else if (!fs::is_directory(src, ec)) {
      fail("tokenizer source '" + tokenizer_source + "' is neither a file nor a directory");
    }
    for (const char* name :
         {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
          "tokenizer.model", "added_tokens.json", "generation_config.json"}) {
      const fs::path p = src_dir / name;
      const bool taken =
          std::any_of(copies.begin(), copies.end(), [&](const auto& c) { return c.second == name; });
      if (!taken && fs::is_regular_file(p, ec)) copies.emplace_back(p, name);
    }
  }

  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)))
    fail("already exists and is not an empty directory; choose another --out or remove it");
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  if (ec) fail("cannot create the parent directory: " + ec.message());
  const fs::path tmp = parent / ("." + out.filename().string() + ".tmp-" + std::to_string(::getpid()));
  zenflow::remove_tree(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) fail("cannot create " + tmp.string() + ": " + ec.message());
  try {
    json cfg = config;
    cfg["torch_dtype"] = dtype_name;
    if (cfg.contains("dtype")) cfg["dtype"] = dtype_name;  // transformers 5's name for it
    write_text_file(tmp / "config.json", cfg.dump(2) + "\n");

    for (auto& [name, t] : ordered) t = t.detach().to(at::kCPU, dtype);
    write_safetensors((tmp / "model.safetensors").string(), ordered, {{"format", "pt"}});
    ordered.clear();

    for (const auto& [src, name] : copies) {
      fs::copy_file(src, tmp / name, fs::copy_options::overwrite_existing, ec);
      if (ec) throw std::runtime_error("cannot copy " + src.string() + ": " + ec.message());
      fsync_path(tmp / name, false);
    }
    fsync_path(tmp, true);
    if (fs::exists(out, ec)) fs::remove(out, ec);  // the empty directory
    fs::rename(tmp, out, ec);
    if (ec) throw std::runtime_error("cannot rename " + tmp.string() + ": " + ec.message());
    fsync_path(parent, true);
  } catch (const std::exception& e) {
    zenflow::remove_tree(tmp, ec);
    const std::string what = e.what();
    if (what.rfind(out.string(), 0) == 0) throw;
    fail(what);
  }
}

void export_hf_model(CausalLM& model, const nlohmann::json& config, const std::string& out_dir,
                     at::ScalarType dtype, const std::string& tokenizer_source) {
  export_hf_model(model.parameters(), config, out_dir, dtype, tokenizer_source);
}

}  // namespace zenflow::model
