#include "common/storage/checkpoint_mirror.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint_names.h"
#include "common/crc32c.h"

namespace zenflow {
namespace fs = std::filesystem;
using storage::S3Uri;

namespace {

constexpr const char* kManifest = kCheckpointManifest;
constexpr const char* kStepLog = "steps.jsonl";
constexpr int64_t kMaxManifestBytes = 16 << 20;

std::string step_name(int64_t step) { return checkpoint_step_name(step); }
int64_t step_of(const std::string& name) { return checkpoint_step_of(name); }

struct RemoteStep {
  std::map<std::string, int64_t> objects;  // file name in the step -> size
  bool committed() const { return objects.count(kManifest) != 0; }
};

// A file of the manifest: its size and CRC32C ("e3069283").
struct ListedFile {
  int64_t bytes = 0;
  std::string crc32c;
};

// The files a manifest lists; throws std::runtime_error saying what is malformed.
std::map<std::string, ListedFile> manifest_files(const std::string& text) {
  const nlohmann::json m = nlohmann::json::parse(text);
  if (!m.is_object() || !m.contains("files") || !m.at("files").is_object())
    throw std::runtime_error("manifest.json has no 'files' object");
  std::map<std::string, ListedFile> out;
  for (const auto& [name, e] : m.at("files").items()) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." || name == kManifest)
      throw std::runtime_error("manifest.json lists a file outside the checkpoint: '" + name + "'");
    if (!e.is_object() || !e.contains("bytes") || !e.contains("crc32c") || !e.at("bytes").is_number_integer() ||
        !e.at("crc32c").is_string())
      throw std::runtime_error("manifest.json's entry of " + name + " is malformed");
    out[name] = {e.at("bytes").get<int64_t>(), e.at("crc32c").get<std::string>()};
  }
  return out;
}

// The number of ranks a manifest records (0 when it has none).
int64_t manifest_world_size(const std::string& text) {
  const nlohmann::json m = nlohmann::json::parse(text);
  return m.contains("world_size") && m.at("world_size").is_number_integer() ? m.at("world_size").get<int64_t>() : 0;
}

constexpr const char* kShardChecksumSuffix = ".crc32c";  // beside a shard another worker sent

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool file_matches(const fs::path& p, const ListedFile& want) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec) || static_cast<int64_t>(fs::file_size(p, ec)) != want.bytes) return false;
  try {
    return crc32c_hex(checksum_file(p.string()).crc32c) == want.crc32c;
  } catch (const std::exception&) {
    return false;
  }
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::string staging_dir_for(const S3Uri& remote, const std::string& base) {
  const std::string dir = storage::zenflow_cache_dir(base, "ZENFLOW_STAGING_DIR", "checkpoints");
  return (fs::path(dir) / remote.bucket / remote.trimmed().key).lexically_normal().string();
}

struct CheckpointMirror::Impl {
  std::shared_ptr<storage::S3Client> client;
  S3Uri remote;  // the prefix, without a trailing '/'
  std::string local;
  MirrorOptions opt;

  std::mutex mu;
  std::condition_variable cv;
  std::thread uploader;
  bool busy = false;
  bool abandoning = false;  // the mirror is being destroyed: stop waiting for other workers
  std::exception_ptr error;
  Durable durable;

  void log(const std::string& line) const {
    if (opt.log) opt.log(line);
  }

  S3Uri step_uri(int64_t step) const { return remote.child(step_name(step)); }

  // Every step under the prefix: one LIST.
  std::map<int64_t, RemoteStep> list_steps() {
    std::map<int64_t, RemoteStep> steps;
    const std::string base = remote.key + "/";
    for (const storage::ObjectInfo& o : client->list(S3Uri{remote.bucket, base})) {
      const std::string rel = o.key.substr(base.size());
      const size_t slash = rel.find('/');
      if (slash == std::string::npos) continue;
      const int64_t step = step_of(rel.substr(0, slash));
      if (step < 0) continue;
      steps[step].objects[rel.substr(slash + 1)] = o.size;
    }
    return steps;
  }

