// Checkpoint integrity: manifests, verification of every file, quarantine, supersede, identity, the commit
// fence, the directory lock.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "common/job_spec.h"
#include "common/remove_tree.h"
#include "tests/support/dir_lock_holder.h"
#include "tests/support/scratch.h"
#include "tests/support/shell.h"
#include "worker/rank/checkpoint.h"

namespace fs = std::filesystem;
using nlohmann::json;
using zenflow::test_support::read_file;
using zenflow::test_support::write_file;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("zenflow-ckpt-" + name + "-" + std::to_string(::getpid()));
  zenflow::remove_tree(d);
  fs::create_directories(d);
  return zenflow::test_support::removed_at_exit(d);
}

zenflow::CheckpointContents contents(float scale) {
  zenflow::CheckpointContents c;
  c.model = {{"w", at::arange(12, at::kFloat).reshape({3, 4}) * scale}, {"b", at::ones({4}) * scale}};
  c.engine = {{"engine.m", at::full({6}, scale)}, {"engine.t", at::full({1}, 7, at::kLong)}};
  c.trainer = {{"loader_epoch", 1}, {"loader_index", 5}, {"losses", {2.5, 2.25}}, {"job", "t"}};
  c.run_yaml = "name: t\n";
  c.identity = {{"optimizer.mode", "zenflow"}, {"train.seq_len", 16}};
  return c;
}

// Three checkpoints at steps 2, 4, 6.
fs::path three_checkpoints(const std::string& name) {
  const fs::path d = scratch(name);
  for (int s : {2, 4, 6}) zenflow::write_checkpoint(d.string(), s, contents(static_cast<float>(s)), 10);
  return d;
}

// Rewrites `file` of a checkpoint and records its new size and checksum in the manifest, so
// that only the content checks (not the checksums) can catch what was changed.
void rewrite_with_manifest(const fs::path& step_dir, const std::string& file, const std::string& bytes) {
  write_file(step_dir / file, bytes);
  json m = json::parse(read_file(step_dir / "manifest.json"));
  m["files"][file] = {{"bytes", static_cast<int64_t>(bytes.size())},
                      {"crc32c", zenflow::crc32c_hex(zenflow::crc32c(bytes.data(), bytes.size()))}};
  write_file(step_dir / "manifest.json", m.dump());
}

// The step the scan settles on, and its warnings.
struct Outcome {
  int64_t step = -1;
  std::vector<std::string> warnings;
  std::vector<std::string> damaged;
};
Outcome scan(const fs::path& d, bool quarantine = true) {
  Outcome o;
  auto s = zenflow::scan_checkpoints(d.string(), [&](const std::string& w) { o.warnings.push_back(w); }, quarantine);
  if (s.checkpoint) o.step = s.checkpoint->step;
  o.damaged = s.damaged;
  return o;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Checkpoint, RoundTripRecordsEveryFileInTheManifest) {
  const fs::path d = three_checkpoints("roundtrip");
  const zenflow::Checkpoint c = zenflow::load_checkpoint((d / "step-00000006").string());
  EXPECT_EQ(c.step, 6);
  EXPECT_EQ(c.world_size, 1);
  EXPECT_EQ(c.loader_epoch, 1);
  EXPECT_EQ(c.loader_index, 5);
  EXPECT_EQ(c.losses, (std::vector<double>{2.5, 2.25}));
  EXPECT_EQ(c.identity, (json{{"optimizer.mode", "zenflow"}, {"train.seq_len", 16}}));
  ASSERT_EQ(c.model.size(), 2u);
  EXPECT_TRUE(at::equal(c.model[0].second, at::arange(12, at::kFloat).reshape({3, 4}) * 6));
  const auto engine = zenflow::load_engine_shard(c, 0);
  EXPECT_TRUE(at::equal(engine[0].second, at::full({6}, 6.0f)));
  const json m = json::parse(read_file(d / "step-00000006" / "manifest.json"));
  for (const char* f : {"model.safetensors", "engine.safetensors", "trainer.json", "run.yaml"}) {
    ASSERT_TRUE(m["files"].contains(f)) << f;
    const auto sum = zenflow::checksum_file((d / "step-00000006" / f).string());
    EXPECT_EQ(m["files"][f]["bytes"].get<int64_t>(), sum.bytes) << f;
    EXPECT_EQ(m["files"][f]["crc32c"].get<std::string>(), zenflow::crc32c_hex(sum.crc32c)) << f;
  }
  EXPECT_EQ(read_file(d / "step-00000006" / "run.yaml"), "name: t\n");
}

