// Hugging Face model directories: Llama / Qwen2 / Mistral / GPT-2 checkpoints generated here
// load and match an independent PyTorch transcription of the HF forward equations; sharded
// and bf16 loading; malformed inputs; export round trips; the job-spec model factory.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/bounded_call.h"
#include "tests/support/shell.h"
#include "common/job_spec.h"
#include "common/remove_tree.h"
#include "worker/rank/checkpoint.h"
#include "worker/model/gpt2.h"
#include "worker/model/hf_model.h"
#include "worker/model/llama.h"
#include "worker/model/safetensors.h"
#include "worker/rank/model_factory.h"
#include "worker/rank/run_export.h"

namespace fs = std::filesystem;
namespace zm = zenflow::model;
using json = nlohmann::json;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

namespace {

const std::string kPython = "/usr/bin/python3";

fs::path scratch_dir(const std::string& name) {
  const fs::path dir = fs::path(ZENFLOW_BINARY_DIR) / "test-tmp" / "test_hf_model" / name;
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

using zenflow::test_support::run;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void write_raw(const fs::path& file, const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous();
  std::ofstream out(file, std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

at::Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(V, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
}

// Random weights with the names and shapes of the architecture `config` describes:
// normal(0, 0.1) matrices and biases, norm / LayerNorm weights around 1 (so every
// parameter shapes the logits).
Named random_weights(const json& config, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  Named out;
  for (const auto& p :
       zm::make_hf_architecture(config, at::TensorOptions().device(at::kMeta))->parameters()) {
    at::Tensor t = at::empty(p.tensor.sizes(), at::kFloat);
    const bool norm = p.name.find("norm") != std::string::npos || p.name.find("ln_") != std::string::npos;
    if (norm && p.name.find(".weight") != std::string::npos) {
      t.uniform_(0.5, 1.5, gen);
    } else {
      t.normal_(0.0, 0.1, gen);
    }
    out.emplace_back(p.name, t);
  }
  return out;
}

// A model directory: config.json and model.safetensors (or `shards` shards + index).
fs::path write_model_dir(const fs::path& dir, const json& config, const Named& tensors,
                         at::ScalarType dtype = at::kFloat, int shards = 1) {
  fs::create_directories(dir);
  write_text(dir / "config.json", config.dump(2));
  Named cast;
  for (const auto& [name, t] : tensors) cast.emplace_back(name, t.is_floating_point() ? t.to(dtype) : t);
  if (shards == 1) {
    zm::write_safetensors((dir / "model.safetensors").string(), cast, {{"format", "pt"}});
    return dir;
  }
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  const size_t per = (cast.size() + shards - 1) / static_cast<size_t>(shards);
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    Named part(cast.begin() + static_cast<long>(std::min(cast.size(), s * per)),
               cast.begin() + static_cast<long>(std::min(cast.size(), (s + 1) * per)));
    zm::write_safetensors((dir / name).string(), part);
    for (const auto& [n, t] : part) index["weight_map"][n] = name;
  }
  write_text(dir / "model.safetensors.index.json", index.dump(2));
  return dir;
}

json llama_gqa_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 96},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 500000.0},
          {"rope_scaling", nullptr},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false},
          {"torch_dtype", "float32"}};
}

json qwen2_config() {
  return {{"architectures", {"Qwen2ForCausalLM"}},
          {"model_type", "qwen2"},
          {"vocab_size", 80},
          {"hidden_size", 32},
          {"intermediate_size", 40},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 128},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"use_sliding_window", false},
          {"sliding_window", 4096},
          {"max_window_layers", 2},
          {"tie_word_embeddings", true},
          {"hidden_act", "silu"}};
}

// Llama 3.1-style rope scaling, an explicit head_dim (q_proj wider than hidden_size) and
// Llama's attention_bias / mlp_bias.
json llama3_config() {
  json c = llama_gqa_config();
  c["head_dim"] = 16;
  c["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  c["attention_bias"] = true;
  c["mlp_bias"] = true;
  c["tie_word_embeddings"] = true;
  return c;
}

// Mistral identified by architectures only; a sliding window shorter than the sequence
// and linear rope scaling.
json mistral_config() {
  return {{"architectures", {"MistralForCausalLM"}},
          {"vocab_size", 72},
          {"hidden_size", 32},
          {"intermediate_size", 64},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 1},
          {"max_position_embeddings", 256},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}},
          {"sliding_window", 5},
          {"hidden_act", "silu"}};
}

json gpt2_config() {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", 90},
          {"n_positions", 48},
          {"n_embd", 32},
          {"n_layer", 2},
          {"n_head", 4},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5}};
}

// Untied output head, per-layer attention scaling, an explicit n_inner.
json gpt2_variant_config() {
  json c = gpt2_config();
  c["tie_word_embeddings"] = false;
  c["scale_attn_by_inverse_layer_idx"] = true;
  c["n_inner"] = 40;
  return c;
}

at::Tensor logits_of(zm::CausalLM& m, const at::Tensor& ids) {
  c10::NoGradGuard no_grad;
  return m.forward(ids);
}

at::Tensor param(zm::CausalLM& m, const std::string& name) {
  for (auto& p : m.parameters())
    if (p.name == name) return p.tensor;
  throw std::runtime_error("no parameter " + name);
}

