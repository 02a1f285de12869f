// What the coordinator has handed out, kept beside its database (DB.ids) where a lost WAL
// tail or a restored copy of the database cannot take it back: the job numbers and worker
// incarnations reserved so far, and how many times the coordinator has started.
//
// The store alone cannot say that an id was issued: a truncated WAL loses the newest rows,
// and with them the evidence, so the next submit would get a number an acknowledged job had.
// So ids are reserved in blocks before they are issued: the file names a ceiling below which
// every id may have been issued, synced before the first id of a block goes out. A restart
// issues from the ceiling up, never below it, and a store whose newest job is below what the
// file says was issued has lost acknowledged jobs (said loudly at load).
//
// The start count qualifies every assignment revision (start << 32 | n), so an agent's
// revision from before a restart is always older than the restarted coordinator's.
//
// Thread safety: none; the coordinator calls it under its lock.
#pragma once

#include <cstdint>
#include <string>

namespace zenflow::server {

struct IssuedMarks {
  int64_t starts = 0;               // coordinator starts on this database
  int64_t job_seq_ceiling = 0;      // no job number at or above it was ever issued
  int64_t job_seq_issued = 0;       // numbers below it were issued (a block was started)
  int64_t incarnation_ceiling = 0;  // likewise for worker incarnations
};

class IssuedIds {
 public:
  // Reads `path` when it exists (a missing file: all zero). StoreError for a file that
  // exists but cannot be read or is not one this coordinator wrote.
  explicit IssuedIds(std::string path);
  const IssuedMarks& marks() const { return marks_; }
  // Replaces the file with `m` atomically and durably (a temporary file, fsync, rename,
  // fsync of the directory); StoreError on failure, leaving the old file in place.
  void write(const IssuedMarks& m);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  IssuedMarks marks_;
};

}  // namespace zenflow::server