TEST(Checkpoint, ACheckpointIsNeverReplaced) {
  const fs::path d = three_checkpoints("never-replaced");
  const std::string before = read_file(d / "step-00000004" / "model.safetensors");
  try {
    zenflow::write_checkpoint(d.string(), 4, contents(99), 10);
    ADD_FAILURE() << "step 4 was written twice";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "step-00000004 already exists")) << e.what();
  }
  EXPECT_EQ(read_file(d / "step-00000004" / "model.safetensors"), before);
}

// Every file of a checkpoint, truncated, with a flipped byte, or deleted: the newest is
// skipped naming the file, renamed *.damaged with its bytes intact, and the previous is used.
TEST(Checkpoint, EveryDamagedFileFallsBackToThePreviousCheckpoint) {
  const std::vector<std::string> files = {"model.safetensors", "engine.safetensors", "trainer.json", "run.yaml",
                                          "manifest.json"};
  int cases = 0;
  for (const std::string& file : files) {
    for (const std::string how : {"truncate", "flip", "delete"}) {
      SCOPED_TRACE(file + " " + how);
      const fs::path d = three_checkpoints("damage");
      const fs::path target = d / "step-00000006" / file;
      std::string bytes = read_file(target);
      if (how == "truncate") write_file(target, bytes.substr(0, bytes.size() / 2));
      if (how == "flip") {
        bytes[bytes.size() - 3] ^= 0x10;  // a data byte (a header byte for the JSON files)
        write_file(target, bytes);
      }
      if (how == "delete") fs::remove(target);
      const std::string kept = how == "delete" ? "" : read_file(target);
      const Outcome o = scan(d);
      EXPECT_EQ(o.step, 4);
      ASSERT_EQ(o.warnings.size(), 1u);
      EXPECT_TRUE(contains(o.warnings[0], (d / "step-00000006" / file).string())) << o.warnings[0];
      EXPECT_TRUE(contains(o.warnings[0], "kept as " + (d / "step-00000006.damaged").string())) << o.warnings[0];
      EXPECT_FALSE(fs::exists(d / "step-00000006"));
      if (how != "delete") {
        EXPECT_EQ(read_file(d / "step-00000006.damaged" / file), kept);
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 15);
}

TEST(Checkpoint, ChecksumMismatchAndSizeAreNamed) {
  const fs::path d = three_checkpoints("reasons");
  std::string w = read_file(d / "step-00000006" / "model.safetensors");
  w[w.size() - 1] ^= 1;
  write_file(d / "step-00000006" / "model.safetensors", w);
  write_file(d / "step-00000004" / "engine.safetensors", read_file(d / "step-00000004" / "engine.safetensors") + "x");
  const Outcome o = scan(d, /*quarantine=*/false);
  EXPECT_EQ(o.step, 2);
  ASSERT_EQ(o.warnings.size(), 2u);
  EXPECT_TRUE(contains(o.warnings[0], "model.safetensors: checksum mismatch")) << o.warnings[0];
  EXPECT_TRUE(contains(o.warnings[1], "engine.safetensors: is ")) << o.warnings[1];
  EXPECT_TRUE(contains(o.warnings[1], "the manifest says")) << o.warnings[1];
  // Without quarantine (export, other ranks) nothing is renamed.
  EXPECT_TRUE(fs::exists(d / "step-00000006"));
  EXPECT_TRUE(fs::exists(d / "step-00000004"));
}

// Fields edited with the checksums fixed up: the content checks catch them.
TEST(Checkpoint, InconsistentOrOutOfRangeTrainerStateIsDamaged) {
  struct Case {
    std::string what;
    json trainer;
    std::string reason;
  };
  json good = json::parse(read_file(three_checkpoints("fields") / "step-00000006" / "trainer.json"));
  auto with = [&](const char* key, json v) {
    json t = good;
    if (v.is_discarded()) t.erase(key); else t[key] = v;
    return t;
  };
  const std::vector<Case> cases = {
      {"wrong step", with("step", 5), "records step 5 but the manifest says 6"},
      {"negative index", with("loader_index", -3), "field 'loader_index' is negative: -3"},
      {"string epoch", with("loader_epoch", "one"), "field 'loader_epoch' is not an integer"},
      {"missing index", with("loader_index", json(json::value_t::discarded)), "field 'loader_index' is missing"},
      {"losses not a list", with("losses", 3), "field 'losses' is not a list"},
      {"world size", with("world_size", 2), "records world_size 2 but the manifest says 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const fs::path d = three_checkpoints("fields");
    rewrite_with_manifest(d / "step-00000006", "trainer.json", c.trainer.dump());
    const Outcome o = scan(d);
    EXPECT_EQ(o.step, 4);
    ASSERT_EQ(o.warnings.size(), 1u);
    EXPECT_TRUE(contains(o.warnings[0], "trainer.json: " + c.reason)) << o.warnings[0];
  }
  // A directory renamed to another step: its name, manifest and trainer.json disagree.
  const fs::path d = three_checkpoints("renamed");
  fs::rename(d / "step-00000004", d / "step-00000008");
  const Outcome o = scan(d, false);
  EXPECT_EQ(o.step, 6);
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_TRUE(contains(o.warnings[0], "records step 4 but the directory is step-00000008")) << o.warnings[0];
}

TEST(Checkpoint, NonFiniteWeightsOrOptimizerStateAreDamaged) {
  const fs::path d = three_checkpoints("nan");
  zenflow::CheckpointContents bad = contents(8);
  bad.engine[0].second[2] = std::nanf("");
  zenflow::write_checkpoint(d.string(), 8, bad, 10);
  zenflow::CheckpointContents inf = contents(10);
  inf.model[1].second[0] = INFINITY;
  zenflow::write_checkpoint(d.string(), 10, inf, 10);
  const Outcome o = scan(d);
  EXPECT_EQ(o.step, 6);
  ASSERT_EQ(o.warnings.size(), 2u);
  EXPECT_TRUE(contains(o.warnings[0], "model.safetensors: tensor 'b' holds 1 non-finite value(s)")) << o.warnings[0];
  EXPECT_TRUE(contains(o.warnings[1], "engine.safetensors: tensor 'engine.m' holds 1 non-finite value(s)"))
      << o.warnings[1];
}

TEST(Checkpoint, AllDamagedLeavesNothingUsableAndRemembersTheDamage) {
  const fs::path d = three_checkpoints("all");
  for (int s : {2, 4, 6}) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%08d", s);
    fs::remove(d / name / "trainer.json");
  }
  Outcome o = scan(d);
  EXPECT_EQ(o.step, -1);
  EXPECT_EQ(o.warnings.size(), 3u);
  EXPECT_EQ(o.damaged.size(), 3u);
  EXPECT_TRUE(zenflow::list_checkpoints(d.string()).empty());
  // A later scan still sees the quarantined ones: a run does not silently start over.
  o = scan(d);
  EXPECT_EQ(o.step, -1);
  EXPECT_EQ(o.damaged.size(), 3u);
  EXPECT_TRUE(o.warnings.empty());
  // A second damaged checkpoint of the same step gets its own name.
  zenflow::write_checkpoint(d.string(), 6, contents(6), 10);
  fs::remove(d / "step-00000006" / "run.yaml");
  o = scan(d);
  EXPECT_TRUE(fs::exists(d / "step-00000006.damaged.2"));
  EXPECT_EQ(o.damaged.size(), 4u);
}

TEST(Checkpoint, MultiRankCommitNeedsEveryShardWithItsChecksum) {
  const fs::path d = scratch("ranks");
  zenflow::begin_checkpoint(d.string(), 3);
  zenflow::write_engine_shard(d.string(), 3, 1, {{"engine.m", at::ones({2})}});
  zenflow::commit_checkpoint(d.string(), 3, contents(3), 10, 2);
  const zenflow::Checkpoint c = zenflow::load_checkpoint((d / "step-00000003").string());
  EXPECT_EQ(c.world_size, 2);
  EXPECT_TRUE(at::equal(zenflow::load_engine_shard(c, 1)[0].second, at::ones({2})));
  EXPECT_FALSE(fs::exists(d / "step-00000003" / "engine-rank-00001.safetensors.crc32c"));
  // A rank that did not write its shard fails the commit; nothing appears under the step's name.
  zenflow::begin_checkpoint(d.string(), 5);
  EXPECT_THROW(zenflow::commit_checkpoint(d.string(), 5, contents(5), 10, 2), std::runtime_error);
  EXPECT_FALSE(fs::exists(d / "step-00000005"));
  // A shard damaged after its rank checksummed it makes the whole checkpoint damaged.
  std::string shard = read_file(d / "step-00000003" / "engine-rank-00001.safetensors");
  shard[shard.size() - 1] ^= 4;
  write_file(d / "step-00000003" / "engine-rank-00001.safetensors", shard);
  const Outcome o = scan(d, false);
  EXPECT_EQ(o.step, -1);
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_TRUE(contains(o.warnings[0], "engine-rank-00001.safetensors: checksum mismatch")) << o.warnings[0];
}

// A fence that refuses leaves the directory as it was: no new step, no temporary
// directory; one that allows sees the rename and rotation happen inside its call.
TEST(Checkpoint, ARefusingFenceCommitsNothing) {
  const fs::path d = three_checkpoints("fence");
  zenflow::begin_checkpoint(d.string(), 8);
  int refused_calls = 0;
  EXPECT_THROW(zenflow::commit_checkpoint(d.string(), 8, contents(8), 2, 1,
                                          [&](const std::function<void()>&) {
                                            ++refused_calls;
                                            return false;
                                          }),
               zenflow::CommitFenced);
  EXPECT_EQ(refused_calls, 1);
  std::vector<int64_t> steps;
  for (const auto& [step, path] : zenflow::list_checkpoints(d.string())) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 6}));  // keep 2 did not rotate either
  EXPECT_FALSE(fs::exists(d / "step-00000008.tmp"));

  zenflow::begin_checkpoint(d.string(), 8);
  std::vector<int64_t> inside;  // what the directory held when the fence's call returned
  const std::string path =
      zenflow::commit_checkpoint(d.string(), 8, contents(8), 2, 1, [&](const std::function<void()>& publish) {
        publish();
        for (const auto& c : zenflow::list_checkpoints(d.string())) inside.push_back(c.first);
        return true;
      });
  EXPECT_EQ(path, (d / "step-00000008").string());
  EXPECT_EQ(inside, (std::vector<int64_t>{6, 8}));
  EXPECT_NO_THROW(zenflow::load_checkpoint(path));
}