// The error load_hf_model throws for `dir` ("" when none).
std::string load_error(const fs::path& dir) {
  try {
    zm::load_hf_model(dir.string());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------
// The reference: HF's modeling_llama.py / modeling_mistral.py / modeling_qwen2.py /
// modeling_gpt2.py forward equations (eager attention) and rope init functions, reading
// config.json and the safetensors bytes by hand.

const char* kReferenceScript = R"PY(
import json, math, os, struct, sys
import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}

def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = bytearray(data[8 + n + b: 8 + n + end])
        t = torch.frombuffer(raw, dtype=DTYPES[e["dtype"]]) if raw else torch.zeros(0)
        out[name] = t.reshape(e["shape"]).to(torch.float32)
    return out

def read_weights(d):
    if os.path.exists(d + "/model.safetensors"):
        return read_safetensors(d + "/model.safetensors")
    index = json.load(open(d + "/model.safetensors.index.json"))
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(read_safetensors(d + "/" + shard))
    return out

# ---- Llama family ----
def default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

def llama3_inv_freq(inv_freq, rs):   # _compute_llama3_parameters
    factor = rs["factor"]
    low_freq_factor = rs["low_freq_factor"]
    high_freq_factor = rs["high_freq_factor"]
    old_context_len = rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)

def rms_norm(x, w, eps):
    dt = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return w * x.to(dt)

def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)

def repeat_kv(h, n_rep):
    b, kv, s, d = h.shape
    if n_rep == 1:
        return h
    return h[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)

def linear(x, W, name):
    return F.linear(x, W[name + ".weight"], W.get(name + ".bias"))

def llama_forward(cfg, W, ids):
    mt = cfg.get("model_type") or {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                                   "Qwen2ForCausalLM": "qwen2"}[cfg["architectures"][0]]
    B, T = ids.shape
    H, nH = cfg["hidden_size"], cfg["num_attention_heads"]
    nKV = cfg.get("num_key_value_heads") or nH
    hd = cfg.get("head_dim") or H // nH
    eps = cfg["rms_norm_eps"]
    inv_freq = default_inv_freq(cfg.get("rope_theta", 10000.0), hd)
    rs = cfg.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "llama3":
            inv_freq = llama3_inv_freq(inv_freq, rs)
        elif kind == "linear":
            inv_freq = inv_freq / rs["factor"]
    position_ids = torch.arange(T)[None, :]
    freqs = (inv_freq[None, :, None].float() @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    window = cfg.get("sliding_window") if mt == "mistral" else None
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    allowed = j <= i
    if window:
        allowed = allowed & (j > i - window)   # sliding_window_overlay
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    x = F.embedding(ids, W["model.embed_tokens.weight"])
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        r = x
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = linear(h, W, p + "self_attn.q_proj").view(B, T, -1, hd).transpose(1, 2)
        k = linear(h, W, p + "self_attn.k_proj").view(B, T, -1, hd).transpose(1, 2)
        v = linear(h, W, p + "self_attn.v_proj").view(B, T, -1, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, nH // nKV), repeat_kv(v, nH // nKV)
        a = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
        a = F.softmax(a, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(a, v).transpose(1, 2).reshape(B, T, -1)
        x = r + linear(o, W, p + "self_attn.o_proj")
        r = x
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        x = r + linear(F.silu(linear(h, W, p + "mlp.gate_proj")) * linear(h, W, p + "mlp.up_proj"), W, p + "mlp.down_proj")
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return F.linear(x, head)

# ---- GPT-2 ----
def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

def conv1d(x, W, name):
    size_out = x.size()[:-1] + (W[name + ".weight"].size(-1),)
    x = torch.addmm(W[name + ".bias"], x.view(-1, x.size(-1)), W[name + ".weight"])
    return x.view(size_out)

def layer_norm(x, W, name, eps):
    return F.layer_norm(x, (x.size(-1),), W[name + ".weight"], W[name + ".bias"], eps)

def gpt2_forward(cfg, W, ids):
    W = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in W.items()}
    B, T = ids.shape
    E, nH = cfg["n_embd"], cfg["n_head"]
    hd = E // nH
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    x = F.embedding(ids, W["wte.weight"]) + F.embedding(torch.arange(T)[None, :], W["wpe.weight"])
    causal = torch.tril(torch.ones((T, T), dtype=torch.bool))
    for l in range(cfg["n_layer"]):
        p = "h.%d." % l
        r = x
        h = layer_norm(x, W, p + "ln_1", eps)
        q, k, v = conv1d(h, W, p + "attn.c_attn").split(E, dim=2)
        q, k, v = [t.view(B, T, nH, hd).permute(0, 2, 1, 3) for t in (q, k, v)]
        a = torch.matmul(q, k.transpose(-1, -2))
        if cfg.get("scale_attn_weights", True):
            a = a / torch.full([], v.size(-1) ** 0.5, dtype=a.dtype)
        if cfg.get("scale_attn_by_inverse_layer_idx", False):
            a = a / float(l + 1)
        a = torch.where(causal, a, torch.finfo(a.dtype).min)
        a = F.softmax(a, dim=-1)
        o = torch.matmul(a, v).permute(0, 2, 1, 3).contiguous().view(B, T, E)
        x = r + conv1d(o, W, p + "attn.c_proj")
        r = x
        h = layer_norm(x, W, p + "ln_2", eps)
        x = r + conv1d(gelu_new(conv1d(h, W, p + "mlp.c_fc")), W, p + "mlp.c_proj")
    x = layer_norm(x, W, "ln_f", eps)
    head = W["wte.weight"] if cfg.get("tie_word_embeddings", True) else W["lm_head.weight"]
    return F.linear(x, head)

for case in sys.argv[1:]:
    model_dir, B, T = open(case + "/case.txt").read().split()
    B, T = int(B), int(T)
    cfg = json.load(open(model_dir + "/config.json"))
    W = read_weights(model_dir)
    ids = torch.from_numpy(np.fromfile(case + "/ids.bin", dtype=np.int64)).view(B, T)
    got = torch.from_numpy(np.fromfile(case + "/logits.bin", dtype=np.float32))
    with torch.no_grad():
        gpt2 = cfg.get("model_type") == "gpt2" or cfg.get("architectures", [""])[0] == "GPT2LMHeadModel"
        want = gpt2_forward(cfg, W, ids) if gpt2 else llama_forward(cfg, W, ids)
    got = got.view(want.shape)
    print("case=%s max_abs_diff=%.9g scale=%.6g" % (os.path.basename(case), (got - want).abs().max().item(),
                                                     want.abs().max().item()))
)PY";

// Loads `model_dir` in fp32, runs it on fixed ids and leaves ids + logits in `case_dir`
// for the reference script.
void prepare_case(const fs::path& case_dir, const fs::path& model_dir, uint64_t seed) {
  fs::create_directories(case_dir);
  zm::HfLoadOptions fp32;
  fp32.dtype = at::kFloat;
  zm::LoadedModel loaded = zm::load_hf_model(model_dir.string(), fp32);
  const int64_t B = 2, T = 24;
  const at::Tensor ids = random_ids(B, T, loaded.model->vocab_size(), seed);
  write_raw(case_dir / "ids.bin", ids);
  write_raw(case_dir / "logits.bin", logits_of(*loaded.model, ids));
  write_text(case_dir / "case.txt", model_dir.string() + " " + std::to_string(B) + " " + std::to_string(T));
}

}  // namespace

