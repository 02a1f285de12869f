// Test helpers for hostile inputs: running a call that must return promptly, making a FIFO.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "common/input_file.h"

namespace zenflow::test_support {

struct CallOutcome {
  bool returned = false;     // false: still running at the deadline
  bool threw = false;
  bool input_error = false;  // the exception was a zenflow::InputError
  std::string message;       // what() of the exception
  double seconds = 0;        // how long it took (the limit when it did not return)
};

// Runs `fn` on its own thread and waits at most `limit`. Not std::async: the future of
// std::async joins in its destructor, so a call that blocks (a regression opening a
// FIFO) would hang the test instead of failing it; here the thread is detached and left
// behind. `fn` must therefore own what it uses (capture by value).
inline CallOutcome call_within(std::function<void()> fn,
                               std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  auto done = std::make_shared<std::promise<CallOutcome>>();
  std::future<CallOutcome> result = done->get_future();
  const auto start = std::chrono::steady_clock::now();
  std::thread([done, fn = std::move(fn), start] {
    CallOutcome o;
    o.returned = true;
    try {
      fn();
    } catch (const InputError& e) {
      o.threw = o.input_error = true;
      o.message = e.what();
    } catch (const std::exception& e) {
      o.threw = true;
      o.message = e.what();
    } catch (...) {
      o.threw = true;
      o.message = "(an exception that is not a std::exception)";
    }
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    done->set_value(o);
  }).detach();
  if (result.wait_for(limit) != std::future_status::ready) {
    CallOutcome o;
    o.seconds = std::chrono::duration<double>(limit).count();
    o.message = "(still running after " + std::to_string(o.seconds) + " s)";
    return o;
  }
  return result.get();
}

// Creates a FIFO at `path` (replacing nothing: the path must not exist). Returns "" or
// the error.
inline std::string make_fifo(const std::filesystem::path& path) {
  if (::mkfifo(path.c_str(), 0600) != 0) return path.string() + ": mkfifo: " + std::strerror(errno);
  return "";
}

}  // namespace zenflow::test_support
