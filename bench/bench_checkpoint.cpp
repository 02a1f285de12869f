// `zenflow bench checkpoint`: what checksummed checkpoints cost — CRC32C throughput in
// memory, from the page cache and from disk (beside the disk's plain read speed), and the
// time to save and to verify + load a checkpoint of a given size.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/commands.h"
#include "common/crc32c.h"
#include "common/input_file.h"
#include "common/remove_tree.h"
#include "common/checkpoint_names.h"
#include "worker/rank/checkpoint.h"
#if ZENFLOW_HAVE_S3
#include "common/storage/checkpoint_mirror.h"
#include "common/storage/s3.h"
#endif
#include "worker/model/safetensors.h"

namespace zenflow::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct CheckpointBenchArgs {
  int64_t bytes = int64_t{1} << 30;
  std::string dir;
  int reps = 3;
  std::string to;  // s3://BUCKET/PREFIX: upload and download too, beside the AWS CLI
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Drops a file's clean pages from the page cache (no root needed for a file we wrote), so
// the next read comes from the disk.
void evict(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Plain sequential read of a file in 4 MiB blocks: the yardstick for checksumming it.
int64_t read_all(const fs::path& file) {
  const int fd = open_regular_file(file.string());
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<char[]> buf(new char[4 << 20]);
  int64_t total = 0;
  for (ssize_t n; (n = ::read(fd, buf.get(), 4 << 20)) > 0;) total += n;
  ::close(fd);
  return total;
}

std::vector<fs::path> files_of(const fs::path& step_dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(step_dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

#if ZENFLOW_HAVE_S3
// Seconds a shell command took; throws naming it when it fails.
double timed_command(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  return seconds_since(t0);
}

// --to s3://BUCKET/PREFIX: the step directory's upload (push, then flush: from written to
// durable) and download (pull, verified) through the checkpoint mirror, each beside the AWS
// CLI's `aws s3 cp --recursive` of the same files to and from the same server, in turns.
// Everything it writes to the bucket goes under PREFIX/zenflow-bench-PID/ and is deleted.
json s3_bench(const CheckpointBenchArgs& a, const fs::path& step_dir, int64_t bytes, const fs::path& root) {
  auto client = std::make_shared<storage::S3Client>(storage::s3_settings_from_environment());
  const storage::S3Uri base = storage::parse_s3_uri(a.to).trimmed().child("zenflow-bench-" + std::to_string(::getpid()));
  const std::string endpoint = client->settings().path_style ? " --endpoint-url " + client->settings().endpoint : "";
  const bool have_aws = std::system("command -v aws >/dev/null 2>&1") == 0;
  std::vector<double> up, down, aws_up, aws_down;
  const int64_t step = checkpoint_step_of(step_dir.filename().string());
  for (int r = 0; r < a.reps; ++r) {
    const storage::S3Uri mine = base.child("zenflow-" + std::to_string(r)), theirs = base.child("aws-" + std::to_string(r));
    const fs::path stage = root / ("stage-" + std::to_string(r));
    fs::create_directories(stage);
    {
      CheckpointMirror m(client, mine, stage.string(), MirrorOptions{});
      auto t0 = std::chrono::steady_clock::now();
      m.push(step_dir.string(), step);
      m.flush();
      up.push_back(seconds_since(t0));
    }
    {
      CheckpointMirror m(client, mine, (root / ("pull-" + std::to_string(r))).string(), MirrorOptions{});
      auto t0 = std::chrono::steady_clock::now();
      if (m.pull().step != step) throw std::runtime_error("the uploaded step did not come back from " + mine.text());
      down.push_back(seconds_since(t0));
    }
    if (have_aws) {
      aws_up.push_back(timed_command("aws s3 cp --recursive --only-show-errors" + endpoint + " '" + step_dir.string() +
                                     "' '" + theirs.text() + "/'"));
      aws_down.push_back(timed_command("aws s3 cp --recursive --only-show-errors" + endpoint + " '" + theirs.text() +
                                       "/' '" + (root / ("aws-" + std::to_string(r))).string() + "'"));
    }
    std::cerr << "zenflow bench checkpoint: s3 rep " << (r + 1) << "/" << a.reps << ": upload " << up.back()
              << " s, download " << down.back() << " s";
    if (have_aws) std::cerr << "; aws s3 cp: upload " << aws_up.back() << " s, download " << aws_down.back() << " s";
    std::cerr << "\n";
    fs::remove_all(root / ("pull-" + std::to_string(r)));
    fs::remove_all(root / ("aws-" + std::to_string(r)));
  }
  for (const storage::ObjectInfo& o : client->list(storage::S3Uri{base.bucket, base.key + "/"}))
    client->remove(storage::S3Uri{base.bucket, o.key});
  const double mib = static_cast<double>(bytes) / (1 << 20);
  json out = {{"to", a.to},
              {"endpoint", client->settings().endpoint},
              {"upload_seconds", median(up)},
              {"upload_mib_per_s", mib / median(up)},
              {"download_seconds", median(down)},
              {"download_mib_per_s", mib / median(down)}};
  if (have_aws) {
    out["aws_upload_mib_per_s"] = mib / median(aws_up);
    out["aws_download_mib_per_s"] = mib / median(aws_down);
    out["upload_vs_aws"] = median(aws_up) / median(up);
    out["download_vs_aws"] = median(aws_down) / median(down);
  } else {
    out["aws"] = "the aws CLI is not on PATH: no comparison";
  }
  return out;
}
#endif

int run_checkpoint_bench(const CheckpointBenchArgs& a) {
  // A directory of our own inside --dir: nothing of the user's is touched.
  const fs::path root = (a.dir.empty() ? fs::temp_directory_path() : fs::path(a.dir)) /
                        ("zenflow-bench-checkpoint-" + std::to_string(::getpid()));
  if (fs::exists(root)) throw std::runtime_error(root.string() + " already exists");
  const double gb = 1e9;
  json out = {{"bench", "checkpoint"}, {"bytes", a.bytes}, {"dir", root.string()},
              {"crc32c_hardware", crc32c_hardware()}, {"reps", a.reps}};

  // In memory: the checksum alone, hardware and portable.
  {
    const int64_t n = std::min<int64_t>(a.bytes, int64_t{256} << 20);
    std::vector<unsigned char> buf(static_cast<size_t>(n));
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 2654435761u >> 24);
    std::vector<double> hw, sw;
    uint32_t sink = 0;
    for (int r = 0; r < a.reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      sink ^= crc32c(buf.data(), buf.size());
      hw.push_back(seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      sink ^= crc32c_extend_portable(0, buf.data(), buf.size());
      sw.push_back(seconds_since(t0));
    }
    out["memory_gb_per_s"] = static_cast<double>(n) / median(hw) / gb;
    out["memory_portable_gb_per_s"] = static_cast<double>(n) / median(sw) / gb;
    out["memory_sample_bytes"] = n;
    out["sink"] = sink == 0xFFFFFFFFu;  // keeps the loops from being optimised away
  }

  // A checkpoint of about `bytes`: a quarter weights, three quarters optimizer state (the
  // proportions of fp32 weights with fp32 master-free Adam moments and accumulators).
  CheckpointContents contents;
  const int64_t elems = a.bytes / 4;
  const int64_t cols = 4096;
  const int64_t model_rows = std::max<int64_t>(1, elems / 4 / cols), engine_rows = std::max<int64_t>(1, elems * 3 / 4 / cols);
  contents.model = {{"model.weight", at::randn({model_rows, cols})}};
  contents.engine = {{"engine.m", at::randn({engine_rows / 2, cols})},
                     {"engine.v", at::rand({engine_rows - engine_rows / 2, cols})}};
  contents.trainer = {{"loader_epoch", 0}, {"loader_index", 0}, {"losses", std::vector<double>(100, 2.0)}};
  contents.run_yaml = "name: bench\n";
  contents.identity = {{"bench", true}};

  std::vector<double> save, load, plain, hot, cold, disk;
  int64_t total = 0;
  std::string last;
  for (int r = 0; r < a.reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    const std::string path = write_checkpoint(root.string(), r + 1, contents, 1);
    save.push_back(seconds_since(t0));
    last = path;
    const auto files = files_of(path);
    total = 0;
    for (const auto& f : files) total += static_cast<int64_t>(fs::file_size(f));

    // From the page cache: what commit_checkpoint adds after writing, what load adds on a warm cache.
    t0 = std::chrono::steady_clock::now();
    for (const auto& f : files) checksum_file(f.string());
    hot.push_back(seconds_since(t0));

    // From the disk: a plain read, then the checksum, each after evicting the files.
    for (const auto& f : files) evict(f);
    t0 = std::chrono::steady_clock::now();
    for (const auto& f : files) read_all(f);
    disk.push_back(seconds_since(t0));
    for (const auto& f : files) evict(f);
    t0 = std::chrono::steady_clock::now();
    for (const auto& f : files) checksum_file(f.string());
    cold.push_back(seconds_since(t0));

    // Verify + load (checksums, field checks, finite checks, model copy), warm; and beside
    // it what loading took before checkpoints were verified: open, validate headers, copy.
    t0 = std::chrono::steady_clock::now();
    const Checkpoint c = load_checkpoint(path);
    load.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    {
      model::SafetensorsFile weights((fs::path(path) / "model.safetensors").string());
      NamedTensors copy;
      for (const auto& name : weights.names()) copy.emplace_back(name, weights.tensor(name).clone());
      model::SafetensorsFile engine((fs::path(path) / "engine.safetensors").string());
    }
    plain.push_back(seconds_since(t0));
    std::cerr << "zenflow bench checkpoint: rep " << (r + 1) << "/" << a.reps << ": " << format_bytes(total)
              << ", save " << save.back() << " s, checksum (cached) " << hot.back() << " s, disk read "
              << disk.back() << " s, checksum (disk) " << cold.back() << " s, verify+load " << load.back() << " s\n";
  }
  const double bytes = static_cast<double>(total);
  out["checkpoint_bytes"] = total;
  out["save_seconds"] = median(save);
  out["checksum_cached_seconds"] = median(hot);
  out["checksum_cached_gb_per_s"] = bytes / median(hot) / gb;
  out["disk_read_gb_per_s"] = bytes / median(disk) / gb;
  out["checksum_disk_gb_per_s"] = bytes / median(cold) / gb;
  out["checksum_disk_vs_read"] = median(disk) / median(cold);
  out["verify_load_seconds"] = median(load);
  out["unverified_load_seconds"] = median(plain);
  out["verify_added_seconds"] = median(load) - median(plain);
  out["checksum_share_of_save"] = median(hot) / median(save);
  if (!a.to.empty()) {
#if ZENFLOW_HAVE_S3
    try {
      out["s3"] = s3_bench(a, last, total, root);
    } catch (const std::exception& e) {
      zenflow::remove_tree(root);
      std::cerr << "zenflow bench checkpoint: --to " << a.to << ": " << e.what() << "\n";
      return kExitFailure;
    }
#else
    zenflow::remove_tree(root);
    std::cerr << "zenflow bench checkpoint: --to: this build has no s3:// support (libcurl4-openssl-dev and "
                 "libexpat1-dev were not found when it was built)\n";
    return kExitBadInput;
#endif
  }
  zenflow::remove_tree(root);
  std::cout << out.dump() << std::endl;
  return kExitOk;
}

const CommandRegistrar kCheckpointBench(60, [](CommandContext& ctx) {
  auto args = std::make_shared<CheckpointBenchArgs>();
  CLI::App* cmd = ctx.bench->add_subcommand("checkpoint", "CRC32C and checkpoint save/verify throughput (JSON)");
  cmd->add_option("--bytes", args->bytes, "Checkpoint size in bytes (default 1 GiB)")->check(CLI::Range(int64_t{4096}, int64_t{1} << 40));
  cmd->add_option("--dir", args->dir, "Directory to write it in, in a subdirectory of its own that is removed after "
                  "(default: the temporary directory)");
  cmd->add_option("--reps", args->reps, "Repetitions (medians are printed)")->check(CLI::Range(1, 100));
  cmd->add_option("--to", args->to,
                  "s3://BUCKET/PREFIX: also upload and download the checkpoint there (AWS_* settings), beside "
                  "`aws s3 cp --recursive` of the same files; what it writes there is deleted");
  CommandContext* context = &ctx;
  cmd->callback([args, context] { context->exit_code = run_checkpoint_bench(*args); });
});

}  // namespace
}  // namespace zenflow::cli
