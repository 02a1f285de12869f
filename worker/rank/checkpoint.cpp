// Atomic, checksummed training checkpoints and the checkpoint directory's lock (see checkpoint.h).
#include "worker/rank/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <thread>

#include "common/checkpoint_names.h"
#include "common/crc32c.h"
#include "common/input_file.h"
#include "common/job_spec.h"
#include "common/remove_tree.h"
#include "worker/model/safetensors.h"
#include "worker/rank/job_profiler.h"
#include "worker/rank/step_log.h"

namespace zenflow {
namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = kCheckpointManifest;
constexpr const char* kTrainer = "trainer.json";
constexpr const char* kModel = "model.safetensors";
constexpr const char* kRunYaml = "run.yaml";
constexpr const char* kManifestFormat = "zenflow-checkpoint";
constexpr int64_t kManifestVersion = 1;
constexpr const char* kChecksumSuffix = ".crc32c";  // a rank's shard checksum, beside it until commit

// The reason part of an InputError ("<path>: <reason>").
std::string reason_of(const InputError& e) {
  const std::string what = e.what();
  return what.size() > e.path().size() + 2 ? what.substr(e.path().size() + 2) : what;
}

// A damaged checkpoint: the file and what is wrong with it.
class Damaged : public std::runtime_error {
 public:
  Damaged(const fs::path& file, const std::string& reason) : std::runtime_error(file.string() + ": " + reason) {}
};

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("checkpoint: cannot open " + p.string() + " to fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw std::runtime_error("checkpoint: fsync failed for " + p.string());
}

void write_text_file(const fs::path& path, const std::string& text) {
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw std::runtime_error("checkpoint: cannot write " + path.string());
  }
  fsync_path(path);
}

void save_tensors(const fs::path& path, const NamedTensors& named) {
  std::vector<std::pair<std::string, at::Tensor>> cpu;
  cpu.reserve(named.size());
  for (const auto& [name, t] : named) cpu.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  model::write_safetensors(path.string(), cpu, {{"format", "pt"}, {"writer", "zenflow"}});
}

// Elements whose exponent bits are all ones (Inf or NaN), counted over the raw words: one
// pass at memory speed, no temporary tensor (a multi-GB checkpoint is checked on load).
template <typename Word>
int64_t count_all_ones_exponent(const void* data, int64_t n, Word mask) {
  const auto* w = static_cast<const Word*>(data);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += (w[i] & mask) == mask;
  return bad;
}

}  // namespace

int64_t count_non_finite(const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return 0;
  if (t.device().is_cpu() && t.is_contiguous()) {
    switch (t.scalar_type()) {
      case at::kFloat: return count_all_ones_exponent<uint32_t>(t.data_ptr(), t.numel(), 0x7F800000u);
      case at::kDouble: return count_all_ones_exponent<uint64_t>(t.data_ptr(), t.numel(), 0x7FF0000000000000ull);
      case at::kBFloat16: return count_all_ones_exponent<uint16_t>(t.data_ptr(), t.numel(), 0x7F80);
      case at::kHalf: return count_all_ones_exponent<uint16_t>(t.data_ptr(), t.numel(), 0x7C00);
      default: break;
    }
  }
  return (~at::isfinite(t)).sum().item<int64_t>();
}

namespace {

// Non-finite values in a floating-point tensor make the checkpoint unusable: resuming would
// train on NaN weights or optimizer moments.
void check_finite(const fs::path& file, const std::string& name, const at::Tensor& t) {
  if (const int64_t bad = count_non_finite(t))
    throw Damaged(file, "tensor '" + name + "' holds " + std::to_string(bad) + " non-finite value(s)");
}

// Opens a safetensors file (header and byte ranges validated) and checks every tensor is finite.
model::SafetensorsFile open_checked(const fs::path& path) {
  try {
    model::SafetensorsFile file(path.string());
    for (const std::string& name : file.names())
      if (file.info(name).dtype != at::ScalarType::Undefined) check_finite(path, name, file.tensor(name));
    return file;
  } catch (const Damaged&) {
    throw;
  } catch (const std::exception& e) {
    throw Damaged(path, e.what());
  }
}

std::string step_name(int64_t step) { return checkpoint_step_name(step); }

fs::path tmp_dir(const std::string& dir, int64_t step) { return fs::path(dir) / (step_name(step) + ".tmp"); }

std::string shard_name(int rank) { return checkpoint_shard_name(rank); }

nlohmann::json checksum_entry(const fs::path& file) {
  const FileChecksum c = checksum_file(file.string());
  return {{"bytes", c.bytes}, {"crc32c", crc32c_hex(c.crc32c)}};
}

// An integer field of a JSON object, >= 0.
int64_t nonnegative_field(const nlohmann::json& j, const char* key, const fs::path& file) {
  if (!j.contains(key)) throw Damaged(file, std::string("field '") + key + "' is missing");
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer()) throw Damaged(file, std::string("field '") + key + "' is not an integer: " + v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < 0) throw Damaged(file, std::string("field '") + key + "' is negative: " + std::to_string(x));
  return x;
}

