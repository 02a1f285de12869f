// Hostile inputs to the zenflow binary, end to end: for each case the binary runs (bounded
// at 30 s: a hang is a failure, never a hung suite) and the harness checks
//   (1) the exit code, (2) that stderr names the file or key (exact substrings) and holds
//   no LibTorch stack trace, (3) that nothing outside the run's checkpoint directory
//   changed (path, type, mode, size, mtime and CRC32C of every file in the case's scratch
//   tree, the user's spec directory included), (4) that no checkpoint was overwritten
//   (every step-* directory that existed before still exists afterwards with identical
//   bytes, under its name, renamed step-NNNNNNNN.damaged[.N] or moved into superseded-*/),
//   (5) that the process ended within 30 s.
// Cases are tables (struct Case) per family; a few TEST()s per family run them, several
// processes at a time (most cases wait, not compute). Each family prints
//   [figure] hostile inputs: family F: N cases, M passed
//
// Families: user-files (user files never overwritten; names and dirs), checkpoints
// (checkpoints trusted blindly), unbounded (unbounded inputs), misleading (errors that
// mislead).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/crc32c.h"
#include "common/remove_tree.h"
#include "worker/rank/checkpoint.h"
#include "worker/model/hf_model.h"
#include "worker/model/safetensors.h"

extern char** environ;

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kBoundSeconds = 30.0;
// A case that is expected to train (exit 0: the controls beside the hostile inputs) does
// real work, which a loaded 2-core CI machine can slow tenfold: it gets a wider bound. Every
// hostile input must still end within kBoundSeconds.
constexpr double kTrainingBoundSeconds = 120.0;
const std::string kBin = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow";
const char* kData = "/usr/share/common-licenses";

// ---------------------------------------------------------------------------------
// Small file helpers

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

void make_fifo(const fs::path& p) {
  fs::create_directories(p.parent_path());
  if (::mkfifo(p.c_str(), 0644) != 0) throw std::runtime_error("mkfifo " + p.string() + ": " + std::strerror(errno));
}

void make_sparse(const fs::path& p, int64_t bytes) {
  fs::create_directories(p.parent_path());
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || ::ftruncate(fd, bytes) != 0) throw std::runtime_error("ftruncate " + p.string());
  ::close(fd);
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) s.replace(pos, from.size(), to);
  return s;
}

// The first/last lines of a long output, for failure messages.
std::string shorten(const std::string& s, size_t max = 3000) {
  if (s.size() <= max) return s;
  return s.substr(0, max / 2) + "\n[...]\n" + s.substr(s.size() - max / 2);
}

// ---------------------------------------------------------------------------------
// The job spec: an ordered list of dotted keys emitted as block YAML (with comments, so
// "unchanged byte for byte" covers what a YAML round trip would lose).

class Yaml {
 public:
  Yaml() {
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"name", "hostile"},
             {"model.arch", "llama"},
             {"model.config.hidden_size", "32"},
             {"model.config.num_hidden_layers", "1"},
             {"model.config.num_attention_heads", "4"},
             {"model.config.intermediate_size", "64"},
             {"model.config.max_position_embeddings", "32"},
             {"data.train", kData},
             {"data.tokenizer", "byte"},
             {"train.steps", "6"},
             {"train.micro_batch", "2"},
             {"train.seq_len", "16"},
             {"train.lr", "1.0e-3"},
             {"train.warmup_steps", "1"},
             {"train.device", "cpu"},
             {"optimizer.mode", "zenflow"},
             {"optimizer.zenflow.update_interval", "2"},
             {"optimizer.zenflow.full_warm_up_rounds", "0"},
             {"optimizer.zenflow.min_split_numel", "512"},
             {"checkpoint.every_steps", "2"},
             {"checkpoint.keep", "10"},
         })
      kv_.emplace_back(k, v);
  }

  // Sets `key` (replacing it, or inserting it after the keys of its section).
  Yaml& set(const std::string& key, const std::string& value) {
    for (auto& kv : kv_)
      if (kv.first == key) {
        kv.second = value;
        return *this;
      }
    size_t best = kv_.size(), best_len = 0;
    const auto segs = split(key);
    for (size_t i = 0; i < kv_.size(); ++i) {
      const auto other = split(kv_[i].first);
      size_t n = 0;
      while (n + 1 < segs.size() && n + 1 < other.size() && segs[n] == other[n]) ++n;
      if (n > 0 && n >= best_len) {
        best_len = n;
        best = i + 1;
      }
    }
    kv_.insert(kv_.begin() + static_cast<long>(best), {key, value});
    return *this;
  }

  // Removes `key` and every key under it.
  Yaml& erase(const std::string& key) {
    kv_.erase(std::remove_if(kv_.begin(), kv_.end(),
                             [&](const auto& kv) { return kv.first == key || kv.first.rfind(key + ".", 0) == 0; }),
              kv_.end());
    return *this;
  }

  std::string text() const {
    std::string out = "# The user's job. Comments and layout must survive every zenflow command.\n";
    std::vector<std::string> prev;
    for (const auto& [key, value] : kv_) {
      const auto segs = split(key);
      size_t common = 0;
      while (common + 1 < segs.size() && common < prev.size() && prev[common] == segs[common]) ++common;
      for (size_t i = common; i + 1 < segs.size(); ++i) out += std::string(2 * i, ' ') + segs[i] + ":\n";
      out += std::string(2 * (segs.size() - 1), ' ') + segs.back() + ": " + value + "\n";
      prev.assign(segs.begin(), segs.end() - 1);
    }
    out += "# end of the user's job (trailing comment)\n";
    return out;
  }

 private:
  static std::vector<std::string> split(const std::string& key) {
    std::vector<std::string> out;
    std::stringstream ss(key);
    for (std::string s; std::getline(ss, s, '.');) out.push_back(s);
    return out;
  }
  std::vector<std::pair<std::string, std::string>> kv_;
};

// ---------------------------------------------------------------------------------
// Running the binary: fork/exec in its own process group, stdout/stderr to files, a hard
// deadline after which the whole group is killed.

struct Invocation {
  std::vector<std::string> args;  // without the binary
  std::vector<std::pair<std::string, std::string>> env;
  fs::path cwd;
  fs::path out, err;
  uint64_t data_limit = 2ull << 30;  // RLIMIT_DATA: a runaway reader must not take the machine
  double bound_seconds = kBoundSeconds;
};

struct Proc {
  int code = -1000;  // exit status, or -signal
  bool timed_out = false;
  double seconds = 0;
  pid_t pid = -1;
  std::string out, err;
};

struct Child {
  pid_t pid = -1;
  std::chrono::steady_clock::time_point start;
};

Child spawn(const Invocation& inv) {
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> argv_s = {kBin};
  argv_s.insert(argv_s.end(), inv.args.begin(), inv.args.end());
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    const std::string v = *e;
    if (v.rfind("ZENFLOW_", 0) == 0) continue;  // never inherit a distributed setup
    bool overridden = false;
    for (const auto& [k, val] : inv.env) overridden |= v.rfind(k + "=", 0) == 0;
    if (!overridden) env_s.push_back(v);
  }
  for (const auto& [k, val] : inv.env) env_s.push_back(k + "=" + val);
  std::vector<char*> argv, envp;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string out = inv.out.string(), err = inv.err.string(), cwd = inv.cwd.string();
  const uint64_t data_limit = inv.data_limit;

  Child c;
  c.start = std::chrono::steady_clock::now();
  c.pid = ::fork();
  if (c.pid < 0) throw std::runtime_error("fork failed");
  if (c.pid == 0) {
    ::setpgid(0, 0);
    const int in = ::open("/dev/null", O_RDONLY);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || o < 0 || e < 0) ::_exit(125);
    ::dup2(in, 0);
    ::dup2(o, 1);
    ::dup2(e, 2);
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    // A runaway reader (/dev/zero into a string) must not take the machine's memory.
    struct rlimit lim;
    lim.rlim_cur = lim.rlim_max = data_limit;
    ::setrlimit(RLIMIT_DATA, &lim);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(c.pid, c.pid);
  return c;
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Polls `c`; returns true (and fills `p`) once it ended or was killed at the deadline.
bool reap(const Child& c, Proc& p, double bound = kBoundSeconds) {
  int st = 0;
  const pid_t r = ::waitpid(c.pid, &st, WNOHANG);
  if (r == 0) {
    if (since(c.start) < bound) return false;
    ::kill(-c.pid, SIGKILL);
    ::waitpid(c.pid, &st, 0);
    p.timed_out = true;
  }
  p.seconds = since(c.start);
  p.pid = c.pid;
  p.code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1000;
  ::kill(-c.pid, SIGKILL);  // anything it left behind in its group (rank processes)
  return true;
}

void collect(const Invocation& inv, Proc& p) {
  p.out = slurp(inv.out);
  p.err = slurp(inv.err);
}

