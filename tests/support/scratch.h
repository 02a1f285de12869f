// Scratch directories that a test binary removes when it exits (gtest_main returning),
// unless ZENFLOW_KEEP_TEST_DIRS is set. Only the process that registered them removes them:
// a forked child that exits leaves its parent's directories alone.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <system_error>

#include "common/remove_tree.h"

namespace zenflow::test_support {

// Registers `dir` for removal at exit; returns it.
inline std::filesystem::path removed_at_exit(const std::filesystem::path& dir) {
  static struct Registry {
    pid_t owner = ::getpid();
    std::mutex mu;
    std::set<std::filesystem::path> dirs;
    ~Registry() {
      if (::getpid() != owner || std::getenv("ZENFLOW_KEEP_TEST_DIRS") != nullptr) return;
      for (const std::filesystem::path& d : dirs) {
        std::error_code ec;
        zenflow::remove_tree(d, ec);
      }
    }
  } registry;
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.dirs.insert(dir);
  return dir;
}

// A fresh, empty directory under the system's temp dir, named after `name` and this process,
// removed at exit (removed_at_exit).
inline std::filesystem::path fresh_scratch_dir(const std::string& name) {
  static std::atomic<int> n{0};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("zenflow-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return removed_at_exit(dir);
}

}  // namespace zenflow::test_support
