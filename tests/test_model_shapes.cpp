// The torch-free parameter shapes (common/model/model_shapes.h) against the models
// themselves: for every config, hf_parameter_shapes equals the names and shapes of
// make_hf_architecture(config, meta)->parameters(), in order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "common/model/model_shapes.h"
#include "common/model/spec_model_config.h"
#include "tests/support/scratch.h"
#include "worker/model/hf_model.h"
#include "worker/model/llama.h"
#include "worker/rank/model_factory.h"

namespace {

namespace fs = std::filesystem;
namespace zm = zenflow::model;
using json = nlohmann::json;
using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

Shapes torch_shapes(const json& config) {
  Shapes out;
  for (const zm::NamedTensor& p :
       zm::make_hf_architecture(config, at::TensorOptions().device(at::kMeta).dtype(at::kFloat))
           ->parameters())
    out.emplace_back(p.name, p.tensor.sizes().vec());
  return out;
}

Shapes free_shapes(const json& config) {
  Shapes out;
  for (const zm::ParameterShape& p : zm::hf_parameter_shapes(config)) out.emplace_back(p.name, p.shape);
  return out;
}

int64_t total(const Shapes& shapes) {
  int64_t n = 0;
  for (const auto& [name, shape] : shapes) {
    int64_t k = 1;
    for (const int64_t d : shape) k *= d;
    n += k;
  }
  return n;
}

// The message `f` throws; empty when it returns.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string text(const std::vector<int64_t>& shape) { return json(shape).dump(); }

// Equal lists, or a failure naming the first parameter that differs.
void expect_same_shapes(const json& config) {
  SCOPED_TRACE(config.dump());
  const Shapes expected = torch_shapes(config);
  const Shapes got = free_shapes(config);
  for (size_t i = 0; i < std::min(expected.size(), got.size()); ++i) {
    ASSERT_EQ(got[i].first, expected[i].first) << "parameter " << i;
    ASSERT_EQ(got[i].second, expected[i].second)
        << got[i].first << ": " << text(got[i].second) << " vs the model's " << text(expected[i].second);
  }
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(zm::parameter_count(zm::hf_parameter_shapes(config)), total(expected));
}

json llama(json extra = json::object()) {
  json c = {{"model_type", "llama"},    {"vocab_size", 96},       {"hidden_size", 64},
            {"intermediate_size", 160}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
  c.update(extra);
  return c;
}

TEST(ModelShapes, LlamaFamilyEqualsTheMetaModel) {
  const std::vector<json> configs = {
      llama(),                                                              // kv heads default to heads
      llama({{"tie_word_embeddings", true}}),                               // no lm_head
      llama({{"num_attention_heads", 8}, {"num_key_value_heads", 2}}),      // GQA
      llama({{"num_key_value_heads", 1}, {"tie_word_embeddings", false}}),  // MQA
      llama({{"attention_bias", true}}),                                    // q/k/v/o biases
      llama({{"mlp_bias", true}, {"attention_bias", true}, {"num_key_value_heads", 2}}),
      llama({{"head_dim", 32}}),  // q_proj [128, 64], o_proj [64, 128]
      llama({{"head_dim", 16}}),  // = hidden / heads
      llama({{"num_key_value_heads", nullptr}, {"head_dim", nullptr}, {"tie_word_embeddings", nullptr}}),
      llama({{"hidden_size", 64.0}, {"num_hidden_layers", 3.0}}),  // integral floats
      llama({{"rope_scaling",
              {{"rope_type", "llama3"},
               {"factor", 8.0},
               {"low_freq_factor", 1.0},
               {"high_freq_factor", 4.0},
               {"original_max_position_embeddings", 64}}}}),
      llama({{"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 5e5}}}}),
      [] {  // architectures instead of model_type
        json c = llama({{"architectures", {"LlamaForCausalLM"}}});
        c.erase("model_type");
        return c;
      }(),
      llama({{"model_type", "mistral"},
             {"num_attention_heads", 8},
             {"num_key_value_heads", 2},
             {"sliding_window", nullptr}}),
      llama({{"model_type", "mistral"}, {"sliding_window", 32}, {"tie_word_embeddings", true}}),
      llama({{"model_type", "qwen2"}, {"num_key_value_heads", 2}}),  // q/k/v biases, no o bias
      llama({{"model_type", "qwen2"}, {"tie_word_embeddings", true}, {"use_sliding_window", false}}),
      // Odd sizes: head_dim 8 from 40 / 5, one kv head, intermediate 97, vocab 151.
      llama({{"model_type", "qwen2"},
             {"vocab_size", 151},
             {"hidden_size", 40},
             {"num_attention_heads", 5},
             {"num_key_value_heads", 1},
             {"intermediate_size", 97},
             {"num_hidden_layers", 3}}),
      llama({{"vocab_size", 1},
             {"hidden_size", 2},
             {"num_attention_heads", 1},
             {"intermediate_size", 1},
             {"num_hidden_layers", 1}}),
  };
  for (const json& c : configs) expect_same_shapes(c);
}

TEST(ModelShapes, Gpt2EqualsTheMetaModel) {
  const std::vector<json> configs = {
      {{"model_type", "gpt2"}, {"vocab_size", 50257}},  // every size from GPT2Config's defaults: 124M
      {{"model_type", "gpt2"}, {"vocab_size", 100}, {"n_embd", 48}, {"n_layer", 2}, {"n_head", 3}},
      {{"model_type", "gpt2"},
       {"vocab_size", 101},
       {"n_embd", 48},
       {"n_layer", 3},
       {"n_head", 4},
       {"n_inner", 100},
       {"n_positions", 77},
       {"tie_word_embeddings", false}},
      {{"model_type", "gpt2"},
       {"vocab_size", 100},
       {"n_embd", 48},
       {"n_layer", 1},
       {"n_head", 4},
       {"n_inner", nullptr},
       {"activation_function", "relu"}},
      // transformers' aliases (GPT2Config.attribute_map), and architectures only.
      {{"architectures", {"GPT2LMHeadModel"}},
       {"vocab_size", 64},
       {"hidden_size", 32},
       {"num_hidden_layers", 2},
       {"num_attention_heads", 2},
       {"max_position_embeddings", 16}},
  };
  for (const json& c : configs) expect_same_shapes(c);
  EXPECT_EQ(zm::parameter_count(zm::hf_parameter_shapes(configs[0])), 124439808);
}

TEST(ModelShapes, RefusesWhatTheModelRefusesWithTheSameMessage) {
  const std::vector<std::pair<json, std::string>> configs = {
      {llama({{"model_type", "bert"}}), "model_type 'bert' is not supported"},
      {[] {
         json c = llama();
         c.erase("vocab_size");
         return c;
       }(),
       "required key 'vocab_size' is missing"},
      {llama({{"hidden_act", "gelu"}}), "hidden_act 'gelu' is not supported"},
      {llama({{"num_attention_heads", 3}}), "must be divisible by num_attention_heads"},
      {llama({{"num_key_value_heads", 3}}), "must be divisible by num_key_value_heads"},
      {llama({{"hidden_size", 64.5}}), "key 'hidden_size' must be an integer"},
      {llama({{"model_type", "qwen2"}, {"use_sliding_window", true}}), "use_sliding_window true"},
      {json{{"model_type", "gpt2"}, {"vocab_size", 10}, {"n_embd", 10}, {"n_head", 3}},
       "must be divisible by n_head"},
      {json::array(), "not a JSON object"},
  };
  for (const auto& [config, needle] : configs) {
    SCOPED_TRACE(config.dump());
    const std::string expected = error_of([&] { torch_shapes(config); });
    EXPECT_NE(expected.find(needle), std::string::npos) << expected;
    EXPECT_EQ(error_of([&] { zm::hf_parameter_shapes(config); }), expected);
  }
}

// The spec's model section: the config describe_model_from_spec gives, and its totals.
void expect_same_spec_config(const zenflow::ModelSpec& m, int64_t tokenizer_vocab) {
  const json described = zenflow::describe_model_from_spec(m, tokenizer_vocab).config;
  const json config = zm::hf_config_from_spec(m, tokenizer_vocab);
  EXPECT_EQ(config, described);
  EXPECT_EQ(zm::parameter_count(zm::hf_parameter_shapes(config)), total(torch_shapes(described)));
}

TEST(ModelShapes, TheExampleSpecsGiveTheSameConfigAndTotals) {
  int seen = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(fs::path(ZENFLOW_SOURCE_DIR) / "examples")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    std::ifstream in(e.path());
    const std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const zenflow::JobSpec spec = zenflow::parse_job_spec(yaml, {}, e.path().parent_path().string());
    expect_same_spec_config(spec.model, spec.data.tokenizer == "byte" ? 256 : 0);
    ++seen;
  }
  EXPECT_GE(seen, 1);
}

TEST(ModelShapes, InlineSpecConfigsEqualDescribeModelFromSpec) {
  zenflow::ModelSpec m;
  m.arch = "llama";
  m.config = {{"hidden_size", 96},        {"num_hidden_layers", 3},   {"num_attention_heads", 6},
              {"num_key_value_heads", 2}, {"intermediate_size", 200}, {"tie_word_embeddings", 1}};
  expect_same_spec_config(m, 256);
  m.config.erase("num_key_value_heads");  // then it follows num_attention_heads
  expect_same_spec_config(m, 300);
  m.arch = "gpt2";
  m.config = {{"hidden_size", 48},        {"num_hidden_layers", 2},        {"num_attention_heads", 4},
              {"intermediate_size", 100}, {"max_position_embeddings", 64}, {"vocab_size", 500}};
  expect_same_spec_config(m, 256);
}

TEST(ModelShapes, ModelDirectorySpecsEqualDescribeModelFromSpec) {
  const fs::path dir = zenflow::test_support::removed_at_exit(
      fs::temp_directory_path() / ("zenflow-model-shapes-" + std::to_string(::getpid())));
  zm::LlamaConfig c;
  c.vocab_size = 300;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 50;
  c.qkv_bias = true;
  zm::export_hf_model(*zm::make_llama(c, 1), zm::hf_config_json(c, "qwen2"), (dir / "qwen").string(),
                      at::kFloat, "");
  zenflow::ModelSpec m;
  m.from = (dir / "qwen").string();
  m.arch_given = false;
  expect_same_spec_config(m, 256);

  // The same refusals as describe_model_from_spec, word for word.
  const auto both_refuse = [&](const zenflow::ModelSpec& bad, int64_t vocab, const std::string& needle) {
    const std::string expected = error_of([&] { zenflow::describe_model_from_spec(bad, vocab); });
    EXPECT_NE(expected.find(needle), std::string::npos) << expected;
    EXPECT_EQ(error_of([&] { zm::hf_config_from_spec(bad, vocab); }), expected);
  };
  both_refuse(m, 301, "smaller than the tokenizer's 301");
  zenflow::ModelSpec gpt2_arch = m;
  gpt2_arch.arch = "gpt2";
  gpt2_arch.arch_given = true;
  both_refuse(gpt2_arch, 256, "contradicts model.from");
  zenflow::ModelSpec with_config = m;
  with_config.config = {{"hidden_size", 64}};
  both_refuse(with_config, 256, "cannot be combined with model.from");
  zenflow::ModelSpec inline_bad;
  inline_bad.config = {{"hidden_size", 64}, {"num_attention_heads", 3}};
  both_refuse(inline_bad, 256, "model.config: ");
  inline_bad.config = {{"rope_theta", 1.0}};
  inline_bad.arch = "gpt2";
  both_refuse(inline_bad, 256, "model.config.rope_theta: not a gpt2 setting");
}

// make_model_from_spec and describe_model_from_spec check a spec with hf_config_from_spec,
// on config.json alone: a directory without its weights yet gets the spec's refusal, not
// the missing weights.
TEST(ModelShapes, ModelFactoryChecksTheSpecAgainstConfigJsonBeforeAnyWeight) {
  const fs::path dir = zenflow::test_support::removed_at_exit(
      fs::temp_directory_path() / ("zenflow-model-factory-" + std::to_string(::getpid())));
  zm::LlamaConfig c;
  c.vocab_size = 300;
  c.hidden_size = 32;
  c.intermediate_size = 50;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << zm::hf_config_json(c).dump();
  zenflow::ModelSpec m;
  m.from = dir.string();
  const auto expect_refusal = [&](const zenflow::ModelSpec& spec, int64_t vocab,
                                  const std::string& expected) {
    EXPECT_EQ(error_of([&] { zenflow::describe_model_from_spec(spec, vocab); }), expected);
    EXPECT_EQ(error_of([&] { zenflow::make_model_from_spec(spec, vocab, 1, nullptr); }), expected);
  };
  expect_refusal(m, 301, "model.from: " + m.from + " has vocab_size 300, smaller than the tokenizer's 301");
  zenflow::ModelSpec gpt2_arch = m;
  gpt2_arch.arch = "gpt2";
  gpt2_arch.arch_given = true;
  expect_refusal(gpt2_arch, 256,
                 "model.arch: 'gpt2' contradicts model.from (" + m.from +
                     "/config.json is a llama model); remove model.arch or change it");
  // A spec the directory satisfies goes on to the weights, which are missing.
  const std::string no_weights = error_of([&] { zenflow::describe_model_from_spec(m, 256); });
  EXPECT_NE(no_weights.find(m.from), std::string::npos) << no_weights;
  EXPECT_NE(no_weights.rfind("model.", 0), 0u) << "not a spec error: " << no_weights;
}

}  // namespace
