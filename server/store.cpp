// SqliteStore: store.h's Store on one SQLite connection in WAL mode.
//
// What makes a commit durable. Every commit(batch) is one BEGIN IMMEDIATE ... COMMIT. In WAL
// mode a transaction is committed once its frames, ending in a commit frame, are in the -wal
// file; the database file itself is only written later, by checkpoints.
// - synchronous=FULL (the default): SQLite fsyncs the WAL before COMMIT returns, so a commit
//   that returned survives a process crash, an OS crash and power loss. The first sync of a
//   newly created WAL also fsyncs its directory, which holds the database file too.
// - synchronous=NORMAL (SqliteOptions::synchronous_full = false): the WAL is synced only at
//   checkpoints. A returned commit survives the process being killed (its frames are in the
//   OS page cache, which outlives the process), but may roll back after an OS crash or power
//   loss. The database is consistent either way; only the last commits can be lost.
// A kill -9 test cannot tell the two apart (tests/test_store.cpp kills real processes, so it
// pins crash durability and atomicity; power-loss durability rests on FULL's fsync).
//
// One coordinator per database: an flock on PATH.lock, held for the Store's lifetime, refuses
// a second opener instead of letting two coordinators interleave their writes (SQLite's own
// locking would serialize them but not stop both from scheduling the same jobs). The lock file
// stays behind when the Store closes: removing it would let a third opener lock a fresh file
// while a second still holds the old one. It is O_CLOEXEC, so programs the coordinator
// execs do not keep the database locked after it dies.
#include "server/store.h"