// Runs `invs`, at most `jobs` at a time, each within its bound_seconds.
std::vector<Proc> run_all(const std::vector<Invocation>& invs, int jobs) {
  std::vector<Proc> procs(invs.size());
  std::vector<std::pair<size_t, Child>> active;
  size_t next = 0;
  while (next < invs.size() || !active.empty()) {
    while (next < invs.size() && static_cast<int>(active.size()) < jobs) {
      active.emplace_back(next, spawn(invs[next]));
      ++next;
    }
    for (size_t i = 0; i < active.size();) {
      if (reap(active[i].second, procs[active[i].first], invs[active[i].first].bound_seconds)) {
        collect(invs[active[i].first], procs[active[i].first]);
        active.erase(active.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
    ::usleep(20 * 1000);
  }
  return procs;
}

int jobs_for(int wanted) {
  if (const char* j = std::getenv("ZENFLOW_HOSTILE_JOBS")) return std::max(1, std::atoi(j));
  return wanted;
}

// ---------------------------------------------------------------------------------
// Snapshots: the scratch tree outside the run dir, and the checkpoints inside it.

fs::path suite_root() {
  static const fs::path root = [] {
    fs::path r = fs::temp_directory_path() / ("zenflow-hostile-" + std::to_string(::getpid()));
    zenflow::remove_tree(r);
    fs::create_directories(r / "logs");
    return r;
  }();
  return root;
}

// relative path -> "type mode size mtime crc" for everything under `root` except `skip`.
using TreeSnapshot = std::map<std::string, std::string>;

void snapshot_into(const fs::path& root, const fs::path& dir, const fs::path& skip, TreeSnapshot& out) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    if (!skip.empty() && p == skip) continue;
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) continue;
    const std::string rel = fs::relative(p, root).string();
    char mode[16];
    std::snprintf(mode, sizeof mode, "%o", static_cast<unsigned>(st.st_mode));
    std::string d = std::string(mode);
    if (S_ISREG(st.st_mode)) {
      uint32_t crc = 0;
      const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      std::vector<char> buf(1 << 20);
      for (ssize_t n; fd >= 0 && (n = ::read(fd, buf.data(), buf.size())) > 0;)
        crc = zenflow::crc32c_extend(crc, buf.data(), static_cast<size_t>(n));
      if (fd >= 0) ::close(fd);
      d += " file size=" + std::to_string(st.st_size) + " mtime=" + std::to_string(st.st_mtim.tv_sec) + "." +
           std::to_string(st.st_mtim.tv_nsec) + " crc=" + zenflow::crc32c_hex(crc);
    } else if (S_ISLNK(st.st_mode)) {
      d += " link -> " + fs::read_symlink(p, ec).string();
    } else if (S_ISDIR(st.st_mode)) {
      d += " dir";
      out[rel] = d;
      snapshot_into(root, p, skip, out);
      continue;
    } else {
      d += " special";
    }
    out[rel] = d;
  }
}

TreeSnapshot snapshot_tree(const fs::path& root, const fs::path& skip) {
  TreeSnapshot out;
  snapshot_into(root, root, skip, out);
  return out;
}

// A description of how two snapshots differ ("" when they are equal).
// Directories created only to hold the run dir (runs/ of runs/<name>) are not a change.
std::string tree_diff(const TreeSnapshot& before, const TreeSnapshot& after, const fs::path& root = {},
                      const fs::path& run = {}) {
  std::set<std::string> ancestors;
  if (!root.empty() && !run.empty())
    for (fs::path a = fs::relative(run, root).parent_path(); !a.empty(); a = a.parent_path()) ancestors.insert(a.string());
  std::string out;
  for (const auto& [k, v] : before) {
    auto it = after.find(k);
    if (it == after.end())
      out += "  removed: " + k + " (" + v + ")\n";
    else if (it->second != v)
      out += "  changed: " + k + " (" + v + " -> " + it->second + ")\n";
  }
  for (const auto& [k, v] : after)
    if (!before.count(k) && !(ancestors.count(k) && contains(v, " dir"))) out += "  created: " + k + " (" + v + ")\n";
  return out;
}

// Every step-* directory under `run` (recursively: superseded-*/ too): relative path ->
// file name -> bytes.
using CheckpointRecord = std::map<std::string, std::map<std::string, std::string>>;

void record_into(const fs::path& run, const fs::path& dir, CheckpointRecord& out) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec) || it->is_symlink(ec)) continue;
    const std::string name = it->path().filename().string();
    if (name.rfind("step-", 0) == 0 && !contains(name, ".tmp")) {
      auto& files = out[fs::relative(it->path(), run).string()];
      for (fs::directory_iterator f(it->path(), ec), fend; !ec && f != fend; f.increment(ec))
        if (f->is_regular_file(ec)) files[f->path().filename().string()] = slurp(f->path());
    } else {
      record_into(run, it->path(), out);
    }
  }
}

CheckpointRecord record_checkpoints(const fs::path& run) {
  CheckpointRecord out;
  std::error_code ec;
  if (fs::is_directory(run, ec)) record_into(run, run, out);
  return out;
}

// What of `before` is missing from `after` ("" when every checkpoint survived intact).
std::string lost_checkpoints(const CheckpointRecord& before, const CheckpointRecord& after) {
  std::string out;
  for (const auto& [rel, files] : before) {
    const std::string name = fs::path(rel).filename().string();
    const std::string base = name.substr(0, std::min<size_t>(name.size(), 13));  // step-NNNNNNNN
    bool found = false;
    std::string near;
    for (const auto& [rel2, files2] : after) {
      const std::string name2 = fs::path(rel2).filename().string();
      const bool same_name = name2 == name || name2 == base || name2.rfind(base + ".damaged", 0) == 0;
      const std::string parent2 = fs::path(rel2).parent_path().string();
      const bool place_ok = fs::path(rel2).parent_path() == fs::path(rel).parent_path() ||
                            parent2.rfind("superseded-", 0) == 0;
      if (!same_name || !place_ok) continue;
      bool all = true;
      for (const auto& [f, bytes] : files) {
        auto it = files2.find(f);
        if (it == files2.end() || it->second != bytes) {
          all = false;
          near += "\n    " + rel2 + "/" + f + (it == files2.end() ? " is missing" : " has other bytes");
          break;
        }
      }
      if (all) {
        found = true;
        break;
      }
    }
    if (!found) out += "  checkpoint " + rel + " (" + std::to_string(files.size()) + " files) is gone or changed" + near + "\n";
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Cases

struct Ctx {
  std::string name;
  fs::path root;      // this case's scratch tree (hashed, except `run`)
  fs::path spec_dir;  // root/user: the user's directory holding job.yaml
  fs::path spec;      // spec_dir/job.yaml
  fs::path run;       // the run's checkpoint.dir: the one place allowed to change
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<std::string> extra_args;  // appended by setup
  std::vector<std::string> expect;      // more substrings, computed by setup
};

struct Case {
  std::string name;
  std::function<void(Ctx&)> setup;
  std::vector<std::string> args;     // {root} {spec} {specdir} {run} are replaced
  std::vector<int> codes;            // any of these
  std::vector<std::string> messages; // substrings of stderr; "A||B": either
  std::function<void(const Ctx&, const Proc&)> check = nullptr;  // extra checks (gtest assertions)
};

std::string expand(const std::string& s, const Ctx& c) {
  std::string r = replace_all(s, "{specdir}", c.spec_dir.string());
  r = replace_all(r, "{spec}", c.spec.string());
  r = replace_all(r, "{root}", c.root.string());
  r = replace_all(r, "{run}", c.run.string());
  return r;
}

void write_spec(Ctx& c, const Yaml& y) { spit(c.spec, y.text()); }

// The standard spec of a case, checkpoints in ctx.run.
Yaml spec_for(const Ctx& c) {
  Yaml y;
  y.set("checkpoint.dir", c.run.string());
  return y;
}

// Per family: cases and passes, printed as figures at the end.
struct Tally {
  int cases = 0, passed = 0;
};
std::map<std::string, Tally>& tallies() {
  static std::map<std::string, Tally> t;
  return t;
}
const std::vector<std::string> kFamilies = {"user-files", "checkpoints", "unbounded", "misleading"};

class Figures : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& f : kFamilies) {
      auto it = tallies().find(f);
      if (it == tallies().end()) continue;
      std::printf("[figure] hostile inputs: family %s: %d cases, %d passed\n", f.c_str(), it->second.cases,
                  it->second.passed);
    }
    int total = 0, passed = 0;
    for (const auto& [f, t] : tallies()) {
      total += t.cases;
      passed += t.passed;
    }
    std::printf("[figure] hostile inputs: all families: %d cases, %d passed\n", total, passed);
    std::fflush(stdout);
    if (!std::getenv("ZENFLOW_HOSTILE_KEEP")) zenflow::remove_tree(suite_root());
  }
};
const auto* const kFiguresEnv = ::testing::AddGlobalTestEnvironment(new Figures);

// Failures recorded in the current test so far.
int failures_so_far() {
  const auto* r = ::testing::UnitTest::GetInstance()->current_test_info()->result();
  int n = 0;
  for (int i = 0; i < r->total_part_count(); ++i) n += r->GetTestPartResult(i).failed();
  return n;
}

