// Data-parallel infrastructure on CPU Gloo over 127.0.0.1: rank-info parsing, the
// Communicator's collectives (exact numbers, byte counters), the bucketed GradReducer
// (2 ranks x micro-batch b == 1 rank x 2b; buckets launched during backward; gradient
// accumulation; unused parameters), failure handling (a SIGKILLed or SIGSTOPped peer,
// the store host lost, a rank that never joins) and the local launcher.
//
// Ranks run as threads of this process, or — when a rank must die — as subprocesses:
// this test binary re-executed with --gtest_filter=DistributedChild.Role and
// ZENFLOW_TEST_ROLE naming what the child does (DistributedChild.Role skips itself in
// an ordinary run). Every child is killed and reaped by the test that started it, and
// dies with it (PR_SET_PDEATHSIG). Ports are found at run time; every wait is bounded.
#include <ATen/detail/CUDAHooksInterface.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/distributed/communicator.h"
#include "worker/distributed/grad_reducer.h"
#include "tests/support/bounded_call.h"
#include "tests/support/ranks.h"
#include "worker/distributed/launcher.h"
#include "worker/distributed/rendezvous.h"

extern char** environ;

namespace zd = zenflow::distributed;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

using zenflow::test_support::local_rank;
using zenflow::test_support::run_ranks;

// ---- subprocess ranks ----------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  Child() = default;
  explicit Child(pid_t p) : pid(p) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { reap(true); }
  void reap(bool kill_first) {
    if (pid <= 0) return;
    if (kill_first) ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// Re-executes this test binary as rank `rank` playing `role`.
pid_t spawn_role(const std::string& role, int rank, int world, int port, double timeout_s,
                 bool external = false) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "ZENFLOW_", 8) != 0) env.emplace_back(*e);
  }
  env.push_back("ZENFLOW_TEST_ROLE=" + role);
  env.push_back("ZENFLOW_RANK=" + std::to_string(rank));
  env.push_back("ZENFLOW_WORLD_SIZE=" + std::to_string(world));
  env.push_back("ZENFLOW_MASTER_ADDR=127.0.0.1");
  env.push_back("ZENFLOW_MASTER_PORT=" + std::to_string(port));
  env.push_back("ZENFLOW_DIST_TIMEOUT_S=" + std::to_string(timeout_s));
  env.push_back(std::string("ZENFLOW_STORE_EXTERNAL=") + (external ? "1" : "0"));
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=DistributedChild.Role";
  std::vector<char*> argv{exe.data(), filter.data(), nullptr};
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// Options for ranks whose start-up (a process loading LibTorch) is part of the rendezvous.
zd::CommunicatorOptions slow_start_options() {
  zd::CommunicatorOptions o;
  o.rendezvous_timeout = 60s;
  return o;
}

// ---- a small MLP for the reducer tests -----------------------------------------------

struct Mlp {
  std::vector<at::Tensor> params;  // w1, b1, w2, b2, w3, b3
  static Mlp make(uint64_t seed) {
    at::manual_seed(seed);
    Mlp m;
    const std::vector<std::vector<int64_t>> shapes{{32, 16}, {32}, {32, 32}, {32}, {4, 32}, {4}};
    for (const auto& s : shapes) m.params.push_back(at::randn(s) * 0.3);
    return m;
  }
  Mlp clone_leaves() const {
    Mlp m;
    for (const auto& p : params) m.params.push_back(p.detach().clone().set_requires_grad(true));
    return m;
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) const {
    at::Tensor h = at::relu(at::linear(x, params[0], params[1]));
    h = at::tanh(at::linear(h, params[2], params[3]));
    return at::mse_loss(at::linear(h, params[4], params[5]), y);
  }
};

struct Batch {
  at::Tensor x, y;
};

Batch make_batch(int64_t n) {
  at::manual_seed(1234);
  return {at::randn({n, 16}), at::randn({n, 4})};
}

std::vector<at::Tensor> reference_grads(const Mlp& init, const at::Tensor& x, const at::Tensor& y) {
  Mlp m = init.clone_leaves();
  m.loss(x, y).backward();
  std::vector<at::Tensor> g;
  for (auto& p : m.params) g.push_back(p.grad().clone());
  return g;
}

void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = want[i].abs().max().item<double>();
    const double diff = (got[i] - want[i]).abs().max().item<double>();
    EXPECT_LE(diff, rel * scale) << what << ": parameter " << i << " max|diff| " << diff << " scale "
                                 << scale;
  }
}

}  // namespace

// ---- the child roles (run only as subprocesses) -----------------------------------

