// Atomic training checkpoints (see checkpoint.h).
#include "common/remove_tree.h"
#include "worker/checkpoint.h"

#include "worker/model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace zenflow {
namespace fs = std::filesystem;

namespace {

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("checkpoint: cannot open " + p.string() + " to fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw std::runtime_error("checkpoint: fsync failed for " + p.string());
}

void save_tensors(const fs::path& path, const NamedTensors& named) {
  std::vector<std::pair<std::string, at::Tensor>> cpu;
  cpu.reserve(named.size());
  for (const auto& [name, t] : named) cpu.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  model::write_safetensors(path.string(), cpu, {{"format", "pt"}, {"writer", "zenflow"}});
}

NamedTensors load_tensors(const fs::path& path) {
  model::SafetensorsFile file(path.string());  // validates the header and the byte ranges
  NamedTensors out;
  for (const std::string& name : file.names()) out.emplace_back(name, file.tensor(name).clone());
  return out;
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos) continue;
    try {
      out.emplace_back(std::stoll(name.substr(5)), e.path().string());
    } catch (const std::exception&) {
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string write_checkpoint(const std::string& dir, int64_t step, const NamedTensors& model,
                             const NamedTensors& engine, const nlohmann::json& trainer, int64_t keep) {
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw std::runtime_error("checkpoint: cannot create " + root.string() + ": " + ec.message());
  const fs::path final_dir = root / step_name(step);
  const fs::path tmp = root / (step_name(step) + ".tmp");
  zenflow::remove_tree(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw std::runtime_error("checkpoint: cannot create " + tmp.string() + ": " + ec.message());

  nlohmann::json meta = trainer;
  meta["step"] = step;
  save_tensors(tmp / "model.safetensors", model);
  save_tensors(tmp / "engine.safetensors", engine);
  {
    std::ofstream f(tmp / "trainer.json");
    f << meta.dump(1) << "\n";
    if (!f) throw std::runtime_error("checkpoint: cannot write " + (tmp / "trainer.json").string());
  }
  for (const char* name : {"model.safetensors", "engine.safetensors", "trainer.json"}) fsync_path(tmp / name);
  fsync_path(tmp);
  zenflow::remove_tree(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  if (ec) throw std::runtime_error("checkpoint: cannot rename " + tmp.string() + ": " + ec.message());
  fsync_path(root);

  auto all = list_checkpoints(dir);
  for (size_t i = 0; keep > 0 && all.size() - i > static_cast<size_t>(keep); ++i)
    zenflow::remove_tree(all[i].second, ec);
  return final_dir.string();
}

std::optional<Checkpoint> load_latest_checkpoint(const std::string& dir,
                                                 const std::function<void(const std::string&)>& warn) {
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const fs::path p(it->second);
    try {
      std::ifstream f(p / "trainer.json");
      if (!f) throw std::runtime_error("missing trainer.json");
      std::stringstream ss;
      ss << f.rdbuf();
      Checkpoint c;
      c.path = p.string();
      c.trainer = nlohmann::json::parse(ss.str());
      c.step = c.trainer.at("step").get<int64_t>();
      c.model = load_tensors(p / "model.safetensors");
      c.engine = load_tensors(p / "engine.safetensors");
      return c;
    } catch (const std::exception& e) {
      if (warn) warn("checkpoint " + p.string() + " is damaged (" + e.what() + "); trying the previous one");
    }
  }
  return std::nullopt;
}

}  // namespace zenflow
