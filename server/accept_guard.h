// Keeps the coordinator's listening ports alive when the process runs out of file descriptors.
//
// gRPC 1.51's listener stops for good after one accept4() failure other than EAGAIN,
// ECONNABORTED or EINTR: after a single EMFILE (an idle-connection burst past the open-files
// limit) the main port never accepts again, even once the connections are gone. This file
// defines accept4() in the coordinator's executable, which the dynamic linker binds gRPC's
// calls to (the executable exports it: server/CMakeLists.txt). On EMFILE or ENFILE it sheds
// the pending connections (accepted on a descriptor kept in reserve and closed at once, so
// clients are told instead of waiting in the backlog) and answers EAGAIN, on which gRPC waits
// for the next connection instead of giving up. Once descriptors are free again, the next
// connection is accepted as usual.
//
// The coordinator reports NOT_SERVING on its health ports while connections are being shed
// (server/main.cpp asks exhausted_within()).
#pragma once

#include <chrono>
#include <cstdint>

namespace zenflow::server::accept_guard {

// Opens the reserve descriptor. Call once at start, before listening.
void install();

struct Stats {
  int64_t shed = 0;       // connections closed at once for want of descriptors
  int64_t exhausted = 0;  // accept4() calls that met EMFILE or ENFILE
};
Stats stats();

// Whether an accept failed for want of descriptors within the last `window`.
bool exhausted_within(std::chrono::milliseconds window);

}  // namespace zenflow::server::accept_guard
