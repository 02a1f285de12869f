// The Llama decoder: shapes, causality, GQA, init, parameter layout, loss, training, and
// a logits check against Hugging Face's LlamaForCausalLM equations in Python.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "common/remove_tree.h"
#include "worker/model/causal_lm.h"
#include "worker/model/llama.h"

namespace fs = std::filesystem;
namespace zm = zenflow::model;

namespace {

zm::LlamaConfig tiny_config() {
  zm::LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 48;
  c.max_position_embeddings = 64;
  return c;
}

at::Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(V, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
}

at::Tensor param(zm::CausalLM& m, const std::string& name) {
  for (auto& p : m.parameters())
    if (p.name == name) return p.tensor;
  throw std::runtime_error("no parameter " + name);
}

// Copies every parameter of `from` into the same-named parameter of `to`.
void copy_parameters(zm::CausalLM& from, zm::CausalLM& to) {
  c10::NoGradGuard no_grad;
  for (auto& p : from.parameters()) param(to, p.name).copy_(p.tensor);
}

}  // namespace

TEST(Llama, ForwardGivesLogitsPerPositionAndVocabEntry) {
  auto model = zm::make_llama(tiny_config(), 1);
  const at::Tensor logits = model->forward(random_ids(3, 10, 64, 5));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10, 64}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
  EXPECT_EQ(model->vocab_size(), 64);
  EXPECT_THROW(model->forward(random_ids(1, 65, 64, 5)), std::invalid_argument);  // > max pos
  EXPECT_THROW(model->forward(at::zeros({4}, at::kLong)), std::invalid_argument);
}

TEST(Llama, ChangingATokenLeavesEarlierLogitsBitwiseUnchanged) {
  auto model = zm::make_llama(tiny_config(), 2);
  c10::NoGradGuard no_grad;
  const at::Tensor ids = random_ids(2, 16, 64, 7);
  const at::Tensor base = model->forward(ids);
  const int64_t t = 9;
  at::Tensor changed_ids = ids.clone();
  changed_ids.select(1, t).add_(1).remainder_(64);
  const at::Tensor changed = model->forward(changed_ids);
  EXPECT_TRUE(at::equal(base.narrow(1, 0, t), changed.narrow(1, 0, t)));
  for (int64_t pos = t; pos < 16; ++pos)
    EXPECT_GT((base.select(1, pos) - changed.select(1, pos)).abs().max().item<float>(), 1e-6f)
        << "position " << pos;
}

TEST(Llama, GroupedQueryAttentionEqualsMultiHeadWithRepeatedKeyValueHeads) {
  zm::LlamaConfig gqa = tiny_config();  // 4 query heads share 2 kv heads
  zm::LlamaConfig mha = gqa;
  mha.num_key_value_heads = 4;
  auto g = zm::make_llama(gqa, 3);
  auto m = zm::make_llama(mha, 4);
  const int64_t hd = 8, H = 32;
  ASSERT_EQ(param(*g, "model.layers.0.self_attn.k_proj.weight").sizes(),
            (std::vector<int64_t>{2 * hd, H}));
  ASSERT_EQ(param(*m, "model.layers.0.self_attn.k_proj.weight").sizes(),
            (std::vector<int64_t>{4 * hd, H}));
  {
    c10::NoGradGuard no_grad;
    for (auto& p : g->parameters()) {
      at::Tensor w = p.tensor;
      if (p.name.find("k_proj") != std::string::npos || p.name.find("v_proj") != std::string::npos)
        w = w.view({2, hd, H}).repeat_interleave(2, 0).reshape({4 * hd, H});  // head j -> j / 2
      param(*m, p.name).copy_(w);
    }
  }
  c10::NoGradGuard no_grad;
  const at::Tensor ids = random_ids(2, 12, 64, 8);
  const at::Tensor lg = g->forward(ids), lm = m->forward(ids);
  EXPECT_LT((lg - lm).abs().max().item<float>(), 1e-6f);
}

