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
      for (const auto& [name, want] : files) all = all && file_matches(final_dir / name, want);
      if (all) {
        for (const auto& [name, want] : files) out->bytes_reused += want.bytes;
        return true;
      }
    }
    const fs::path tmp = fs::path(local) / (".pull-" + step_name(step));
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp);
    for (const auto& [name, want] : files) {
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
    for (const auto& [name, want] : files) client->put_file((snapshot / name).string(), dir.child(name), opt.upload);
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

  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !busy; });
    if (uploader.joinable()) {
      lock.unlock();
      uploader.join();
      lock.lock();
    }
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

CheckpointMirror::Pulled CheckpointMirror::pull(int64_t only_step) {
  Impl& i = *impl_;
  Pulled out;
  const std::map<int64_t, RemoteStep> steps = i.list_steps();
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
  i.wait_idle();
  const double waited = seconds_since(started);
  i.rethrow();
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
  {
    std::lock_guard<std::mutex> lock(i.mu);
    i.busy = true;
  }
  i.uploader = std::thread([&i, snapshot, step, step_log, started] {
    std::exception_ptr error;
    try {
      i.upload(snapshot, step, step_log, started);
    } catch (...) {
      error = std::current_exception();
    }
    std::error_code rm;
    fs::remove_all(snapshot, rm);
    std::lock_guard<std::mutex> lock(i.mu);
    i.error = error;
    i.busy = false;
    i.cv.notify_all();
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