TEST(HfModel, LogitsMatchHuggingFaceEquationsInPythonForEveryArchitecture) {
  std::string out;
  if (run(kPython + " -c 'import torch, numpy' 2>&1", &out) != 0)
    GTEST_SKIP() << kPython << " with torch and numpy is not available (scripts/install-deps.sh installs it)";
  const fs::path dir = scratch_dir("reference");
  struct Case {
    std::string name;
    json config;
    at::ScalarType dtype = at::kFloat;
  };
  const std::vector<Case> cases = {{"llama_gqa", llama_gqa_config()},
                                   {"qwen2_bias_tied", qwen2_config()},
                                   {"llama3_rope_head_dim_bias", llama3_config()},
                                   {"mistral_window_linear_rope", mistral_config()},
                                   {"gpt2", gpt2_config()},
                                   {"gpt2_untied_inverse_layer_scale", gpt2_variant_config()},
                                   {"llama_gqa_bf16", llama_gqa_config(), at::kBFloat16},
                                   {"qwen2_f16", qwen2_config(), at::kHalf}};
  std::string args;
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const fs::path model_dir =
        write_model_dir(dir / ("model_" + c.name), c.config, random_weights(c.config, ++seed), c.dtype);
    prepare_case(dir / c.name, model_dir, seed);
    args += " " + (dir / c.name).string();
  }
  write_text(dir / "reference.py", kReferenceScript);
  ASSERT_EQ(run(kPython + " " + (dir / "reference.py").string() + args + " 2>&1", &out), 0) << out;
  std::cout << out;
  std::set<std::string> seen;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("case=", 0) != 0) continue;
    const std::string name = line.substr(5, line.find(' ') - 5);
    const double diff = std::stod(line.substr(line.find("max_abs_diff=") + 13));
    const double scale = std::stod(line.substr(line.find("scale=") + 6));
    EXPECT_LE(diff, 1e-4) << line;
    EXPECT_GT(scale, 0.5) << "logits too small for a meaningful check: " << line;
    seen.insert(name);
  }
  EXPECT_EQ(seen.size(), cases.size()) << out;
}

TEST(HfModel, Llama3RopeScalingKeepsHighDividesLowAndBlendsMediumFrequencies) {
  zm::LlamaConfig c = zm::llama_config_from_hf(llama3_config());
  zm::LlamaConfig plain = c;
  plain.rope_scaling = zm::RopeScaling{};
  const at::Tensor scaled = zm::llama_inv_freq(c), base = zm::llama_inv_freq(plain);
  ASSERT_EQ(scaled.numel(), 8);
  // head_dim 16, theta 5e5: wavelengths 2*pi*theta^(i/8) = 6.3, 32.5, 169, 873 (< 8192/4:
  // kept), 4525 (between 2048 and 8192: blended), 23k, 121k, 627k (> 8192: divided by 8).
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(scaled[i].item<float>(), base[i].item<float>()) << i;
  for (int64_t i = 5; i < 8; ++i) EXPECT_FLOAT_EQ(scaled[i].item<float>(), base[i].item<float>() / 8) << i;
  const double wavelen = 2 * M_PI / base[4].item<double>();
  const double smooth = (8192 / wavelen - 1) / (4 - 1);
  EXPECT_NEAR(scaled[4].item<double>(),
              (1 - smooth) * base[4].item<double>() / 8 + smooth * base[4].item<double>(), 1e-9);
  EXPECT_GT(smooth, 0.2);
  EXPECT_LT(smooth, 0.8);
}