  // Brings step `step` into local/step-N through a temporary directory; false (with the
  // reason logged) when it is damaged in the bucket.
  bool fetch_step(int64_t step, const RemoteStep& listed, Pulled* out) {
    const S3Uri dir = step_uri(step);
    std::string manifest;
    std::map<std::string, ListedFile> files;
    try {
      manifest = client->get(dir.child(kManifest), kMaxManifestBytes);
      files = manifest_files(manifest);
    } catch (const storage::S3Error&) {
      throw;
    } catch (const std::exception& e) {
      log(dir.text() + " is damaged: " + e.what() + "; trying the previous checkpoint");
      return false;
    }
    // Every object must be there with its size (one LIST says so for all workers alike);
    // this worker's files are fetched and verified by checksum.
    const int64_t world = manifest_world_size(manifest);
    auto wanted = [&](const std::string& name) {
      const int r = checkpoint_shard_rank(name);
      return r < 0 || r >= world || !opt.shard_wanted || opt.shard_wanted(world, r);
    };
    for (const auto& [name, want] : files) {
      auto it = listed.objects.find(name);
      if (it == listed.objects.end() || it->second != want.bytes) {
        log(dir.text() + " is damaged: " + name +
            (it == listed.objects.end() ? " is missing"
                                        : " is " + std::to_string(it->second) + " bytes, the manifest says " +
                                              std::to_string(want.bytes)) +
            "; trying the previous checkpoint");
        return false;
      }
    }
    const fs::path final_dir = fs::path(local) / step_name(step);
    std::error_code ec;
    if (fs::exists(final_dir / kManifest, ec) && read_file(final_dir / kManifest) == manifest) {
      bool all = true;
      for (const auto& [name, want] : files) all = all && (!wanted(name) || file_matches(final_dir / name, want));
      if (all) {
        for (const auto& [name, want] : files)
          if (wanted(name)) out->bytes_reused += want.bytes;
        return true;
      }
    }
    const fs::path tmp = fs::path(local) / (".pull-" + step_name(step));
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp);
    for (const auto& [name, want] : files) {
      if (!wanted(name)) continue;
      const fs::path have = final_dir / name;
      if (file_matches(have, want)) {  // reused: a hard link (a copy across filesystems)
        fs::create_hard_link(have, tmp / name, ec);
        if (ec) fs::copy_file(have, tmp / name, fs::copy_options::overwrite_existing);
        out->bytes_reused += want.bytes;
        continue;
      }
      const auto started = std::chrono::steady_clock::now();
      // Long downloads say how far they are, every 10 s.
      auto last = started;
      client->get_file(dir.child(name), (tmp / name).string(), [&](int64_t done, int64_t) {
        const auto now = std::chrono::steady_clock::now();
        if (now - last < std::chrono::seconds(10)) return;
        last = now;
        const double s = std::chrono::duration<double>(now - started).count();
        log("downloading " + dir.child(name).text() + ": " + std::to_string(done >> 20) + " of " +
            std::to_string(want.bytes >> 20) + " MiB (" + std::to_string(static_cast<int>(100.0 * done / std::max<int64_t>(1, want.bytes))) +
            "%, " + std::to_string(static_cast<int>(static_cast<double>(done >> 20) / s)) + " MiB/s)");
      });
      if (!file_matches(tmp / name, want)) {
        fs::remove_all(tmp, ec);
        log(dir.text() + " is damaged: " + name + " does not have the manifest's checksum " + want.crc32c +
            "; trying the previous checkpoint");
        return false;
      }
      out->bytes_downloaded += want.bytes;
      if (want.bytes >= (256 << 20))
        log("downloaded " + dir.child(name).text() + " (" + std::to_string(want.bytes >> 20) + " MiB in " +
            std::to_string(static_cast<int>(seconds_since(started))) + " s)");
    }
    {
      std::ofstream m(tmp / kManifest, std::ios::binary);
      m << manifest;
      if (!m.flush()) throw std::runtime_error("cannot write " + (tmp / kManifest).string());
    }
    if (fs::exists(final_dir, ec)) {  // a local step of the same number that is not this one
      fs::path aside = final_dir.string() + ".replaced";
      for (int n = 2; fs::exists(aside, ec); ++n) aside = final_dir.string() + ".replaced." + std::to_string(n);
      fs::rename(final_dir, aside);
      log(final_dir.string() + " differed from " + dir.text() + "; moved to " + aside.string());
    }
    fs::rename(tmp, final_dir);
    return true;
  }

  // The upload of one step (the uploader thread): files, manifest last, steps.jsonl, rotation.
  void upload(const fs::path& snapshot, int64_t step, const std::string& step_log,
              std::chrono::steady_clock::time_point pushed) {
    const S3Uri dir = step_uri(step);
    const std::string manifest = read_file(snapshot / kManifest);
    const std::map<std::string, ListedFile> files = manifest_files(manifest);
    std::vector<std::pair<std::string, ListedFile>> elsewhere;  // shards other workers send
    std::error_code ec;
    for (const auto& [name, want] : files) {
      if (checkpoint_shard_rank(name) > 0 && !fs::exists(snapshot / name, ec)) {
        elsewhere.emplace_back(name, want);
        continue;
      }
      client->put_file((snapshot / name).string(), dir.child(name), opt.upload);
    }
    for (const auto& [name, want] : elsewhere) wait_for_shard(dir, name, want);
    client->put(dir.child(kManifest), manifest, /*if_none_match=*/true);
    {
      std::lock_guard<std::mutex> lock(mu);
      durable = {step, seconds_since(pushed)};
    }
    if (!step_log.empty()) client->put(remote.child(kStepLog), step_log);
    // Rotation: the steps beyond `keep` go, each manifest first (never a step that looks
    // committed with objects missing), and the uncommitted leftovers of older steps.
    const std::map<int64_t, RemoteStep> steps = list_steps();
    int64_t kept = 0;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const auto& [s, rs] = *it;
      if (s > step) continue;  // newer than this one: not ours to judge
      if (rs.committed() && kept < opt.keep) {
        ++kept;
        continue;
      }
      if (rs.committed()) client->remove(step_uri(s).child(kManifest));
      for (const auto& [name, size] : rs.objects)
        if (name != kManifest) client->remove(step_uri(s).child(name));
    }
  }

  // A shard that a rank on another worker sends (push_shard): its checksum object, written
  // after the shard, must hold the checksum rank 0 was told, and the shard the manifest's
  // size. Polled with growing pauses, up to shard_wait_s.
  void wait_for_shard(const S3Uri& dir, const std::string& name, const ListedFile& want) {
    const auto started = std::chrono::steady_clock::now();
    auto last_log = started;
    double pause = 0.05;
    std::string seen = "nothing";
    for (;;) {
      std::optional<storage::ObjectInfo> sum = client->head(dir.child(name + kShardChecksumSuffix));
      if (sum && sum->size <= 64) {
        std::string text = client->get(dir.child(name + kShardChecksumSuffix), 64);
        while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
        const std::optional<storage::ObjectInfo> shard = client->head(dir.child(name));
        if (text == want.crc32c && shard && shard->size == want.bytes) return;
        seen = "checksum " + text + (shard ? ", " + std::to_string(shard->size) + " bytes" : ", no shard");
      }
      const double waited = seconds_since(started);
      if (waited > opt.shard_wait_s) {
        char limit[32];
        std::snprintf(limit, sizeof limit, "%g", opt.shard_wait_s);
        throw std::runtime_error(dir.child(name).text() + " did not arrive from its rank's worker within " +
                                 limit + " s (CRC32C " + want.crc32c +
                                 ", " + std::to_string(want.bytes) + " bytes wanted; found " + seen +
                                 "), so step " + dir.key.substr(dir.key.rfind('/') + 1) + " was not committed");
      }
      if (std::chrono::steady_clock::now() - last_log > std::chrono::seconds(60)) {
        last_log = std::chrono::steady_clock::now();
        log("waiting for " + dir.child(name).text() + " from its rank's worker (" +
            std::to_string(static_cast<int>(waited)) + " s so far)");
      }
      {
        std::unique_lock<std::mutex> lock(mu);
        if (cv.wait_for(lock, std::chrono::duration<double>(pause), [&] { return abandoning; }))
          throw std::runtime_error("step " + dir.key.substr(dir.key.rfind('/') + 1) +
                                   " was not committed: the run ended while it waited for " + dir.child(name).text() +
                                   " from its rank's worker");
      }
      pause = std::min(2.0, pause * 2);
    }
  }

  // Runs `job` on the uploader thread (one at a time); `snapshot` is removed after it.
  void start(const fs::path& snapshot, std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu);
      busy = true;
    }
    uploader = std::thread([this, snapshot, job = std::move(job)] {
      std::exception_ptr err;
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
      std::error_code rm;
      fs::remove_all(snapshot, rm);
      std::lock_guard<std::mutex> lock(mu);
      error = err;
      busy = false;
      cv.notify_all();
    });
  }

  Pulled pull(int64_t only_step, bool for_run, bool clean_uncommitted);

  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !busy; });
    if (uploader.joinable()) {
      lock.unlock();
      uploader.join();
      lock.lock();
    }
  }

  // One upload at a time: waits for the one in flight (the seconds since `started`, the
  // run's checkpoint_upload stall) and throws its error.
  double wait_for_previous(std::chrono::steady_clock::time_point started) {
    wait_idle();
    const double waited = seconds_since(started);
    rethrow();
    return waited;
  }

  void rethrow() {
    std::lock_guard<std::mutex> lock(mu);
    if (error) std::rethrow_exception(std::exchange(error, nullptr));
  }
};