TEST(DistributedChild, Role) {
  const char* role_env = std::getenv("ZENFLOW_TEST_ROLE");
  if (role_env == nullptr) GTEST_SKIP() << "runs only as a subprocess of the multi-process tests";
  const std::string role = role_env;
  int code = 0;
  try {
    const zd::RankInfo info = zd::rank_info_from_env();
    if (role == "spin") {
      // Allreduce ones forever (until killed): the parent checks every result.
      zd::Communicator comm(info, slow_start_options());
      for (;;) {
        at::Tensor t = at::ones({8});
        comm.allreduce_sum_(t);
      }
    } else if (role == "allreduce") {
      zd::Communicator comm(info, slow_start_options());
      const char* local = std::getenv("ZENFLOW_LOCAL_RANK");
      if (local == nullptr || std::atoi(local) != info.rank) {
        std::fprintf(stderr, "ZENFLOW_LOCAL_RANK is %s for rank %d\n", local ? local : "(unset)", info.rank);
        code = 1;
      }
      at::Tensor t = at::full({16}, static_cast<float>(info.rank + 1));
      comm.allreduce_sum_(t);
      const float want = info.world_size * (info.world_size + 1) / 2.0f;
      if (!at::equal(t, at::full({16}, want))) {
        std::fprintf(stderr, "rank %d: allreduce gave %f, want %f\n", info.rank, t[0].item<float>(), want);
        code = 1;
      }
      comm.barrier();
    } else if (role == "exit3_rank1") {
      if (info.rank == 1) {
        std::this_thread::sleep_for(200ms);
        code = 3;
      } else {
        std::this_thread::sleep_for(60s);  // stopped by the launcher
      }
    } else if (role == "sleep") {
      std::this_thread::sleep_for(60s);
    } else {
      std::fprintf(stderr, "unknown ZENFLOW_TEST_ROLE %s\n", role.c_str());
      code = 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child role %s: %s\n", role.c_str(), e.what());
    code = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

// ---- rank info ------------------------------------------------------------------------

TEST(RankInfo, LocalPlacementParsesAndValidatesEnvironment) {
  std::map<std::string, std::string> env;
  auto lookup = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  zd::LocalPlacement p = zd::local_placement_from_lookup(lookup);  // unset: rank 0 of 1
  EXPECT_EQ(p.rank, 0);
  EXPECT_EQ(p.world_size, 1);
  env = {{"ZENFLOW_LOCAL_RANK", "2"}, {"ZENFLOW_LOCAL_WORLD_SIZE", "4"}};
  p = zd::local_placement_from_lookup(lookup);
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 4);
  env["ZENFLOW_LOCAL_RANK"] = "4";
  EXPECT_THROW(zd::local_placement_from_lookup(lookup), std::invalid_argument);
  env["ZENFLOW_LOCAL_RANK"] = "x";
  try {
    zd::local_placement_from_lookup(lookup);
    FAIL() << "a malformed local rank must be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ZENFLOW_LOCAL_RANK"), std::string::npos) << e.what();
  }
}

// Which ranks share this worker's disk: the agent's explicit range (its local placement is
// the machine's GPU slots, not the job's ranks), else the local launcher's contiguous one.
TEST(WorkerRanks, AreTheAgentsRangeElseTheLocalLaunchersAndHoldTheRank) {
  std::map<std::string, std::string> env;
  auto lookup = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  zd::WorkerRanks w = zd::worker_ranks_from_lookup(lookup);  // alone
  EXPECT_EQ(w.first, 0);
  EXPECT_EQ(w.count, 1);
  // zenflow run --nproc 4: rank 2 is local rank 2 of 4.
  env = {{"ZENFLOW_RANK", "2"}, {"ZENFLOW_LOCAL_RANK", "2"}, {"ZENFLOW_LOCAL_WORLD_SIZE", "4"}};
  w = zd::worker_ranks_from_lookup(lookup);
  EXPECT_EQ(w.first, 0);
  EXPECT_EQ(w.count, 4);
  // The agent: the job's second worker holds ranks 2 and 3, on GPU slots 5 and 6 of 8.
  env = {{"ZENFLOW_RANK", "3"},
         {"ZENFLOW_LOCAL_RANK", "6"},
         {"ZENFLOW_LOCAL_WORLD_SIZE", "8"},
         {"ZENFLOW_WORKER_FIRST_RANK", "2"},
         {"ZENFLOW_WORKER_RANKS", "2"}};
  w = zd::worker_ranks_from_lookup(lookup);
  EXPECT_EQ(w.first, 2);
  EXPECT_EQ(w.count, 2);
  EXPECT_TRUE(w.holds(3));
  EXPECT_FALSE(w.holds(1));
  EXPECT_FALSE(w.holds(4));
  env["ZENFLOW_WORKER_FIRST_RANK"] = "4";
  try {
    zd::worker_ranks_from_lookup(lookup);
    FAIL() << "a rank outside its worker's range must be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ZENFLOW_RANK=3 is not among this worker's ranks [4, 6)"), std::string::npos)
        << e.what();
  }
}

TEST(RankInfo, ParsesAndValidatesEnvironment) {
  std::map<std::string, std::string> env{{"ZENFLOW_RANK", "1"},
                                         {"ZENFLOW_WORLD_SIZE", "4"},
                                         {"ZENFLOW_MASTER_ADDR", "10.0.0.7"},
                                         {"ZENFLOW_MASTER_PORT", "29511"},
                                         {"ZENFLOW_DIST_TIMEOUT_S", "2.5"}};
  auto lookup = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  zd::RankInfo info = zd::rank_info_from_lookup(lookup);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.master_addr, "10.0.0.7");
  EXPECT_EQ(info.master_port, 29511);
  EXPECT_EQ(info.timeout, std::chrono::milliseconds(2500));

  auto expect_error = [&](const std::string& var, const char* value, const std::string& needle) {
    auto saved = env;
    if (value == nullptr) {
      env.erase(var);
    } else {
      env[var] = value;
    }
    try {
      zd::rank_info_from_lookup(lookup);
      ADD_FAILURE() << var << "=" << (value ? value : "(unset)") << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    env = saved;
  };
  expect_error("ZENFLOW_RANK", nullptr, "ZENFLOW_RANK is not set");
  expect_error("ZENFLOW_MASTER_PORT", nullptr, "ZENFLOW_MASTER_PORT is not set");
  expect_error("ZENFLOW_MASTER_ADDR", nullptr, "ZENFLOW_MASTER_ADDR is not set");
  expect_error("ZENFLOW_RANK", "4", "ZENFLOW_RANK=4 must be in [0, 4)");
  expect_error("ZENFLOW_RANK", "x1", "ZENFLOW_RANK='x1' is not an integer");
  expect_error("ZENFLOW_WORLD_SIZE", "0", "ZENFLOW_WORLD_SIZE=0");
  expect_error("ZENFLOW_MASTER_PORT", "70000", "ZENFLOW_MASTER_PORT=70000");
  expect_error("ZENFLOW_DIST_TIMEOUT_S", "-1", "ZENFLOW_DIST_TIMEOUT_S='-1'");
  expect_error("ZENFLOW_DIST_TIMEOUT_S", "soon", "ZENFLOW_DIST_TIMEOUT_S='soon'");
  env.erase("ZENFLOW_DIST_TIMEOUT_S");
  EXPECT_EQ(zd::rank_info_from_lookup(lookup).timeout, zd::kDefaultDistTimeout);
}