TEST(HfModel, ConfigsMapToArchitecturesWithHuggingFaceDefaults) {
  const zm::LlamaConfig q = zm::llama_config_from_hf(qwen2_config());
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.o_bias);
  EXPECT_TRUE(q.tie_word_embeddings);
  EXPECT_EQ(q.rope_theta, 1e6);
  const zm::LlamaConfig m = zm::llama_config_from_hf(mistral_config());
  EXPECT_EQ(m.sliding_window, 5);
  EXPECT_EQ(m.rope_scaling.rope_type, "linear");
  EXPECT_EQ(m.num_key_value_heads, 1);
  json minimal = {{"model_type", "mistral"}, {"vocab_size", 10},       {"hidden_size", 8},
                  {"intermediate_size", 16}, {"num_hidden_layers", 1}, {"num_attention_heads", 2}};
  const zm::LlamaConfig d = zm::llama_config_from_hf(minimal);
  EXPECT_EQ(d.num_key_value_heads, 2);
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.max_position_embeddings, 131072);
  EXPECT_EQ(d.rms_norm_eps, 1e-6);
  EXPECT_FALSE(d.tie_word_embeddings);
  // transformers 5 writes rope_parameters instead of rope_theta / rope_scaling.
  json v5 = llama_gqa_config();
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 123.0}};
  EXPECT_EQ(zm::llama_config_from_hf(v5).rope_theta, 123.0);

  const zm::GPT2Config g = zm::gpt2_config_from_hf(gpt2_config());
  EXPECT_EQ(g.inner_size(), 128);
  EXPECT_TRUE(g.tie_word_embeddings);
  // GPT-2 small: the published 124,439,808 parameters.
  EXPECT_EQ(zm::gpt2_parameter_count(zm::GPT2Config{}), 124439808);

  json act = llama_gqa_config();
  act["hidden_act"] = "gelu";
  EXPECT_THROW(zm::llama_config_from_hf(act), std::runtime_error);
  json rope = llama_gqa_config();
  rope["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_THROW(zm::llama_config_from_hf(rope), std::runtime_error);
  json sliding = qwen2_config();
  sliding["use_sliding_window"] = true;
  EXPECT_THROW(zm::llama_config_from_hf(sliding), std::runtime_error);
}

TEST(HfModel, ShardedCheckpointLoadsTheSameWeightsAsASingleFile) {
  const fs::path dir = scratch_dir("sharded");
  const json config = llama_gqa_config();
  const Named w = random_weights(config, 7);
  write_model_dir(dir / "single", config, w);
  write_model_dir(dir / "sharded", config, w, at::kFloat, 3);
  ASSERT_TRUE(fs::exists(dir / "sharded" / "model-00003-of-00003.safetensors"));
  ASSERT_FALSE(fs::exists(dir / "sharded" / "model.safetensors"));
  zm::LoadedModel a = zm::load_hf_model((dir / "single").string());
  zm::LoadedModel b = zm::load_hf_model((dir / "sharded").string());
  const auto pa = a.model->parameters(), pb = b.model->parameters();
  ASSERT_EQ(pa.size(), w.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].name, w[i].first);
    EXPECT_TRUE(at::equal(pa[i].tensor, w[i].second)) << pa[i].name;
    EXPECT_TRUE(at::equal(pb[i].tensor, w[i].second)) << pb[i].name;
    EXPECT_TRUE(pb[i].tensor.requires_grad());
  }
  const at::Tensor ids = random_ids(2, 16, 96, 3);
  EXPECT_TRUE(at::equal(logits_of(*a.model, ids), logits_of(*b.model, ids)));
  EXPECT_EQ(a.arch, "llama");
  EXPECT_EQ(a.model_type, "llama");
  EXPECT_EQ(a.checkpoint_dtype, at::kFloat);
}

TEST(HfModel, Bfloat16CheckpointLoadsInItsDtypeOrConvertedExactly) {
  const fs::path dir = scratch_dir("bf16");
  const json config = qwen2_config();
  const Named w = random_weights(config, 9);
  write_model_dir(dir, config, w, at::kBFloat16);
  zm::LoadedModel kept = zm::load_hf_model(dir.string());
  EXPECT_EQ(kept.checkpoint_dtype, at::kBFloat16);
  zm::HfLoadOptions fp32;
  fp32.dtype = at::kFloat;
  zm::LoadedModel widened = zm::load_hf_model(dir.string(), fp32);
  const auto pk = kept.model->parameters(), pw = widened.model->parameters();
  for (size_t i = 0; i < pk.size(); ++i) {
    EXPECT_EQ(pk[i].tensor.scalar_type(), at::kBFloat16);
    EXPECT_EQ(pw[i].tensor.scalar_type(), at::kFloat);
    const at::Tensor want = w[i].second.to(at::kBFloat16);
    EXPECT_TRUE(at::equal(pk[i].tensor, want)) << pk[i].name;
    EXPECT_TRUE(at::equal(pw[i].tensor, want.to(at::kFloat))) << pw[i].name;
  }
  const at::Tensor ids = random_ids(1, 12, 80, 4);
  const at::Tensor low = logits_of(*kept.model, ids), high = logits_of(*widened.model, ids);
  EXPECT_EQ(low.scalar_type(), at::kBFloat16);
  EXPECT_LT((low.to(at::kFloat) - high).abs().max().item<float>(), 0.1f);
}

TEST(HfModel, Gpt2CheckpointWithoutPrefixAndWithMaskBuffersLoads) {
  // The original gpt2 checkpoints: GPT2Model names ("h.0.attn.c_attn.weight") and the
  // attn.bias / masked_bias buffers; same weights as the transformer.-prefixed layout.
  const fs::path dir = scratch_dir("gpt2_names");
  const json config = gpt2_config();
  const Named w = random_weights(config, 11);
  Named bare;
  for (const auto& [name, t] : w) bare.emplace_back(name.substr(std::string("transformer.").size()), t);
  for (int l = 0; l < 2; ++l) {
    bare.emplace_back("h." + std::to_string(l) + ".attn.bias", at::ones({1, 1, 48, 48}).tril());
    bare.emplace_back("h." + std::to_string(l) + ".attn.masked_bias", at::full({}, -1e4));
  }
  write_model_dir(dir / "bare", config, bare);
  write_model_dir(dir / "prefixed", config, w);
  zm::LoadedModel a = zm::load_hf_model((dir / "bare").string());
  zm::LoadedModel b = zm::load_hf_model((dir / "prefixed").string());
  EXPECT_EQ(a.arch, "gpt2");
  EXPECT_EQ(a.model->parameters().front().name, "transformer.wte.weight");
  const at::Tensor ids = random_ids(2, 20, 90, 5);
  EXPECT_TRUE(at::equal(logits_of(*a.model, ids), logits_of(*b.model, ids)));
}