CheckpointMirror::CheckpointMirror(std::shared_ptr<storage::S3Client> client, S3Uri remote, std::string local_dir,
                                   MirrorOptions options)
    : impl_(new Impl) {
  impl_->client = std::move(client);
  impl_->remote = remote.trimmed();
  impl_->local = std::move(local_dir);
  impl_->opt = std::move(options);
  fs::create_directories(impl_->local);
}

CheckpointMirror::~CheckpointMirror() {
  {
    // flush() was not called (the run failed): an upload still waiting for another worker's
    // shard gives up rather than hold the process for shard_wait_s.
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->abandoning = true;
    impl_->cv.notify_all();
  }
  impl_->wait_idle();
  if (impl_->error) {
    try {
      std::rethrow_exception(impl_->error);
    } catch (const std::exception& e) {
      impl_->log(std::string("checkpoint upload failed: ") + e.what());
    }
  }
}

const S3Uri& CheckpointMirror::remote() const { return impl_->remote; }
const std::string& CheckpointMirror::local_dir() const { return impl_->local; }

int64_t CheckpointMirror::newest_remote_step() {
  const auto steps = impl_->list_steps();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it)
    if (it->second.committed()) return it->first;
  return -1;
}

void CheckpointMirror::check_writable() {
  const S3Uri probe = impl_->remote.child(".zenflow-write-check-" + std::to_string(::getpid()));
  impl_->client->put(probe, "zenflow checks that it may write here; this object is deleted at once\n");
  impl_->client->remove(probe);
}

