#include "common/storage/object_cache.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace zenflow::storage {
namespace fs = std::filesystem;

namespace {

std::string hex(const unsigned char* d, unsigned n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out.push_back(digits[d[i] >> 4]);
    out.push_back(digits[d[i] & 15]);
  }
  return out;
}

std::string sha256_hex(const std::string& text) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_Digest(text.data(), text.size(), md, &n, EVP_sha256(), nullptr);
  return hex(md, n);
}

// MD5 of a file (what a single-part upload's ETag is), "" when it cannot be read.
std::string md5_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_md5(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  return hex(md, n);
}

bool is_md5_etag(const std::string& etag) {
  return etag.size() == 32 && std::all_of(etag.begin(), etag.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

// A key below a prefix as a relative path, or "" when it cannot be one (empty, "..", absolute).
std::string relative_path(const std::string& rel) {
  if (rel.empty() || rel.back() == '/' || rel.front() == '/') return "";
  const fs::path p(rel);
  for (const auto& part : p)
    if (part == ".." || part == ".") return "";
  return p.lexically_normal().string();
}

int open_lock(const fs::path& p) {
  return ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
}

struct Object {
  std::string key;  // full key
  std::string rel;  // its path in the entry ("" for a single object: its file name)
  int64_t size = 0;
  std::string etag;
};

}  // namespace

std::string size_text(int64_t bytes) {
  char buf[64];
  if (bytes < (1 << 20)) {
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  } else if (bytes < (int64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%lld MiB", static_cast<long long>(bytes >> 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  }
  return buf;
}

std::string object_cache_dir(const std::string& base) {
  return zenflow_cache_dir(base, "ZENFLOW_CACHE_DIR", "objects");
}

ObjectCache::Entry::Entry(Entry&& o) noexcept
    : path(std::move(o.path)), bytes(o.bytes), downloaded(o.downloaded), lock_fd_(std::exchange(o.lock_fd_, -1)) {}

ObjectCache::Entry& ObjectCache::Entry::operator=(Entry&& o) noexcept {
  if (this != &o) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    path = std::move(o.path);
    bytes = o.bytes;
    downloaded = o.downloaded;
    lock_fd_ = std::exchange(o.lock_fd_, -1);
  }
  return *this;
}

ObjectCache::Entry::~Entry() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the shared lock
}

ObjectCache::ObjectCache(std::string root, int64_t max_bytes, std::shared_ptr<S3Client> client,
                         std::function<void(const std::string&)> log)
    : root_(std::move(root)), max_bytes_(max_bytes), client_(std::move(client)), log_(std::move(log)) {
  fs::create_directories(fs::path(root_) / "entries");
}

int64_t ObjectCache::bytes() const {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(root_) / "entries", ec)) {
    if (!e.is_directory() || !fs::exists(e.path() / "meta.json")) continue;
    try {
      std::ifstream in(e.path() / "meta.json");
      total += nlohmann::json::parse(in).value("bytes", int64_t{0});
    } catch (const std::exception&) {
    }
  }
  return total;
}

void ObjectCache::evict(int64_t need) {
  struct Held {
    fs::path dir;
    int64_t bytes;
    fs::file_time_type used;
  };
  std::vector<Held> entries;
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(root_) / "entries", ec)) {
    if (!e.is_directory() || !fs::exists(e.path() / "meta.json")) continue;
    int64_t b = 0;
    try {
      std::ifstream in(e.path() / "meta.json");
      b = nlohmann::json::parse(in).value("bytes", int64_t{0});
    } catch (const std::exception&) {
    }
    entries.push_back({e.path(), b, fs::last_write_time(e.path() / "meta.json", ec)});
    total += b;
  }
  std::sort(entries.begin(), entries.end(), [](const Held& a, const Held& b) { return a.used < b.used; });
  int64_t held = 0;
  for (const Held& h : entries) {
    if (total + need <= max_bytes_) break;
    const int fd = open_lock(h.dir.string() + ".lock");
    if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      fs::remove_all(h.dir, ec);
      total -= h.bytes;
      if (log_) log_("cache: evicted " + h.dir.filename().string() + " (" + size_text(h.bytes) + ")");
    } else {
      held += h.bytes;
    }
    if (fd >= 0) ::close(fd);
  }
  if (total + need > max_bytes_ && log_)
    log_("cache: " + size_text(total + need) + " exceeds its bound of " + size_text(max_bytes_) + " (" +
         size_text(held) + " held by running jobs)");
}