TEST(HfModel, MalformedDirectoriesGiveErrorsNamingTheProblem) {
  const fs::path root = scratch_dir("malformed");
  const json config = llama_gqa_config();
  const Named w = random_weights(config, 13);
  auto variant = [&](const std::string& name, const std::function<void(json&, Named&)>& edit) {
    json c = config;
    Named t = w;
    edit(c, t);
    return write_model_dir(root / name, c, t);
  };

  std::string e = load_error(variant("missing", [](json&, Named& t) {
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](auto& p) { return p.first == "model.layers.1.mlp.up_proj.weight"; }),
            t.end());
  }));
  EXPECT_NE(
      e.find("model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' (shape [48, 32]) is missing"),
      std::string::npos)
      << e;

  e = load_error(variant("shape", [](json&, Named& t) {
    for (auto& [n, x] : t)
      if (n == "model.layers.0.self_attn.k_proj.weight") x = at::zeros({32, 32});
  }));
  EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 32], expected [16, 32]"),
            std::string::npos)
      << e;

  e = load_error(variant("vocab", [](json& c, Named&) { c["vocab_size"] = 100; }));
  EXPECT_NE(e.find("tensor 'model.embed_tokens.weight' has shape [96, 32], expected [100, 32]"),
            std::string::npos)
      << e;

  e = load_error(variant(
      "extra", [](json&, Named& t) { t.emplace_back("model.layers.0.adapter.weight", at::zeros({2})); }));
  EXPECT_NE(e.find("unexpected tensor 'model.layers.0.adapter.weight'"), std::string::npos) << e;

  e = load_error(variant("int_dtype", [](json&, Named& t) {
    for (auto& [n, x] : t)
      if (n == "model.norm.weight") x = at::ones({32}, at::kInt);
  }));
  EXPECT_NE(e.find("tensor 'model.norm.weight' has dtype I32"), std::string::npos) << e;

  // Buffers older transformers saved are accepted.
  EXPECT_EQ(load_error(variant("inv_freq",
                               [](json&, Named& t) {
                                 t.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq",
                                                at::ones({4}));
                               })),
            "");

  const fs::path bad_json = variant("bad_json", [](json&, Named&) {});
  write_text(bad_json / "config.json", "{\"model_type\": \"llama\", \"hidden_size\": ");
  e = load_error(bad_json);
  EXPECT_NE(e.find("config.json: not valid JSON"), std::string::npos) << e;

  e = load_error(variant("unknown_type", [](json& c, Named&) { c["model_type"] = "falcon"; }));
  EXPECT_NE(e.find("model_type 'falcon' is not supported (supported: llama, mistral, qwen2, gpt2)"),
            std::string::npos)
      << e;

  e = load_error(variant("no_heads", [](json& c, Named&) { c.erase("num_attention_heads"); }));
  EXPECT_NE(e.find("required key 'num_attention_heads' is missing"), std::string::npos) << e;

  e = load_error(variant("string_size", [](json& c, Named&) { c["hidden_size"] = "32"; }));
  EXPECT_NE(e.find("key 'hidden_size' must be an integer, got \"32\""), std::string::npos) << e;

  const fs::path truncated = variant("truncated", [](json&, Named&) {});
  const fs::path file = truncated / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  e = load_error(truncated);
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  const fs::path no_weights = variant("no_weights", [](json&, Named&) {});
  fs::remove(no_weights / "model.safetensors");
  e = load_error(no_weights);
  EXPECT_NE(e.find("no model.safetensors or model.safetensors.index.json"), std::string::npos) << e;

  e = load_error(root / "does_not_exist");
  EXPECT_EQ(e, (root / "does_not_exist" / "config.json").string() + ": no such file or directory (is '" +
                   (root / "does_not_exist").string() + "' a model directory?)");
}