// ---- collectives ----------------------------------------------------------------------

TEST(Communicator, CollectivesAreExactOnThreeRanks) {
  REQUIRE_GLOO();
  run_ranks(
      3,
      [](zd::Communicator& comm) {
        const int r = comm.rank();
        const int W = comm.world_size();
        ASSERT_EQ(W, 3);
        EXPECT_EQ(comm.backend(), "gloo");

        // allreduce: rank r contributes (r + 1) * arange -> 6 * arange, exactly.
        at::Tensor a = at::arange(10, at::kFloat) * (r + 1);
        comm.allreduce_sum_(a, zd::Traffic::kGradients);
        EXPECT_TRUE(at::equal(a, at::arange(10, at::kFloat) * 6));
        at::Tensor m = at::full({5}, 3.0 * r, at::kDouble);
        comm.allreduce_mean_(m);
        EXPECT_TRUE(at::equal(m, at::full({5}, 3.0, at::kDouble)));
        // A non-contiguous tensor goes through a copy.
        at::Tensor nc = at::arange(12, at::kFloat).view({3, 4}).t() * (r + 1);
        comm.allreduce_sum_(nc);
        EXPECT_TRUE(at::equal(nc, at::arange(12, at::kFloat).view({3, 4}).t() * 6));

        // A list, coalesced: one collective.
        const int64_t calls_before = comm.stats().kind(zd::CollectiveKind::kAllreduce).calls;
        std::vector<at::Tensor> list{at::full({2, 3}, r + 1.0f), at::full({7}, 10.0f * r),
                                     at::full({1}, 1.0f)};
        comm.allreduce_sum_(list, zd::Traffic::kSelection);
        EXPECT_EQ(comm.stats().kind(zd::CollectiveKind::kAllreduce).calls, calls_before + 1);
        EXPECT_TRUE(at::equal(list[0], at::full({2, 3}, 6.0f)));
        EXPECT_TRUE(at::equal(list[1], at::full({7}, 30.0f)));
        EXPECT_TRUE(at::equal(list[2], at::full({1}, 3.0f)));

        // reduce_scatter over uneven shards, both algorithms; rank r's buffer is
        // (r + 1) * arange(N) + r, so the sum is 6 * arange(N) + 3.
        for (const std::vector<int64_t>& shards :
             {std::vector<int64_t>{4, 3, 3}, std::vector<int64_t>{5, 0, 2}, std::vector<int64_t>{1, 1, 0}}) {
          int64_t n = 0;
          for (int64_t s : shards) n += s;
          at::Tensor flat = at::arange(n, at::kFloat) * (r + 1) + r;
          int64_t off = 0;
          for (int q = 0; q < r; ++q) off += shards[q];
          const at::Tensor want = (at::arange(n, at::kFloat) * 6 + 3).narrow(0, off, shards[r]);
          for (auto algo : {zd::ReduceScatterAlgo::kNative, zd::ReduceScatterAlgo::kAllreduce}) {
            at::Tensor mine =
                comm.reduce_scatter(flat, shards, zd::Reduction::kSum, zd::Traffic::kGradients, algo);
            EXPECT_TRUE(at::equal(mine, want))
                << "shards " << shards[0] << "," << shards[1] << "," << shards[2];
            at::Tensor mean =
                comm.reduce_scatter(flat, shards, zd::Reduction::kMean, zd::Traffic::kGradients, algo);
            EXPECT_TRUE(at::allclose(mean, want / 3.0, 0, 1e-6));
          }
          // all_gather inverts it: every rank gets the whole reduced buffer.
          at::Tensor mine = comm.reduce_scatter(flat, shards);
          at::Tensor all = comm.all_gather(mine, shards, zd::Traffic::kParameters);
          EXPECT_TRUE(at::equal(all, at::arange(n, at::kFloat) * 6 + 3));
        }
        EXPECT_EQ(zd::Communicator::even_shards(10, 3), (std::vector<int64_t>{4, 3, 3}));

        // all_gather of distinct per-rank shards of sizes {2, 0, 3}.
        const std::vector<int64_t> sizes{2, 0, 3};
        at::Tensor shard = at::arange(sizes[r], at::kLong) + 100 * r;
        at::Tensor g = comm.all_gather(shard, sizes);
        EXPECT_TRUE(at::equal(g, at::tensor(std::vector<int64_t>{0, 1, 200, 201, 202})));

        // broadcast from rank 2.
        at::Tensor b = at::full({4}, static_cast<float>(r));
        comm.broadcast_(b, 2);
        EXPECT_TRUE(at::equal(b, at::full({4}, 2.0f)));
        comm.barrier();

        // Argument errors are std::invalid_argument and do not break the communicator.
        at::Tensor bad = at::zeros({5});
        EXPECT_THROW(comm.reduce_scatter(bad, {1, 1, 1}), std::invalid_argument);
        EXPECT_THROW(comm.all_gather(bad, {1, 1, 1}), std::invalid_argument);
        EXPECT_THROW(comm.broadcast_(bad, 3), std::invalid_argument);
        EXPECT_FALSE(comm.failed());
      },
      /*external=*/false);
}

