// The message of the exception a call throws ("" when it throws none): for tests that
// assert what an error says.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace zenflow::test_support {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace zenflow::test_support