#include "common/utf8.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <iterator>
#include <limits>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace zenflow::server {
namespace {

// A step of the schema, applied in order in its own transaction and recorded in
// PRAGMA user_version. A new version is one more entry at the end; entries are never edited
// once released, since databases out there are already past them.
struct Migration {
  int version;
  const char* sql;
};

// STRICT tables: a value of the wrong type is refused instead of stored. Doubles are stored
// as their IEEE-754 bits: SQLite binds NaN as NULL and stores an integral REAL such as -0.0
// as the integer 0, so a REAL column would not give the same bits back. Log data and worker
// resources are BLOBs: arbitrary bytes. Every other string is TEXT bound with its length, so
// it comes back byte for byte too.
const Migration kMigrations[] = {
    {1, R"sql(
CREATE TABLE jobs (
  id TEXT PRIMARY KEY NOT NULL,
  request_id TEXT NOT NULL,
  name TEXT NOT NULL,
  spec_yaml TEXT NOT NULL,
  state TEXT NOT NULL,
  priority INTEGER NOT NULL,
  submit_seq INTEGER NOT NULL,
  submit_time_ms INTEGER NOT NULL,
  start_time_ms INTEGER NOT NULL,
  end_time_ms INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  restarts INTEGER NOT NULL,
  preemptions INTEGER NOT NULL,
  placement TEXT NOT NULL,  -- netstrings: "<length>:<name>," per worker
  master_port INTEGER NOT NULL,
  host_memory_bytes_per_worker INTEGER NOT NULL,
  step INTEGER NOT NULL,
  total_steps INTEGER NOT NULL,
  resumed_from_step INTEGER NOT NULL,
  last_loss_bits INTEGER NOT NULL,
  cost_usd_bits INTEGER NOT NULL,
  last_error TEXT NOT NULL,
  stop_reason TEXT NOT NULL,
  exit_code INTEGER NOT NULL,
  revision INTEGER NOT NULL
) STRICT;
-- The idempotency key: one job per request_id, and any number without one.
CREATE UNIQUE INDEX jobs_by_request_id ON jobs (request_id) WHERE request_id != '';
CREATE INDEX jobs_by_state ON jobs (state);

CREATE TABLE workers (
  name TEXT PRIMARY KEY NOT NULL,
  role TEXT NOT NULL,
  resources BLOB NOT NULL,
  address TEXT NOT NULL,
  rendezvous_ports TEXT NOT NULL,  -- decimal, comma-separated
  incarnation INTEGER NOT NULL,
  registered_ms INTEGER NOT NULL,
  state TEXT NOT NULL
) STRICT;

-- A job's log is its rows in job_offset order, each starting where the previous one ends.
CREATE TABLE logs (
  job_id TEXT NOT NULL REFERENCES jobs (id),
  job_offset INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  attempt_offset INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (job_id, job_offset)
) STRICT;
)sql"},
    {2, R"sql(
-- A job's spec facts (JobRecord): a restart reads these instead of parsing every spec.
-- Rows from version 1 get the "not recorded" defaults; the coordinator fills them in.
ALTER TABLE jobs ADD COLUMN checkpoint_dir TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN device TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN workers INTEGER NOT NULL DEFAULT -1;
ALTER TABLE jobs ADD COLUMN gpus_per_worker INTEGER NOT NULL DEFAULT -1;
ALTER TABLE jobs ADD COLUMN max_restarts INTEGER NOT NULL DEFAULT -1;
-- Cost across attempts (doubles as bits; 0 is the bits of 0.0).
ALTER TABLE jobs ADD COLUMN usd_per_hour_bits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN price_source TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN usd_lost_to_restarts_bits INTEGER NOT NULL DEFAULT 0;
)sql"},
    {3, R"sql(
-- Optimizer nodes a job needs and holds (scheduler rule 8).
ALTER TABLE jobs ADD COLUMN optimizer_nodes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN node_memory_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN node_placement TEXT NOT NULL DEFAULT '';  -- netstrings, as placement
-- A job's profile (`zenflow advise JOB_ID`): the newest attempt's, one row per job.
CREATE TABLE profiles (
  job_id TEXT PRIMARY KEY NOT NULL REFERENCES jobs (id),
  attempt INTEGER NOT NULL,
  yaml TEXT NOT NULL,
  received_ms INTEGER NOT NULL
) STRICT;
)sql"},
    {4, R"sql(
-- The trainer's last reported figures, kept past the attempt (doubles as bits).
ALTER TABLE jobs ADD COLUMN stall_share_bits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN tokens_per_second_bits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN tokens_per_step_bits INTEGER NOT NULL DEFAULT 0;
)sql"},
    {5, R"sql(
-- Nothing reads jobs by state (a restart loads every job), and its entry was rewritten with
-- every transition and progress write: a submit's commit wrote 5.25 pages, now 4; a job
-- update 3, now 1 with request_id no longer rewritten (SqliteStore::write_job).
DROP INDEX jobs_by_state;
)sql"},
    {6, R"sql(
-- No second live attempt: a job whose worker went silent waits for that worker's self-fence
-- (fence_until_ms); the worker's bound comes with its registration (fence_ms).
ALTER TABLE jobs ADD COLUMN fence_until_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN fence_ms INTEGER NOT NULL DEFAULT 0;
-- resources.hang_timeout (0: auto), sent with every assignment; the job log's cap.
ALTER TABLE jobs ADD COLUMN hang_timeout INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN log_dropped_bytes INTEGER NOT NULL DEFAULT 0;
-- A coordinator before this version stored freed heap bytes as a failed job's last_error
-- (invalid UTF-8, which made every ListJobs page holding the row fail): repaired here.
UPDATE jobs SET last_error = zenflow_valid_utf8(last_error) WHERE last_error != zenflow_valid_utf8(last_error);
UPDATE jobs SET stop_reason = zenflow_valid_utf8(stop_reason) WHERE stop_reason != zenflow_valid_utf8(stop_reason);
UPDATE jobs SET name = zenflow_valid_utf8(name) WHERE name != zenflow_valid_utf8(name);
)sql"},
    {7, R"sql(
-- A worker's session (RegisterWorkerResponse.session), as its SHA-256: every later
-- WorkerService call of that incarnation presents the session. Rows from before hold none:
-- their agents are told to register again.
ALTER TABLE workers ADD COLUMN session_digest BLOB NOT NULL DEFAULT x'';
-- The current attempt's secret for its optimizer nodes (Assignment.node_secret): handed to
-- the nodes and the agents again after a restart. Rows from before hold none: their attempts
-- get one when they are placed again.
ALTER TABLE jobs ADD COLUMN node_secret TEXT NOT NULL DEFAULT '';
)sql"},
    {8, R"sql(
-- The directories a worker lets job specs read or write (RegisterWorkerRequest.allowed_roots),
-- netstrings as in placement. Rows from before hold none: unconfined, until the agent
-- registers again.
ALTER TABLE workers ADD COLUMN allowed_roots TEXT NOT NULL DEFAULT '';
)sql"},
};

constexpr int kBusyTimeoutMs = 5000;  // only a reader such as the sqlite3 shell can hold a lock

// The columns in the order write_job/write_worker bind them and read_job/read_worker read them.
// clang-format off
constexpr const char* kJobColumns[] = {
    "id", "request_id", "name", "spec_yaml", "state", "priority", "submit_seq", "submit_time_ms",
    "start_time_ms", "end_time_ms", "attempt", "restarts", "preemptions", "placement", "master_port",
    "host_memory_bytes_per_worker", "step", "total_steps", "resumed_from_step", "last_loss_bits",
    "cost_usd_bits", "last_error", "stop_reason", "exit_code", "revision", "checkpoint_dir", "device", "workers",
    "gpus_per_worker", "max_restarts", "usd_per_hour_bits", "price_source", "usd_lost_to_restarts_bits",
    "optimizer_nodes", "node_memory_bytes", "node_placement", "stall_share_bits", "tokens_per_second_bits",
    "tokens_per_step_bits", "fence_until_ms", "hang_timeout", "log_dropped_bytes", "node_secret"};
constexpr const char* kWorkerColumns[] = {
    "name", "role", "resources", "address", "rendezvous_ports", "incarnation", "registered_ms", "state",
    "fence_ms", "session_digest", "allowed_roots"};
// clang-format on

// INSERT ... ON CONFLICT (key) DO UPDATE: replaces the row with that key and nothing else.
// (INSERT OR REPLACE would also delete a row that conflicts on another unique index, i.e.
// silently drop the job that already holds a request_id.) A `kept` column is not in the
// SET list, so that an update leaves its index entry unwritten (SQLite rewrites the entry
// of every indexed column the SET names, changed or not); the statement returns the stored
// value, and the caller writes it separately where it differs.
template <size_t N>
std::string upsert_sql(const char* table, const char* const (&columns)[N], const char* kept = nullptr) {
  std::string names, params, updates;
  for (size_t i = 0; i < N; ++i) {
    const std::string sep = i == 0 ? "" : ", ";
    names += sep + columns[i];
    params += sep + "?" + std::to_string(i + 1);
    if (i > 0 && (kept == nullptr || std::strcmp(columns[i], kept) != 0))
      updates += (updates.empty() ? "" : ", ") + std::string(columns[i]) + " = excluded." + columns[i];
  }
  return "INSERT INTO " + std::string(table) + " (" + names + ") VALUES (" + params + ") ON CONFLICT (" +
         columns[0] + ") DO UPDATE SET " + updates +
         (kept == nullptr ? "" : std::string(" RETURNING ") + kept);
}

template <size_t N>
std::string select_sql(const char* table, const char* const (&columns)[N], const char* order) {
  std::string names;
  for (size_t i = 0; i < N; ++i) names += std::string(i == 0 ? "" : ", ") + columns[i];
  return "SELECT " + names + " FROM " + table + " ORDER BY " + order;
}

int64_t double_bits(double d) {
  int64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}
double bits_double(int64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// Names as netstrings ("2:w1,3:w10,"): placements, allowed roots; a name may hold any byte,
// a comma too.
std::string encode_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += std::to_string(n.size()) + ":" + n + ",";
  return out;
}
bool decode_names(const std::string& s, std::vector<std::string>& out) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t len = 0;
    const auto [p, ec] = std::from_chars(s.data() + pos, s.data() + s.size(), len);
    const size_t colon = static_cast<size_t>(p - s.data());
    if (ec != std::errc() || colon == pos || colon >= s.size() || s[colon] != ':' ||
        len > s.size() - colon - 1 || s.size() - colon - 1 - len < 1 || s[colon + 1 + len] != ',')
      return false;
    out.push_back(s.substr(colon + 1, len));
    pos = colon + 2 + len;
  }
  return true;
}