// Gloo here has no bf16: the communicator widens to fp32 and rounds back, values exact.
TEST(Communicator, Bf16CollectivesOnGloo) {
  REQUIRE_GLOO();
  run_ranks(2, [](zd::Communicator& comm) {
    const int r = comm.rank();
    at::Tensor a = (at::arange(6, at::kFloat) + r).to(at::kBFloat16);
    comm.allreduce_sum_(a);
    EXPECT_EQ(a.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(a, (at::arange(6, at::kFloat) * 2 + 1).to(at::kBFloat16)));
    at::Tensor b = (at::arange(4, at::kFloat) * (r + 1)).to(at::kBFloat16);
    zd::CommWork w = comm.allreduce_sum_async(b);
    w.wait();
    EXPECT_TRUE(at::equal(b, (at::arange(4, at::kFloat) * 3).to(at::kBFloat16)));
    const at::Tensor mine = comm.reduce_scatter((at::arange(5, at::kFloat) + r).to(at::kBFloat16), {3, 2});
    EXPECT_EQ(mine.scalar_type(), at::kBFloat16);
    const at::Tensor want = at::arange(5, at::kFloat) * 2 + 1;
    EXPECT_TRUE(at::equal(mine.to(at::kFloat), want.narrow(0, r == 0 ? 0 : 3, r == 0 ? 3 : 2)));
    const at::Tensor all = comm.all_gather(mine, {3, 2});
    EXPECT_TRUE(at::equal(all.to(at::kFloat), want));
    at::Tensor c = at::full({3}, static_cast<float>(r + 5)).to(at::kBFloat16);
    comm.broadcast_(c, 1);
    EXPECT_TRUE(at::equal(c.to(at::kFloat), at::full({3}, 6.0f)));
  });
}

TEST(Communicator, ByteCountersPerKindAndTraffic) {
  REQUIRE_GLOO();
  run_ranks(2, [](zd::Communicator& comm) {
    comm.reset_stats();
    at::Tensor grads = at::zeros({1000});  // 4000 B of gradients
    at::Tensor scores = at::zeros({10});   // 40 B of selection scores
    comm.allreduce_sum_(grads, zd::Traffic::kGradients);
    comm.allreduce_sum_(scores, zd::Traffic::kSelection);
    at::Tensor flat = at::zeros({100}, at::kDouble);  // 800 B
    at::Tensor mine = comm.reduce_scatter(flat, {50, 50}, zd::Reduction::kSum, zd::Traffic::kGradients);
    comm.all_gather(mine, {50, 50}, zd::Traffic::kParameters);  // 800 B gathered
    comm.barrier();
    const zd::CommStats s = comm.stats();
    EXPECT_EQ(s.kind(zd::CollectiveKind::kAllreduce).calls, 2);
    EXPECT_EQ(s.kind(zd::CollectiveKind::kAllreduce).bytes, 4040);
    EXPECT_EQ(s.kind(zd::CollectiveKind::kReduceScatter).bytes, 800);
    EXPECT_EQ(s.kind(zd::CollectiveKind::kAllGather).bytes, 800);
    EXPECT_EQ(s.kind(zd::CollectiveKind::kBarrier).calls, 1);
    EXPECT_EQ(s.traffic_bytes(zd::Traffic::kGradients), 4800);
    EXPECT_EQ(s.traffic_bytes(zd::Traffic::kSelection), 40);
    EXPECT_EQ(s.traffic_bytes(zd::Traffic::kParameters), 800);
    EXPECT_EQ(s.total_bytes(), 5640);
  });
}

// Reduce-scatter on Gloo: all-to-all + local sum (what kNative does) against allreduce +
// slice, on 2 ranks x 4 MiB. Both exact; the timings are printed for the closing note.
TEST(Communicator, ReduceScatterAlgorithmsAgreeAndAreTimed) {
  REQUIRE_GLOO();
  run_ranks(2, [](zd::Communicator& comm) {
    const int64_t n = 1 << 20;
    at::Tensor flat = at::arange(n, at::kFloat).remainder(1000) * (comm.rank() + 1);
    const auto shards = zd::Communicator::even_shards(n, 2);
    const at::Tensor want =
        (at::arange(n, at::kFloat).remainder(1000) * 3).narrow(0, comm.rank() * (n / 2), n / 2);
    double best[2] = {1e9, 1e9};
    for (int rep = 0; rep < 5; ++rep) {
      for (int a = 0; a < 2; ++a) {
        comm.barrier();
        const auto t0 = Clock::now();
        at::Tensor mine =
            comm.reduce_scatter(flat, shards, zd::Reduction::kSum, zd::Traffic::kOther,
                                a == 0 ? zd::ReduceScatterAlgo::kNative : zd::ReduceScatterAlgo::kAllreduce);
        best[a] = std::min(best[a], seconds_since(t0));
        EXPECT_TRUE(at::equal(mine, want));
      }
    }
    if (comm.rank() == 0) {
      std::printf(
          "[figure] reduce_scatter of 4 MiB on 2 Gloo ranks: all-to-all+sum %.2f ms, allreduce+slice %.2f "
          "ms\n",
          best[0] * 1e3, best[1] * 1e3);
    }
  });
}

// ---- the bucketed gradient reducer ----------------------------------------------------