// A FIFO or a directory as config.json or model.safetensors, and a config.json over its
// limit: refused at once naming the file (a FIFO used to block forever, a directory gave
// "basic_filebuf::underflow"); each call is bounded so a regression fails, not hangs.
TEST(HfModel, HostileFilesInAModelDirectoryAreRefusedPromptly) {
  using zenflow::test_support::call_within;
  using zenflow::test_support::make_fifo;
  const fs::path root = scratch_dir("hostile");
  const json config = llama_gqa_config();
  const Named w = random_weights(config, 17);
  const auto expect_refused = [](const fs::path& dir, const fs::path& named, const std::string& problem) {
    for (bool load : {false, true}) {
      const auto o = call_within([dir = dir.string(), load] {
        if (load) {
          zm::load_hf_model(dir);
        } else {
          zm::describe_hf_model(dir);
        }
      });
      ASSERT_TRUE(o.returned) << o.message;
      EXPECT_TRUE(o.input_error) << o.message;
      EXPECT_EQ(o.message, named.string() + ": " + problem);
    }
  };

  const fs::path fifo_config = write_model_dir(root / "fifo_config", config, w);
  fs::remove(fifo_config / "config.json");
  ASSERT_EQ(make_fifo(fifo_config / "config.json"), "");
  expect_refused(fifo_config, fifo_config / "config.json", "is a FIFO, expected a regular file");

  const fs::path dir_config = write_model_dir(root / "dir_config", config, w);
  fs::remove(dir_config / "config.json");
  fs::create_directory(dir_config / "config.json");
  expect_refused(dir_config, dir_config / "config.json", "is a directory, expected a regular file");

  const fs::path big_config = write_model_dir(root / "big_config", config, w);
  fs::resize_file(big_config / "config.json", zenflow::kMaxConfigBytes * 2);  // sparse tail
  expect_refused(big_config, big_config / "config.json",
                 "is 8 MiB, larger than the 4 MiB limit for a config.json");

  const fs::path fifo_weights = write_model_dir(root / "fifo_weights", config, w);
  fs::remove(fifo_weights / "model.safetensors");
  ASSERT_EQ(make_fifo(fifo_weights / "model.safetensors"), "");
  expect_refused(fifo_weights, fifo_weights / "model.safetensors", "is a FIFO, expected a regular file");

  // A sharded checkpoint whose index reaches outside the directory.
  const fs::path sharded = write_model_dir(root / "escaping_index", config, w, at::kFloat, 2);
  json index = json::parse(read_text(sharded / "model.safetensors.index.json"));
  const std::string first = index["weight_map"].begin().key();
  index["weight_map"][first] = "../outside.safetensors";
  write_text(sharded / "model.safetensors.index.json", index.dump());
  const std::string e = load_error(sharded);
  EXPECT_EQ(e, (sharded / "model.safetensors.index.json").string() + ": weight_map[\"" + first +
                   "\"] = \"../outside.safetensors\" has a '..' component; a shard must be a file inside the "
                   "model directory");
}