// Bookkeeping for a case checked by hand (not through run_cases).
struct CaseScope {
  std::string family, name;
  int before;
  ::testing::ScopedTrace trace;
  std::string info;  // "exit 2 in 0.8 s"
  CaseScope(const std::string& fam, const std::string& n)
      : family(fam), name(n), before(failures_so_far()), trace(__FILE__, __LINE__, "case " + fam + "/" + n) {}
  ~CaseScope() {
    auto& t = tallies()[family];
    ++t.cases;
    const bool ok = failures_so_far() == before;
    if (ok) ++t.passed;
    std::printf("[ case     ] %s %s/%s%s%s\n", ok ? "PASS" : "FAIL", family.c_str(), name.c_str(),
                info.empty() ? "" : ": ", info.c_str());
    std::fflush(stdout);
  }
};

// No LibTorch trace, no uncaught exception, no misleading library message.
void expect_clean_stderr(const std::string& err) {
  for (const char* bad : {"Exception raised from", "frame #", "basic_filebuf", "terminate called", "what():",
                          "Segmentation fault", "std::bad_alloc", "Aborted"})
    EXPECT_FALSE(contains(err, bad)) << "stderr holds '" << bad << "':\n" << shorten(err);
}

struct Prepared {
  Ctx ctx;
  Invocation inv;
  TreeSnapshot tree;
  CheckpointRecord checkpoints;
  std::string setup_error;
};

fs::path family_dir(const std::string& family) { return suite_root() / family; }

// Sets up, snapshots, runs (`jobs` at a time) and checks every case.
void run_cases(const std::string& family, const std::vector<Case>& cases, int jobs) {
  std::vector<Prepared> prep(cases.size());
  std::vector<Invocation> invs;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    Prepared& p = prep[i];
    p.ctx.name = k.name;
    p.ctx.root = family_dir(family) / k.name;
    zenflow::remove_tree(p.ctx.root);
    p.ctx.spec_dir = p.ctx.root / "user";
    p.ctx.spec = p.ctx.spec_dir / "job.yaml";
    p.ctx.run = p.ctx.root / "ckpt";
    fs::create_directories(p.ctx.spec_dir);
    fs::create_directories(p.ctx.root / "cwd");
    try {
      if (k.setup) k.setup(p.ctx);
    } catch (const std::exception& e) {
      p.setup_error = e.what();
    }
    for (const auto& a : k.args) p.inv.args.push_back(expand(a, p.ctx));
    for (const auto& a : p.ctx.extra_args) p.inv.args.push_back(a);
    p.inv.env = p.ctx.env;
    if (std::find(k.codes.begin(), k.codes.end(), 0) != k.codes.end()) p.inv.bound_seconds = kTrainingBoundSeconds;
    p.inv.cwd = p.ctx.root / "cwd";
    p.inv.out = suite_root() / "logs" / (family + "." + k.name + ".out");
    p.inv.err = suite_root() / "logs" / (family + "." + k.name + ".err");
    p.tree = snapshot_tree(p.ctx.root, p.ctx.run);
    p.checkpoints = record_checkpoints(p.ctx.run);
    invs.push_back(p.inv);
  }
  const std::vector<Proc> procs = run_all(invs, jobs_for(jobs));
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    const Prepared& p = prep[i];
    const Proc& r = procs[i];
    CaseScope scope(family, k.name);
    {
      char buf[96];
      std::snprintf(buf, sizeof buf, "exit %d in %.1f s%s", r.code, r.seconds, r.timed_out ? " (killed at the bound)" : "");
      scope.info = buf;
    }
    std::string cmd = "zenflow";
    for (const auto& a : p.inv.args) cmd += " '" + (a.size() > 200 ? a.substr(0, 200) + "..." : a) + "'";
    SCOPED_TRACE(cmd);
    ASSERT_TRUE(p.setup_error.empty()) << "setup failed: " << p.setup_error;
    const std::string err = r.err;
    EXPECT_FALSE(r.timed_out) << "did not end within " << p.inv.bound_seconds << " s; stderr:\n" << shorten(err);
    EXPECT_LT(r.seconds, p.inv.bound_seconds);
    EXPECT_TRUE(std::find(k.codes.begin(), k.codes.end(), r.code) != k.codes.end())
        << "exit code " << r.code << "; stderr:\n" << shorten(err);
    std::vector<std::string> msgs = k.messages;
    msgs.insert(msgs.end(), p.ctx.expect.begin(), p.ctx.expect.end());
    for (const std::string& m0 : msgs) {
      const std::string m = expand(m0, p.ctx);
      bool any = false;
      std::stringstream alts(replace_all(m, "||", "\x1f"));
      for (std::string alt; std::getline(alts, alt, '\x1f');) any |= contains(err, alt);
      EXPECT_TRUE(any) << "stderr lacks \"" << m << "\":\n" << shorten(err);
    }
    expect_clean_stderr(err);
    const std::string tree = tree_diff(p.tree, snapshot_tree(p.ctx.root, p.ctx.run), p.ctx.root, p.ctx.run);
    EXPECT_TRUE(tree.empty()) << "files outside " << p.ctx.run << " changed:\n" << shorten(tree);
    const std::string lost = lost_checkpoints(p.checkpoints, record_checkpoints(p.ctx.run));
    EXPECT_TRUE(lost.empty()) << "checkpoints overwritten:\n" << lost;
    if (k.check) k.check(p.ctx, r);
  }
}

// ---------------------------------------------------------------------------------
// Shared inputs

// Runs zenflow synchronously (for setups), bounded; returns the process.
Proc run_now(const std::vector<std::string>& args, const fs::path& cwd, double bound = kTrainingBoundSeconds) {
  static int n = 0;
  Invocation inv;
  inv.args = args;
  inv.cwd = cwd;
  inv.out = suite_root() / "logs" / ("setup-" + std::to_string(++n) + ".out");
  inv.err = suite_root() / "logs" / ("setup-" + std::to_string(n) + ".err");
  Proc p;
  const Child c = spawn(inv);
  while (!reap(c, p, bound)) ::usleep(20 * 1000);
  collect(inv, p);
  return p;
}

// The base run: steps 6, a checkpoint every 2 steps, keep 10 -> step-00000002, -04, -06.
// Made once per test binary run; cases copy it.
const fs::path& base_run() {
  static const fs::path run = [] {
    const fs::path dir = suite_root() / "base";
    fs::create_directories(dir / "user");
    Yaml y;
    y.set("checkpoint.dir", (dir / "ckpt").string());
    spit(dir / "user" / "job.yaml", y.text());
    const Proc p = run_now({"run", (dir / "user" / "job.yaml").string(), "--quiet"}, dir);
    if (p.code != 0) throw std::runtime_error("the base run failed (" + std::to_string(p.code) + "):\n" + p.err);
    for (const char* s : {"step-00000002", "step-00000004", "step-00000006"})
      if (!fs::exists(dir / "ckpt" / s / "manifest.json")) throw std::runtime_error(std::string("base run lacks ") + s);
    return dir / "ckpt";
  }();
  return run;
}

void copy_base_run(const fs::path& to) {
  fs::create_directories(to.parent_path());
  fs::copy(base_run(), to, fs::copy_options::recursive);
}

// A setup that copies the base run into ctx.run and writes the standard spec for it.
std::function<void(Ctx&)> with_base_run(std::function<void(Ctx&)> more = nullptr) {
  return [more](Ctx& c) {
    copy_base_run(c.run);
    write_spec(c, spec_for(c));
    if (more) more(c);
  };
}

// A tiny Hugging Face llama directory (config.json + model.safetensors) for model.from.
json tiny_llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 256},
          {"hidden_size", 32},
          {"intermediate_size", 64},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 4},
          {"max_position_embeddings", 32},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", false}};
}

std::vector<std::pair<std::string, at::Tensor>> tiny_llama_weights() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  at::Generator gen = at::detail::createCPUGenerator(7);
  for (const auto& p :
       zenflow::model::make_hf_architecture(tiny_llama_config(), at::TensorOptions().device(at::kMeta))->parameters()) {
    at::Tensor t = at::empty(p.tensor.sizes(), at::kFloat);
    if (p.name.find("norm") != std::string::npos)
      t.fill_(1.0);
    else
      t.normal_(0.0, 0.02, gen);
    out.emplace_back(p.name, t);
  }
  return out;
}

void write_tiny_llama(const fs::path& dir) {
  fs::create_directories(dir);
  spit(dir / "config.json", tiny_llama_config().dump(2));
  zenflow::model::write_safetensors((dir / "model.safetensors").string(), tiny_llama_weights(), {{"format", "pt"}});
}

// The standard spec with model.from instead of model.config.
Yaml spec_from(const Ctx& c, const fs::path& model_dir) {
  Yaml y = spec_for(c);
  y.erase("model.config");
  y.set("model.from", model_dir.string());
  return y;
}

// Edits a checkpoint's trainer.json and updates the manifest's size and CRC32C to match,
// so only the content checks can catch it.
void edit_trainer(const fs::path& step_dir, const std::function<void(json&)>& edit) {
  json t = json::parse(slurp(step_dir / "trainer.json"));
  edit(t);
  const std::string text = t.dump(1) + "\n";
  spit(step_dir / "trainer.json", text);
  json m = json::parse(slurp(step_dir / "manifest.json"));
  m["files"]["trainer.json"]["bytes"] = static_cast<int64_t>(text.size());
  m["files"]["trainer.json"]["crc32c"] = zenflow::crc32c_hex(zenflow::crc32c(text.data(), text.size()));
  spit(step_dir / "manifest.json", m.dump(1) + "\n");
}

