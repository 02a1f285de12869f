// Test helper: runs a function on several threads of the test process, as ranks.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zenflow::test_support {

// Runs fn(r) for r in [0, n) on n threads and joins them; failures inside are gtest
// failures (gtest assertions are thread-safe); an exception fails the test, naming the
// rank.
inline void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<std::string> errors;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(mu);
        errors.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
}

}  // namespace zenflow::test_support