nlohmann::json parse_json_file(const fs::path& file, int64_t max_bytes) {
  std::string text;
  try {
    text = read_regular_file(file.string(), max_bytes, "a checkpoint's " + file.filename().string());
  } catch (const InputError& e) {
    throw Damaged(file, reason_of(e));
  }
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object()) throw Damaged(file, "not a JSON object");
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw Damaged(file, std::string("not valid JSON (") + e.what() + ")");
  }
}

// The step of a directory name step-NNNNNNNN (digits only), or -1.
int64_t step_of_name(const std::string& name) { return checkpoint_step_of(name); }

// A name beside `path` that does not exist yet: path + suffix, then path + suffix + ".2", …
fs::path free_name(const fs::path& path, const std::string& suffix) {
  std::error_code ec;
  fs::path candidate = path.string() + suffix;
  for (int n = 2; fs::exists(fs::symlink_status(candidate, ec)); ++n)
    candidate = path.string() + suffix + "." + std::to_string(n);
  return candidate;
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of_name(e.path().filename().string());
    if (step >= 0 && e.is_directory(ec) && !e.is_symlink(ec)) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

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

std::string engine_shard_path(const std::string& dir, int64_t step, int rank) {
  return (tmp_dir(dir, step) / shard_name(rank)).string();
}

ShardChecksum write_engine_shard(const std::string& dir, int64_t step, int rank, const NamedTensors& engine) {
  const fs::path path = engine_shard_path(dir, step, rank);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);  // rank 0 made it, unless this rank stages elsewhere
  if (ec) throw std::runtime_error("checkpoint: cannot create " + path.parent_path().string() + ": " + ec.message());
  save_tensors(path, engine);
  // The checksum travels beside the shard to rank 0, which puts it in the manifest.
  const FileChecksum c = checksum_file(path.string());
  write_text_file(path.string() + kChecksumSuffix,
                  nlohmann::json{{"bytes", c.bytes}, {"crc32c", crc32c_hex(c.crc32c)}}.dump() + "\n");
  return {c.bytes, c.crc32c};
}