TEST(Checkpoint, SupersedeMovesAnEarlierRunAsideWithoutDeleting) {
  const fs::path d = three_checkpoints("supersede");
  // What else the earlier run left: its record, its profile, a quarantined and a half-written
  // checkpoint; and what is not the run's: the user's files, a link, an older superseded run.
  auto write = [](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  write(d / "steps.jsonl", "{\"event\":\"start\"}\n");
  write(d / "profile.yaml", "steady: {}\n");
  write(d / "profile.yaml.tmp.4242", "stead");
  fs::create_directories(d / "step-00000001.damaged");
  fs::create_directories(d / "step-00000001.damaged.2");
  fs::create_directories(d / "step-00000008.tmp");
  write(d / "notes.txt", "mine\n");
  write(d / "step-00000009", "a file of mine named like a checkpoint\n");
  write(d / "steps.jsonl.bak", "mine\n");
  fs::create_directories(d / "step-00000003.old");
  fs::create_directories(d / "superseded-19990101-000000" / "step-00000001");
  write(d / ".zenflow.lock", "host pid start\n");
  write(d.parent_path() / "supersede-target.txt", "outside\n");
  fs::create_symlink(d.parent_path() / "supersede-target.txt", d / "profile.yaml.tmp.7");

  const std::string moved = zenflow::supersede_checkpoints(d.string());
  ASSERT_FALSE(moved.empty());
  EXPECT_EQ(fs::path(moved).parent_path(), d);
  EXPECT_EQ(fs::path(moved).filename().string().rfind("superseded-2", 0), 0u) << moved;
  EXPECT_TRUE(zenflow::list_checkpoints(d.string()).empty());
  EXPECT_EQ(zenflow::list_checkpoints(moved).size(), 3u);
  EXPECT_NO_THROW(zenflow::load_checkpoint((fs::path(moved) / "step-00000006").string()));
  std::set<std::string> aside, left;
  for (const auto& e : fs::directory_iterator(moved)) aside.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(d)) left.insert(e.path().filename().string());
  EXPECT_EQ(aside, (std::set<std::string>{"step-00000002", "step-00000004", "step-00000006", "steps.jsonl",
                                          "profile.yaml", "profile.yaml.tmp.4242", "step-00000001.damaged",
                                          "step-00000001.damaged.2", "step-00000008.tmp"}));
  EXPECT_EQ(left, (std::set<std::string>{"notes.txt", "step-00000009", "steps.jsonl.bak", "step-00000003.old",
                                         "superseded-19990101-000000", ".zenflow.lock", "profile.yaml.tmp.7",
                                         fs::path(moved).filename().string()}));
  EXPECT_EQ(zenflow::supersede_checkpoints(d.string()), "");  // nothing left to move
  fs::remove(d.parent_path() / "supersede-target.txt");
}

