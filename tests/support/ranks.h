// Test helper: data-parallel ranks as threads of the test process, each with its own
// c10d Communicator (Gloo on 127.0.0.1, ports found at run time, every wait bounded).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/threads.h"
#include "worker/distributed/communicator.h"
#include "worker/distributed/launcher.h"
#include "worker/distributed/rendezvous.h"

namespace zenflow::test_support {

// LibTorch wheels ship ProcessGroupGloo.hpp without Gloo's own headers, so a build
// against one has no CPU process group (Communicator::gloo_available() is false there);
// GPU hosts use NCCL. The CPU tests skip themselves in such a build.
#define REQUIRE_GLOO()                                         \
  do {                                                         \
    if (!zenflow::distributed::Communicator::gloo_available()) \
      GTEST_SKIP() << "this LibTorch has no Gloo headers";     \
  } while (0)

inline distributed::RankInfo local_rank(int rank, int world, int port,
                                        std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  distributed::RankInfo info;
  info.rank = rank;
  info.world_size = world;
  info.master_addr = "127.0.0.1";
  info.master_port = port;
  info.timeout = timeout;
  return info;
}

// Runs fn(comm) on `world` rank threads of this process; failures inside are gtest
// failures (gtest assertions are thread-safe); an exception fails the test. The store is
// hosted by this test (a StoreServer, as the launcher does) or, with external off, by
// rank 0 on a reserved port.
inline void run_ranks(int world, const std::function<void(distributed::Communicator&)>& fn,
                      bool external = true, std::chrono::milliseconds timeout = std::chrono::seconds(20),
                      const distributed::CommunicatorOptions& options = {}) {
  std::unique_ptr<distributed::StoreServer> server;
  std::unique_ptr<distributed::PortReservation> reservation;
  int port = 0;
  if (external) {
    server = std::make_unique<distributed::StoreServer>("127.0.0.1", 0, timeout);
    port = server->port();
  } else {
    reservation = std::make_unique<distributed::PortReservation>();
    port = reservation->port();
  }
  run_threads(world, [&](int r) {
    distributed::RankInfo info = local_rank(r, world, port, timeout);
    info.store_external = external;
    distributed::Communicator comm(info, options);
    fn(comm);
  });
}

}  // namespace zenflow::test_support