CheckpointMirror::Pulled CheckpointMirror::pull(int64_t only_step) { return impl_->pull(only_step, false, false); }

CheckpointMirror::Pulled CheckpointMirror::pull_for_run(bool clean_uncommitted) {
  return impl_->pull(-1, true, clean_uncommitted);
}

CheckpointMirror::Pulled CheckpointMirror::Impl::pull(int64_t only_step, bool for_run, bool clean_uncommitted) {
  Impl& i = *this;
  Pulled out;
  std::map<int64_t, RemoteStep> steps = i.list_steps();
  if (clean_uncommitted) {
    // Objects of steps whose manifest never arrived, newer than every committed step (an
    // upload cut short): a later commit of the same step must not find them.
    while (!steps.empty() && !steps.rbegin()->second.committed()) {
      const int64_t step = steps.rbegin()->first;
      for (const auto& [name, size] : steps.rbegin()->second.objects) i.client->remove(i.step_uri(step).child(name));
      i.log(i.step_uri(step).text() + " never committed (no " + kManifest + "): its objects were deleted");
      steps.erase(step);
    }
  }
  if (only_step >= 0 && (!steps.count(only_step) || !steps.at(only_step).committed()))
    throw std::runtime_error(i.step_uri(only_step).text() + " is not a checkpoint in the bucket (no " + kManifest + ")");
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (only_step >= 0 && it->first != only_step) continue;
    if (!it->second.committed()) continue;  // an upload that never finished
    if (i.fetch_step(it->first, it->second, &out)) {
      out.step = it->first;
      break;
    }
    ++out.damaged;
  }
  std::error_code ec;
  // Steps staged here that are newer than the bucket's: their upload never finished.
  std::vector<fs::path> unconfirmed;
  if (for_run)
    for (const auto& e : fs::directory_iterator(i.local, ec))
      if (step_of(e.path().filename().string()) > out.step && e.is_directory(ec)) unconfirmed.push_back(e.path());
  for (const fs::path& p : unconfirmed) {
    fs::remove_all(p, ec);
    i.log(p.string() + " never reached the bucket (no " + kManifest + " there): deleted; the run resumes from " +
          (out.step >= 0 ? i.step_uri(out.step).text() : std::string("step 0")));
  }
  const fs::path log_path = fs::path(i.local) / kStepLog;
  if (out.step >= 0 && !fs::exists(log_path, ec)) {
    if (i.client->head(i.remote.child(kStepLog))) {
      i.client->get_file(i.remote.child(kStepLog), log_path.string());
    }
  }
  return out;
}

