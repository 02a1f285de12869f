// An exception's message for the user, one line: what `zenflow run` and the other verbs print.
#pragma once

#include <exception>
#include <string>

namespace zenflow {

// e.what(), except for LibTorch's errors (c10::Error), whose what() carries a stack trace:
// their first line, and a note that --verbose shows the trace; the whole what() if `verbose`.
std::string error_text(const std::exception& e, bool verbose = false);

}  // namespace zenflow
