// Test helper: start `zenflow run SPEC --nproc 2`, kill its rank 1 once the ranks have met,
// and see how the job ends (bounded: 30 s for the ranks to meet, 30 s for the job to stop;
// every process it started is killed by PID on the way out).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace zenflow::test_support {

struct KilledRankRun {
  std::string error;  // non-empty: the run could not be observed (the ranks never met, or the job never stopped)
  int status = 0;     // the launcher's wait status
  pid_t killed = -1;  // rank 1's pid
  std::string log;    // the launcher's standard error
};

// `lock_file`: a path that exists once the ranks have met (rank 0 holds checkpoint.dir).
inline KilledRankRun kill_rank_one_of_two(const std::string& zenflow_bin, const std::string& spec,
                                          const std::filesystem::path& lock_file, const std::string& log_path) {
  KilledRankRun out;
  const pid_t launcher = fork();
  if (launcher < 0) return {"fork failed", 0, -1, ""};
  if (launcher == 0) {
    if (!freopen(log_path.c_str(), "w", stderr)) _exit(126);
    execl(zenflow_bin.c_str(), zenflow_bin.c_str(), "run", spec.c_str(), "--nproc", "2", "--quiet", "--no-resume",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  // The launcher's children are the ranks.
  std::vector<pid_t> ranks;
  for (int i = 0; i < 600 && (ranks.size() < 2 || !std::filesystem::exists(lock_file)); ++i) {
    usleep(50 * 1000);
    ranks.clear();
    std::ifstream children("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) + "/children");
    for (pid_t p; children >> p;) ranks.push_back(p);
  }
  auto stop_all = [&] {
    kill(launcher, SIGKILL);
    for (pid_t p : ranks) kill(p, SIGKILL);
    int st = 0;
    waitpid(launcher, &st, 0);
  };
  if (ranks.size() != 2u) {
    stop_all();
    out.error = "the launcher did not start 2 ranks holding checkpoint.dir within 30 s (saw " +
                std::to_string(ranks.size()) + ")";
    return out;
  }
  usleep(500 * 1000);
  out.killed = ranks[1];
  kill(ranks[1], SIGKILL);
  bool exited = false;
  for (int i = 0; i < 600 && !exited; ++i) {  // 30 s bound
    exited = waitpid(launcher, &out.status, WNOHANG) == launcher;
    if (!exited) usleep(50 * 1000);
  }
  if (!exited) {
    stop_all();
    out.error = "the job did not stop within 30 s of losing a rank";
  }
  std::ifstream in(log_path);
  out.log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return out;
}

// The job spec `text` (a run of `steps: 10` writing into DIR/ckpt) made endless, run with
// 2 ranks of which rank 1 is killed: the job must fail, the launcher naming the rank.
inline void expect_killed_rank_fails_the_job(std::string text, const std::filesystem::path& dir) {
  text.replace(text.find("steps: 10"), 9, "steps: 1000000");
  const std::string spec = (dir / "long.yaml").string();
  std::ofstream(spec) << text;
  const KilledRankRun r = kill_rank_one_of_two(std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow", spec,
                                               dir / "ckpt" / ".zenflow.lock", (dir / "log.txt").string());
  ASSERT_EQ(r.error, "");
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0);
  EXPECT_NE(r.log.find("rank 1 (pid " + std::to_string(r.killed) + ") failed"), std::string::npos) << r.log;
}

}  // namespace zenflow::test_support