double CheckpointMirror::push(const std::string& step_dir, int64_t step) {
  Impl& i = *impl_;
  const auto started = std::chrono::steady_clock::now();
  const double waited = i.wait_for_previous(started);
  // Hard links of the step's files: the local rotation may remove the step meanwhile.
  const fs::path snapshot = fs::path(i.local) / (".upload-" + step_name(step));
  std::error_code ec;
  fs::remove_all(snapshot, ec);
  fs::create_directories(snapshot);
  for (const auto& e : fs::directory_iterator(step_dir)) {
    if (!e.is_regular_file()) continue;
    fs::create_hard_link(e.path(), snapshot / e.path().filename(), ec);
    if (ec) fs::copy_file(e.path(), snapshot / e.path().filename(), fs::copy_options::overwrite_existing);
  }
  std::string step_log;
  if (fs::exists(fs::path(i.local) / kStepLog, ec)) step_log = read_file(fs::path(i.local) / kStepLog);
  i.start(snapshot, [&i, snapshot, step, step_log, started] { i.upload(snapshot, step, step_log, started); });
  return waited;
}

double CheckpointMirror::push_shard(const std::string& shard_file, int64_t step, uint32_t crc32c) {
  Impl& i = *impl_;
  const double waited = i.wait_for_previous(std::chrono::steady_clock::now());
  const fs::path file(shard_file);
  const std::string name = file.filename().string();
  const fs::path snapshot = fs::path(i.local) / (".upload-" + step_name(step) + "-" + name);
  std::error_code ec;
  fs::remove_all(snapshot, ec);
  fs::create_directories(snapshot);
  fs::rename(file, snapshot / name);  // the same filesystem: the staging directory
  // The rest of this worker's copy of the step (the checksum beside it; the directory once
  // its last rank is done) is not needed here: rank 0's worker holds the checkpoint.
  fs::remove(file.string() + kShardChecksumSuffix, ec);
  fs::remove(file.parent_path(), ec);  // only when empty
  const S3Uri dir = i.step_uri(step);
  i.start(snapshot, [&i, snapshot, name, dir, crc32c] {
    i.client->put_file((snapshot / name).string(), dir.child(name), i.opt.upload);
    i.client->put(dir.child(name + kShardChecksumSuffix), crc32c_hex(crc32c) + "\n");
  });
  return waited;
}

CheckpointMirror::Durable CheckpointMirror::flush() {
  impl_->wait_idle();
  impl_->rethrow();
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->durable;
}

}  // namespace zenflow
