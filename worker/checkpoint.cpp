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

namespace {

fs::path tmp_dir(const std::string& dir, int64_t step) { return fs::path(dir) / (step_name(step) + ".tmp"); }

std::string shard_name(int rank) {
  if (rank == 0) return "engine.safetensors";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "engine-rank-%05d.safetensors", rank);
  return buf;
}

}  // namespace

void begin_checkpoint(const std::string& dir, int64_t step) {
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw std::runtime_error("checkpoint: cannot create " + root.string() + ": " + ec.message());
  const fs::path tmp = tmp_dir(dir, step);
  zenflow::remove_tree(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw std::runtime_error("checkpoint: cannot create " + tmp.string() + ": " + ec.message());
}

void write_engine_shard(const std::string& dir, int64_t step, int rank, const NamedTensors& engine) {
  const fs::path path = tmp_dir(dir, step) / shard_name(rank);
  save_tensors(path, engine);
  fsync_path(path);
}

std::string commit_checkpoint(const std::string& dir, int64_t step, const NamedTensors& model,
                              const NamedTensors& engine, const nlohmann::json& trainer, int64_t keep,
                              int world_size) {
  const fs::path root(dir);
  const fs::path final_dir = root / step_name(step);
  const fs::path tmp = tmp_dir(dir, step);
  std::error_code ec;
  for (int r = 1; r < world_size; ++r)
    if (!fs::is_regular_file(tmp / shard_name(r), ec))
      throw std::runtime_error("checkpoint: rank " + std::to_string(r) + " did not write " +
                               (tmp / shard_name(r)).string());
  nlohmann::json meta = trainer;
  meta["step"] = step;
  meta["world_size"] = world_size;
  save_tensors(tmp / "model.safetensors", model);
  write_engine_shard(dir, step, 0, engine);
  {
    std::ofstream f(tmp / "trainer.json");
    f << meta.dump(1) << "\n";
    if (!f) throw std::runtime_error("checkpoint: cannot write " + (tmp / "trainer.json").string());
  }
  for (const char* name : {"model.safetensors", "trainer.json"}) fsync_path(tmp / name);
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

std::string write_checkpoint(const std::string& dir, int64_t step, const NamedTensors& model,
                             const NamedTensors& engine, const nlohmann::json& trainer, int64_t keep) {
  begin_checkpoint(dir, step);
  return commit_checkpoint(dir, step, model, engine, trainer, keep, 1);
}

NamedTensors load_engine_shard(const Checkpoint& c, int rank) {
  if (rank < 0 || rank >= static_cast<int>(c.engine_shards.size()))
    throw std::invalid_argument("checkpoint " + c.path + " has no engine shard of rank " + std::to_string(rank));
  return load_tensors(c.engine_shards[static_cast<size_t>(rank)]);
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
      c.world_size = c.trainer.value("world_size", int64_t{1});
      if (c.world_size < 1) throw std::runtime_error("world_size " + std::to_string(c.world_size));
      c.model = load_tensors(p / "model.safetensors");
      for (int r = 0; r < static_cast<int>(c.world_size); ++r) {
        const fs::path shard = p / shard_name(r);
        model::SafetensorsFile check(shard.string());  // validates the header and byte ranges
        c.engine_shards.push_back(shard.string());
      }
      return c;
    } catch (const std::exception& e) {
      if (warn) warn("checkpoint " + p.string() + " is damaged (" + e.what() + "); trying the previous one");
    }
  }
  return std::nullopt;
}

}  // namespace zenflow
