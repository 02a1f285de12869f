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

std::unique_ptr<CausalLM> make_architecture(const json& config, const at::TensorOptions& options,
                                            std::string* arch, const std::string& where) {
  const std::string type = hf_model_type(config, where);
  if (arch) *arch = type == "gpt2" ? "gpt2" : "llama";
  if (type == "gpt2") return make_gpt2_uninitialized(gpt2_config_from_hf(config, where), options);
  return make_llama_uninitialized(llama_config_from_hf(config, where), options);
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
  out.config = read_hf_config(dir);
  const std::string where = (fs::path(dir) / "config.json").string();
  out.model_type = hf_model_type(out.config, where);
  const auto meta = make_architecture(out.config, at::TensorOptions().device(at::kMeta).dtype(at::kFloat),
                                      &out.arch, where);
  const bool tied = out.arch == "gpt2" ? gpt2_config_from_hf(out.config, where).tie_word_embeddings
                                       : llama_config_from_hf(out.config, where).tie_word_embeddings;

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

std::unique_ptr<CausalLM> make_hf_architecture(const nlohmann::json& config, const at::TensorOptions& options,
                                               std::string* arch) {
  return make_architecture(config, options, arch, "config.json");
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