std::string commit_checkpoint(const std::string& dir, int64_t step, const CheckpointContents& contents,
                              int64_t keep, int world_size, const CommitFence& fence,
                              const std::map<int, ShardChecksum>& elsewhere) {
  const fs::path root(dir);
  const fs::path final_dir = root / step_name(step);
  const fs::path tmp = tmp_dir(dir, step);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(final_dir, ec)))
    throw std::runtime_error("checkpoint: " + final_dir.string() + " already exists; a checkpoint is never replaced");
  nlohmann::json files = nlohmann::json::object();
  for (int r = 1; r < world_size; ++r) {
    if (auto it = elsewhere.find(r); it != elsewhere.end()) {
      files[shard_name(r)] = {{"bytes", it->second.bytes}, {"crc32c", crc32c_hex(it->second.crc32c)}};
      continue;
    }
    const fs::path shard = tmp / shard_name(r);
    const fs::path sum = shard.string() + kChecksumSuffix;
    if (!fs::is_regular_file(shard, ec) || !fs::is_regular_file(sum, ec))
      throw std::runtime_error("checkpoint: rank " + std::to_string(r) + " did not write " + shard.string());
    nlohmann::json entry = nlohmann::json::parse(read_regular_file(sum.string(), kMaxConfigBytes, "a checksum"));
    if (entry.at("bytes").get<int64_t>() != static_cast<int64_t>(fs::file_size(shard, ec)))
      throw std::runtime_error("checkpoint: " + shard.string() + " changed size after rank " + std::to_string(r) +
                               " wrote it");
    files[shard_name(r)] = entry;
    fs::remove(sum, ec);
  }
  nlohmann::json meta = contents.trainer;
  meta["step"] = step;
  meta["world_size"] = world_size;
  save_tensors(tmp / kModel, contents.model);
  save_tensors(tmp / shard_name(0), contents.engine);
  write_text_file(tmp / kTrainer, meta.dump(1) + "\n");
  write_text_file(tmp / kRunYaml, contents.run_yaml);
  for (const std::string& name : {std::string(kModel), shard_name(0), std::string(kTrainer), std::string(kRunYaml)})
    files[name] = checksum_entry(tmp / name);
  const std::string identity_text = contents.identity.dump();
  nlohmann::json manifest = {{"format", kManifestFormat},
                             {"version", kManifestVersion},
                             {"step", step},
                             {"world_size", world_size},
                             {"identity", contents.identity},
                             {"identity_crc32c", crc32c_hex(crc32c(identity_text.data(), identity_text.size()))},
                             {"files", files}};
  write_text_file(tmp / kManifest, manifest.dump(1) + "\n");
  fsync_path(tmp);
  // Everything that changes what checkpoint.dir shows happens inside the fence.
  const auto publish = [&] {
    fs::rename(tmp, final_dir, ec);
    if (ec) throw std::runtime_error("checkpoint: cannot rename " + tmp.string() + ": " + ec.message());
    fsync_path(root);
    auto all = list_checkpoints(dir);
    for (size_t i = 0; keep > 0 && all.size() - i > static_cast<size_t>(keep); ++i)
      zenflow::remove_tree(all[i].second, ec);
  };
  if (!fence) {
    publish();
  } else if (!fence(publish)) {
    zenflow::remove_tree(tmp, ec);
    throw CommitFenced("checkpoint: step " + std::to_string(step) + " was not committed in " + dir +
                       ": this process may no longer commit checkpoints of the job (its lease ended)");
  }
  return final_dir.string();
}

std::string write_checkpoint(const std::string& dir, int64_t step, const CheckpointContents& contents, int64_t keep) {
  begin_checkpoint(dir, step);
  return commit_checkpoint(dir, step, contents, keep, 1);
}

NamedTensors load_engine_shard(const Checkpoint& c, int rank) {
  if (rank < 0 || rank >= static_cast<int>(c.engine_shards.size()))
    throw std::invalid_argument("checkpoint " + c.path + " has no engine shard of rank " + std::to_string(rank));
  model::SafetensorsFile file(c.engine_shards[static_cast<size_t>(rank)]);
  NamedTensors out;
  for (const std::string& name : file.names()) out.emplace_back(name, file.tensor(name).clone());
  return out;
}