TEST(GradReducer, TwoRanksOfBatchBEqualOneRankOf2B) {
  REQUIRE_GLOO();
  const int64_t b = 8;
  const Mlp init = Mlp::make(7);
  const Batch full = make_batch(2 * b);
  const auto want = reference_grads(init, full.x, full.y);
  for (int64_t bucket_bytes : {int64_t{1024}, int64_t{25} * 1024 * 1024}) {
    run_ranks(2, [&](zd::Communicator& comm) {
      Mlp m = init.clone_leaves();
      zd::GradReducerOptions o;
      o.bucket_bytes = bucket_bytes;
      zd::GradReducer red(comm, m.params, o);
      if (bucket_bytes == 1024) {
        // 4 KiB w2 alone; w3+b3+b2 fit 1 KiB; b1 too; w1 (2 KiB) alone.
        EXPECT_GE(red.num_buckets(), 4);
      } else {
        EXPECT_EQ(red.num_buckets(), 1);
      }
      const int r = comm.rank();
      for (int step = 0; step < 2; ++step) {
        for (auto& p : m.params) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
        m.loss(full.x.narrow(0, r * b, b), full.y.narrow(0, r * b, b)).backward();
        // Every bucket was launched from a hook, before backward returned.
        EXPECT_EQ(red.launched_during_backward(), red.num_buckets());
        const zd::ReduceReport rep = red.finish();
        EXPECT_EQ(rep.buckets, red.num_buckets());
        EXPECT_EQ(rep.launched_during_backward, red.num_buckets());
        EXPECT_EQ(rep.bytes, (32 * 16 + 32 + 32 * 32 + 32 + 4 * 32 + 4) * 4);
        EXPECT_GE(rep.wait_seconds, 0.0);
        std::vector<at::Tensor> got;
        for (auto& p : m.params) got.push_back(p.grad());
        expect_close(got, want, 1e-6,
                     "bucket " + std::to_string(bucket_bytes) + " step " + std::to_string(step));
      }
      EXPECT_EQ(comm.stats().traffic_bytes(zd::Traffic::kGradients),
                2 * (32 * 16 + 32 + 32 * 32 + 32 + 4 * 32 + 4) * 4);
    });
  }
}

TEST(GradReducer, AccumulationCommunicatesOnlyOnTheLastMicroBatch) {
  REQUIRE_GLOO();
  const int64_t b = 8;  // per rank: 2 micro-batches of 4
  const Mlp init = Mlp::make(11);
  const Batch full = make_batch(2 * b);
  const auto want = reference_grads(init, full.x, full.y);
  run_ranks(2, [&](zd::Communicator& comm) {
    Mlp m = init.clone_leaves();
    zd::GradReducerOptions o;
    o.bucket_bytes = 2048;
    zd::GradReducer red(comm, m.params, o);
    const int r = comm.rank();
    red.set_sync(false);
    (m.loss(full.x.narrow(0, r * b, b / 2), full.y.narrow(0, r * b, b / 2)) * 0.5).backward();
    EXPECT_EQ(red.launched_during_backward(), 0);
    EXPECT_EQ(red.finish().buckets, 0);
    EXPECT_EQ(comm.stats().kind(zd::CollectiveKind::kAllreduce).calls, 0);
    red.set_sync(true);
    (m.loss(full.x.narrow(0, r * b + b / 2, b / 2), full.y.narrow(0, r * b + b / 2, b / 2)) * 0.5).backward();
    EXPECT_EQ(red.launched_during_backward(), red.num_buckets());
    const zd::ReduceReport rep = red.finish();
    EXPECT_EQ(rep.buckets, red.num_buckets());
    EXPECT_EQ(comm.stats().kind(zd::CollectiveKind::kAllreduce).calls, red.num_buckets());
    std::vector<at::Tensor> got;
    for (auto& p : m.params) got.push_back(p.grad());
    expect_close(got, want, 1e-6, "accumulated");

    // A second gradient in one synced step is refused out of backward().
    for (auto& p : m.params) p.mutable_grad().zero_();
    m.loss(full.x.narrow(0, r * b, b), full.y.narrow(0, r * b, b)).backward();
    EXPECT_THROW(m.loss(full.x.narrow(0, r * b, b), full.y.narrow(0, r * b, b)).backward(), std::exception);
    red.finish();  // keeps both ranks' collective sequences aligned
  });
}

TEST(GradReducer, UnusedParameterOnOneRankContributesZeros) {
  REQUIRE_GLOO();
  run_ranks(2, [](zd::Communicator& comm) {
    at::Tensor w = at::ones({3}).set_requires_grad(true);
    at::Tensor extra = at::ones({2}).set_requires_grad(true);
    zd::GradReducer red(comm, {w, extra});
    const int r = comm.rank();
    at::Tensor loss = (w * (r + 1)).sum();
    if (r == 0) loss = loss + (extra * 4).sum();  // rank 1 never touches `extra`
    loss.backward();
    red.finish();
    EXPECT_TRUE(at::equal(w.grad(), at::full({3}, 1.5f)));      // (1 + 2) / 2
    EXPECT_TRUE(at::equal(extra.grad(), at::full({2}, 2.0f)));  // (4 + 0) / 2
  });
}

TEST(GradReducer, AllreduceNowWithoutHooks) {
  REQUIRE_GLOO();
  run_ranks(2, [](zd::Communicator& comm) {
    std::vector<at::Tensor> ps;
    for (int i = 0; i < 3; ++i) {
      at::Tensor p = at::zeros({5 + i}).set_requires_grad(true);
      p.mutable_grad() = at::full({5 + i}, static_cast<float>((comm.rank() + 1) * (i + 1)));
      ps.push_back(p);
    }
    const zd::ReduceReport rep = zd::allreduce_gradients(comm, ps, 24);
    EXPECT_EQ(rep.buckets, 3);  // 20, 24, 28 bytes: one per bucket
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(ps[i].grad(), at::full({5 + i}, 1.5f * (i + 1))));
  });
}