TEST(Checkpoint, RunFilesAreTheNamesARunWrites) {
  for (const char* name : {"step-00000002", "step-123456789", "step-00000002.tmp", "step-00000002.damaged",
                           "step-00000002.damaged.3", "steps.jsonl", "profile.yaml", "profile.yaml.tmp.99"})
    EXPECT_TRUE(zenflow::is_run_file(name)) << name;
  for (const char* name : {"step-", "step-x", "step-00000002.bak", "step-00000002.damaged.", "step-00000002.damaged.x",
                           "step-00000002.tmp.1", "steps.jsonl.1", "profile.yaml.tmp.", "profile.yaml.tmp.x",
                           ".zenflow.lock", "superseded-20260101-000000", "notes.txt", ""})
    EXPECT_FALSE(zenflow::is_run_file(name)) << name;
}

TEST(Checkpoint, IdentityListsTheKeysThatChanged) {
  zenflow::JobSpec a = zenflow::parse_job_spec("name: a\ndata: {train: x}\n");
  zenflow::JobSpec b = a;
  b.train.steps = 999;  // may change
  b.train.lr = 1;       // may change
  EXPECT_TRUE(zenflow::identity_changes(zenflow::job_identity(a, 1), zenflow::job_identity(b, 1)).empty());
  b.optimizer.mode = "offload";
  b.train.seq_len = 32;
  b.model.config["hidden_size"] = 64;
  auto changes = zenflow::identity_changes(zenflow::job_identity(a, 1), zenflow::job_identity(b, 1));
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0], "model.config: {} -> {\"hidden_size\":64.0}");
  EXPECT_EQ(changes[1], "optimizer.mode: \"zenflow\" -> \"offload\"");
  EXPECT_EQ(changes[2], "train.seq_len: 128 -> 32");
  changes = zenflow::identity_changes(zenflow::job_identity(a, 1), zenflow::job_identity(b, 1),
                                      {"optimizer.mode", "model.config"});
  ASSERT_EQ(changes.size(), 1u);
  // W ranks x micro-batch b is the global batch of one rank x W*b: the same job.
  zenflow::JobSpec c = a;
  c.train.micro_batch = a.train.micro_batch * 2;
  EXPECT_TRUE(zenflow::identity_changes(zenflow::job_identity(a, 2), zenflow::job_identity(c, 1)).empty());
  changes = zenflow::identity_changes(zenflow::job_identity(a, 1), zenflow::job_identity(c, 1));
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0], "train.global_batch (train.micro_batch x train.grad_accum x ranks): 8 -> 16");
  // Allowing a factor of the global batch allows the global batch.
  EXPECT_TRUE(zenflow::identity_changes(zenflow::job_identity(a, 1), zenflow::job_identity(c, 1), {"train.micro_batch"})
                  .empty());
}