Checkpoint load_checkpoint(const std::string& step_dir, const ShardFilter& needed) {
  const fs::path p(step_dir);
  const int64_t named_step = step_of_name(p.filename().string());
  if (named_step < 0) throw Damaged(p, "not a step-NNNNNNNN directory");

  // The manifest: what must be here, how large and with which checksum.
  const fs::path manifest_path = p / kManifest;
  const nlohmann::json manifest = parse_json_file(manifest_path, kMaxConfigBytes);
  if (manifest.value("format", std::string()) != kManifestFormat)
    throw Damaged(manifest_path, std::string("field 'format' is not \"") + kManifestFormat + "\"");
  if (!manifest.contains("version") || manifest.at("version") != kManifestVersion)
    throw Damaged(manifest_path, "unsupported version " + manifest.value("version", nlohmann::json()).dump() +
                                     " (this zenflow reads version " + std::to_string(kManifestVersion) + ")");
  Checkpoint c;
  c.path = p.string();
  c.step = nonnegative_field(manifest, "step", manifest_path);
  if (c.step != named_step)
    throw Damaged(manifest_path, "records step " + std::to_string(c.step) + " but the directory is " +
                                     p.filename().string());
  c.world_size = nonnegative_field(manifest, "world_size", manifest_path);
  if (c.world_size < 1 || c.world_size > 65536)
    throw Damaged(manifest_path, "world_size " + std::to_string(c.world_size) + " is out of range");
  if (!manifest.contains("identity") || !manifest.at("identity").is_object())
    throw Damaged(manifest_path, "field 'identity' is missing or not an object");
  c.identity = manifest.at("identity");
  const std::string identity_text = c.identity.dump();
  if (manifest.value("identity_crc32c", std::string()) != crc32c_hex(crc32c(identity_text.data(), identity_text.size())))
    throw Damaged(manifest_path, "field 'identity' does not match its checksum 'identity_crc32c'");
  if (!manifest.contains("files") || !manifest.at("files").is_object())
    throw Damaged(manifest_path, "field 'files' is missing or not an object");
  const nlohmann::json& files = manifest.at("files");
  std::vector<std::string> required = {kModel, kTrainer, kRunYaml};
  for (int r = 0; r < static_cast<int>(c.world_size); ++r) required.push_back(shard_name(r));
  for (const std::string& name : required)
    if (!files.contains(name)) throw Damaged(manifest_path, "does not list " + name);
  auto shard_needed = [&](int r) { return !needed || needed(c.world_size, r); };
  for (const auto& [name, entry] : files.items()) {
    if (name.find('/') != std::string::npos || name == "." || name == ".." || name == kManifest)
      throw Damaged(manifest_path, "lists a file outside the checkpoint: '" + name + "'");
    const fs::path file = p / name;
    if (!entry.is_object() || !entry.contains("bytes") || !entry.contains("crc32c") ||
        !entry.at("bytes").is_number_integer() || !entry.at("crc32c").is_string())
      throw Damaged(manifest_path, "entry of " + name + " is malformed: " + entry.dump());
    if (const int r = checkpoint_shard_rank(name); r >= 0 && r < c.world_size && !shard_needed(r)) continue;
    FileChecksum actual;
    try {
      actual = checksum_file(file.string());
    } catch (const InputError& e) {
      throw Damaged(file, reason_of(e));
    }
    const int64_t bytes = entry.at("bytes").get<int64_t>();
    if (actual.bytes != bytes)
      throw Damaged(file, "is " + std::to_string(actual.bytes) + " bytes, the manifest says " + std::to_string(bytes) +
                              " (truncated or overwritten)");
    const std::string crc = entry.at("crc32c").get<std::string>();
    if (crc32c_hex(actual.crc32c) != crc)
      throw Damaged(file, "checksum mismatch (CRC32C " + crc32c_hex(actual.crc32c) + ", the manifest says " + crc +
                              "): the file's bytes changed after it was written");
  }

  // trainer.json: the loader position and history, consistent with the manifest.
  const fs::path trainer_path = p / kTrainer;
  c.trainer = parse_json_file(trainer_path, kMaxTrainerStateBytes);
  if (nonnegative_field(c.trainer, "step", trainer_path) != c.step)
    throw Damaged(trainer_path, "records step " + c.trainer.at("step").dump() + " but the manifest says " +
                                    std::to_string(c.step));
  if (nonnegative_field(c.trainer, "world_size", trainer_path) != c.world_size)
    throw Damaged(trainer_path, "records world_size " + c.trainer.at("world_size").dump() +
                                    " but the manifest says " + std::to_string(c.world_size));
  c.loader_epoch = nonnegative_field(c.trainer, "loader_epoch", trainer_path);
  c.loader_index = nonnegative_field(c.trainer, "loader_index", trainer_path);
  if (c.trainer.contains("losses")) {
    const nlohmann::json& losses = c.trainer.at("losses");
    if (!losses.is_array()) throw Damaged(trainer_path, "field 'losses' is not a list");
    for (const auto& v : losses) {
      if (!v.is_number()) throw Damaged(trainer_path, "field 'losses' holds a non-number: " + v.dump());
      c.losses.push_back(v.get<double>());
    }
  }

  // Tensors: headers and byte ranges valid, every floating-point value finite.
  const model::SafetensorsFile model_file = open_checked(p / kModel);
  for (const std::string& name : model_file.names()) c.model.emplace_back(name, model_file.tensor(name).clone());
  for (int r = 0; r < static_cast<int>(c.world_size); ++r) {
    if (shard_needed(r)) open_checked(p / shard_name(r));
    c.engine_shards.push_back((p / shard_name(r)).string());
  }
  return c;
}