ObjectCache::Entry ObjectCache::fetch(const S3Uri& uri) {
  // What the URI names: one object, or every object under it as a prefix.
  std::vector<Object> objects;
  bool single = false;
  if (!uri.key.empty() && uri.key.back() != '/') {
    if (auto info = client_->head(uri)) {
      single = true;
      const size_t slash = uri.key.rfind('/');
      objects.push_back({uri.key, uri.key.substr(slash == std::string::npos ? 0 : slash + 1), info->size, info->etag});
    }
  }
  if (!single) {
    S3Uri prefix = uri;
    if (!prefix.key.empty() && prefix.key.back() != '/') prefix.key += '/';
    for (const ObjectInfo& o : client_->list(prefix)) {
      const std::string rel = relative_path(o.key.substr(prefix.key.size()));
      if (rel.empty()) continue;  // a "directory" marker, or a key that is no relative path
      objects.push_back({o.key, rel, o.size, o.etag});
    }
    if (objects.empty()) throw std::runtime_error(uri.text() + ": no object has this key or this prefix");
  }
  std::string identity = uri.bucket + "\n" + uri.key + "\n";
  int64_t total = 0;
  for (const Object& o : objects) {
    identity += o.rel + "\t" + o.etag + "\t" + std::to_string(o.size) + "\n";
    total += o.size;
  }
  const std::string name = sha256_hex(identity);
  const fs::path dir = fs::path(root_) / "entries" / name;
  const fs::path data = dir / "data";

  // Two locks per entry: `.lock`, held shared by every process using the entry (eviction
  // takes it exclusively, without waiting, and skips an entry it cannot get); `.download`,
  // held exclusively while one process looks for the entry and makes it, so that processes
  // asking at once wait for one download instead of repeating it.
  Entry entry;
  entry.path = single ? (data / objects[0].rel).string() : data.string();
  entry.bytes = total;
  entry.lock_fd_ = open_lock(dir.string() + ".lock");
  if (entry.lock_fd_ < 0 || ::flock(entry.lock_fd_, LOCK_SH) != 0)
    throw std::runtime_error("cache: cannot lock " + dir.string() + ".lock: " + std::strerror(errno));
  struct DownloadLock {
    int fd;
    ~DownloadLock() {
      if (fd >= 0) ::close(fd);
    }
  } download{open_lock(dir.string() + ".download")};
  if (download.fd < 0 || ::flock(download.fd, LOCK_EX) != 0)
    throw std::runtime_error("cache: cannot lock " + dir.string() + ".download: " + std::strerror(errno));
  std::error_code ec;
  if (fs::exists(dir / "meta.json", ec)) {  // here already: used now
    fs::last_write_time(dir / "meta.json", fs::file_time_type::clock::now(), ec);
    return entry;
  }
  evict(total);
  const fs::path tmp = fs::path(root_) / "entries" / (name + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp / "data");
  const auto started = std::chrono::steady_clock::now();
  auto last = started;
  int64_t before = 0;
  try {
    for (const Object& o : objects) {
      const fs::path dest = tmp / "data" / o.rel;
      fs::create_directories(dest.parent_path());
      const S3Uri src{uri.bucket, o.key};
      const ObjectInfo got = client_->get_file(src, dest.string(), [&](int64_t done, int64_t) {
        const auto now = std::chrono::steady_clock::now();
        if (!log_ || now - last < std::chrono::seconds(10)) return;
        last = now;
        const int64_t all = before + done;
        log_("downloading " + uri.text() + ": " + std::to_string(all >> 20) + " of " + std::to_string(total >> 20) +
             " MiB (" + std::to_string(static_cast<int>(100.0 * all / std::max<int64_t>(1, total))) + "%)");
      });
      if (got.size != o.size)
        throw std::runtime_error(src.text() + ": " + std::to_string(got.size) + " bytes arrived, the listing says " +
                                 std::to_string(o.size));
      if (is_md5_etag(o.etag) && md5_file(dest) != o.etag)
        throw std::runtime_error(src.text() + ": the bytes that arrived do not match its ETag " + o.etag +
                                 " (MD5): damaged in transit, or replaced while it was read");
      before += o.size;
    }
    std::ofstream meta(tmp / "meta.json");
    meta << nlohmann::json({{"uri", uri.text()}, {"bytes", total}, {"objects", objects.size()}}).dump() << "\n";
    if (!meta.flush()) throw std::runtime_error("cache: cannot write " + (tmp / "meta.json").string());
    meta.close();
    fs::rename(tmp, dir);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  if (log_ && total >= (64 << 20))
    log_("downloaded " + uri.text() + " (" + size_text(total) + " in " +
         std::to_string(static_cast<int>(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count())) +
         " s) into the cache");
  entry.downloaded = true;
  return entry;
}

}  // namespace zenflow::storage