TEST(CheckpointDirLock, ASecondOwnerIsRefusedNamingTheFirst) {
  const fs::path d = scratch("lock");
  // The first owner is another process, so the message names its pid.
  zenflow::test_support::DirLockHolder first(d.string());
  ASSERT_GT(first.pid(), 0);
  try {
    zenflow::CheckpointDirLock second(d.string());
    ADD_FAILURE() << "two owners of one checkpoint.dir";
  } catch (const zenflow::CheckpointDirBusy& e) {
    EXPECT_TRUE(contains(e.what(), "is in use by zenflow pid " + std::to_string(first.pid()) + " on host "))
        << e.what();
  }
  first.release();  // the kernel drops a killed owner's lock
  EXPECT_NO_THROW(zenflow::CheckpointDirLock again(d.string()));
}

// lock_checkpoint_dir waits for an owner to let go (here: killed), and gives up after its wait.
TEST(CheckpointDirLock, AWaitOutlastsAnOwnerThatLetsGoAndFailsAfterIt) {
  const fs::path d = scratch("lock-wait");
  zenflow::test_support::DirLockHolder first(d.string());
  ASSERT_GT(first.pid(), 0);
  const pid_t first_pid = first.pid();
  std::vector<std::string> waited;
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    first.release();
  });
  std::unique_ptr<zenflow::CheckpointDirLock> lock;
  EXPECT_NO_THROW(lock =
                      zenflow::lock_checkpoint_dir(d.string(), std::chrono::seconds(60),
                                                   [&](const std::string& busy) { waited.push_back(busy); }));
  release.join();
  EXPECT_NE(lock, nullptr);
  ASSERT_EQ(waited.size(), 1u);  // told once, naming the owner
  EXPECT_TRUE(contains(waited[0], "is in use by zenflow pid " + std::to_string(first_pid))) << waited[0];
  lock.reset();

  zenflow::test_support::DirLockHolder second(d.string());
  ASSERT_GT(second.pid(), 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    zenflow::lock_checkpoint_dir(d.string(), std::chrono::milliseconds(500));
    ADD_FAILURE() << "two owners of one checkpoint.dir";
  } catch (const zenflow::CheckpointDirBusy& e) {
    EXPECT_TRUE(contains(e.what(), "is in use by zenflow pid " + std::to_string(second.pid()))) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));  // it did wait
}

TEST(CheckpointDirLock, AUsersFileOfThatNameIsLeftAlone) {
  const fs::path d = scratch("lock-user");
  write_file(d / ".zenflow.lock", "my notes\n");
  try {
    zenflow::CheckpointDirLock lock(d.string());
    ADD_FAILURE() << "took over a user's file";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "exists and was not written by zenflow")) << e.what();
  }
  EXPECT_EQ(read_file(d / ".zenflow.lock"), "my notes\n");
  fs::remove(d / ".zenflow.lock");
  fs::create_symlink(d / "elsewhere", d / ".zenflow.lock");
  EXPECT_THROW(zenflow::CheckpointDirLock lock(d.string()), std::runtime_error);
  EXPECT_FALSE(fs::exists(d / "elsewhere"));
}