TEST(HfModel, ExportAfterTrainingReloadsToIdenticalLogitsAndCopiesTokenizerFiles) {
  const fs::path dir = scratch_dir("export");
  for (const json& config : {llama_gqa_config(), gpt2_variant_config(), qwen2_config()}) {
    SCOPED_TRACE(config.dump());
    zenflow::remove_tree(dir);
    const fs::path src = write_model_dir(dir / "src", config, random_weights(config, 17));
    write_text(src / "tokenizer.json", "{\"model\": {\"type\": \"BPE\"}}");
    write_text(src / "tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    zm::LoadedModel loaded = zm::load_hf_model(src.string());
    const at::Tensor before = logits_of(*loaded.model, random_ids(1, 8, 80, 8));
    for (int step = 0; step < 3; ++step) {  // fine-tune: three SGD steps on fixed data
      const at::Tensor ids = random_ids(4, 12, 80, 40 + step);
      zm::causal_lm_loss(loaded.model->forward(ids), random_ids(4, 12, 80, 50 + step)).backward();
      c10::NoGradGuard no_grad;
      for (auto& p : loaded.model->parameters()) {
        p.tensor.sub_(0.5 * p.tensor.grad());
        p.tensor.grad().zero_();
      }
    }
    ASSERT_GT((logits_of(*loaded.model, random_ids(1, 8, 80, 8)) - before).abs().max().item<float>(), 1e-3f);
    zm::export_hf_model(*loaded.model, loaded.config, (dir / "out").string(), at::kFloat, src.string());
    EXPECT_EQ(read_text(dir / "out" / "tokenizer.json"), read_text(src / "tokenizer.json"));
    EXPECT_EQ(read_text(dir / "out" / "tokenizer_config.json"), read_text(src / "tokenizer_config.json"));
    EXPECT_FALSE(fs::exists(dir / "out" / "merges.txt"));
    zm::LoadedModel again = zm::load_hf_model((dir / "out").string());
    const at::Tensor ids = random_ids(2, 16, 80, 6);
    EXPECT_TRUE(at::equal(logits_of(*loaded.model, ids), logits_of(*again.model, ids)));
    EXPECT_EQ(again.config, [&] {
      json c = loaded.config;
      c["torch_dtype"] = "float32";
      return c;
    }());

    // bf16: every tensor is the rounded fine-tuned weight.
    zm::export_hf_model(*loaded.model, loaded.config, (dir / "out_bf16").string(), at::kBFloat16, "");
    zm::LoadedModel low = zm::load_hf_model((dir / "out_bf16").string());
    EXPECT_EQ(low.checkpoint_dtype, at::kBFloat16);
    EXPECT_EQ(low.config["torch_dtype"], "bfloat16");
    EXPECT_FALSE(fs::exists(dir / "out_bf16" / "tokenizer.json"));
    const auto pl = low.model->parameters(), pf = loaded.model->parameters();
    for (size_t i = 0; i < pl.size(); ++i)
      EXPECT_TRUE(at::equal(pl[i].tensor, pf[i].tensor.to(at::kBFloat16))) << pl[i].name;
  }
}

TEST(HfModel, ExportRefusesBadInputAndLeavesNothingBehind) {
  const fs::path dir = scratch_dir("export_errors");
  const json config = llama_gqa_config();
  zm::LoadedModel loaded =
      zm::load_hf_model(write_model_dir(dir / "src", config, random_weights(config, 19)).string());
  std::vector<zm::NamedTensor> params = loaded.model->parameters();

  fs::create_directories(dir / "busy");
  write_text(dir / "busy" / "keep.txt", "mine");
  try {
    zm::export_hf_model(params, config, (dir / "busy").string(), at::kFloat, "");
    ADD_FAILURE() << "exported into a non-empty directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not an empty directory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_text(dir / "busy" / "keep.txt"), "mine");

  std::vector<zm::NamedTensor> missing(params.begin(), params.end() - 1);
  try {
    zm::export_hf_model(missing, config, (dir / "out").string(), at::kFloat, "");
    ADD_FAILURE() << "exported without lm_head.weight";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'lm_head.weight' is missing"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(zm::export_hf_model(params, config, (dir / "out").string(), at::kDouble, ""),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(dir / "out"));
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();

  // An existing empty directory is filled.
  fs::create_directories(dir / "empty");
  zm::export_hf_model(params, config, (dir / "empty").string(), at::kFloat, "");
  EXPECT_TRUE(fs::exists(dir / "empty" / "model.safetensors"));
}

TEST(ModelFactory, RandomInitFromSpecBuildsTheArchAndAnExportableConfig) {
  zenflow::ModelSpec llama;
  llama.config = {{"hidden_size", 32},        {"num_hidden_layers", 2},  {"num_attention_heads", 4},
                  {"num_key_value_heads", 2}, {"intermediate_size", 48}, {"max_position_embeddings", 64}};
  zenflow::ModelSpec gpt2 = llama;
  gpt2.arch = "gpt2";
  gpt2.config.erase("num_key_value_heads");
  const fs::path dir = scratch_dir("factory");
  for (const auto* spec : {&llama, &gpt2}) {
    SCOPED_TRACE(spec->arch);
    zm::LoadedModel info;
    auto m = zenflow::make_model_from_spec(*spec, 300, 5, &info);
    EXPECT_EQ(m->vocab_size(), 300);
    EXPECT_EQ(info.arch, spec->arch);
    EXPECT_EQ(info.checkpoint_dtype, at::kFloat);
    EXPECT_TRUE(info.source_dir.empty());
    EXPECT_EQ(info.config["vocab_size"], 300);
    // Same seed, same weights.
    auto again = zenflow::make_model_from_spec(*spec, 300, 5, nullptr);
    const at::Tensor ids = random_ids(2, 10, 300, 1);
    EXPECT_TRUE(at::equal(logits_of(*m, ids), logits_of(*again, ids)));
    // The generated config.json describes exactly this model: export, load, same logits.
    const fs::path out = dir / spec->arch;
    zm::export_hf_model(*m, info.config, out.string(), at::kFloat, "");
    zm::LoadedModel loaded = zm::load_hf_model(out.string());
    EXPECT_TRUE(at::equal(logits_of(*m, ids), logits_of(*loaded.model, ids)));
    // describe_model_from_spec agrees without building anything.
    EXPECT_EQ(zenflow::describe_model_from_spec(*spec, 300).config, info.config);
  }
  auto g = zenflow::make_model_from_spec(gpt2, 300, 5, nullptr);
  EXPECT_EQ(g->parameters().size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(param(*g, "transformer.h.0.mlp.c_fc.weight").sizes(), (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(param(*g, "transformer.h.0.attn.c_attn.weight").sizes(), (std::vector<int64_t>{32, 96}));

  zenflow::ModelSpec small_vocab = llama;
  small_vocab.config["vocab_size"] = 100;
  EXPECT_THROW(zenflow::make_model_from_spec(small_vocab, 300, 1, nullptr), std::invalid_argument);
  zenflow::ModelSpec gqa_gpt2 = gpt2;
  gqa_gpt2.config["num_key_value_heads"] = 2;
  try {
    zenflow::make_model_from_spec(gqa_gpt2, 300, 1, nullptr);
    ADD_FAILURE() << "gpt2 accepted num_key_value_heads";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "model.config.num_key_value_heads: not a gpt2 setting");
  }
}

TEST(ModelFactory, ModelFromLoadsTheCheckpointAndRejectsConfigOverrides) {
  const fs::path dir = scratch_dir("factory_from");
  const json config = qwen2_config();
  const Named w = random_weights(config, 23);
  write_model_dir(dir, config, w, at::kBFloat16);
  zenflow::ModelSpec spec;
  spec.from = dir.string();
  zm::LoadedModel info;
  auto m = zenflow::make_model_from_spec(spec, 80, 1, &info, at::kCPU, at::kFloat);
  EXPECT_EQ(info.model_type, "qwen2");
  EXPECT_EQ(info.checkpoint_dtype, at::kBFloat16);
  EXPECT_EQ(info.source_dir, dir.string());
  EXPECT_FALSE(info.model);
  EXPECT_TRUE(
      at::equal(param(*m, "model.layers.1.self_attn.q_proj.bias"),
                w[std::find_if(w.begin(), w.end(),
                               [](auto& p) { return p.first == "model.layers.1.self_attn.q_proj.bias"; }) -
                  w.begin()]
                    .second.to(at::kBFloat16)
                    .to(at::kFloat)));
  EXPECT_EQ(zenflow::describe_model_from_spec(spec, 80).checkpoint_dtype, at::kBFloat16);
  try {
    zenflow::make_model_from_spec(spec, 81, 1, nullptr);
    ADD_FAILURE() << "a tokenizer larger than the model was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 80, smaller than the tokenizer's 81"), std::string::npos)
        << e.what();
  }
  spec.config["hidden_size"] = 64;
  EXPECT_THROW(zenflow::make_model_from_spec(spec, 80, 1, nullptr), std::invalid_argument);
}

namespace {

// A run directory as the trainer leaves it: checkpoints of `weights`, each with its run.yaml.
void write_run(const fs::path& run_dir, const std::string& job_yaml, const Named& weights, int64_t step) {
  fs::create_directories(run_dir);
  const zenflow::JobSpec spec = zenflow::parse_job_spec(job_yaml);
  Named earlier;
  for (const auto& [n, t] : weights) earlier.emplace_back(n, at::zeros_like(t));
  zenflow::CheckpointContents first;
  first.model = earlier;
  first.trainer = {{"loader_epoch", 0}, {"loader_index", 0}};
  first.run_yaml = zenflow::to_yaml(spec);
  first.identity = zenflow::job_identity(spec, 1);
  zenflow::write_checkpoint(run_dir.string(), step - 1, first, 3);
  zenflow::CheckpointContents last = first;
  last.model = weights;
  last.engine = {{"engine.m", at::ones({3})}};
  zenflow::write_checkpoint(run_dir.string(), step, last, 3);
}

}  // namespace

TEST(ExportRun, FineTunedCheckpointOfAPretrainedModelExportsInItsDtypeWithTokenizerFiles) {
  const fs::path dir = scratch_dir("export_run_from");
  json config = llama_gqa_config();
  config["vocab_size"] = 300;  // the byte tokenizer's 256 ids fit
  const fs::path src = write_model_dir(dir / "base", config, random_weights(config, 29), at::kBFloat16);
  write_text(src / "tokenizer.json", "{\"model\": {\"type\": \"BPE\"}}");
  write_text(src / "special_tokens_map.json", "{}");
  // The "fine-tuned" weights: fp32, as a CPU run keeps them.
  const Named tuned = random_weights(config, 31);
  write_run(dir / "run",
            "name: t\nmodel: {from: " + src.string() +
                "}\ndata: {train: /dev/null, tokenizer: byte}\n"
                "train: {seq_len: 16}\n",
            tuned, 8);
  std::vector<std::string> warnings;
  const zenflow::ExportSummary s = zenflow::export_run((dir / "run").string(), (dir / "out").string(), "auto",
                                                       [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(s.step, 8);
  EXPECT_EQ(s.dtype, "bfloat16");
  EXPECT_EQ(s.model_type, "llama");
  EXPECT_EQ(s.tensors, static_cast<int64_t>(tuned.size()));
  EXPECT_EQ(s.tokenizer_source, src.string());
  EXPECT_EQ(read_text(dir / "out" / "tokenizer.json"), read_text(src / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(dir / "out" / "special_tokens_map.json"));
  zm::LoadedModel out = zm::load_hf_model((dir / "out").string());
  EXPECT_EQ(out.checkpoint_dtype, at::kBFloat16);
  const auto p = out.model->parameters();
  ASSERT_EQ(p.size(), tuned.size());
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_TRUE(at::equal(p[i].tensor, tuned[i].second.to(at::kBFloat16))) << p[i].name;

  // --dtype float32 keeps the checkpoint's weights bit for bit.
  zenflow::export_run((dir / "run").string(), (dir / "out32").string(), "float32", nullptr);
  zm::LoadedModel out32 = zm::load_hf_model((dir / "out32").string());
  const auto p32 = out32.model->parameters();
  for (size_t i = 0; i < p32.size(); ++i)
    EXPECT_TRUE(at::equal(p32[i].tensor, tuned[i].second)) << p32[i].name;
}

TEST(ExportRun, RandomInitRunExportsFloat32AndBadInputIsReported) {
  const fs::path dir = scratch_dir("export_run_random");
  zenflow::ModelSpec m;
  m.arch = "gpt2";
  m.config = {{"hidden_size", 32},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"max_position_embeddings", 32}};
  auto model = zenflow::make_model_from_spec(m, 256, 3, nullptr);
  Named weights;
  for (const auto& p : model->parameters()) weights.emplace_back(p.name, p.tensor.detach());
  write_run(
      dir / "run",
      "name: r\nmodel: {arch: gpt2, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
      "max_position_embeddings: 32}}\ndata: {train: /dev/null}\ntrain: {seq_len: 16}\n",
      weights, 5);
  const zenflow::ExportSummary s =
      zenflow::export_run((dir / "run").string(), (dir / "out").string(), "auto", nullptr);
  EXPECT_EQ(s.dtype, "float32");
  EXPECT_EQ(s.model_type, "gpt2");
  EXPECT_TRUE(s.tokenizer_source.empty());
  zm::LoadedModel out = zm::load_hf_model((dir / "out").string());
  const at::Tensor ids = random_ids(2, 16, 256, 9);
  EXPECT_TRUE(at::equal(logits_of(*model, ids), logits_of(*out.model, ids)));

  auto input_error = [&](const fs::path& run, const std::string& dtype) {
    try {
      zenflow::export_run(run.string(), (dir / "never").string(), dtype, nullptr);
    } catch (const zenflow::ExportInputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(input_error(dir / "run", "float64").find("--dtype: dtype 'float64' is not one of"),
            std::string::npos);
  fs::create_directories(dir / "empty");
  EXPECT_NE(input_error(dir / "empty", "auto").find("holds no readable checkpoint"), std::string::npos);
  try {
    zenflow::export_run((dir / "run").string(), "", "auto", nullptr);
    ADD_FAILURE() << "an empty --out was accepted";
  } catch (const zenflow::ExportInputError& e) {
    EXPECT_EQ(std::string(e.what()), "--out: must not be empty");
  }
  // A checkpoint whose run.yaml is gone no longer verifies: export falls back to the
  // previous one and leaves the damaged one where it is.
  fs::remove(dir / "run" / "step-00000005" / "run.yaml");
  std::vector<std::string> warnings;
  const zenflow::ExportSummary prev = zenflow::export_run((dir / "run").string(), (dir / "out-prev").string(), "auto",
                                                          [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_EQ(prev.step, 4);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("run.yaml: no such file or directory"), std::string::npos) << warnings[0];
  EXPECT_TRUE(fs::exists(dir / "run" / "step-00000005"));
  EXPECT_NE(input_error(dir / "missing", "auto").find("not a directory"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "never"));
}