CheckpointScan scan_checkpoints(const std::string& dir, const std::function<void(const std::string&)>& warn,
                                bool quarantine, const ShardFilter& needed) {
  CheckpointScan scan;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step-", 0) == 0 && name.find(".damaged") != std::string::npos) scan.damaged.push_back(e.path());
    }
  }
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const fs::path p(it->second);
    try {
      scan.checkpoint = load_checkpoint(p.string(), needed);
      break;
    } catch (const std::exception& e) {
      std::string where = p.string();
      if (quarantine) {
        const fs::path aside = free_name(p, ".damaged");
        fs::rename(p, aside, ec);
        if (!ec) where = aside.string();
      }
      scan.damaged.push_back(where);
      if (warn)
        warn("warning: checkpoint " + p.string() + " is damaged (" + e.what() + ")" +
             (where != p.string() ? "; kept as " + where : "") + "; trying the previous one");
    }
  }
  std::sort(scan.damaged.begin(), scan.damaged.end());
  return scan;
}

std::optional<Checkpoint> load_latest_checkpoint(const std::string& dir,
                                                 const std::function<void(const std::string&)>& warn) {
  return scan_checkpoints(dir, warn, /*quarantine=*/false).checkpoint;
}

bool is_run_file(const std::string& name) {
  // step-N, step-N.tmp, step-N.damaged, step-N.damaged.K (free_name's).
  const size_t dot = name.find('.');
  if (step_of_name(name.substr(0, dot)) >= 0) {
    if (dot == std::string::npos) return true;
    const std::string suffix = name.substr(dot);
    if (suffix == ".tmp" || suffix == ".damaged") return true;
    if (suffix.rfind(".damaged.", 0) != 0 || suffix.size() == 9) return false;
    return std::all_of(suffix.begin() + 9, suffix.end(), [](char c) { return c >= '0' && c <= '9'; });
  }
  if (name == StepLog::kFileName || name == kProfileFileName) return true;
  // write_job_profile's temporary, left by a process killed while writing it.
  const std::string profile_tmp = std::string(kProfileFileName) + ".tmp.";
  return name.size() > profile_tmp.size() && name.rfind(profile_tmp, 0) == 0 &&
         std::all_of(name.begin() + static_cast<std::ptrdiff_t>(profile_tmp.size()), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

std::string supersede_checkpoints(const std::string& dir) {
  std::vector<fs::path> moving;
  std::error_code ec;
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      // Of the kind the run writes: step-* directories, regular files (a link is not the run's).
      const std::string name = e.path().filename().string();
      const fs::file_status st = e.symlink_status(ec);
      const bool kind = name.rfind("step-", 0) == 0 ? fs::is_directory(st) : fs::is_regular_file(st);
      if (kind && is_run_file(name)) moving.push_back(e.path());
    }
  if (moving.empty()) return "";
  std::sort(moving.begin(), moving.end());
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  const fs::path target = free_name(fs::path(dir) / (std::string("superseded-") + stamp), "");
  fs::create_directory(target, ec);
  if (ec) throw std::runtime_error("checkpoint: cannot create " + target.string() + ": " + ec.message());
  for (const fs::path& path : moving) {
    fs::rename(path, target / path.filename(), ec);
    if (ec)
      throw std::runtime_error("checkpoint: cannot move " + path.string() + " into " + target.string() + ": " +
                               ec.message());
  }
  fsync_path(target.string());
  fsync_path(dir);
  return target.string();
}

nlohmann::json job_identity(const JobSpec& spec, int64_t world_size) {
  nlohmann::json config = nlohmann::json::object();
  for (const auto& [key, value] : spec.model.config) config[key] = value;
  const auto& z = spec.optimizer.zenflow;
  return {
      {"model.arch", spec.model.arch},
      {"model.from", spec.model.from},
      {"model.config", config},
      {"data.train", spec.data.train},
      {"data.val", spec.data.val},
      {"data.format", spec.data.format},
      {"data.tokenizer", spec.data.tokenizer},
      {"data.val_fraction", spec.data.val_fraction},
      {"optimizer.mode", spec.optimizer.mode},
      {"optimizer.zenflow.topk_ratio", z.topk_ratio},
      {"optimizer.zenflow.update_interval",
       z.update_interval_auto ? nlohmann::json("auto") : nlohmann::json(z.update_interval)},
      {"train.seq_len", spec.train.seq_len},
      {"train.global_batch", spec.train.micro_batch * spec.train.grad_accum * world_size},
  };
}

std::vector<std::string> identity_changes(const nlohmann::json& saved, const nlohmann::json& now,
                                          const std::vector<std::string>& allowed) {
  std::map<std::string, std::pair<nlohmann::json, nlohmann::json>> keys;
  for (const auto& [k, v] : saved.items()) keys[k].first = v;
  for (const auto& [k, v] : now.items()) keys[k].second = v;
  auto is_allowed = [&](const std::string& k) {
    if (std::find(allowed.begin(), allowed.end(), k) != allowed.end()) return true;
    // The global batch is what users change through its factors.
    return k == "train.global_batch" && std::any_of(allowed.begin(), allowed.end(), [](const std::string& a) {
             return a == "train.micro_batch" || a == "train.grad_accum";
           });
  };
  std::vector<std::string> out;
  for (const auto& [k, values] : keys) {
    if (values.first == values.second || is_allowed(k)) continue;
    auto show = [](const nlohmann::json& v) { return v.is_null() ? std::string("(none)") : v.dump(); };
    out.push_back(k + (k == "train.global_batch" ? " (train.micro_batch x train.grad_accum x ranks)" : "") + ": " +
                  show(values.first) + " -> " + show(values.second));
  }
  return out;
}

CheckpointDirLock::CheckpointDirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("checkpoint.dir: cannot create " + dir + ": " + ec.message());
  const fs::path path = fs::path(dir) / kFileName;
  // O_NOFOLLOW: a symlink planted at the lock's name must not redirect our writes.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0)
    throw std::runtime_error("checkpoint.dir: cannot create the lock file " + path.string() + ": " +
                             std::strerror(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("checkpoint.dir: " + path.string() + " is not a regular file");
  }
  auto read_owner = [&] {
    std::string text(static_cast<size_t>(std::min<off_t>(st.st_size, 4096)), '\0');
    const ssize_t n = ::pread(fd_, text.data(), text.size(), 0);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return text;
  };
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::fstat(fd_, &st);
    std::string owner = read_owner();
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw std::runtime_error("checkpoint.dir: cannot lock " + path.string() + ": " + std::strerror(err));
    std::string who = "another process";
    try {
      const nlohmann::json j = nlohmann::json::parse(owner);
      who = "zenflow pid " + std::to_string(j.at("pid").get<int64_t>()) + " on host " + j.at("host").get<std::string>() +
            " (since " + j.at("started").get<std::string>() + ")";
    } catch (const std::exception&) {
    }
    throw CheckpointDirBusy("checkpoint.dir " + dir + " is in use by " + who +
                            "; wait for that run to end, or give this one another checkpoint.dir");
  }
  // Ours now. A non-empty file that is not a zenflow lock was the user's: never overwrite it.
  const std::string previous = read_owner();
  if (!previous.empty()) {
    bool ours = false;
    try {
      ours = nlohmann::json::parse(previous).value("zenflow_lock", 0) == 1;
    } catch (const std::exception&) {
    }
    if (!ours) {
      ::close(fd_);
      fd_ = -1;
      throw std::runtime_error("checkpoint.dir: " + path.string() +
                               " exists and was not written by zenflow; it is left as it is: choose another checkpoint.dir");
    }
  }
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  char started[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const std::string text =
      nlohmann::json{{"zenflow_lock", 1}, {"host", host}, {"pid", static_cast<int64_t>(::getpid())}, {"started", started}}
          .dump() +
      "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    // The lock holds regardless; only the owner note is missing.
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

std::unique_ptr<CheckpointDirLock> lock_checkpoint_dir(
    const std::string& dir, std::chrono::milliseconds wait,
    const std::function<void(const std::string&)>& on_wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (bool first = true;; first = false) {
    try {
      return std::make_unique<CheckpointDirLock>(dir);
    } catch (const CheckpointDirBusy& e) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) throw;
      if (first && on_wait) on_wait(e.what());
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(deadline - now, std::chrono::milliseconds(100)));
    }
  }
}

}  // namespace zenflow