enum class Damage { kTruncate, kFlip, kDelete };

void damage(const fs::path& file, Damage how) {
  if (how == Damage::kDelete) {
    fs::remove(file);
    return;
  }
  std::string bytes = slurp(file);
  if (bytes.empty()) throw std::runtime_error(file.string() + " is empty");
  if (how == Damage::kTruncate) {
    bytes.resize(bytes.size() / 2);
  } else {
    // The manifest has no checksum of its own: break its syntax (byte 0) so it is the
    // manifest, not a file it lists, that is found damaged. Other files: a middle byte.
    const size_t at = file.filename() == "manifest.json" ? 0 : bytes.size() / 2;
    bytes[at] = static_cast<char>(bytes[at] ^ 0x5a);
  }
  spit(file, bytes);
}

// Extra check: the run dir holds step-NNNNNNNN directories of exactly the checkpoint
// files, .zenflow.lock, the run's step log (steps.jsonl, for `zenflow report`) and nothing
// else (no job.yaml, no leftovers).
void expect_clean_run_dir(const fs::path& run, const std::vector<std::string>& steps) {
  std::set<std::string> top;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run, ec)) top.insert(e.path().filename().string());
  std::set<std::string> want(steps.begin(), steps.end());
  want.insert(".zenflow.lock");
  want.insert("steps.jsonl");
  EXPECT_EQ(top, want) << "contents of " << run;
  const std::set<std::string> files = {"manifest.json", "model.safetensors", "engine.safetensors", "trainer.json",
                                       "run.yaml"};
  for (const auto& s : steps) {
    std::set<std::string> have;
    for (const auto& e : fs::directory_iterator(run / s, ec)) have.insert(e.path().filename().string());
    EXPECT_EQ(have, files) << "contents of " << (run / s);
  }
  const json lock = json::parse(slurp(run / ".zenflow.lock"), nullptr, false);
  EXPECT_TRUE(lock.is_object() && lock.value("zenflow_lock", 0) == 1) << slurp(run / ".zenflow.lock");
}

// No file named job.yaml anywhere under `root` but the user's.
void expect_no_stray_job_yaml(const Ctx& c) {
  for (const auto& e : fs::recursive_directory_iterator(c.root))
    if (e.path().filename() == "job.yaml") {
      EXPECT_EQ(e.path(), c.spec) << "zenflow wrote " << e.path();
    }
}

std::string trainer_step_losses(const fs::path& step_dir, int64_t* step) {
  const json t = json::parse(slurp(step_dir / "trainer.json"), nullptr, false);
  if (!t.is_object()) return "";
  if (step) *step = t.value("step", int64_t{-1});
  return t.contains("losses") ? std::to_string(t["losses"].size()) : "";
}

// The harness itself: a change outside the run dir, an overwritten checkpoint are seen;
// a checkpoint renamed .damaged or moved into superseded-*/ intact is not a loss.
TEST(HostileHarness, SeesChangesAndLosses) {
  const fs::path root = suite_root() / "harness";
  zenflow::remove_tree(root);
  spit(root / "user" / "job.yaml", "name: x\n");
  spit(root / "ckpt" / "step-00000002" / "model.safetensors", "weights");
  spit(root / "ckpt" / "step-00000004" / "model.safetensors", "weights 4");
  const TreeSnapshot t0 = snapshot_tree(root, root / "ckpt");
  const CheckpointRecord c0 = record_checkpoints(root / "ckpt");
  EXPECT_EQ(c0.size(), 2u);
  spit(root / "ckpt" / "other", "inside the run dir: allowed");
  EXPECT_EQ(tree_diff(t0, snapshot_tree(root, root / "ckpt")), "");
  ::usleep(10 * 1000);
  spit(root / "user" / "job.yaml", "name: x\n");  // same bytes, rewritten
  EXPECT_NE(tree_diff(t0, snapshot_tree(root, root / "ckpt")), "");
  fs::rename(root / "ckpt" / "step-00000002", root / "ckpt" / "step-00000002.damaged");
  fs::create_directories(root / "ckpt" / "superseded-1");
  fs::rename(root / "ckpt" / "step-00000004", root / "ckpt" / "superseded-1" / "step-00000004");
  EXPECT_EQ(lost_checkpoints(c0, record_checkpoints(root / "ckpt")), "");
  spit(root / "ckpt" / "step-00000002.damaged" / "model.safetensors", "weightz");
  EXPECT_NE(lost_checkpoints(c0, record_checkpoints(root / "ckpt")), "");
  Invocation inv;
  inv.args = {"--version-that-does-not-exist"};
  inv.cwd = root;
  inv.out = root / "o";
  inv.err = root / "e";
  const auto t = std::chrono::steady_clock::now();
  const Child c = spawn(inv);
  Proc p;
  while (!reap(c, p, 0.5)) ::usleep(10 * 1000);
  EXPECT_LT(since(t), 5.0);
  EXPECT_NE(p.code, 0);
}

// ===================================================================================
// Family 1: user files never overwritten; names and directories.

std::vector<Case> user_files_spec_cases() {
  auto bad_name = [](const std::string& name, const std::string& yaml_value) {
    return Case{"name_" + name,
                [yaml_value](Ctx& c) {
                  Yaml y;  // no checkpoint.dir: the default runs/<name> is what a bad name would escape
                  y.set("name", yaml_value);
                  write_spec(c, y);
                  c.run = c.root / "nothing-may-change";
                },
                {"run", "{spec}", "--quiet"},
                {2},
                {"zenflow: invalid job spec: name: "}};
  };
  std::vector<Case> cases = {
      {"ckpt_dir_is_spec_dir",
       [](Ctx& c) {
         Yaml y;
         y.set("checkpoint.dir", ".");
         write_spec(c, y);
         c.run = c.root / "nothing-may-change";  // the spec dir must not change at all
       },
       {"run", "{spec}", "--quiet"},
       {2},
       {"checkpoint.dir: must not be the directory holding the job spec"}},
      {"ckpt_dir_is_spec_dir_absolute",
       [](Ctx& c) {
         Yaml y;
         y.set("checkpoint.dir", c.spec_dir.string() + "/");
         write_spec(c, y);
         c.run = c.root / "nothing-may-change";
       },
       {"run", "{spec}", "--quiet"},
       {2},
       {"checkpoint.dir: must not be the directory holding the job spec"}},
      {"ckpt_dir_is_spec_dir_by_set",
       [](Ctx& c) {
         write_spec(c, spec_for(c));
         c.run = c.root / "nothing-may-change";
       },
       {"run", "{spec}", "--quiet", "--set", "checkpoint.dir={specdir}"},
       {2},
       {"checkpoint.dir: must not be the directory holding the job spec"}},
      bad_name("dotdot", ".."),
      bad_name("dot", "."),
      bad_name("slash", "a/b"),
      bad_name("dash", "-x"),
      bad_name("129_chars", std::string(129, 'n')),
      {"name_50MB_spec_over_1MiB",
       [](Ctx& c) {
         Yaml y;
         y.set("name", std::string(50u << 20, 'n'));
         write_spec(c, y);
         c.run = c.root / "nothing-may-change";
       },
       {"run", "{spec}", "--quiet"},
       {2},
       {"{spec}: ", "larger than the 1 MiB limit"}},
      {"ckpt_dir_is_root",
       [](Ctx& c) {
         Yaml y;
         y.set("checkpoint.dir", "/");
         write_spec(c, y);
         c.run = c.root / "nothing-may-change";
       },
       {"run", "{spec}", "--quiet"},
       {2},
       {"zenflow: invalid job spec: checkpoint.dir: "},
       // The run is refused before anything is written: "/" got no lock and no checkpoint.
       // (Runs as the test's own user: dropping to nobody cannot reach a binary inside a
       // private 0700 directory, such as a CI clone's.)
       [](const Ctx&, const Proc&) {
         EXPECT_FALSE(fs::exists("/.zenflow.lock"));
         for (const auto& e : fs::directory_iterator("/"))
           EXPECT_NE(e.path().filename().string().rfind("step-", 0), 0u) << e.path();
       }},
      {"ckpt_dir_is_home",
       [](Ctx& c) {
         fs::create_directories(c.root / "home");
         spit(c.root / "home" / ".bashrc", "# the user's shell setup\n");
         Yaml y;
         y.set("checkpoint.dir", (c.root / "home").string());
         write_spec(c, y);
         c.env = {{"HOME", (c.root / "home").string()}};
         c.run = c.root / "nothing-may-change";
       },
       {"run", "{spec}", "--quiet"},
       {2},
       {"zenflow: invalid job spec: checkpoint.dir: "}},
      {"ckpt_dir_is_home_spelled_differently",
       [](Ctx& c) {
         fs::create_directories(c.root / "home" / "sub");
         Yaml y;
         y.set("checkpoint.dir", (c.root / "home" / "sub" / "..").string() + "/.");
         write_spec(c, y);
         c.env = {{"HOME", (c.root / "home").string()}};
         c.run = c.root / "nothing-may-change";
       },
       {"run", "{spec}", "--quiet"},
       {2},
       {"zenflow: invalid job spec: checkpoint.dir: "}},
  };
  return cases;
}