// The `allreduce` stall figure: 2 ranks, a 4-layer MLP of width 384, batch 32 per rank;
// the time finish() blocks, as a share of the step, with 1 MiB buckets launched during
// backward against one bucket launched at its end. Sanity checks only: CPU timings on a
// shared machine are the figure, not a pass criterion.
TEST(GradReducer, AllreduceStallShareFigure) {
  REQUIRE_GLOO();
  const int64_t width = 384, batch = 32;
  at::manual_seed(3);
  std::vector<at::Tensor> init;
  for (int l = 0; l < 4; ++l) {
    init.push_back(at::randn({width, width}) * 0.05);
    init.push_back(at::zeros({width}));
  }
  const at::Tensor x = at::randn({2 * batch, width}), y = at::randn({2 * batch, width});
  for (int64_t bucket : {int64_t{1} << 20, int64_t{1} << 30}) {
    run_ranks(2, [&](zd::Communicator& comm) {
      std::vector<at::Tensor> ps;
      for (const auto& p : init) ps.push_back(p.clone().set_requires_grad(true));
      zd::GradReducerOptions o;
      o.bucket_bytes = bucket;
      zd::GradReducer red(comm, ps, o);
      const at::Tensor xr = x.narrow(0, comm.rank() * batch, batch),
                       yr = y.narrow(0, comm.rank() * batch, batch);
      double step_s = 0, wait_s = 0;
      for (int it = 0; it < 8; ++it) {
        comm.barrier();
        const auto t0 = Clock::now();
        at::Tensor h = xr;
        for (int l = 0; l < 4; ++l) h = at::tanh(at::linear(h, ps[2 * l], ps[2 * l + 1]));
        at::mse_loss(h, yr).backward();
        const zd::ReduceReport rep = red.finish();
        if (it >= 2) {  // warm-up excluded
          step_s += seconds_since(t0);
          wait_s += rep.wait_seconds;
        }
        EXPECT_EQ(rep.launched_during_backward, red.num_buckets());
      }
      EXPECT_LE(wait_s, step_s);
      if (comm.rank() == 0) {
        std::printf(
            "[figure] 2 Gloo ranks, %d bucket(s) of <= %lld B, %.1f MiB of gradients: allreduce stall %.2f "
            "ms "
            "of %.2f ms per step (%.0f%%)\n",
            red.num_buckets(), static_cast<long long>(bucket), 4 * (width * width + width) * 4 / 1048576.0,
            wait_s / 6 * 1e3, step_s / 6 * 1e3, 100 * wait_s / step_s);
      }
    });
  }
}

// ---- NCCL (GPU hosts) ------------------------------------------------------------------

// Every collective on CUDA tensors through NCCL: one rank per visible GPU (threads), so a
// 1-GPU host runs a 1-rank NCCL group and a 2-GPU host a real 2-rank one.
TEST(CommunicatorNccl, CollectivesAndReducerOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(zd::Communicator::nccl_available()) << "this LibTorch has CUDA but was built without NCCL";
  const int world = std::min<int>(2, at::detail::getCUDAHooks().getNumGPUs());
  std::printf("[figure] NCCL test with %d rank(s)\n", world);
  zd::CommunicatorOptions o;
  o.device_type = at::kCUDA;
  run_ranks(
      world,
      [&](zd::Communicator& comm) {
        const int r = comm.rank();
        const at::Device dev(at::kCUDA, static_cast<c10::DeviceIndex>(r));
        EXPECT_EQ(comm.backend(), "nccl");
        const int W = comm.world_size();
        const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
        at::Tensor a = at::arange(10, f32) * (r + 1);
        comm.allreduce_sum_(a, zd::Traffic::kGradients);
        EXPECT_TRUE(at::equal(a.cpu(), at::arange(10, at::kFloat) * (W * (W + 1) / 2)));
        const std::vector<int64_t> shards = W == 1 ? std::vector<int64_t>{7} : std::vector<int64_t>{4, 3};
        at::Tensor flat = at::arange(7, f32) * (r + 1) + r;
        at::Tensor mine = comm.reduce_scatter(flat, shards);
        at::Tensor all = comm.all_gather(mine, shards);
        at::Tensor want = at::zeros({7});
        for (int q = 0; q < W; ++q) want += at::arange(7, at::kFloat) * (q + 1) + q;
        EXPECT_TRUE(at::equal(all.cpu(), want));
        at::Tensor b = at::full({4}, static_cast<float>(r), f32);
        comm.broadcast_(b, W - 1);
        EXPECT_TRUE(at::equal(b.cpu(), at::full({4}, static_cast<float>(W - 1))));
        comm.barrier();
        at::Tensor w = at::ones({3}, f32).set_requires_grad(true);
        zd::GradReducer red(comm, {w});
        (w * (r + 1)).sum().backward();
        EXPECT_EQ(red.launched_during_backward(), 1);
        red.finish();
        EXPECT_TRUE(at::equal(w.grad().cpu(), at::full({3}, (W + 1) / 2.0f)));
      },
      true, 60s, o);
}

// ---- failures -------------------------------------------------------------------------