std::string encode_ports(const std::vector<int64_t>& ports) {
  std::string out;
  for (size_t i = 0; i < ports.size(); ++i) out += (i == 0 ? "" : ",") + std::to_string(ports[i]);
  return out;
}
bool decode_ports(const std::string& s, std::vector<int64_t>& out) {
  if (s.empty()) return true;
  const char* p = s.data();
  const char* end = s.data() + s.size();
  while (true) {
    int64_t port = 0;
    const auto [next, ec] = std::from_chars(p, end, port);
    if (ec != std::errc()) return false;
    out.push_back(port);
    if (next == end) return true;
    if (*next != ',') return false;
    p = next + 1;
  }
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

struct StatementDeleter {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using Statement = std::unique_ptr<sqlite3_stmt, StatementDeleter>;

struct ConnectionDeleter {
  void operator()(sqlite3* db) const { sqlite3_close(db); }  // statements are finalized first
};

// Resets a statement when the call that stepped it ends, however it ends: a statement left
// mid-step keeps its read transaction (and its bound values) open.
class StepScope {
 public:
  explicit StepScope(sqlite3_stmt* s) : s_(s) {}
  ~StepScope() { sqlite3_reset(s_); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  sqlite3_stmt* s_;
};

// Binds parameters 1, 2, ... in order.
class Binder {
 public:
  explicit Binder(sqlite3_stmt* s) : s_(s) {}
  int text(const std::string& v) {
    if (too_big(v)) {
      ++i_;
      return SQLITE_TOOBIG;
    }
    return sqlite3_bind_text(s_, i_++, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
  }
  // std::string::data() is never null, so "" binds a zero-length blob, not NULL.
  int blob(const std::string& v) {
    if (too_big(v)) {
      ++i_;
      return SQLITE_TOOBIG;
    }
    return sqlite3_bind_blob(s_, i_++, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
  }
  int integer(int64_t v) { return sqlite3_bind_int64(s_, i_++, v); }

 private:
  // Lengths are ints in the C API; SQLite refuses what is over its own (smaller) limit.
  static bool too_big(const std::string& v) {
    return v.size() > static_cast<size_t>(std::numeric_limits<int>::max());
  }
  sqlite3_stmt* s_;
  int i_ = 1;
};

class Row {
 public:
  explicit Row(sqlite3_stmt* s) : s_(s) {}
  std::string text() {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, i_));
    const int n = sqlite3_column_bytes(s_, i_++);
    return p == nullptr ? std::string() : std::string(p, static_cast<size_t>(n));
  }
  std::string blob() {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(s_, i_));  // null when empty
    const int n = sqlite3_column_bytes(s_, i_++);
    return p == nullptr ? std::string() : std::string(p, static_cast<size_t>(n));
  }
  int64_t integer() { return sqlite3_column_int64(s_, i_++); }

 private:
  sqlite3_stmt* s_;
  int i_ = 0;
};

// The exclusive lock on PATH.lock that makes one Store per database. flock is held by the
// open file description: it is released when the fd closes, including when the process dies,
// and a second open() of the file, even in the same process, conflicts with it.
class CoordinatorLock {
 public:
  explicit CoordinatorLock(const std::string& db_path) {
    const std::string lock_path = db_path + ".lock";
    fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw StoreError("database " + db_path + ": cannot open " + lock_path + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = read_holder();
      ::close(fd_);
      if (err == EWOULDBLOCK)
        throw StoreError("database " + db_path + " is in use by another coordinator (" + lock_path +
                         " is locked" + (holder.empty() ? "" : " by pid " + holder) + ")");
      throw StoreError("database " + db_path + ": cannot lock " + lock_path + ": " + std::strerror(err));
    }
    // For the message above, read by the next opener; the lock itself is the flock.
    const std::string pid = std::to_string(::getpid()) + "\n";
    const bool written = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) > 0;
    (void)written;  // only informational
  }
  ~CoordinatorLock() { ::close(fd_); }
  CoordinatorLock(const CoordinatorLock&) = delete;
  CoordinatorLock& operator=(const CoordinatorLock&) = delete;

 private:
  std::string read_holder() const {
    char buf[24] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    const bool digits =
        !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    return digits ? s : "";
  }
  int fd_ = -1;
};

class SqliteStore final : public Store {
 public:
  SqliteStore(const std::string& path, const SqliteOptions& options);
  void commit(const StoreBatch& batch) override;
  std::vector<JobRecord> load_jobs() override;
  std::vector<WorkerRecord> load_workers() override;
  std::string read_log(const std::string& job_id, int64_t offset, int64_t max_bytes) override;
  int64_t log_size(const std::string& job_id) override;
  std::map<std::pair<std::string, int64_t>, int64_t> attempt_log_sizes() override;
  std::optional<ProfileRecord> load_profile(const std::string& job_id) override;
  int schema_version() override;

 private:
  [[noreturn]] void fail(const std::string& doing) const {
    throw StoreError("database " + path_ + ": " + doing + ": " + sqlite3_errmsg(db_.get()));
  }
  void check(int rc, const std::string& doing) const {
    if (rc == SQLITE_OK) return;
    // The connection's message, unless rc did not come from SQLite (Binder::too_big).
    if (sqlite3_extended_errcode(db_.get()) == rc) fail(doing);
    throw StoreError("database " + path_ + ": " + doing + ": " + sqlite3_errstr(rc));
  }
  Statement prepare(const std::string& sql) const;
  void exec(const std::string& sql, const std::string& doing) const;
  // Steps a statement that returns no rows (and resets it).
  void run(sqlite3_stmt* s, const std::string& doing) const;
  // Steps a write once its bind results (`binds`) are all SQLITE_OK; the caller resets it.
  template <size_t N>
  void step_write(sqlite3_stmt* s, const int (&binds)[N], const std::string& doing) const {
    for (int rc : binds) check(rc, doing);
    if (sqlite3_step(s) != SQLITE_DONE) fail(doing);
  }
  // Steps `s` through its rows, calling on_row(s) at each, and resets it. An on_row that
  // returns bool stops the rows early by returning false.
  template <typename OnRow>
  void each_row(sqlite3_stmt* s, const std::string& doing, OnRow on_row) const {
    StepScope scope(s);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
      if constexpr (std::is_same_v<decltype(on_row(s)), bool>) {
        if (!on_row(s)) return;
      } else {
        on_row(s);
      }
    }
    if (rc != SQLITE_DONE) fail(doing);
  }
  int64_t pragma_integer(const std::string& pragma) const;
  std::string pragma_text(const std::string& pragma) const;
  void migrate(int from_version);
  void rollback() const;
  void write_job(const JobRecord& j);
  void write_worker(const WorkerRecord& w);
  void append_log(const LogAppend& l, std::map<std::string, int64_t>& sizes);
  void write_profile(const ProfileRecord& p);
  JobRecord read_job(sqlite3_stmt* s) const;
  WorkerRecord read_worker(sqlite3_stmt* s) const;
  void load_log_sizes();

  const std::string path_;
  // Declaration order is destruction order reversed: the statements are finalized before the
  // connection closes, and the lock is released last, once the database is closed.
  CoordinatorLock lock_;
  std::unique_ptr<sqlite3, ConnectionDeleter> db_;
  Statement begin_, commit_, rollback_;
  Statement upsert_job_, update_job_request_id_, upsert_worker_, insert_log_;
  Statement select_jobs_, select_workers_, select_log_, select_attempt_sizes_;
  Statement upsert_profile_, select_profile_, delete_worker_;
  // Bytes in each job's log, as of the last successful commit: the next append's job_offset.
  std::map<std::string, int64_t> log_sizes_;
};