std::vector<Case> user_files_run_cases() {
  return {
      {"normal_run_writes_only_checkpoint_dir",
       [](Ctx& c) {
         Yaml y = spec_for(c);
         y.set("train.steps", "4");
         write_spec(c, y);
         spit(c.spec_dir / "notes.txt", "the user's notes\n");
       },
       {"run", "{spec}", "--quiet"},
       {0},
       {},
       [](const Ctx& c, const Proc&) {
         expect_clean_run_dir(c.run, {"step-00000002", "step-00000004"});
         expect_no_stray_job_yaml(c);
       }},
      {"normal_run_default_checkpoint_dir",
       [](Ctx& c) {
         Yaml y;
         y.set("name", "deflt");
         y.set("train.steps", "2");
         write_spec(c, y);
         c.run = c.root / "cwd" / "runs" / "deflt";  // the current directory's, not beside the spec
       },
       {"run", "{spec}", "--quiet"},
       {0},
       {},
       [](const Ctx& c, const Proc&) {
         expect_clean_run_dir(c.run, {"step-00000002"});
         expect_no_stray_job_yaml(c);
       }},
      {"user_lock_file_kept",
       [](Ctx& c) {
         write_spec(c, spec_for(c));
         spit(c.run / ".zenflow.lock", "my own notes, not zenflow's\n");
       },
       {"run", "{spec}", "--quiet"},
       {1, 2},
       {"{run}/.zenflow.lock", "exists and was not written by zenflow"},
       [](const Ctx& c, const Proc&) {
         EXPECT_EQ(slurp(c.run / ".zenflow.lock"), "my own notes, not zenflow's\n");
         EXPECT_TRUE(zenflow::list_checkpoints(c.run.string()).empty()) << "it trained anyway";
       }},
      {"lock_symlink_to_user_file",
       [](Ctx& c) {
         write_spec(c, spec_for(c));
         spit(c.root / "precious.txt", "a user's file the lock name points at\n");
         fs::create_directories(c.run);
         fs::create_symlink(c.root / "precious.txt", c.run / ".zenflow.lock");
       },
       {"run", "{spec}", "--quiet"},
       {1, 2},
       {"{run}/.zenflow.lock"}},
      {"ckpt_dir_is_a_user_file",
       [](Ctx& c) {
         spit(c.root / "data.bin", "a user's file given as checkpoint.dir\n");
         Yaml y = spec_for(c);
         y.set("checkpoint.dir", (c.root / "data.bin").string());
         write_spec(c, y);
         c.run = c.root / "nothing-may-change";
       },
       {"run", "{spec}", "--quiet"},
       {1, 2},
       {"checkpoint.dir", "{root}/data.bin"}},
  };
}

std::vector<Case> user_files_export_cases() {
  // Export cases hash the whole tree, the run included: export never modifies the run.
  auto with_run = [](std::function<void(Ctx&)> more = nullptr) {
    return [more](Ctx& c) {
      copy_base_run(c.root / "run");
      c.run = c.root / "nothing-may-change";
      if (more) more(c);
    };
  };
  return {
      {"export_out_empty", with_run(), {"export", "{root}/run", "--out", ""}, {2}, {"--out: must not be empty"}},
      {"export_out_non_empty_dir",
       with_run([](Ctx& c) { spit(c.root / "out" / "keep.txt", "the user's file\n"); }),
       {"export", "{root}/run", "--out", "{root}/out"},
       {2},
       {"{root}/out"}},
      {"export_out_is_a_file",
       with_run([](Ctx& c) { spit(c.root / "out.bin", "the user's file\n"); }),
       {"export", "{root}/run", "--out", "{root}/out.bin"},
       {2},
       {"{root}/out.bin"}},
      {"export_out_is_the_run_dir", with_run(), {"export", "{root}/run", "--out", "{root}/run"}, {2}, {"{root}/run"}},
      {"export_ok_run_dir_unchanged",
       [](Ctx& c) {
         copy_base_run(c.root / "run");
         c.run = c.root / "exported";  // the only place allowed to change
       },
       {"export", "{root}/run", "--out", "{root}/exported"},
       {0},
       {},
       [](const Ctx& c, const Proc&) {
         EXPECT_TRUE(fs::is_regular_file(c.root / "exported" / "config.json"));
         EXPECT_TRUE(fs::is_regular_file(c.root / "exported" / "model.safetensors"));
       }},
      {"export_skips_damaged_and_leaves_it",
       [](Ctx& c) {
         copy_base_run(c.root / "run");
         damage(c.root / "run" / "step-00000006" / "model.safetensors", Damage::kFlip);
         c.run = c.root / "exported";
       },
       {"export", "{root}/run", "--out", "{root}/exported"},
       {0},
       {"{root}/run/step-00000006"},
       [](const Ctx& c, const Proc& p) {
         EXPECT_TRUE(contains(p.out, "step-00000004")) << p.out;  // the newest usable one
       }},
  };
}

TEST(HostileUserFiles, NamesAndDirectories) { run_cases("user-files", user_files_spec_cases(), 3); }
TEST(HostileUserFiles, RunsWriteOnlyTheirCheckpointDir) { run_cases("user-files", user_files_run_cases(), 2); }
TEST(HostileUserFiles, ExportNeverTouchesTheRun) { run_cases("user-files", user_files_export_cases(), 3); }

// A second run on a directory in use fails at once naming the owner; the first one goes on.
TEST(HostileUserFiles, ConcurrentRunOnLockedDirectory) {
  const fs::path root = family_dir("user-files") / "concurrent";
  zenflow::remove_tree(root);
  fs::create_directories(root / "user");
  fs::create_directories(root / "cwd");
  const fs::path run = root / "ckpt", spec = root / "user" / "job.yaml";
  Yaml y;
  y.set("checkpoint.dir", run.string());
  y.set("train.steps", "100000");
  y.set("checkpoint.keep", "3");
  spit(spec, y.text());
  const TreeSnapshot before = snapshot_tree(root, run);

  Invocation a;
  a.args = {"run", spec.string(), "--quiet"};
  a.cwd = root / "cwd";
  a.out = suite_root() / "logs" / "concurrent-A.out";
  a.err = suite_root() / "logs" / "concurrent-A.err";
  const Child ca = spawn(a);
  Proc pa;
  bool a_ended = false;
  // Bounded wait: the lock and a first checkpoint.
  for (int i = 0; i < 600 && !(fs::exists(run / ".zenflow.lock") && !zenflow::list_checkpoints(run.string()).empty());
       ++i) {
    if (reap(ca, pa)) {
      a_ended = true;
      break;
    }
    ::usleep(50 * 1000);
  }
  if (a_ended) {
    collect(a, pa);
    CaseScope s("user-files", "concurrent_second_run_refused");
    FAIL() << "run A ended early (" << pa.code << "):\n" << shorten(pa.err);
  }

  auto second = [&](const std::string& name, std::vector<std::string> extra) {
    CaseScope s("user-files", name);
    Invocation b = a;
    b.args.insert(b.args.end(), extra.begin(), extra.end());
    b.out = suite_root() / "logs" / ("concurrent-" + name + ".out");
    b.err = suite_root() / "logs" / ("concurrent-" + name + ".err");
    const std::vector<Proc> pb = run_all({b}, 1);
    EXPECT_FALSE(pb[0].timed_out);
    EXPECT_EQ(pb[0].code, 74) << pb[0].err;  // attempt::kExitWorkerFault
    EXPECT_TRUE(contains(pb[0].err, "is in use by zenflow pid " + std::to_string(ca.pid) + " on host")) << pb[0].err;
    expect_clean_stderr(pb[0].err);
    // B moved nothing aside: every checkpoint A had when B started is still A's, or was
    // rotated away by A itself (keep 3); none was quarantined or superseded.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run, ec)) {
      const std::string n = e.path().filename().string();
      EXPECT_FALSE(contains(n, ".damaged") || n.rfind("superseded-", 0) == 0) << "B moved " << n;
    }
    Proc still;
    EXPECT_FALSE(reap(ca, still)) << "run A ended while B ran (" << still.code << ")";
  };
  second("concurrent_second_run_refused", {});
  second("concurrent_second_run_fresh_refused", {"--fresh"});

  {
    CaseScope s("user-files", "concurrent_first_run_interrupted_cleanly");
    ::kill(ca.pid, SIGINT);
    while (!reap(ca, pa)) ::usleep(20 * 1000);
    collect(a, pa);
    EXPECT_FALSE(pa.timed_out);
    EXPECT_EQ(pa.code, 130) << pa.err;
    expect_clean_stderr(pa.err);
    const auto cks = zenflow::list_checkpoints(run.string());
    ASSERT_FALSE(cks.empty());
    EXPECT_NO_THROW(zenflow::load_checkpoint(cks.back().second));
    EXPECT_EQ(tree_diff(before, snapshot_tree(root, run)), "");
  }
}

// ===================================================================================
// Family 2: checkpoints trusted blindly.