TEST(Llama, ParametersUseHuggingFaceNamesInStableOrder) {
  auto model = zm::make_llama(tiny_config(), 1);
  const auto params = model->parameters();
  ASSERT_EQ(params.size(), 21u);  // embed + 2 * 9 + norm + lm_head
  const std::vector<std::string> layer0 = {
      "model.layers.0.input_layernorm.weight",  "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight", "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",    "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight"};
  EXPECT_EQ(params[0].name, "model.embed_tokens.weight");
  for (size_t i = 0; i < layer0.size(); ++i) EXPECT_EQ(params[1 + i].name, layer0[i]);
  EXPECT_EQ(params[10].name, "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(params[19].name, "model.norm.weight");
  EXPECT_EQ(params[20].name, "lm_head.weight");
  const std::vector<std::vector<int64_t>> shapes = {{64, 32}, {32}, {32, 32}, {16, 32}, {16, 32},
                                                    {32, 32}, {32}, {48, 32}, {48, 32}, {32, 48}};
  for (size_t i = 0; i < shapes.size(); ++i)
    EXPECT_EQ(params[i].tensor.sizes(), shapes[i]) << params[i].name;
  EXPECT_EQ(params[20].tensor.sizes(), (std::vector<int64_t>{64, 32}));
  for (const auto& p : params) {
    EXPECT_TRUE(p.tensor.requires_grad()) << p.name;
    EXPECT_TRUE(p.tensor.is_leaf()) << p.name;
  }
}

TEST(Llama, ParameterCountMatchesParametersAndHandFigure) {
  // hd = 8; per layer: norms 2*32, q 32*32, k,v 2*16*32, o 32*32, mlp 3*48*32 = 7744.
  zm::LlamaConfig c = tiny_config();
  EXPECT_EQ(zm::llama_parameter_count(c), 64 * 32 + 2 * 7744 + 32 + 64 * 32);  // 19616
  c.tie_word_embeddings = true;
  EXPECT_EQ(zm::llama_parameter_count(c), 17568);
  for (bool tie : {false, true}) {
    c.tie_word_embeddings = tie;
    auto model = zm::make_llama(c, 1);
    int64_t sum = 0;
    for (const auto& p : model->parameters()) sum += p.tensor.numel();
    EXPECT_EQ(sum, zm::llama_parameter_count(c)) << "tie " << tie;
  }
  zm::LlamaConfig bad = tiny_config();
  bad.num_key_value_heads = 3;
  EXPECT_THROW(zm::llama_parameter_count(bad), std::invalid_argument);
  EXPECT_THROW(zm::make_llama(bad, 1), std::invalid_argument);
}

TEST(Llama, SameSeedSameWeightsDifferentSeedDifferentWeights) {
  auto a = zm::make_llama(tiny_config(), 11), b = zm::make_llama(tiny_config(), 11);
  auto c = zm::make_llama(tiny_config(), 12);
  const auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::equal(pa[i].tensor, pb[i].tensor)) << pa[i].name;
    if (pa[i].tensor.dim() == 2)
      EXPECT_FALSE(at::equal(pa[i].tensor, pc[i].tensor)) << pa[i].name;
    else
      EXPECT_TRUE(at::equal(pa[i].tensor, at::ones_like(pa[i].tensor))) << pa[i].name;
  }
  // Matrices are normal(0, initializer_range).
  zm::LlamaConfig big = tiny_config();
  big.vocab_size = 512;
  big.hidden_size = 64;
  const at::Tensor embed = param(*zm::make_llama(big, 5), "model.embed_tokens.weight");
  EXPECT_NEAR(embed.std().item<double>(), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(embed.mean().item<double>(), 0.0, 0.02 * 0.03);
}

TEST(Llama, TiedEmbeddingsServeAsTheOutputHead) {
  zm::LlamaConfig c = tiny_config();
  c.tie_word_embeddings = true;
  auto tied = zm::make_llama(c, 1);
  auto untied = zm::make_llama(tiny_config(), 1);
  EXPECT_EQ(tied->parameters().size(), 20u);
  EXPECT_EQ(tied->parameters().back().name, "model.norm.weight");

  // Inputs use tokens 0..3 only; the head still touches every embedding row when tied.
  const at::Tensor ids = random_ids(2, 8, 4, 3);
  const at::Tensor targets = random_ids(2, 8, 4, 4);
  for (auto* m : {tied.get(), untied.get()}) {
    zm::causal_lm_loss(m->forward(ids), targets).backward();
  }
  const at::Tensor g_tied = param(*tied, "model.embed_tokens.weight").grad();
  const at::Tensor g_untied = param(*untied, "model.embed_tokens.weight").grad();
  EXPECT_GT(g_tied[40].abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(g_untied[40].abs().sum().item<float>(), 0.0f);
  EXPECT_GT(g_untied[2].abs().sum().item<float>(), 0.0f);

  // With lm_head set to the embedding, the untied model computes the same logits.
  copy_parameters(*tied, *untied);
  {
    c10::NoGradGuard no_grad;
    param(*untied, "lm_head.weight").copy_(param(*tied, "model.embed_tokens.weight"));
  }
  c10::NoGradGuard no_grad;
  EXPECT_LT((tied->forward(ids) - untied->forward(ids)).abs().max().item<float>(), 1e-6f);
}

TEST(Llama, EveryParameterReceivesAGradient) {
  auto model = zm::make_llama(tiny_config(), 1);
  const at::Tensor ids = random_ids(2, 12, 64, 1);
  zm::causal_lm_loss(model->forward(ids), random_ids(2, 12, 64, 2)).backward();
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    EXPECT_GT(p.tensor.grad().abs().sum().item<float>(), 0.0f) << p.name;
  }
}

