// Models and data from a bucket: model.from, data.train, data.val and data.tokenizer may be
// s3:// URIs. Each is downloaded once per worker into a content-addressed cache and the job
// reads the local copy.
//
// A URI names an object (a file), or a prefix (a directory: every object under it, at its
// path relative to the prefix). An entry's key is the SHA-256 of the bucket, the key, and
// the ETag and size of every object it holds: a changed object is a new entry, an unchanged
// one is never fetched again. Objects are verified as they arrive: their size, and their
// MD5 where the ETag is one (a single-part upload's). An entry is written to a temporary
// directory and renamed into place, so a crash leaves nothing half-made under its name.
//
// Sharing: the jobs (and ranks) of a worker share the cache. While an Entry lives its
// process holds a shared lock on it (flock), which eviction respects; a second lock is held
// exclusively while an entry is looked for and made, so ranks asking at once wait for the
// first one's download instead of repeating it. Past max_bytes the least recently used
// entries that nobody holds are removed before a new one is downloaded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/storage/s3.h"

namespace zenflow::storage {

// "3000 bytes", "12 MiB", "1.5 GiB": sizes in the cache's and the runs' lines.
std::string size_text(int64_t bytes);

// Where the cache lives: `base` (--cache-dir) if given, else $ZENFLOW_CACHE_DIR, else
// $XDG_CACHE_HOME/zenflow/objects, else $HOME/.cache/zenflow/objects.
std::string object_cache_dir(const std::string& base = "");

class ObjectCache {
 public:
  ObjectCache(std::string root, int64_t max_bytes, std::shared_ptr<S3Client> client,
              std::function<void(const std::string&)> log = nullptr);

  // A fetched URI: where its copy is (a file, or a directory for a prefix), held against
  // eviction while this lives (move-only).
  class Entry {
   public:
    Entry() = default;
    Entry(Entry&& other) noexcept;
    Entry& operator=(Entry&& other) noexcept;
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    ~Entry();
    std::string path;
    int64_t bytes = 0;
    bool downloaded = false;  // false: it was in the cache already

   private:
    friend class ObjectCache;
    int lock_fd_ = -1;
  };

  // Throws S3Error (the bucket's answer), std::runtime_error naming the URI when it names
  // nothing, or an object arrives damaged, or the cache cannot be written.
  Entry fetch(const S3Uri& uri);

  // Bytes the cache's entries hold now.
  int64_t bytes() const;

 private:
  std::string root_;
  int64_t max_bytes_;
  std::shared_ptr<S3Client> client_;
  std::function<void(const std::string&)> log_;
  void evict(int64_t need);
};

}  // namespace zenflow::storage