sqlite3* open_connection(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string why = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    throw StoreError("database " + path + ": cannot open: " + why);
  }
  return db;
}

SqliteStore::SqliteStore(const std::string& path, const SqliteOptions& options)
    : path_(path), lock_(path), db_(open_connection(path)) {
  sqlite3_extended_result_codes(db_.get(), 1);
  check(sqlite3_busy_timeout(db_.get(), kBusyTimeoutMs), "setting the busy timeout");

  // The first read of the file: a file that is not a database fails here, before anything
  // is written to it, and so does a database from a newer zenflow.
  const int64_t version = pragma_integer("user_version");
  if (version > sqlite_schema_version())
    throw StoreError("database " + path_ + " has schema version " + std::to_string(version) +
                     ", newer than version " + std::to_string(sqlite_schema_version()) +
                     ", the newest this zenflow knows (was it written by a newer zenflow?)");

  const std::string mode = pragma_text("journal_mode = WAL");
  if (mode != "wal")
    throw StoreError("database " + path_ + ": journal_mode=WAL did not take (the mode is " + quoted(mode) +
                     ")");
  const int64_t synchronous = options.synchronous_full ? 2 : 1;
  exec(std::string("PRAGMA synchronous = ") + (options.synchronous_full ? "FULL" : "NORMAL"),
       "setting synchronous");
  if (pragma_integer("synchronous") != synchronous)
    throw StoreError("database " + path_ + ": PRAGMA synchronous did not take");
  exec("PRAGMA foreign_keys = ON", "enabling foreign keys");
  if (pragma_integer("foreign_keys") != 1)
    throw StoreError("database " + path_ + ": PRAGMA foreign_keys did not take (SQLite built without them?)");

  // zenflow_valid_utf8(text): the text with invalid UTF-8 replaced (common/utf8.h), for
  // the migration that repairs rows stored with invalid bytes.
  check(sqlite3_create_function_v2(
            db_.get(), "zenflow_valid_utf8", 1, SQLITE_UTF8 | SQLITE_DETERMINISTIC, nullptr,
            [](sqlite3_context* ctx, int, sqlite3_value** argv) {
              const auto* p = reinterpret_cast<const char*>(sqlite3_value_text(argv[0]));
              const std::string fixed =
                  valid_utf8(std::string_view(p == nullptr ? "" : p, static_cast<size_t>(sqlite3_value_bytes(argv[0]))));
              sqlite3_result_text(ctx, fixed.data(), static_cast<int>(fixed.size()), SQLITE_TRANSIENT);
            },
            nullptr, nullptr, nullptr),
        "registering zenflow_valid_utf8");
  begin_ = prepare("BEGIN IMMEDIATE");  // takes the write lock now, not at the first write
  commit_ = prepare("COMMIT");
  rollback_ = prepare("ROLLBACK");
  migrate(static_cast<int>(version));

  // A job's request_id is set at submit and never changes: the jobs_by_request_id entry of
  // a job is written once, not with every transition and progress write.
  upsert_job_ = prepare(upsert_sql("jobs", kJobColumns, "request_id"));
  update_job_request_id_ = prepare("UPDATE jobs SET request_id = ?2 WHERE id = ?1");
  upsert_worker_ = prepare(upsert_sql("workers", kWorkerColumns));
  insert_log_ = prepare(
      "INSERT INTO logs (job_id, job_offset, attempt, attempt_offset, data) VALUES (?1, ?2, ?3, ?4, ?5)");
  select_jobs_ = prepare(select_sql("jobs", kJobColumns, "submit_seq, id"));
  select_workers_ = prepare(select_sql("workers", kWorkerColumns, "name"));
  // The rows overlapping [?2, ?3): rows tile the log, so they start at the last row that
  // starts at or before ?2. Both bounds use the primary key; no row is scanned to find them.
  select_log_ = prepare(
      "SELECT job_offset, data FROM logs WHERE job_id = ?1 AND job_offset < ?3 AND job_offset >= "
      "(SELECT MAX(job_offset) FROM logs WHERE job_id = ?1 AND job_offset <= ?2) ORDER BY job_offset");
  // length() of a BLOB column reads the row header, not the bytes.
  select_attempt_sizes_ = prepare(
      "SELECT job_id, attempt, MAX(attempt_offset + length(data)) FROM logs GROUP BY job_id, attempt");
  upsert_profile_ = prepare(
      "INSERT INTO profiles (job_id, attempt, yaml, received_ms) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (job_id) "
      "DO UPDATE SET attempt = excluded.attempt, yaml = excluded.yaml, received_ms = excluded.received_ms");
  select_profile_ = prepare("SELECT job_id, attempt, yaml, received_ms FROM profiles WHERE job_id = ?1");
  delete_worker_ = prepare("DELETE FROM workers WHERE name = ?1");
  load_log_sizes();
}

