#include "worker/rank/error_text.h"

#include <c10/util/Exception.h>

namespace zenflow {

std::string error_text(const std::exception& e, bool verbose) {
  if (verbose) return e.what();
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    const std::string msg = c10->what_without_backtrace();
    return msg.substr(0, msg.find('\n')) + " (--verbose shows LibTorch's trace)";
  }
  return e.what();
}

}  // namespace zenflow