TEST(Llama, Bfloat16ForwardTracksFloat32) {
  auto model = zm::make_llama(tiny_config(), 1);
  const at::Tensor ids = random_ids(2, 12, 64, 1);
  const at::Tensor targets = random_ids(2, 12, 64, 2);
  c10::NoGradGuard no_grad;
  const at::Tensor ref = model->forward(ids);
  const double ref_loss = zm::causal_lm_loss(ref, targets).item<double>();
  model->to(at::kCPU, at::kBFloat16);
  for (const auto& p : model->parameters()) EXPECT_EQ(p.tensor.scalar_type(), at::kBFloat16);
  const at::Tensor low = model->forward(ids);
  EXPECT_EQ(low.scalar_type(), at::kBFloat16);
  EXPECT_LT((low.to(at::kFloat) - ref).abs().max().item<float>(), 0.02f);
  const at::Tensor low_loss = zm::causal_lm_loss(low, targets);
  EXPECT_EQ(low_loss.scalar_type(), at::kFloat);
  EXPECT_NEAR(low_loss.item<double>(), ref_loss, 0.01);
  model->to(at::kCPU, at::kFloat);
  for (const auto& p : model->parameters()) {
    EXPECT_EQ(p.tensor.scalar_type(), at::kFloat);
    EXPECT_TRUE(p.tensor.requires_grad());
  }
}

TEST(CausalLmLoss, UniformLogitsGiveLogVocab) {
  const at::Tensor logits = at::zeros({2, 5, 50});
  const at::Tensor targets = random_ids(2, 5, 50, 1);
  EXPECT_NEAR(zm::causal_lm_loss(logits, targets).item<double>(), std::log(50.0), 1e-6);
  EXPECT_NEAR(zm::causal_lm_loss(logits.to(at::kBFloat16), targets).item<double>(), std::log(50.0),
              1e-6);
}

TEST(CausalLmLoss, IgnoresMinus100Targets) {
  // Row 0: uniform over 4 -> ln 4. Row 1: ignored (it would cost ~50). Row 2: p(0) = 3/6.
  at::Tensor logits = at::zeros({1, 3, 4});
  logits[0][1][0] = 50.0;
  logits[0][2][0] = std::log(3.0);
  const at::Tensor ignored = at::tensor(std::vector<int64_t>{2, -100, 0}).view({1, 3});
  EXPECT_NEAR(zm::causal_lm_loss(logits, ignored).item<double>(),
              (std::log(4.0) + std::log(2.0)) / 2, 1e-6);
  const at::Tensor counted = at::tensor(std::vector<int64_t>{2, 3, 0}).view({1, 3});
  EXPECT_NEAR(zm::causal_lm_loss(logits, counted).item<double>(),
              (std::log(4.0) + 50.0 + std::log(2.0)) / 3, 1e-5);
}