Statement SqliteStore::prepare(const std::string& sql) const {
  sqlite3_stmt* s = nullptr;
  check(sqlite3_prepare_v3(db_.get(), sql.c_str(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT,
                           &s, nullptr),
        "preparing " + quoted(sql));
  return Statement(s);
}

void SqliteStore::exec(const std::string& sql, const std::string& doing) const {
  check(sqlite3_exec(db_.get(), sql.c_str(), nullptr, nullptr, nullptr), doing);
}

void SqliteStore::run(sqlite3_stmt* s, const std::string& doing) const {
  StepScope scope(s);
  if (sqlite3_step(s) != SQLITE_DONE) fail(doing);
}

int64_t SqliteStore::pragma_integer(const std::string& pragma) const {
  const Statement s = prepare("PRAGMA " + pragma);
  if (sqlite3_step(s.get()) != SQLITE_ROW) fail("reading PRAGMA " + pragma);
  return sqlite3_column_int64(s.get(), 0);
}

std::string SqliteStore::pragma_text(const std::string& pragma) const {
  const Statement s = prepare("PRAGMA " + pragma);
  if (sqlite3_step(s.get()) != SQLITE_ROW) fail("PRAGMA " + pragma + " returned no value");
  return Row(s.get()).text();
}

void SqliteStore::migrate(int from_version) {
  for (const Migration& m : kMigrations) {
    if (m.version <= from_version) continue;
    const std::string doing = "migrating to schema version " + std::to_string(m.version);
    run(begin_.get(), doing);
    try {
      exec(m.sql, doing);
      // user_version lives in the database header, so it commits or rolls back with the step.
      exec("PRAGMA user_version = " + std::to_string(m.version), doing);
      run(commit_.get(), doing);
    } catch (const StoreError&) {
      rollback();
      throw;
    }
  }
}

void SqliteStore::rollback() const {
  // Some errors (a full disk, an I/O error) have already rolled the transaction back.
  if (sqlite3_get_autocommit(db_.get())) return;
  StepScope scope(rollback_.get());
  sqlite3_step(rollback_.get());  // a failure shows at the next BEGIN, which then fails
}

void SqliteStore::commit(const StoreBatch& batch) {
  if (batch.empty()) return;
  run(begin_.get(), "beginning a transaction");
  std::map<std::string, int64_t> sizes;  // log sizes as this batch leaves them
  try {
    for (const JobRecord& j : batch.jobs) write_job(j);
    for (const WorkerRecord& w : batch.workers) write_worker(w);
    for (const LogAppend& l : batch.logs) append_log(l, sizes);
    for (const ProfileRecord& p : batch.profiles) write_profile(p);
    for (const std::string& name : batch.removed_workers) {
      sqlite3_stmt* d = delete_worker_.get();
      StepScope scope(d);
      Binder b(d);
      const int rc[] = {b.text(name)};
      step_write(d, rc, "removing worker " + quoted(name));
    }
    run(commit_.get(), "committing " + std::to_string(batch.jobs.size()) + " jobs, " +
                           std::to_string(batch.workers.size()) + " workers, " +
                           std::to_string(batch.logs.size()) + " log appends and " +
                           std::to_string(batch.profiles.size()) + " profiles");
  } catch (const StoreError&) {
    rollback();
    throw;  // log_sizes_ untouched: the next append to these jobs starts where the last commit left
  }
  for (const auto& [job_id, size] : sizes) log_sizes_[job_id] = size;
}

void SqliteStore::write_job(const JobRecord& j) {
  sqlite3_stmt* s = upsert_job_.get();
  StepScope scope(s);
  Binder b(s);
  const std::string placement = encode_names(j.placement);
  const std::string node_placement = encode_names(j.node_placement);
  // A braced list is evaluated left to right: parameters 1, 2, ... in kJobColumns order.
  const int rc[] = {b.text(j.id),
                    b.text(j.request_id),
                    b.text(j.name),
                    b.text(j.spec_yaml),
                    b.text(j.state),
                    b.integer(j.priority),
                    b.integer(j.submit_seq),
                    b.integer(j.submit_time_ms),
                    b.integer(j.start_time_ms),
                    b.integer(j.end_time_ms),
                    b.integer(j.attempt),
                    b.integer(j.restarts),
                    b.integer(j.preemptions),
                    b.text(placement),
                    b.integer(j.master_port),
                    b.integer(j.host_memory_bytes_per_worker),
                    b.integer(j.step),
                    b.integer(j.total_steps),
                    b.integer(j.resumed_from_step),
                    b.integer(double_bits(j.last_loss)),
                    b.integer(double_bits(j.cost_usd)),
                    b.text(j.last_error),
                    b.text(j.stop_reason),
                    b.integer(j.exit_code),
                    b.integer(j.revision),
                    b.text(j.checkpoint_dir),
                    b.text(j.device),
                    b.integer(j.workers),
                    b.integer(j.gpus_per_worker),
                    b.integer(j.max_restarts),
                    b.integer(double_bits(j.usd_per_hour)),
                    b.text(j.price_source),
                    b.integer(double_bits(j.usd_lost_to_restarts)),
                    b.integer(j.optimizer_nodes),
                    b.integer(j.node_memory_bytes),
                    b.text(node_placement),
                    b.integer(double_bits(j.stall_share)),
                    b.integer(double_bits(j.tokens_per_second)),
                    b.integer(double_bits(j.tokens_per_step)),
                    b.integer(j.fence_until_ms),
                    b.integer(j.hang_timeout),
                    b.integer(j.log_dropped_bytes),
                    b.text(j.node_secret)};
  static_assert(std::size(rc) == std::size(kJobColumns), "write_job binds every jobs column");
  const std::string doing = "writing job " + quoted(j.id) +
                            (j.request_id.empty() ? "" : " (request_id " + quoted(j.request_id) + ")");
  for (int r : rc) check(r, doing);
  if (sqlite3_step(s) != SQLITE_ROW) fail(doing);  // RETURNING: the stored request_id
  const auto* stored = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  const bool request_id_changed =
      j.request_id !=
      std::string_view(stored == nullptr ? "" : stored, static_cast<size_t>(sqlite3_column_bytes(s, 0)));
  if (sqlite3_step(s) != SQLITE_DONE) fail(doing);
  if (!request_id_changed) return;
  sqlite3_stmt* u = update_job_request_id_.get();
  StepScope update_scope(u);
  Binder ub(u);
  const int urc[] = {ub.text(j.id), ub.text(j.request_id)};
  step_write(u, urc, doing);
}

void SqliteStore::write_worker(const WorkerRecord& w) {
  sqlite3_stmt* s = upsert_worker_.get();
  StepScope scope(s);
  Binder b(s);
  const std::string ports = encode_ports(w.rendezvous_ports);
  const std::string roots = encode_names(w.allowed_roots);
  const int rc[] = {b.text(w.name),        b.text(w.role),           b.blob(w.resources),
                    b.text(w.address),     b.text(ports),            b.integer(w.incarnation),
                    b.integer(w.registered_ms), b.text(w.state),     b.integer(w.fence_ms),
                    b.blob(w.session_digest), b.text(roots)};
  static_assert(std::size(rc) == std::size(kWorkerColumns), "write_worker binds every workers column");
  const std::string doing = "writing worker " + quoted(w.name);
  step_write(s, rc, doing);
}

void SqliteStore::append_log(const LogAppend& l, std::map<std::string, int64_t>& sizes) {
  // An empty append holds no bytes, and its row would take the job_offset of the next one.
  if (l.data.empty()) return;
  const auto pending = sizes.find(l.job_id);
  const int64_t offset = pending != sizes.end() ? pending->second : log_size(l.job_id);
  sqlite3_stmt* s = insert_log_.get();
  StepScope scope(s);
  Binder b(s);
  const int rc[] = {b.text(l.job_id), b.integer(offset), b.integer(l.attempt), b.integer(l.attempt_offset),
                    b.blob(l.data)};
  const std::string doing = "appending " + std::to_string(l.data.size()) + " bytes to the log of job " +
                            quoted(l.job_id) + " (attempt " + std::to_string(l.attempt) + ")";
  step_write(s, rc, doing);
  sizes[l.job_id] = offset + static_cast<int64_t>(l.data.size());
}

void SqliteStore::write_profile(const ProfileRecord& p) {
  sqlite3_stmt* s = upsert_profile_.get();
  StepScope scope(s);
  Binder b(s);
  const int rc[] = {b.text(p.job_id), b.integer(p.attempt), b.text(p.yaml), b.integer(p.received_ms)};
  step_write(s, rc,
             "writing the profile of job " + quoted(p.job_id) + " (attempt " + std::to_string(p.attempt) + ")");
}

std::optional<ProfileRecord> SqliteStore::load_profile(const std::string& job_id) {
  const std::string doing = "reading the profile of job " + quoted(job_id);
  sqlite3_stmt* s = select_profile_.get();
  Binder b(s);
  check(b.text(job_id), doing);
  std::optional<ProfileRecord> out;
  each_row(s, doing, [&](sqlite3_stmt* row) {
    Row r(row);
    ProfileRecord p;
    p.job_id = r.text();
    p.attempt = r.integer();
    p.yaml = r.text();
    p.received_ms = r.integer();
    out = std::move(p);
    return false;
  });
  return out;
}

JobRecord SqliteStore::read_job(sqlite3_stmt* s) const {
  Row r(s);
  JobRecord j;
  j.id = r.text();
  j.request_id = r.text();
  j.name = r.text();
  j.spec_yaml = r.text();
  j.state = r.text();
  j.priority = r.integer();
  j.submit_seq = r.integer();
  j.submit_time_ms = r.integer();
  j.start_time_ms = r.integer();
  j.end_time_ms = r.integer();
  j.attempt = r.integer();
  j.restarts = r.integer();
  j.preemptions = r.integer();
  const std::string placement = r.text();
  if (!decode_names(placement, j.placement))
    throw StoreError("database " + path_ + ": job " + quoted(j.id) + " has a malformed placement " +
                     quoted(placement));
  j.master_port = r.integer();
  j.host_memory_bytes_per_worker = r.integer();
  j.step = r.integer();
  j.total_steps = r.integer();
  j.resumed_from_step = r.integer();
  j.last_loss = bits_double(r.integer());
  j.cost_usd = bits_double(r.integer());
  j.last_error = r.text();
  j.stop_reason = r.text();
  j.exit_code = r.integer();
  j.revision = r.integer();
  j.checkpoint_dir = r.text();
  j.device = r.text();
  j.workers = r.integer();
  j.gpus_per_worker = r.integer();
  j.max_restarts = r.integer();
  j.usd_per_hour = bits_double(r.integer());
  j.price_source = r.text();
  j.usd_lost_to_restarts = bits_double(r.integer());
  j.optimizer_nodes = r.integer();
  j.node_memory_bytes = r.integer();
  const std::string nodes = r.text();
  if (!decode_names(nodes, j.node_placement))
    throw StoreError("database " + path_ + ": job " + quoted(j.id) + " has a malformed node placement " +
                     quoted(nodes));
  j.stall_share = bits_double(r.integer());
  j.tokens_per_second = bits_double(r.integer());
  j.tokens_per_step = bits_double(r.integer());
  j.fence_until_ms = r.integer();
  j.hang_timeout = r.integer();
  j.log_dropped_bytes = r.integer();
  j.node_secret = r.text();
  return j;
}

WorkerRecord SqliteStore::read_worker(sqlite3_stmt* s) const {
  Row r(s);
  WorkerRecord w;
  w.name = r.text();
  w.role = r.text();
  w.resources = r.blob();
  w.address = r.text();
  const std::string ports = r.text();
  if (!decode_ports(ports, w.rendezvous_ports))
    throw StoreError("database " + path_ + ": worker " + quoted(w.name) + " has malformed rendezvous ports " +
                     quoted(ports));
  w.incarnation = r.integer();
  w.registered_ms = r.integer();
  w.state = r.text();
  w.fence_ms = r.integer();
  w.session_digest = r.blob();
  const std::string roots = r.text();
  if (!decode_names(roots, w.allowed_roots))
    throw StoreError("database " + path_ + ": worker " + quoted(w.name) + " has malformed allowed roots " +
                     quoted(roots));
  return w;
}

std::vector<JobRecord> SqliteStore::load_jobs() {
  std::vector<JobRecord> jobs;
  each_row(select_jobs_.get(), "loading jobs", [&](sqlite3_stmt* s) { jobs.push_back(read_job(s)); });
  return jobs;
}

std::vector<WorkerRecord> SqliteStore::load_workers() {
  std::vector<WorkerRecord> workers;
  each_row(select_workers_.get(), "loading workers",
           [&](sqlite3_stmt* s) { workers.push_back(read_worker(s)); });
  return workers;
}

std::string SqliteStore::read_log(const std::string& job_id, int64_t offset, int64_t max_bytes) {
  if (offset < 0 || max_bytes < 0)
    throw StoreError("database " + path_ + ": reading the log of job " + quoted(job_id) + " from offset " +
                     std::to_string(offset) + ", at most " + std::to_string(max_bytes) +
                     " bytes: neither may be negative");
  const int64_t size = log_size(job_id);
  if (offset >= size || max_bytes == 0) return "";
  const int64_t end = offset + std::min(max_bytes, size - offset);  // no overflow: both <= size
  const std::string doing = "reading bytes [" + std::to_string(offset) + ", " + std::to_string(end) +
                            ") of the log of job " + quoted(job_id);
  sqlite3_stmt* s = select_log_.get();
  Binder b(s);
  const int binds[] = {b.text(job_id), b.integer(offset), b.integer(end)};
  for (int rc : binds) check(rc, doing);
  std::string out;
  out.reserve(static_cast<size_t>(end - offset));
  int64_t at = offset;  // the next byte wanted
  each_row(s, doing, [&](sqlite3_stmt* row) {
    const int64_t row_offset = sqlite3_column_int64(row, 0);
    const auto* data = static_cast<const char*>(sqlite3_column_blob(row, 1));
    const int64_t row_end = row_offset + sqlite3_column_bytes(row, 1);
    if (data == nullptr || row_offset > at || row_end <= at) return false;  // a gap or an overlap: see below
    const int64_t to = std::min(end, row_end);
    out.append(data + (at - row_offset), static_cast<size_t>(to - at));
    at = to;
    return true;
  });
  if (at != end)
    throw StoreError("database " + path_ + ": " + doing + ": the rows hold only [" + std::to_string(offset) +
                     ", " + std::to_string(at) +
                     ") of it contiguously (the logs table does not tile the log)");
  return out;
}

int64_t SqliteStore::log_size(const std::string& job_id) {
  const auto it = log_sizes_.find(job_id);
  return it == log_sizes_.end() ? 0 : it->second;
}

std::map<std::pair<std::string, int64_t>, int64_t> SqliteStore::attempt_log_sizes() {
  std::map<std::pair<std::string, int64_t>, int64_t> sizes;
  each_row(select_attempt_sizes_.get(), "reading the log size of each attempt", [&](sqlite3_stmt* s) {
    Row r(s);
    std::string job_id = r.text();
    const int64_t attempt = r.integer();
    sizes[{std::move(job_id), attempt}] = r.integer();
  });
  return sizes;
}

void SqliteStore::load_log_sizes() {
  const Statement s = prepare("SELECT job_id, MAX(job_offset + length(data)) FROM logs GROUP BY job_id");
  each_row(s.get(), "reading the log size of each job", [&](sqlite3_stmt* row) {
    Row r(row);
    std::string job_id = r.text();
    log_sizes_[std::move(job_id)] = r.integer();
  });
}

int SqliteStore::schema_version() { return static_cast<int>(pragma_integer("user_version")); }

// The fields compared with ==; the doubles are compared by bits apart from these.
auto fields(const JobRecord& j) {
  return std::tie(j.id, j.request_id, j.name, j.spec_yaml, j.state, j.priority, j.submit_seq,
                  j.submit_time_ms, j.start_time_ms, j.end_time_ms, j.attempt, j.restarts, j.preemptions,
                  j.placement, j.master_port, j.host_memory_bytes_per_worker, j.step, j.total_steps,
                  j.resumed_from_step, j.last_error, j.stop_reason, j.exit_code, j.revision, j.checkpoint_dir,
                  j.device, j.workers, j.gpus_per_worker, j.max_restarts, j.price_source, j.optimizer_nodes,
                  j.node_memory_bytes, j.node_placement, j.fence_until_ms, j.hang_timeout, j.log_dropped_bytes,
                  j.node_secret);
}
auto fields(const WorkerRecord& w) {
  return std::tie(w.name, w.role, w.resources, w.address, w.rendezvous_ports, w.incarnation, w.registered_ms,
                  w.state, w.fence_ms, w.session_digest, w.allowed_roots);
}

}  // namespace