std::vector<Case> checkpoint_damage_cases() {
  std::vector<Case> cases;
  const std::vector<std::pair<std::string, Damage>> damages = {
      {"truncated", Damage::kTruncate}, {"flipped", Damage::kFlip}, {"deleted", Damage::kDelete}};
  for (const std::string file :
       {"model.safetensors", "engine.safetensors", "trainer.json", "run.yaml", "manifest.json"}) {
    for (const auto& [dname, how] : damages) {
      const Damage h = how;
      std::string stem = file.substr(0, file.find('.'));
      cases.push_back(
          {stem + "_" + dname,
           with_base_run([file, h](Ctx& c) { damage(c.run / "step-00000006" / file, h); }),
           {"run", "{spec}", "--quiet", "--set", "train.steps=8"},
           {0},
           {"checkpoint {run}/step-00000006 is damaged (", "{run}/step-00000006/" + file + ":",
            "resumed from {run}/step-00000004 at step 4"},
           [](const Ctx& c, const Proc&) {
             // Kept aside with its (damaged) bytes: the harness checks they are intact.
             EXPECT_TRUE(fs::is_directory(c.run / "step-00000006.damaged"));
             int64_t step = -1;
             EXPECT_EQ(trainer_step_losses(c.run / "step-00000008", &step), "8");
             EXPECT_EQ(step, 8);
             EXPECT_NO_THROW(zenflow::load_checkpoint((c.run / "step-00000008").string()));
           }});
    }
  }
  return cases;
}

std::vector<Case> checkpoint_content_cases() {
  const std::vector<std::string> resume8 = {"run", "{spec}", "--quiet", "--set", "train.steps=8"};
  return {
      {"trainer_wrong_step_manifest_matches",
       with_base_run([](Ctx& c) { edit_trainer(c.run / "step-00000006", [](json& t) { t["step"] = 5; }); }),
       resume8,
       {0},
       {"{run}/step-00000006/trainer.json: records step", "resumed from {run}/step-00000004 at step 4"}},
      {"trainer_negative_loader_index",
       with_base_run([](Ctx& c) { edit_trainer(c.run / "step-00000006", [](json& t) { t["loader_index"] = -3; }); }),
       resume8,
       {0},
       {"{run}/step-00000006/trainer.json: field 'loader_index' is negative",
        "resumed from {run}/step-00000004 at step 4"}},
      {"trainer_string_for_int",
       with_base_run([](Ctx& c) { edit_trainer(c.run / "step-00000006", [](json& t) { t["loader_epoch"] = "zero"; }); }),
       resume8,
       {0},
       {"{run}/step-00000006/trainer.json: field 'loader_epoch' is not an integer",
        "resumed from {run}/step-00000004 at step 4"}},
      {"trainer_nan_loss",
       with_base_run([](Ctx& c) {
         // NaN is not JSON: written as a string where a number belongs.
         edit_trainer(c.run / "step-00000006", [](json& t) { t["losses"][0] = "NaN"; });
       }),
       resume8,
       {0},
       {"{run}/step-00000006/trainer.json: field 'losses' holds a non-number",
        "resumed from {run}/step-00000004 at step 4"}},
      {"step_dir_renamed",
       with_base_run([](Ctx& c) { fs::rename(c.run / "step-00000004", c.run / "step-00000008"); }),
       resume8,
       {0},
       {"but the directory is step-00000008", "resumed from {run}/step-00000006 at step 6"},
       [](const Ctx& c, const Proc&) { EXPECT_TRUE(fs::is_directory(c.run / "step-00000008.damaged")); }},
      {"nan_weights_with_matching_manifest",
       with_base_run([](Ctx& c) {
         // A non-finite weight, checksums updated: only the finiteness check catches it.
         const fs::path dir = c.run / "step-00000006";
         std::vector<std::pair<std::string, at::Tensor>> named;
         {
           zenflow::model::SafetensorsFile f((dir / "model.safetensors").string());
           for (const auto& n : f.names()) named.emplace_back(n, f.tensor(n).clone());
         }
         named[0].second.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
         zenflow::model::write_safetensors((dir / "model.safetensors").string(), named, {{"format", "pt"}});
         const zenflow::FileChecksum sum = zenflow::checksum_file((dir / "model.safetensors").string());
         json m = json::parse(slurp(dir / "manifest.json"));
         m["files"]["model.safetensors"] = {{"bytes", sum.bytes}, {"crc32c", zenflow::crc32c_hex(sum.crc32c)}};
         spit(dir / "manifest.json", m.dump(1) + "\n");
       }),
       resume8,
       {0},
       {"{run}/step-00000006/model.safetensors: tensor '", "non-finite", "resumed from {run}/step-00000004 at step 4"}},
      {"all_damaged_refused",
       with_base_run([](Ctx& c) {
         for (const char* s : {"step-00000002", "step-00000004", "step-00000006"})
           damage(c.run / s / "model.safetensors", Damage::kFlip);
       }),
       resume8,
       {2},
       {"holds no usable checkpoint", "step-00000002", "step-00000004", "step-00000006", "--fresh"},
       [](const Ctx& c, const Proc&) { EXPECT_TRUE(zenflow::list_checkpoints(c.run.string()).empty()); }},
      {"all_damaged_rerun_still_refused",
       with_base_run([](Ctx& c) {
         for (const char* s : {"step-00000002", "step-00000004", "step-00000006"})
           damage(c.run / s / "model.safetensors", Damage::kFlip);
         const Proc first = run_now({"run", c.spec.string(), "--quiet", "--set", "train.steps=8"}, c.root / "cwd");
         if (first.code != 2) throw std::runtime_error("the first rerun exited " + std::to_string(first.code) + ":\n" + first.err);
       }),
       resume8,
       {2},
       {"holds no usable checkpoint", "step-00000002.damaged", "step-00000004.damaged", "step-00000006.damaged"}},
      {"all_damaged_fresh_starts_at_0",
       with_base_run([](Ctx& c) {
         for (const char* s : {"step-00000002", "step-00000004", "step-00000006"})
           damage(c.run / s / "model.safetensors", Damage::kFlip);
       }),
       {"run", "{spec}", "--quiet", "--set", "train.steps=8", "--fresh"},
       {0},
       {},
       [](const Ctx& c, const Proc& p) {
         EXPECT_FALSE(contains(p.err, "resumed from")) << p.err;
         int64_t step = -1;
         EXPECT_EQ(trainer_step_losses(c.run / "step-00000008", &step), "8");
         EXPECT_EQ(step, 8);
       }},
      {"fresh_supersedes_valid",
       with_base_run(),
       {"run", "{spec}", "--quiet", "--set", "train.steps=2", "--fresh"},
       {0},
       {"moved to {run}/superseded-"},
       [](const Ctx& c, const Proc& p) {
         EXPECT_FALSE(contains(p.err, "resumed from")) << p.err;
         int supersede_dirs = 0;
         for (const auto& e : fs::directory_iterator(c.run)) {
           if (e.path().filename().string().rfind("superseded-", 0) != 0) continue;
           ++supersede_dirs;
           for (const char* s : {"step-00000002", "step-00000004", "step-00000006"})
             EXPECT_TRUE(fs::is_directory(e.path() / s)) << e.path() / s;
         }
         EXPECT_EQ(supersede_dirs, 1);
         int64_t step = -1;
         EXPECT_EQ(trainer_step_losses(c.run / "step-00000002", &step), "2");
       }},
      {"every_step_skipped",
       [](Ctx& c) {
         // Weights ~N(0, 1e18): attention logits overflow fp32 at once, so every step's loss is NaN.
         Yaml y = spec_for(c);
         y.set("model.config.initializer_range", "1e18");
         write_spec(c, y);
       },
       {"run", "{spec}", "--quiet"},
       {1},
       {"every one of the", "steps of this run was skipped"}},
  };
}