namespace {

// This process is rank `me` of 2; the child is the other rank, running "spin". The
// store is hosted by rank 0 (on a port reserved here), or, with `external`, by this
// process outside the ranks. After three good allreduces the child is signalled; an
// allreduce must then throw a message naming the lost rank within `bound` seconds.
void lose_peer(int me, int sig, double timeout_s, double bound_s, bool external = false) {
  std::unique_ptr<zd::StoreServer> server;
  std::unique_ptr<zd::PortReservation> reservation;
  int port = 0;
  if (external) {
    server = std::make_unique<zd::StoreServer>("127.0.0.1", 0);
    port = server->port();
  } else {
    reservation = std::make_unique<zd::PortReservation>();
    port = reservation->port();
  }
  const int peer = 1 - me;
  Child child(spawn_role("spin", peer, 2, port, timeout_s, external));
  ASSERT_GT(child.pid, 0);
  zd::RankInfo info =
      local_rank(me, 2, port, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  info.store_external = external;
  zd::Communicator comm(info, slow_start_options());
  for (int i = 0; i < 3; ++i) {
    at::Tensor t = at::ones({8});
    comm.allreduce_sum_(t);
    ASSERT_TRUE(at::equal(t, at::full({8}, 2.0f)));
  }
  ASSERT_EQ(::kill(child.pid, sig), 0);
  if (sig == SIGKILL) child.reap(false);
  // The peer may have sent its part of the next allreduce before the signal landed, so
  // that one can still succeed; the one after cannot.
  const auto t0 = Clock::now();
  std::string message;
  int attempts = 0;
  for (; attempts < 3 && message.empty(); ++attempts) {
    try {
      at::Tensor t = at::ones({8});
      comm.allreduce_sum_(t);
      ASSERT_TRUE(at::equal(t, at::full({8}, 2.0f)));
    } catch (const std::runtime_error& e) {
      message = e.what();
    }
  }
  ASSERT_FALSE(message.empty()) << "allreduces kept succeeding without rank " << peer;
  EXPECT_LE(attempts, 2);
  const double took = seconds_since(t0);
  std::printf("[figure] lost rank %d (signal %d, timeout %.1f s): rank %d threw after %.2f s: %s\n", peer,
              sig, timeout_s, me, took, message.c_str());
  EXPECT_LT(took, bound_s);
  EXPECT_NE(message.find("lost rank " + std::to_string(peer)), std::string::npos) << message;
  EXPECT_NE(message.find("allreduce"), std::string::npos) << message;
  EXPECT_NE(message.find("timeout"), std::string::npos) << message;
  EXPECT_TRUE(comm.failed());
  // Later calls fail at once with the first failure's message.
  const auto t1 = Clock::now();
  at::Tensor t = at::ones({8});
  try {
    comm.allreduce_sum_(t);
    ADD_FAILURE() << "a failed communicator accepted a collective";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("lost rank " + std::to_string(peer)), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(t1), 0.5);
}

}  // namespace

TEST(DistributedFailure, KilledPeerIsNamedWithinTheTimeout) {
  REQUIRE_GLOO();
  lose_peer(0, SIGKILL, 5.0, 5.0);
}

TEST(DistributedFailure, KilledStoreHostIsNamedWithinTheTimeout) {
  REQUIRE_GLOO();
  lose_peer(1, SIGKILL, 5.0, 5.0);
}

TEST(DistributedFailure, KilledRank0WithAnExternalStoreIsNamedByItsHeartbeat) {
  REQUIRE_GLOO();
  lose_peer(1, SIGKILL, 5.0, 5.0, /*external=*/true);
}

TEST(DistributedFailure, StoppedPeerTimesOutAndIsNamed) {
  REQUIRE_GLOO();
  // A frozen peer (SIGSTOP) keeps its sockets open: the collective's timeout (3 s)
  // fires, and its heartbeat, read while the wait lasted, is found stale at once.
  lose_peer(0, SIGSTOP, 3.0, 3.0 + 1.0);
}

TEST(DistributedFailure, RendezvousNamesTheRankThatNeverJoined) {
  zd::PortReservation port;
  const auto t0 = Clock::now();
  try {
    zd::Communicator comm(local_rank(0, 3, port.port(), 1500ms));
    ADD_FAILURE() << "rendezvous succeeded with ranks missing";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks 1, 2 did not join"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after 1.50 s"), std::string::npos) << m;
  }
  EXPECT_LT(seconds_since(t0), 4.0);
}

namespace {

// Accepts TCP connections on 127.0.0.1 and never answers. At the end it drains what the
// clients sent before closing, so that they see an orderly close: LibTorch 1.13's
// TCPStore client terminates the process when its background thread reads a reset.
class SilentEndpoint {
 public:
  SilentEndpoint() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd_, 16) != 0) {
      throw std::runtime_error("SilentEndpoint: cannot listen");
    }
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) > 0) {
          const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (c >= 0) conns_.push_back(c);
        }
      }
    });
  }
  ~SilentEndpoint() {
    stop_ = true;
    acceptor_.join();
    char buf[4096];
    for (int c : conns_) {
      while (::recv(c, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
      }
      ::shutdown(c, SHUT_WR);
      ::close(c);
    }
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> conns_;  // touched by the acceptor until it is joined
  std::thread acceptor_;
};

}  // namespace

// A store address where something accepts connections but never answers (a stopped
// store host, a wrong port): the constructor gives up within its bound instead of
// blocking in the store client forever.
TEST(DistributedFailure, SilentStoreEndpointIsBounded) {
  SilentEndpoint silent;
  zd::CommunicatorOptions o;
  o.rendezvous_timeout = 1s;
  const auto t0 = Clock::now();
  try {
    zd::Communicator comm(local_rank(1, 2, silent.port(), 1s), o);
    ADD_FAILURE() << "rendezvous with a silent endpoint succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("does not answer"), std::string::npos) << e.what();
  }
  const double took = seconds_since(t0);
  EXPECT_GT(took, 3.5);  // rendezvous 1 s + timeout 1 s + 2 s
  EXPECT_LT(took, 6.0);
}