TEST(Llama, TrainingOnRepetitiveTextReducesTheLoss) {
  zm::LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 128;
  c.max_position_embeddings = 64;
  auto model = zm::make_llama(c, 1);
  const std::string text = [] {
    std::string s;
    while (s.size() < 2000) s += "the quick brown fox jumps over the lazy dog. ";
    return s;
  }();
  const int64_t B = 8, T = 32;
  std::mt19937_64 rng(1);
  auto batch = [&](at::Tensor& in, at::Tensor& tg) {
    in = at::empty({B, T}, at::kLong);
    tg = at::empty({B, T}, at::kLong);
    auto a_in = in.accessor<int64_t, 2>();
    auto a_tg = tg.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      const size_t start = rng() % (text.size() - T - 1);
      for (int64_t t = 0; t < T; ++t) {
        a_in[b][t] = static_cast<unsigned char>(text[start + t]);
        a_tg[b][t] = static_cast<unsigned char>(text[start + t + 1]);
      }
    }
  };
  // Plain Adam (beta 0.9/0.999), written out.
  auto params = model->parameters();
  std::vector<at::Tensor> m, v;
  for (auto& p : params) {
    m.push_back(at::zeros_like(p.tensor));
    v.push_back(at::zeros_like(p.tensor));
  }
  const double lr = 3e-3;
  std::vector<double> losses;
  for (int step = 1; step <= 30; ++step) {
    at::Tensor in, tg;
    batch(in, tg);
    at::Tensor loss = zm::causal_lm_loss(model->forward(in), tg);
    loss.backward();
    losses.push_back(loss.item<double>());
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor p = params[i].tensor;
      at::Tensor g = p.grad();
      m[i].mul_(0.9).add_(g, 0.1);
      v[i].mul_(0.999).addcmul_(g, g, 0.001);
      const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.999, step);
      p.addcdiv_(m[i], (v[i] / bc2).sqrt_().add_(1e-8), -lr / bc1);
      g.zero_();
    }
  }
  std::cout << "loss step 1: " << losses.front() << ", step 30: " << losses.back() << "\n";
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  const double last = (losses[27] + losses[28] + losses[29]) / 3;
  EXPECT_LT(last, 0.5 * losses.front()) << "first " << losses.front() << " last " << last;
}

// ----------------------------------------------------------------------------------------
// Reference check: the same weights through Hugging Face's LlamaForCausalLM equations,
// transcribed in Python (modeling_llama.py: LlamaRMSNorm, rotate_half, apply_rotary_pos_emb,
// repeat_kv, eager attention, LlamaMLP). Skipped when python3 with torch is missing.

namespace {

const char* kReferenceScript = R"PY(
import sys, torch, numpy as np

def load(path, dtype, shape):
    return torch.from_numpy(np.fromfile(path, dtype=dtype).reshape(shape))

class LlamaRMSNorm:
    def __init__(self, weight, eps):
        self.weight, self.variance_epsilon = weight, eps
    def __call__(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)

def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)

def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)

def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)