std::vector<Case> checkpoint_identity_cases() {
  auto changed = [](const std::string& name, const std::string& set, const std::string& key) {
    return Case{name,
                with_base_run([](Ctx& c) {
                  fs::create_directories(c.root / "other");
                  fs::copy_file(std::string(kData) + "/GPL-3", c.root / "other" / "GPL-3");
                }),
                {"run", "{spec}", "--quiet", "--set", "train.steps=8", "--set", set},
                {2},
                {"{run}/step-00000006 was written by a job with other settings; changed:", "\n  " + key},
                [](const Ctx& c, const Proc&) {
                  EXPECT_FALSE(fs::exists(c.run / "step-00000008")) << "it resumed anyway";
                }};
  };
  auto accepted = [](const std::string& name, std::vector<std::string> extra, const std::string& resumed) {
    std::vector<std::string> args = {"run", "{spec}", "--quiet", "--set", "train.steps=8"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Case{name, with_base_run(), args, {0}, {"resumed from {run}/" + resumed},
                [](const Ctx& c, const Proc&) { EXPECT_TRUE(fs::is_directory(c.run / "step-00000008")); }};
  };
  std::vector<Case> cases = {
      changed("changed_mode", "optimizer.mode=offload", "optimizer.mode: "),
      changed("changed_topk_ratio", "optimizer.zenflow.topk_ratio=0.2", "optimizer.zenflow.topk_ratio: "),
      changed("changed_seq_len", "train.seq_len=8", "train.seq_len: "),
      changed("changed_micro_batch", "train.micro_batch=1", "train.global_batch (train.micro_batch x train.grad_accum x ranks): 2 -> 1"),
      changed("changed_data_train", "data.train={root}/other", "data.train: "),
      changed("changed_update_interval", "optimizer.zenflow.update_interval=1", "optimizer.zenflow.update_interval: "),
      changed("changed_model_config", "model.config.intermediate_size=48", "model.config: "),
      accepted("allowed_micro_batch",
               {"--set", "train.micro_batch=1", "--allow-spec-change", "train.micro_batch"},
               "step-00000006 at step 6"),
      accepted("allowed_seq_len", {"--set", "train.seq_len=8", "--allow-spec-change", "train.seq_len"},
               "step-00000006 at step 6"),
      accepted("steps_change_does_not_matter", {}, "step-00000006 at step 6"),
      accepted("lr_change_does_not_matter", {"--set", "train.lr=2e-3"}, "step-00000006 at step 6"),
  };
  return cases;
}

TEST(HostileCheckpoints, DamagedFilesOfTheNewestCheckpoint) {
  ASSERT_NO_THROW(base_run());
  run_cases("checkpoints", checkpoint_damage_cases(), 3);
}
TEST(HostileCheckpoints, ContentChecksAndRefusals) {
  ASSERT_NO_THROW(base_run());
  run_cases("checkpoints", checkpoint_content_cases(), 3);
}
TEST(HostileCheckpoints, ResumeWithChangedSettings) {
  ASSERT_NO_THROW(base_run());
  run_cases("checkpoints", checkpoint_identity_cases(), 3);
}

// ===================================================================================
// Family 3: unbounded inputs. Each must end within 30 s, exit 2, naming the file or key.

Case spec_range(const std::string& name, const std::string& key, const std::string& value) {
  return {name,
          [key, value](Ctx& c) {
            Yaml y = spec_for(c);
            if (key == "train.seq_len") y.erase("model.config.max_position_embeddings");
            y.set(key, value);
            write_spec(c, y);
          },
          {"run", "{spec}", "--quiet"},
          {2},
          {"zenflow: invalid job spec: " + key + ": must be in ["}};
}

std::vector<Case> unbounded_file_cases() {
  const std::vector<std::string> run = {"run", "{spec}", "--quiet"};
  auto spec_with = [](std::function<void(Ctx&, Yaml&)> edit) {
    return [edit](Ctx& c) {
      Yaml y = spec_for(c);
      edit(c, y);
      write_spec(c, y);
    };
  };
  auto model_dir = [](std::function<void(const fs::path&)> edit) {
    return [edit](Ctx& c) {
      const fs::path dir = c.root / "model";
      write_tiny_llama(dir);
      edit(dir);
      Yaml y = spec_from(c, dir);
      write_spec(c, y);
    };
  };
  return {
      {"spec_is_fifo", [](Ctx& c) { make_fifo(c.root / "job.fifo"); }, {"run", "{root}/job.fifo", "--quiet"}, {2},
       {"{root}/job.fifo", "FIFO"}},
      {"spec_is_dev_zero", nullptr, {"run", "/dev/zero", "--quiet"}, {2}, {"/dev/zero", "character device"}},
      {"spec_is_symlink_to_dev_zero",
       [](Ctx& c) { fs::create_symlink("/dev/zero", c.spec_dir / "zero.yaml"); },
       {"run", "{specdir}/zero.yaml", "--quiet"},
       {2},
       {"{specdir}/zero.yaml", "character device"}},
      {"spec_sparse_100MiB",
       [](Ctx& c) { make_sparse(c.spec_dir / "huge.yaml", 100ll << 20); },
       {"run", "{specdir}/huge.yaml", "--quiet"},
       {2},
       {"{specdir}/huge.yaml", "larger than the 1 MiB limit"}},
      {"tokenizer_is_fifo",
       spec_with([](Ctx& c, Yaml& y) {
         make_fifo(c.root / "tok" / "tokenizer.json");
         y.set("data.tokenizer", (c.root / "tok" / "tokenizer.json").string());
       }),
       run,
       {2},
       {"{root}/tok/tokenizer.json", "FIFO"}},
      {"tokenizer_is_dev_zero",
       spec_with([](Ctx&, Yaml&) {}),
       {"run", "{spec}", "--quiet", "--set", "data.tokenizer=/dev/zero"},
       {2},
       {"/dev/zero", "character device"}},
      {"tokenizer_json_is_a_directory",
       spec_with([](Ctx& c, Yaml& y) {
         fs::create_directories(c.root / "tok" / "tokenizer.json");
         y.set("data.tokenizer", (c.root / "tok" / "tokenizer.json").string());
       }),
       run,
       {2},
       {"{root}/tok/tokenizer.json"}},
      {"tokenizer_sparse_100MiB",
       spec_with([](Ctx& c, Yaml& y) {
         make_sparse(c.root / "tok" / "tokenizer.json", 100ll << 20);
         y.set("data.tokenizer", (c.root / "tok" / "tokenizer.json").string());
       }),
       run,
       {2},
       {"{root}/tok/tokenizer.json", "larger than the 64 MiB limit"}},
      {"data_train_is_fifo",
       spec_with([](Ctx& c, Yaml& y) {
         make_fifo(c.root / "train.fifo");
         y.set("data.train", (c.root / "train.fifo").string());
       }),
       run,
       {2},
       {"{root}/train.fifo", "FIFO"}},
      {"data_val_is_fifo",
       spec_with([](Ctx& c, Yaml& y) {
         make_fifo(c.root / "val.fifo");
         y.set("data.val", (c.root / "val.fifo").string());
       }),
       run,
       {2},
       {"{root}/val.fifo", "FIFO"}},
      {"data_train_is_dev_zero", spec_with([](Ctx&, Yaml& y) { y.set("data.train", "/dev/zero"); }), run, {2},
       {"/dev/zero", "character device"}},
      {"model_safetensors_is_fifo",
       model_dir([](const fs::path& d) {
         fs::remove(d / "model.safetensors");
         make_fifo(d / "model.safetensors");
       }),
       run,
       {2},
       {"{root}/model/model.safetensors", "FIFO"}},
      {"model_config_is_fifo",
       model_dir([](const fs::path& d) {
         fs::remove(d / "config.json");
         make_fifo(d / "config.json");
       }),
       run,
       {2},
       {"{root}/model/config.json", "FIFO"}},
      {"model_config_is_dev_zero_symlink",
       model_dir([](const fs::path& d) {
         fs::remove(d / "config.json");
         fs::create_symlink("/dev/zero", d / "config.json");
       }),
       run,
       {2},
       {"{root}/model/config.json", "character device"}},
      {"model_config_sparse_100MiB",
       model_dir([](const fs::path& d) { make_sparse(d / "config.json", 100ll << 20); }),
       run,
       {2},
       {"{root}/model/config.json", "larger than the 4 MiB limit"}},
      {"model_index_sparse_100MiB",
       model_dir([](const fs::path& d) {
         fs::remove(d / "model.safetensors");
         make_sparse(d / "model.safetensors.index.json", 100ll << 20);
       }),
       run,
       {2},
       {"{root}/model/model.safetensors.index.json", "larger than the 16 MiB limit"}},
      {"model_safetensors_header_claims_exabytes",
       model_dir([](const fs::path& d) {
         std::string bytes = slurp(d / "model.safetensors");
         const uint64_t n = 1ull << 60;
         std::memcpy(bytes.data(), &n, 8);
         spit(d / "model.safetensors", bytes);
       }),
       run,
       {2},
       {"{root}/model/model.safetensors"}},
  };
}

std::vector<Case> unbounded_value_cases() {
  std::vector<Case> cases = {
      // First the ones that run long when not refused (they overlap the quick ones).
      spec_range("steps_1e15", "train.steps", "1e15"),
      spec_range("grad_accum_1e12", "train.grad_accum", "1e12"),
      spec_range("gpus_per_worker_2pow32plus2", "resources.gpus_per_worker", "4294967298"),
      {"master_addr_no_such_host",
       [](Ctx& c) {
         write_spec(c, spec_for(c));
         c.env = {{"ZENFLOW_MASTER_ADDR", "no-such-host.invalid"},
                  {"ZENFLOW_MASTER_PORT", "29999"},
                  {"ZENFLOW_RANK", "0"},
                  {"ZENFLOW_WORLD_SIZE", "2"}};
       },
       {"run", "{spec}", "--quiet"},
       {1, 2},
       {"no-such-host.invalid"}},
      spec_range("num_hidden_layers_1e9", "model.config.num_hidden_layers", "1e9"),
      spec_range("hidden_size_2e9", "model.config.hidden_size", "2e9"),
      spec_range("intermediate_size_1e12", "model.config.intermediate_size", "1e12"),
      spec_range("vocab_size_1e12", "model.config.vocab_size", "1e12"),
      spec_range("micro_batch_1e9", "train.micro_batch", "1e9"),
      spec_range("seq_len_1e9", "train.seq_len", "1e9"),
      {"model_too_large_for_ram",
       [](Ctx& c) {
         Yaml y = spec_for(c);
         y.set("model.config.num_hidden_layers", "1024");
         y.set("model.config.hidden_size", "131072");
         y.set("model.config.num_attention_heads", "128");
         write_spec(c, y);
       },
       {"run", "{spec}", "--quiet"},
       {2},
       {"estimated", "available"},
       [](const Ctx& c, const Proc&) { EXPECT_TRUE(zenflow::list_checkpoints(c.run.string()).empty()); }},
      {"nproc_1000",
       [](Ctx& c) { write_spec(c, spec_for(c)); },
       {"run", "{spec}", "--quiet", "--nproc", "1000"},
       {2},
       {"--nproc"}},
  };
  return cases;
}

TEST(HostileUnbounded, FilesThatNeverEnd) { run_cases("unbounded", unbounded_file_cases(), 5); }
TEST(HostileUnbounded, ValuesBeyondAnyMachine) { run_cases("unbounded", unbounded_value_cases(), 4); }

// A signal while the model is being built ends the process at once (130), nothing written.
TEST(HostileUnbounded, SignalDuringModelLoading) {
  for (const int sig : {SIGTERM, SIGINT}) {
    const std::string name = sig == SIGTERM ? "sigterm_during_load" : "sigint_during_load";
    CaseScope s("unbounded", name);
    const fs::path root = family_dir("unbounded") / name;
    zenflow::remove_tree(root);
    fs::create_directories(root / "user");
    fs::create_directories(root / "cwd");
    const fs::path run = root / "ckpt", spec = root / "user" / "job.yaml";
    Yaml y;
    y.set("checkpoint.dir", run.string());
    // Large enough that building it takes a while, small enough for the machine.
    y.set("model.config.hidden_size", "1024");
    y.set("model.config.num_hidden_layers", "8");
    y.set("model.config.num_attention_heads", "16");
    y.set("model.config.intermediate_size", "2816");
    spit(spec, y.text());
    const TreeSnapshot before = snapshot_tree(root, run);
    Invocation inv;
    inv.args = {"run", spec.string(), "--quiet"};
    inv.cwd = root / "cwd";
    inv.out = suite_root() / "logs" / (name + ".out");
    inv.err = suite_root() / "logs" / (name + ".err");
    inv.data_limit = 6ull << 30;  // if training starts after all, it needs its optimizer state
    const Child c = spawn(inv);
    Proc p;
    bool ended = false;
    // The handler is installed before the "zenflow: job" line; signal right after it.
    for (int i = 0; i < 3000 && !contains(slurp(inv.err), "zenflow: job "); ++i) {
      if ((ended = reap(c, p))) break;
      ::usleep(10 * 1000);
    }
    const auto signalled = std::chrono::steady_clock::now();
    if (!ended) {
      ::kill(c.pid, sig);
      while (!reap(c, p)) ::usleep(20 * 1000);
    }
    collect(inv, p);
    EXPECT_FALSE(ended) << "it ended before the signal: " << p.code << "\n" << shorten(p.err);
    EXPECT_FALSE(p.timed_out);
    EXPECT_LT(since(signalled), kBoundSeconds);
    EXPECT_EQ(p.code, 130) << shorten(p.err);
    const bool before_training = contains(p.err, "interrupted before training started");
    const auto cks = zenflow::list_checkpoints(run.string());
    EXPECT_TRUE(before_training || !cks.empty()) << shorten(p.err);
    if (before_training) {
      EXPECT_TRUE(cks.empty()) << "it said nothing was written";
    }
    expect_clean_stderr(p.err);
    EXPECT_EQ(tree_diff(before, snapshot_tree(root, run)), "");
  }
}

// ===================================================================================
// Family 4: errors that mislead.

std::vector<Case> misleading_cases() {
  const std::vector<std::string> run = {"run", "{spec}", "--quiet"};
  auto spec_with = [](std::function<void(Ctx&, Yaml&)> edit) {
    return [edit](Ctx& c) {
      Yaml y = spec_for(c);
      edit(c, y);
      write_spec(c, y);
    };
  };
  auto from_dir = [](std::function<void(const fs::path&, Yaml&)> edit) {
    return [edit](Ctx& c) {
      const fs::path dir = c.root / "model";
      write_tiny_llama(dir);
      Yaml y = spec_from(c, dir);
      edit(dir, y);
      write_spec(c, y);
    };
  };
  auto sharded = [](const std::string& entry) {
    return [entry](const fs::path& d, Yaml&) {
      fs::remove(d / "model.safetensors");
      const auto w = tiny_llama_weights();
      zenflow::model::write_safetensors((d / "model-00001-of-00001.safetensors").string(), w);
      json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
      for (const auto& [n, t] : w) index["weight_map"][n] = "model-00001-of-00001.safetensors";
      index["weight_map"][w.front().first] = entry;
      spit(d / "model.safetensors.index.json", index.dump(2));
    };
  };
  auto missing = [spec_with](const std::string& key) {
    return Case{"missing_" + replace_all(key, ".", "_"),
                spec_with([key](Ctx& c, Yaml& y) {
                  if (key == "model.from") y.erase("model.config");
                  y.set(key, (c.root / "no-such-thing").string());
                }),
                {"run", "{spec}", "--quiet"},
                {2},
                {key, "{root}/no-such-thing", "no such file or directory"}};
  };
  return {
      {"tokenize_fifo",
       [](Ctx& c) { make_fifo(c.root / "tokenizer.json"); },
       {"tokenize", "--tokenizer", "{root}/tokenizer.json", "x"},
       {2},
       {"{root}/tokenizer.json", "FIFO"}},
      {"model_from_valid_dir_control", from_dir([](const fs::path&, Yaml& y) { y.set("train.steps", "2"); }), run, {0},
       {}},
      {"tokenizer_is_a_directory",
       spec_with([](Ctx& c, Yaml& y) {
         fs::create_directories(c.root / "tokdir");
         y.set("data.tokenizer", (c.root / "tokdir").string());
       }),
       run,
       {2},
       {"{root}/tokdir"}},
      {"spec_arg_is_a_directory", nullptr, {"run", "{specdir}", "--quiet"}, {2}, {"{specdir}"}},
      missing("data.train"),
      missing("data.val"),
      missing("model.from"),
      missing("data.tokenizer"),
      {"data_train_empty_dir",
       spec_with([](Ctx& c, Yaml& y) {
         fs::create_directories(c.root / "empty");
         y.set("data.train", (c.root / "empty").string());
       }),
       run,
       {2},
       {"data.train", "{root}/empty"}},
      {"model_from_is_a_file",
       spec_with([](Ctx& c, Yaml& y) {
         spit(c.root / "model.bin", "not a directory\n");
         y.erase("model.config");
         y.set("model.from", (c.root / "model.bin").string());
       }),
       run,
       {2},
       {"model.from", "{root}/model.bin"}},
      {"model_from_without_config",
       from_dir([](const fs::path& d, Yaml&) { fs::remove(d / "config.json"); }),
       run,
       {2},
       {"{root}/model/config.json", "no such file or directory"}},
      {"model_config_not_json",
       from_dir([](const fs::path& d, Yaml&) { spit(d / "config.json", "{\"model_type\": \"llama\", \"hidden"); }),
       run,
       {2},
       {"{root}/model/config.json"}},
      {"model_safetensors_truncated",
       from_dir([](const fs::path& d, Yaml&) {
         std::string b = slurp(d / "model.safetensors");
         b.resize(b.size() / 2);
         spit(d / "model.safetensors", b);
       }),
       run,
       {2},
       {"{root}/model/model.safetensors"}},
      {"dtype_float16_on_cpu", spec_with([](Ctx&, Yaml& y) { y.set("train.dtype", "float16"); }), run, {2},
       {"train.dtype"}},
      {"autocast_bfloat16_on_cpu_warns",
       spec_with([](Ctx&, Yaml& y) {
         y.set("train.autocast", "bfloat16");
         y.set("train.steps", "2");
       }),
       run,
       {0},
       {"warning", "train.autocast"}},
      {"host_threads_64_warns",
       spec_with([](Ctx&, Yaml& y) {
         y.set("optimizer.host.threads", "64");
         y.set("train.steps", "2");
       }),
       run,
       {0},
       {"warning", "optimizer.host.threads"}},
      {"instance_type_unknown_warns",
       spec_with([](Ctx&, Yaml& y) {
         y.set("cost.instance_type", "nosuch");
         y.set("train.steps", "2");
       }),
       run,
       {0},
       {"warning", "cost.instance_type", "nosuch"}},
      {"arch_contradicts_model_from",
       from_dir([](const fs::path&, Yaml& y) { y.set("model.arch", "gpt2"); }),
       run,
       {2},
       {"model.arch", "contradicts"}},
      {"index_entry_escapes_dir",
       from_dir(sharded("../../etc/passwd")),
       run,
       {2},
       {"{root}/model/model.safetensors.index.json", "../../etc/passwd"}},
      {"index_entry_absolute",
       from_dir(sharded("/etc/passwd")),
       run,
       {2},
       {"{root}/model/model.safetensors.index.json", "/etc/passwd"}},
      {"tokenize_dev_zero", nullptr, {"tokenize", "--tokenizer", "/dev/zero", "x"}, {2}, {"/dev/zero"}},
      {"tokenize_directory",
       [](Ctx& c) { fs::create_directories(c.root / "tokdir"); },
       {"tokenize", "--tokenizer", "{root}/tokdir", "x"},
       {2},
       {"{root}/tokdir"}},
  };
}

TEST(HostileMisleading, ErrorsNameThePathOrKey) { run_cases("misleading", misleading_cases(), 3); }

}  // namespace
