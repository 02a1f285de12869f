// config.json parsing and validation of the model configs (see hf_config.h).
#include "common/model/hf_config.h"

#include <filesystem>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/input_file.h"
#include "common/json_error.h"

namespace zenflow::model {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

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

// Throws std::invalid_argument("<type>: <name> must be > 0, got <v>") for the first size <= 0.
void require_positive(const char* type, std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [name, v] : sizes)
    if (v <= 0)
      throw std::invalid_argument(std::string(type) + ": " + name + " must be > 0, got " + std::to_string(v));
}

}  // namespace

std::string hf_model_type(const json& c, const std::string& where) {
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

LlamaConfig llama_config_from_hf(const json& c, const std::string& where) {
  const std::string type = hf_model_type(c, where);
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
    check_llama_config(l);
  } catch (const std::invalid_argument& e) {
    config_fail(where, e.what());
  }
  return l;
}

GPT2Config gpt2_config_from_hf(const json& c, const std::string& where) {
  if (hf_model_type(c, where) != "gpt2") config_fail(where, "not a gpt2 config");
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
    check_gpt2_config(g);
  } catch (const std::invalid_argument& e) {
    config_fail(where, e.what());
  }
  return g;
}

void check_llama_config(const LlamaConfig& c) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("LlamaConfig: " + what); };
  require_positive("LlamaConfig", {{"vocab_size", c.vocab_size},
                                   {"hidden_size", c.hidden_size},
                                   {"num_hidden_layers", c.num_hidden_layers},
                                   {"num_attention_heads", c.num_attention_heads},
                                   {"num_key_value_heads", c.num_key_value_heads},
                                   {"intermediate_size", c.intermediate_size},
                                   {"max_position_embeddings", c.max_position_embeddings}});
  if (c.head_dim < 0)
    fail("head_dim must be >= 0 (0: hidden_size / num_attention_heads), got " + std::to_string(c.head_dim));
  if (c.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0)
    fail("hidden_size (" + std::to_string(c.hidden_size) + ") must be divisible by num_attention_heads (" +
         std::to_string(c.num_attention_heads) + ")");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail("num_attention_heads (" + std::to_string(c.num_attention_heads) +
         ") must be divisible by num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ")");
  if (c.resolved_head_dim() % 2 != 0)
    fail("the head dimension must be even for rotary embeddings, got " +
         std::to_string(c.resolved_head_dim()));
  if (!(c.rope_theta > 0)) fail("rope_theta must be > 0");
  if (!(c.rms_norm_eps > 0)) fail("rms_norm_eps must be > 0");
  if (!(c.initializer_range >= 0)) fail("initializer_range must be >= 0");
  if (c.sliding_window < 0) fail("sliding_window must be >= 0, got " + std::to_string(c.sliding_window));
  const RopeScaling& r = c.rope_scaling;
  if (r.rope_type != "default" && r.rope_type != "linear" && r.rope_type != "llama3")
    fail("rope_scaling.rope_type '" + r.rope_type + "' is not supported (default, linear, llama3)");
  if (r.rope_type != "default" && !(r.factor > 0)) fail("rope_scaling.factor must be > 0");
  if (r.rope_type == "llama3") {
    if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor))
      fail("rope_scaling needs 0 < low_freq_factor < high_freq_factor for llama3");
    if (r.original_max_position_embeddings <= 0)
      fail("rope_scaling.original_max_position_embeddings must be > 0");
  }
}

void check_gpt2_config(const GPT2Config& c) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("GPT2Config: " + what); };
  require_positive("GPT2Config", {{"vocab_size", c.vocab_size},
                                  {"n_positions", c.n_positions},
                                  {"n_embd", c.n_embd},
                                  {"n_layer", c.n_layer},
                                  {"n_head", c.n_head}});
  if (c.n_inner < 0) fail("n_inner must be >= 0 (0: 4 * n_embd), got " + std::to_string(c.n_inner));
  if (c.n_embd % c.n_head != 0)
    fail("n_embd (" + std::to_string(c.n_embd) + ") must be divisible by n_head (" +
         std::to_string(c.n_head) + ")");
  if (!(c.layer_norm_epsilon > 0)) fail("layer_norm_epsilon must be > 0");
  if (!(c.initializer_range >= 0)) fail("initializer_range must be >= 0");
  const std::string& a = c.activation_function;
  if (a != "gelu_new" && a != "gelu_pytorch_tanh" && a != "gelu" && a != "relu" && a != "silu" &&
      a != "swish")
    fail("activation_function '" + a +
         "' is not supported (gelu_new, gelu_pytorch_tanh, gelu, relu, silu, swish)");
}

nlohmann::json hf_config_json(const LlamaConfig& c, const std::string& model_type) {
  check_llama_config(c);
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
  check_gpt2_config(c);
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

json read_hf_config(const std::string& dir_name) {
  const fs::path dir(dir_name);
  const fs::path path = dir / "config.json";
  std::string text;
  try {
    text = read_regular_file(path.string(), kMaxConfigBytes, "a config.json");
  } catch (const InputError&) {
    std::error_code ec;
    // A missing config.json most often means the path is not a model directory at all.
    if (!fs::exists(fs::symlink_status(path, ec)))
      throw InputError(path.string(),
                       "no such file or directory (is '" + dir.string() + "' a model directory?)");
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

}  // namespace zenflow::model