def check(d):
    lines = open(d + "/manifest.txt").read().strip().split("\n")
    cfg = dict(kv.split("=") for kv in lines[0].split())
    V, H, L = int(cfg["V"]), int(cfg["H"]), int(cfg["L"])
    nH, nKV = int(cfg["nH"]), int(cfg["nKV"])
    theta, eps, tie = float(cfg["theta"]), float(cfg["eps"]), cfg["tie"] == "1"
    B, T = int(cfg["B"]), int(cfg["T"])
    W = {}
    for i, line in enumerate(lines[1:]):
        name, *dims = line.split()
        W[name] = load("%s/p%d.bin" % (d, i), np.float32, [int(x) for x in dims])
    ids = load(d + "/ids.bin", np.int64, [B, T])
    got = load(d + "/logits.bin", np.float32, [B, T, V])
    hd = H // nH
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    position_ids = torch.arange(T)[None, :]
    inv_freq_expanded = inv_freq[None, :, None].float().expand(1, -1, 1)
    freqs = (inv_freq_expanded.float() @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    lin = torch.nn.functional.linear
    x = torch.nn.functional.embedding(ids, W["model.embed_tokens.weight"])
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
    for l in range(L):
        p = "model.layers.%d." % l
        residual = x
        h = LlamaRMSNorm(W[p + "input_layernorm.weight"], eps)(x)
        q = lin(h, W[p + "self_attn.q_proj.weight"]).view(B, T, -1, hd).transpose(1, 2)
        k = lin(h, W[p + "self_attn.k_proj.weight"]).view(B, T, -1, hd).transpose(1, 2)
        v = lin(h, W[p + "self_attn.v_proj.weight"]).view(B, T, -1, hd).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = repeat_kv(k, nH // nKV), repeat_kv(v, nH // nKV)
        attn = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
        attn = torch.nn.functional.softmax(attn, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(B, T, -1)
        x = residual + lin(out, W[p + "self_attn.o_proj.weight"])
        residual = x
        h = LlamaRMSNorm(W[p + "post_attention_layernorm.weight"], eps)(x)
        mlp = lin(torch.nn.functional.silu(lin(h, W[p + "mlp.gate_proj.weight"])) *
                  lin(h, W[p + "mlp.up_proj.weight"]), W[p + "mlp.down_proj.weight"])
        x = residual + mlp
    x = LlamaRMSNorm(W["model.norm.weight"], eps)(x)
    head = W["model.embed_tokens.weight"] if tie else W["lm_head.weight"]
    want = lin(x, head)
    return (got - want).abs().max().item(), want.abs().max().item()

for d in sys.argv[1:]:
    diff, scale = check(d)
    print("max_abs_diff=%.9g scale=%.6g" % (diff, scale))
)PY";

void write_raw(const fs::path& file, const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous();
  std::ofstream out(file, std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

// Writes weights, ids and the model's logits for the Python script to check.
void export_case(const fs::path& dir, const zm::LlamaConfig& c, uint64_t seed) {
  fs::create_directories(dir);
  auto model = zm::make_llama(c, seed);
  {  // norms away from 1 so that their weights are exercised
    c10::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      if (p.tensor.dim() == 1) p.tensor.copy_(1.0 + 0.5 * at::rand_like(p.tensor));
  }
  const int64_t B = 2, T = 24;
  const at::Tensor ids = random_ids(B, T, c.vocab_size, seed + 100);
  c10::NoGradGuard no_grad;
  const at::Tensor logits = model->forward(ids);
  std::ofstream manifest(dir / "manifest.txt");
  manifest << "V=" << c.vocab_size << " H=" << c.hidden_size << " L=" << c.num_hidden_layers
           << " nH=" << c.num_attention_heads << " nKV=" << c.num_key_value_heads
           << " theta=" << c.rope_theta << " eps=" << c.rms_norm_eps
           << " tie=" << (c.tie_word_embeddings ? 1 : 0) << " B=" << B << " T=" << T << "\n";
  int i = 0;
  for (const auto& p : model->parameters()) {
    manifest << p.name;
    for (int64_t d : p.tensor.sizes()) manifest << " " << d;
    manifest << "\n";
    write_raw(dir / ("p" + std::to_string(i++) + ".bin"), p.tensor);
  }
  write_raw(dir / "ids.bin", ids);
  write_raw(dir / "logits.bin", logits);
}

std::string run_capture(const std::string& cmd, int* status) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  *status = pclose(pipe);
  return out;
}

}  // namespace

TEST(Llama, LogitsMatchHuggingFaceEquationsInPython) {
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  int status = 0;
  run_capture(python + " -c 'import torch, numpy' 2>&1", &status);
  if (status != 0) GTEST_SKIP() << python << " with torch and numpy is not available";

  const fs::path dir =
      fs::temp_directory_path() / ("zenflow_llama_ref_" + std::to_string(std::random_device{}()));
  zm::LlamaConfig gqa = tiny_config();
  gqa.vocab_size = 256;
  gqa.rope_theta = 500000.0;
  gqa.rms_norm_eps = 1e-6;
  gqa.initializer_range = 0.1;  // larger weights: attention far from uniform
  export_case(dir / "gqa", gqa, 21);
  zm::LlamaConfig tied = tiny_config();
  tied.num_key_value_heads = 4;
  tied.tie_word_embeddings = true;
  tied.initializer_range = 0.1;
  export_case(dir / "tied", tied, 22);
  { std::ofstream(dir / "reference.py") << kReferenceScript; }
  const std::string out =
      run_capture(python + " " + (dir / "reference.py").string() + " " + (dir / "gqa").string() +
                      " " + (dir / "tied").string() + " 2>&1",
                  &status);
  std::error_code ec;
  zenflow::remove_tree(dir, ec);
  ASSERT_EQ(status, 0) << out;
  std::cout << out;
  size_t pos = 0;
  int cases = 0;
  while ((pos = out.find("max_abs_diff=", pos)) != std::string::npos) {
    pos += 13;
    const double diff = std::stod(out.substr(pos));
    const double scale = std::stod(out.substr(out.find("scale=", pos) + 6));
    EXPECT_LE(diff, 1e-4) << out;
    EXPECT_GT(scale, 0.1) << "logits too small for a meaningful check: " << out;
    ++cases;
  }
  EXPECT_EQ(cases, 2) << out;
}