// Field by field, doubles by their bits: a record equals what the store gives back for it,
// a NaN loss included (NaN != NaN as a double).
bool JobRecord::operator==(const JobRecord& o) const {
  return fields(*this) == fields(o) && double_bits(last_loss) == double_bits(o.last_loss) &&
         double_bits(cost_usd) == double_bits(o.cost_usd) &&
         double_bits(usd_per_hour) == double_bits(o.usd_per_hour) &&
         double_bits(usd_lost_to_restarts) == double_bits(o.usd_lost_to_restarts) &&
         double_bits(stall_share) == double_bits(o.stall_share) &&
         double_bits(tokens_per_second) == double_bits(o.tokens_per_second) &&
         double_bits(tokens_per_step) == double_bits(o.tokens_per_step);
}

bool WorkerRecord::operator==(const WorkerRecord& o) const { return fields(*this) == fields(o); }

bool ProfileRecord::operator==(const ProfileRecord& o) const {
  return std::tie(job_id, attempt, yaml, received_ms) == std::tie(o.job_id, o.attempt, o.yaml, o.received_ms);
}

std::unique_ptr<Store> open_sqlite_store(const std::string& path, const SqliteOptions& options) {
  return std::make_unique<SqliteStore>(path, options);
}

int sqlite_schema_version() { return kMigrations[std::size(kMigrations) - 1].version; }

}  // namespace zenflow::server
