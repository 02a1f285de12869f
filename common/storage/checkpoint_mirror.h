// checkpoint.dir: s3://bucket/prefix. The run reads and writes its checkpoints in a local
// staging directory exactly as it would a local checkpoint.dir (the same step-N layout,
// lock, manifests and checks, checkpoint.h); a CheckpointMirror keeps the bucket in step
// with it, so a job needs no shared filesystem and resumes on any worker:
//
//  - pull(): before the run (by one rank per host), one LIST of the prefix; the newest step
//    whose manifest.json is in the bucket and whose every listed object arrives with the
//    manifest's size and CRC32C is brought into the staging directory (a file already there
//    with that size and checksum is kept, not downloaded); a damaged step is reported and
//    the previous one tried. steps.jsonl comes too when the staging directory has none.
//  - push(): after rank 0 committed a step locally, a background thread uploads it while
//    training goes on: every file (large ones as parallel multipart uploads, each part with
//    its CRC32C), then manifest.json, last and only where none exists (If-None-Match). In
//    the bucket a checkpoint exists iff its manifest does. Then steps.jsonl (replaced), then
//    the steps beyond `keep` are deleted, each manifest first. The upload reads hard links
//    of the step's files, so the local rotation of old steps cannot pull them away. One
//    upload at a time: a push while the previous one runs waits for it (the returned
//    seconds are the run's checkpoint_upload stall).
//  - push_shard(): a rank on another worker than rank 0 (each worker stages its own copy)
//    sends its engine shard of a step in the background, then a small FILE.crc32c object
//    with its checksum; rank 0's upload of that step waits for each such shard (the
//    checksum it was told over the ranks' communicator, the size the manifest says)
//    before the manifest goes up. A worker's pull brings only its own ranks' shards
//    (MirrorOptions::shard_wanted).
//  - flush(): waits for the upload in flight (at the end of the run, and on SIGTERM: a spot
//    notice gives 30 s to 2 min) and returns when the last checkpoint became durable.
//
// An upload that fails after the client's retries fails the run at the next push or flush
// (its checkpoint is not durable; nothing claims otherwise). LibTorch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/storage/s3.h"

namespace zenflow {

struct MirrorOptions {
  int64_t keep = 2;                  // checkpoint.keep: steps kept in the bucket
  storage::UploadOptions upload;     // part size, parallel parts, bandwidth
  std::function<void(const std::string&)> log;  // one line each (warnings, durability)
  // Which engine shards this worker pulls (a checkpoint's number of ranks, a shard's rank;
  // checkpoint_names.h): a worker's own ranks' when the ranks did not change, all of them
  // to re-shard. Empty: every file.
  std::function<bool(int64_t checkpoint_world_size, int rank)> shard_wanted;
  // How long a step's upload waits for the shards that ranks on other workers send
  // (push_shard) before it gives up; the step then never commits in the bucket.
  double shard_wait_s = 1800;
};

// Where a run stages a bucket's checkpoints: DIR/<bucket>/<prefix> with DIR the first of
// `base` (--staging-dir), $ZENFLOW_STAGING_DIR, $XDG_CACHE_HOME/zenflow/checkpoints,
// $HOME/.cache/zenflow/checkpoints.
std::string staging_dir_for(const storage::S3Uri& remote, const std::string& base = "");

class CheckpointMirror {
 public:
  CheckpointMirror(std::shared_ptr<storage::S3Client> client, storage::S3Uri remote, std::string local_dir,
                   MirrorOptions options);
  ~CheckpointMirror();  // waits for the upload in flight; its error is logged
  CheckpointMirror(const CheckpointMirror&) = delete;
  CheckpointMirror& operator=(const CheckpointMirror&) = delete;

  struct Pulled {
    int64_t step = -1;  // -1: the bucket holds no usable checkpoint
    int64_t bytes_downloaded = 0;
    int64_t bytes_reused = 0;  // already in the staging directory
    int64_t damaged = 0;       // newer steps skipped as damaged
  };
  // `only_step` >= 0: that step or nothing (no fallback); throws std::runtime_error when the
  // bucket has no committed step of that number.
  Pulled pull(int64_t only_step = -1);
  // Before a run resumes: pull(), then the steps in the staging directory newer than the
  // one pulled, which never reached the bucket, are deleted (a checkpoint exists iff its
  // manifest is in the bucket, and the workers must all resume from the same one). With
  // `clean_uncommitted` (rank 0's worker), the objects of steps newer than the newest
  // committed one, whose manifest never arrived, are deleted from the bucket first, so a
  // later commit of the same step cannot find them.
  Pulled pull_for_run(bool clean_uncommitted);
  // The newest step whose manifest is in the bucket (-1: none). One LIST.
  int64_t newest_remote_step();
  // Writes and deletes a small object under the prefix (rank 0, before training), so that a
  // key that may read but not write, or a prefix denied, fails before the first step rather
  // than at the first upload. Throws storage::S3Error.
  void check_writable();

  // Starts uploading `step_dir` (step `step`, committed); returns the seconds it waited for
  // the previous upload. Throws the previous upload's error.
  double push(const std::string& step_dir, int64_t step);
  // Starts uploading one engine shard of step `step` (a rank on another worker than rank
  // 0's; `crc32c` its checksum) and removes the local file; returns the seconds it waited
  // for this mirror's previous upload. Throws the previous upload's error.
  double push_shard(const std::string& shard_file, int64_t step, uint32_t crc32c);

  struct Durable {
    int64_t step = -1;          // the newest step whose manifest is in the bucket (-1: none yet)
    double seconds_to_durable = 0;  // from its push to its manifest's commit
  };
  // Waits for the upload in flight; throws its error.
  Durable flush();

  const storage::S3Uri& remote() const;
  const std::string& local_dir() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace zenflow