// A master address that does not resolve fails at once naming ZENFLOW_MASTER_ADDR and
// the host, on the connecting ranks and on the rank hosting the store alike (c10d's
// store client retried the lookup for the whole 300 s timeout). Each attempt is bounded
// by a future, so a regression fails here instead of waiting out the timeout.
TEST(DistributedFailure, UnresolvableMasterAddrFailsAtOnceNamingTheHost) {
  using zenflow::test_support::call_within;
  const std::string host = "no-such-host.invalid";  // RFC 6761: never resolves
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int probe = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (probe == 0) ::freeaddrinfo(res);
  ASSERT_NE(probe, 0) << host << " resolves here";
  // Without a reachable DNS server the lookup fails temporarily (EAI_AGAIN) rather than
  // saying the name does not exist: then the check retries until the timeout, so keep it short.
  const bool temporary = probe == EAI_AGAIN;
  const auto timeout = temporary ? std::chrono::milliseconds(2000) : zd::kDefaultDistTimeout;
  std::cout << "getaddrinfo(" << host << "): " << gai_strerror(probe) << "\n";

  for (int rank : {1, 0}) {
    zd::RankInfo info;
    info.rank = rank;
    info.world_size = 2;
    info.master_addr = host;
    info.master_port = 29500;
    info.timeout = timeout;
    const auto o = call_within([info] { zd::Communicator comm(info); }, 60s);
    ASSERT_TRUE(o.returned) << "rank " << rank << ": " << o.message;
    ASSERT_TRUE(o.threw) << "rank " << rank << ": rendezvous with an unresolvable host succeeded";
    std::cout << "rank " << rank << " failed after " << o.seconds << " s: " << o.message << "\n";
    EXPECT_NE(o.message.find("ZENFLOW_MASTER_ADDR='" + host + "'"), std::string::npos) << o.message;
    EXPECT_NE(o.message.find(temporary ? "looking up the rendezvous host failed"
                                       : "the rendezvous host cannot be resolved"),
              std::string::npos)
        << o.message;
  }
  const auto server = call_within([host, timeout] { zd::StoreServer s(host, 0, timeout); }, 60s);
  ASSERT_TRUE(server.returned) << server.message;
  EXPECT_NE(server.message.find("ZENFLOW_MASTER_ADDR='" + host + "'"), std::string::npos) << server.message;

  if (!temporary) {
    try {
      zd::resolve_master_addr(host, zd::kDefaultDistTimeout);
      ADD_FAILURE() << host << " was resolved";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), "ZENFLOW_MASTER_ADDR='" + host +
                                           "': the rendezvous host cannot be resolved (" + gai_strerror(probe) +
                                           "); set it to rank 0's host name or IP address");
    }
  }
  EXPECT_NO_THROW(zd::resolve_master_addr("127.0.0.1", 1s));
  EXPECT_NO_THROW(zd::resolve_master_addr("localhost", 1s));
}

// ---- the launcher ---------------------------------------------------------------------

namespace {
zd::LaunchOptions launcher_options(const std::string& role, std::vector<std::string>* lines) {
  zd::LaunchOptions o;
  o.extra_env = {{"ZENFLOW_TEST_ROLE", role}};
  o.grace = 1s;
  o.term_grace = 2s;
  o.timeout = 20s;
  o.log = [lines](const std::string& m) {
    std::fprintf(stderr, "%s\n", m.c_str());
    if (lines) lines->push_back(m);
  };
  return o;
}
const std::vector<std::string> kChildArgv{"test_distributed", "--gtest_filter=DistributedChild.Role"};
}  // namespace

TEST(Launcher, RanksRendezvousThroughTheEnvironment) {
  REQUIRE_GLOO();
  for (bool host_store : {true, false}) {
    zd::LaunchOptions o = launcher_options("allreduce", nullptr);
    o.host_store = host_store;  // the launcher hosts the store, or rank 0 does
    const zd::LaunchResult r = zd::launch_local_ranks_detailed(3, kChildArgv, o);
    EXPECT_EQ(r.exit_code, 0) << r.message;
    EXPECT_EQ(r.failed_rank, -1);
    ASSERT_EQ(r.ranks.size(), 3u);
    for (const auto& e : r.ranks) EXPECT_TRUE(e.exited && e.status == 0);
  }
}

TEST(Launcher, FailedRankIsNamedAndTheOthersAreStopped) {
  std::vector<std::string> lines;
  const auto t0 = Clock::now();
  const zd::LaunchResult r =
      zd::launch_local_ranks_detailed(2, kChildArgv, launcher_options("exit3_rank1", &lines));
  const double took = seconds_since(t0);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_NE(r.message.find("rank 1 failed with exit status 3"), std::string::npos) << r.message;
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_TRUE(r.ranks[0].stopped_by_launcher);
  EXPECT_FALSE(r.ranks[0].exited);  // SIGTERM after the 1 s grace
  EXPECT_EQ(r.ranks[0].status, SIGTERM);
  EXPECT_LT(took, 15.0);  // not the 60 s rank 0 would have slept
  // The int form returns the same code.
  EXPECT_EQ(zd::launch_local_ranks(2, kChildArgv, launcher_options("exit3_rank1", nullptr)), 3);
}

TEST(Launcher, ForwardsSigintToTheRanks) {
  std::vector<std::string> lines;
  std::thread interrupter([] {
    std::this_thread::sleep_for(1500ms);
    ::kill(::getpid(), SIGINT);  // as a terminal's Ctrl-C would reach the launcher
  });
  const auto t0 = Clock::now();
  const zd::LaunchResult r =
      zd::launch_local_ranks_detailed(2, kChildArgv, launcher_options("sleep", &lines));
  interrupter.join();
  EXPECT_EQ(r.interrupted_by, SIGINT);
  EXPECT_EQ(r.exit_code, 128 + SIGINT);
  for (const auto& e : r.ranks) {
    EXPECT_FALSE(e.exited);
    EXPECT_EQ(e.status, SIGINT);
  }
  EXPECT_LT(seconds_since(t0), 10.0);
}

TEST(Launcher, MissingExecutableIsAnError) {
  zd::LaunchOptions o = launcher_options("sleep", nullptr);
  o.executable = "/nonexistent/zenflow";
  EXPECT_THROW(zd::launch_local_ranks_detailed(2, kChildArgv, o), std::runtime_error);
}
