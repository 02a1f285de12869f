// Remote optimizer nodes (zenflow-optimizer over UCX) against the in-process host
// optimizer, with real node processes on 127.0.0.1, over UCX_TLS=tcp and over shared
// memory:
//  * Remote == in-process, bit for bit (weights after every step, engine state at the
//    end), over update_interval {1, 4, auto} x overlap {on, off} x re-selection at every
//    boundary x data-parallel ranks {1, 2} x nodes per rank {1, 2}, fp32 and bf16 weights;
//    on one GPU (ranks as threads) under ZENFLOW_TEST_DEVICE=cuda, as scripts/gpu-check.sh runs it.
//  * Engine state written with remote nodes resumes in-process exactly, and the reverse.
//  * A SIGKILLed node fails the waiting step within 5 s naming the node; a SIGSTOPped one
//    is caught by the ping; a stale epoch, a wrong token (in the transport's handshake) and
//    a session larger than the node's --memory-limit are refused with errors naming why.
//  * Garbage, truncated and oversized handshakes, a wrong proof, a stall and a crowd at
//    the node's port leave it up and serving a real session.
//  * The payload codecs reject truncated, malformed and out-of-range descriptors (fuzzed).
//  * The backend's threads run on the host cores it is given, not the training thread's.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/hostile_peer.h"
#include "tests/support/listening_sockets.h"
#include "tests/support/process.h"
#include "tests/support/test_device.h"
#include "tests/support/thread_collectives.h"
#include "worker/rank/checkpoint.h"
#include "worker/engine/host_isa.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/engine/zenflow_optimizer.h"
#include "worker/transport/optimizer_protocol.h"
#include "worker/transport/remote_host_optimizer.h"
#include "worker/transport/transport.h"

namespace {

namespace fs = std::filesystem;
using zenflow::engine::EngineOptions;
using zenflow::engine::ParamSpec;
using zenflow::engine::ZenFlowOptimizer;
using zenflow::test_support::Process;
using zenflow::test_support::wait_until;
using State = std::vector<std::pair<std::string, at::Tensor>>;

const char* const kToken = "node-test-token-5b1f";

// UCX reads its environment when a context is created: set before every Transport (and
// before starting a node, which inherits it). "sm": UCX 1.13's client-server wireup needs
// tcp on lo, and with tcp put off (Transport::create's default, tested here, not one the
// caller's environment chose) it offers no data lane, so data moves over shared memory
// (test_transport checks the lanes UCX picks).
void use_tls(const std::string& tls) {
  ::setenv("UCX_TLS", tls == "sm" ? "sm,tcp" : tls.c_str(), 1);
  ::setenv("UCX_NET_DEVICES", "lo", 1);
  ::unsetenv("UCX_TCP_PUT_ENABLE");
}

// This process's scratch directory (the token, the node tests' runs), removed at exit.
class ScratchDir {
 public:
  ScratchDir() : owner_(::getpid()), path_(fs::temp_directory_path() / ("zenflow-node-test-" + std::to_string(owner_))) {
    fs::create_directories(path_);
    zenflow::test_support::write_file(path_ / "token", std::string(kToken) + "\n");
  }
  ~ScratchDir() {
    if (::getpid() != owner_) return;  // a forked child that exits does not remove it
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  pid_t owner_;
  fs::path path_;
};

fs::path temp_dir() {
  static const ScratchDir dir;
  return dir.path();
}

// One zenflow-optimizer process on 127.0.0.1 (its port read back from --port-file).
class Node {
 public:
  Node(const std::string& tls, const std::string& tag, std::vector<std::string> extra = {}) {
    use_tls(tls);
    const fs::path port_file = temp_dir() / (tag + ".port");
    fs::remove(port_file);
    std::vector<std::string> argv = {std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow-optimizer", "--listen",
                                     "127.0.0.1:0", "--port-file", port_file.string(), "--token-file",
                                     (temp_dir() / "token").string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc_ = std::make_unique<Process>(argv, temp_dir() / (tag + ".log"));
    if (!wait_until([&] { return fs::exists(port_file); }, std::chrono::seconds(20)))
      throw std::runtime_error("zenflow-optimizer did not start: " + proc_->output());
    address_ = "127.0.0.1:" + std::to_string(std::stoi(zenflow::test_support::read_file(port_file)));
  }
  const std::string& address() const { return address_; }
  Process& process() { return *proc_; }

 private:
  std::unique_ptr<Process> proc_;
  std::string address_;
};

// Two nodes per transport, shared by the grid.
std::vector<std::string> shared_nodes(const std::string& tls) {
  static std::map<std::string, std::vector<std::unique_ptr<Node>>> nodes;
  auto& v = nodes[tls];
  while (v.size() < 2) v.push_back(std::make_unique<Node>(tls, "shared-" + tls + "-" + std::to_string(v.size())));
  return {v[0]->address(), v[1]->address()};
}

struct Shape {
  const char* name;
  int64_t rows, cols;  // cols == 0: 1-D
};
const Shape kModel[] = {{"embed", 20, 40}, {"proj", 32, 24}, {"norm", 20, 0}, {"head", 12, 36}};

// The grid's device (test_device(): CUDA under ZENFLOW_TEST_DEVICE=cuda, as the GPU check
// runs it: ranks as threads on one GPU, gradients streamed to the nodes through the pinned
// ring, parameters back through the device-side staging).
using zenflow::test_support::test_device;

std::vector<at::Tensor> model_params(at::ScalarType dtype, at::Device device = at::kCPU) {
  std::vector<at::Tensor> ps;
  at::Generator gen = at::detail::createCPUGenerator(1234);
  for (const Shape& s : kModel) {
    at::Tensor t = s.cols ? at::randn({s.rows, s.cols}, gen) : at::randn({s.rows}, gen);
    ps.push_back((t * 0.2).to(dtype).to(device).contiguous().set_requires_grad(true));
  }
  return ps;
}

// Gradients of step `step` on rank `rank`: random, with a few heavy columns that move
// every 3 steps so that every re-selection changes the set.
void feed(const std::vector<at::Tensor>& ps, int64_t step, int rank) {
  at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(step * 7919 + rank * 104729 + 1));
  for (size_t k = 0; k < ps.size(); ++k) {
    const Shape& s = kModel[k];
    at::Tensor g = at::randn(ps[k].sizes(), gen) * 0.05;
    if (s.cols) {
      const int64_t hot = (step / 3 * 5 + static_cast<int64_t>(k)) % s.cols;
      g.narrow(1, hot, 1).mul_(9.0);
    }
    ps[k].mutable_grad() = g.to(ps[k].device(), ps[k].scalar_type());
  }
}

std::unique_ptr<ZenFlowOptimizer> engine_for(const std::vector<at::Tensor>& ps, const EngineOptions& o,
                                             zenflow::engine::Collectives* coll) {
  std::vector<ParamSpec> specs;
  for (size_t k = 0; k < ps.size(); ++k) {
    ParamSpec p;
    p.name = kModel[k].name;
    p.param = ps[k];
    p.weight_decay = kModel[k].cols > 0;
    p.weight_decay_value = 0.02;
    specs.push_back(p);
  }
  return std::make_unique<ZenFlowOptimizer>(specs, o, nullptr, coll);
}

zenflow::transport::RemoteHostOptions remote(const std::vector<std::string>& addresses, const std::string& job,
                                             uint64_t epoch = 1) {
  zenflow::transport::RemoteHostOptions r;
  r.addresses = addresses;
  r.token = kToken;
  r.job = job;
  r.epoch = epoch;
  r.chunk_bytes = 4096;  // many chunks per span even on this small model
  return r;
}

EngineOptions engine_options(int64_t U, bool overlap) {
  EngineOptions o;
  o.min_split_numel = 64;
  o.host_threads = 1;
  o.huge_pages = false;
  o.topk_ratio = 0.25;
  o.update_interval = U;
  o.overlap_step = overlap;
  o.select_strategy = zenflow::engine::SelectStrategy::kStep;
  o.select_interval = U > 0 ? U : 1;  // re-selection at every boundary
  return o;
}

void expect_same_params(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const std::string& where) {
  for (size_t k = 0; k < a.size(); ++k)
    ASSERT_TRUE(at::equal(a[k].detach(), b[k].detach())) << kModel[k].name << " differs " << where;
}

void expect_same_state(const State& a, const State& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first << " differs";
  }
}

struct GridCase {
  std::string tls;
  int64_t U;
  bool overlap;
  int world;
  int nodes;
  at::ScalarType dtype;
};

std::string case_name(const testing::TestParamInfo<GridCase>& info) {
  const GridCase& c = info.param;
  return c.tls + "_U" + (c.U ? std::to_string(c.U) : std::string("auto")) + (c.overlap ? "_overlap" : "_sync") + "_W" +
         std::to_string(c.world) + "_N" + std::to_string(c.nodes) + (c.dtype == at::kBFloat16 ? "_bf16" : "_fp32");
}

class RemoteEqualsInProcess : public testing::TestWithParam<GridCase> {};

TEST_P(RemoteEqualsInProcess, WeightsEveryStepAndStateAtTheEnd) {
  const GridCase c = GetParam();
  const at::Device device = test_device();
  const std::vector<std::string> all = shared_nodes(c.tls);
  const std::vector<std::string> nodes(all.begin(), all.begin() + c.nodes);
  const std::string job = "grid-" + case_name({c, 0});
  constexpr int64_t kSteps = 14;
  use_tls(c.tls);  // here, not on the ranks' threads: setenv races with their UCX reading the environment
  zenflow::test_support::run_thread_ranks(c.world, [&](zenflow::test_support::ThreadCollectives& coll, int rank) {
    zenflow::engine::Collectives* group = c.world > 1 ? &coll : nullptr;
    std::vector<at::Tensor> ref_p = model_params(c.dtype, device), rem_p = model_params(c.dtype, device);
    EngineOptions ro = engine_options(c.U, c.overlap);
    EngineOptions mo = ro;
    const auto opts = remote(nodes, job);
    mo.host_backend = [opts](const zenflow::engine::HostStateLayout& l) {
      return zenflow::transport::make_remote_host_optimizer(opts, l);
    };
    auto ref = engine_for(ref_p, ro, group);
    auto rem = engine_for(rem_p, mo, group);
    ASSERT_NE(rem->host_optimizer()->describe().find(nodes[0]), std::string::npos);
    int64_t reselections = 0;
    for (int64_t t = 0; t < kSteps; ++t) {
      feed(ref_p, t, rank);
      feed(rem_p, t, rank);
      const auto a = ref->step({1e-2, 0});
      const auto b = rem->step({1e-2, 0});
      ASSERT_EQ(a.boundary, b.boundary) << "step " << t;
      ASSERT_EQ(a.reselected, b.reselected) << "step " << t;
      reselections += b.reselected ? 1 : 0;
      expect_same_params(ref_p, rem_p, "after step " + std::to_string(t));
    }
    EXPECT_GT(reselections, 0) << "the gradients must move the selection";
    expect_same_state(ref->state_dict(), rem->state_dict());
    ref->finish();
    rem->finish();
    expect_same_params(ref_p, rem_p, "after finish");
    EXPECT_EQ(rem->host_memory_bytes().master, 0) << "the worker holds no host state";
    // Host staging: one output buffer in the weights' dtype, into which each step's result
    // comes back: bf16, or fp32 weights' master with several ranks (the packed copy that
    // the all-gather sends; one rank on the CPU reads the master at the boundary and holds
    // none; on CUDA it is the H2D source); no gradient copy (the CPU device's staging is
    // sent in place: no ring). On CUDA the gradients pass through the pinned ring of
    // stream_ring_chunks chunks: at most that much more.
    const int64_t elements = ref->host_memory_bytes().master / 4;
    const bool cuda = device.is_cuda();
    const int64_t out_bytes = c.dtype == at::kFloat ? (c.world > 1 || cuda ? 4 * elements : 0) : 2 * elements;
    if (!cuda) {
      EXPECT_EQ(rem->host_memory_bytes().transfer_buffers, out_bytes);
    } else {
      const int64_t ring = int64_t{mo.stream_ring_chunks} * static_cast<int64_t>(opts.chunk_bytes);
      EXPECT_LE(rem->host_memory_bytes().transfer_buffers, out_bytes + ring)
          << "output " << out_bytes << ", ring " << ring;
    }
    EXPECT_GT(rem->host_optimizer()->network_bytes_sent(), 0);
    EXPECT_GT(rem->host_optimizer()->network_bytes_received(), 0);
  });
}

std::vector<GridCase> grid() {
  std::vector<GridCase> out;
  for (const char* tls : {"tcp", "sm"})
    for (int64_t U : {1, 4, 0})
      for (bool overlap : {true, false})
        for (int world : {1, 2})
          for (int nodes : {1, 2}) out.push_back({tls, U, overlap, world, nodes, at::kFloat});
  for (const char* tls : {"tcp", "sm"})
    for (int64_t U : {1, 4, 0})
      for (bool overlap : {true, false})
        for (int world : {1, 2}) out.push_back({tls, U, overlap, world, 2, at::kBFloat16});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Grid, RemoteEqualsInProcess, testing::ValuesIn(grid()), case_name);

// The worker's host memory for the optimizer at a size where it shows (one 4096 x 4096
// bf16 matrix, the remote backend's default 8 MiB chunks): no host state and one bf16
// output buffer, 2 bytes per element of host state (+ the 96 MiB ring on CUDA; the CPU
// device sends its staging in place), against 20 bytes of state + 12 of staging
// in-process; bit for bit the same run.
TEST(OptimizerNode, WorkerKeepsTwoBytesPerHostElementPlusTheRing) {
  use_tls("tcp");
  const std::vector<std::string> nodes = shared_nodes("tcp");
  auto make = [](bool remote_backend, const std::string& job, std::vector<at::Tensor>& ps) {
    at::Generator gen = at::detail::createCPUGenerator(77);
    ps = {(at::randn({4096, 4096}, gen) * 0.02).to(at::kBFloat16).set_requires_grad(true),
          (at::randn({4096}, gen) * 0.02).to(at::kBFloat16).set_requires_grad(true)};
    EngineOptions o;
    o.update_interval = 2;
    o.huge_pages = false;
    if (remote_backend) {
      zenflow::transport::RemoteHostOptions r;
      r.addresses = {job.empty() ? std::string() : job};
      r.token = kToken;
      r.job = "memory";
      o.host_backend = [r](const zenflow::engine::HostStateLayout& l) {
        return zenflow::transport::make_remote_host_optimizer(r, l);
      };
    }
    std::vector<ParamSpec> specs(2);
    specs[0].name = "w";
    specs[0].param = ps[0];
    specs[0].weight_decay_value = 0.01;
    specs[1].name = "b";
    specs[1].param = ps[1];
    specs[1].weight_decay = false;
    return std::make_unique<ZenFlowOptimizer>(specs, o);
  };
  std::vector<at::Tensor> ref_p, rem_p;
  auto ref = make(false, "", ref_p);
  auto rem = make(true, nodes[0], rem_p);
  for (int64_t t = 0; t < 6; ++t) {
    at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + t));
    for (size_t k = 0; k < 2; ++k) {
      const at::Tensor g = (at::randn(ref_p[k].sizes(), gen) * 0.01).to(at::kBFloat16);
      ref_p[k].mutable_grad() = g.clone();
      rem_p[k].mutable_grad() = g.clone();
    }
    ref->step({1e-3, 0});
    rem->step({1e-3, 0});
    for (size_t k = 0; k < 2; ++k) ASSERT_TRUE(at::equal(ref_p[k], rem_p[k])) << "step " << t;
  }
  ref->finish();
  rem->finish();
  for (size_t k = 0; k < 2; ++k) ASSERT_TRUE(at::equal(ref_p[k], rem_p[k])) << "after finish";
  const auto in = ref->host_memory_bytes(), out = rem->host_memory_bytes();
  const int64_t elements = in.master / 4;
  ASSERT_EQ(elements, 4096 * 4096);
  EXPECT_EQ(in.master + in.moments + in.accumulators, 20 * elements);
  EXPECT_EQ(in.transfer_buffers, 12 * elements) << "two gradient ring buffers, two last gradients, two outputs";
  EXPECT_EQ(out.master + out.moments + out.accumulators, 0);
  EXPECT_EQ(out.transfer_buffers, 2 * elements) << "one output buffer";
  std::printf("worker host memory for the optimizer state, %lld elements: in-process %.1f B/element, with a node "
              "%.2f B/element\n",
              static_cast<long long>(elements), static_cast<double>(ref->host_state_bytes()) / double(elements),
              static_cast<double>(rem->host_state_bytes()) / double(elements));
}

// Engine state moves between backends: saved remote, resumed in-process, and the reverse,
// continuing exactly like the run that never switched.
TEST(OptimizerNode, StateResumesAcrossBackendsExactly) {
  for (const char* tls : {"tcp", "sm"}) {
    const std::vector<std::string> nodes = shared_nodes(tls);
    use_tls(tls);
    for (bool from_remote : {true, false}) {
      std::vector<at::Tensor> straight_p = model_params(at::kFloat), first_p = model_params(at::kFloat);
      const EngineOptions local = engine_options(4, true);
      EngineOptions rem = local;
      const auto opts = remote({nodes[0], nodes[1]}, std::string("resume-") + tls + (from_remote ? "-r" : "-l"));
      rem.host_backend = [opts](const zenflow::engine::HostStateLayout& l) {
        return zenflow::transport::make_remote_host_optimizer(opts, l);
      };
      auto straight = engine_for(straight_p, local, nullptr);
      auto first = engine_for(first_p, from_remote ? rem : local, nullptr);
      for (int64_t t = 0; t < 6; ++t) {  // mid-window, a host step in flight
        feed(straight_p, t, 0);
        feed(first_p, t, 0);
        straight->step({1e-2, 0});
        first->step({1e-2, 0});
      }
      const State saved = first->state_dict();
      std::vector<at::Tensor> second_p;
      for (auto& p : first_p) second_p.push_back(p.detach().clone().set_requires_grad(true));
      first.reset();
      auto second = engine_for(second_p, from_remote ? local : rem, nullptr);
      second->load_state(saved);
      for (int64_t t = 6; t < 15; ++t) {
        feed(straight_p, t, 0);
        feed(second_p, t, 0);
        straight->step({1e-2, 0});
        second->step({1e-2, 0});
        expect_same_params(straight_p, second_p, std::string(tls) + " step " + std::to_string(t));
      }
      straight->finish();
      second->finish();
      expect_same_params(straight_p, second_p, "after finish");
    }
  }
}

// A remote engine over one fresh node of its own.
struct OwnNode {
  std::unique_ptr<Node> node;
  std::vector<at::Tensor> params;
  std::unique_ptr<ZenFlowOptimizer> engine;
  OwnNode(const std::string& tls, const std::string& tag) {
    node = std::make_unique<Node>(tls, tag);
    params = model_params(at::kFloat);
    EngineOptions o = engine_options(4, true);
    const auto opts = remote({node->address()}, tag);
    o.host_backend = [opts](const zenflow::engine::HostStateLayout& l) {
      return zenflow::transport::make_remote_host_optimizer(opts, l);
    };
    engine = engine_for(params, o, nullptr);
  }
  // Steps until one throws (at most `limit`); returns its message and the seconds from `since`.
  std::pair<std::string, double> step_until_error(std::chrono::steady_clock::time_point since, int limit = 400) {
    for (int t = 0; t < limit; ++t) {
      feed(params, t, 0);
      try {
        engine->step({1e-2, 0});
        if (t % 4 == 3) engine->state_dict();  // a transfer: waits for the node's answer
      } catch (const std::exception& e) {
        return {e.what(), std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count()};
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return {"", 0};
  }
};

TEST(OptimizerNode, KilledNodeFailsTheStepNamingItWithinFiveSeconds) {
  for (const char* tls : {"tcp", "sm"}) {
    OwnNode o(tls, std::string("kill-") + tls);
    for (int t = 0; t < 5; ++t) {
      feed(o.params, t, 0);
      o.engine->step({1e-2, 0});
    }
    const auto killed = std::chrono::steady_clock::now();
    o.node->process().kill(SIGKILL);
    const auto [error, seconds] = o.step_until_error(killed);
    ASSERT_FALSE(error.empty()) << tls << ": no step failed after the node was killed";
    EXPECT_NE(error.find(o.node->address()), std::string::npos) << error;
    EXPECT_NE(error.find("lost"), std::string::npos) << error;
    EXPECT_LT(seconds, 5.0) << tls << ": " << error;
    o.engine.reset();  // destruction after a loss must not hang
  }
}

// check_host_backend(): how a rank whose collective failed (its peer lost the node first
// and left) learns that its own node is gone too. A live node passes; a killed one is named
// (HostBackendLost), as the next step would name it; SIGSTOPped, it is caught by the ping.
TEST(OptimizerNode, CheckingTheHostBackendNamesALostNodeAndPassesALiveOne) {
  OwnNode o("tcp", "check");
  for (int t = 0; t < 6; ++t) {  // mid-window, a host step in flight
    feed(o.params, t, 0);
    o.engine->step({1e-2, 0});
  }
  EXPECT_NO_THROW(o.engine->check_host_backend());
  o.node->process().signal(SIGSTOP);
  // kill() returns before the node is stopped: until it is, it may answer one more ping.
  const std::string stat = "/proc/" + std::to_string(o.node->process().pid()) + "/stat";
  ASSERT_TRUE(zenflow::test_support::wait_until(
      [&] {
        const std::string st = zenflow::test_support::read_file(stat);
        const size_t paren = st.rfind(')');
        return paren != std::string::npos && paren + 2 < st.size() && st[paren + 2] == 'T';
      },
      std::chrono::seconds(5)))
      << "the node did not stop";
  try {
    o.engine->check_host_backend();
    FAIL() << "a stopped node passed the check";
  } catch (const zenflow::engine::HostBackendLost& e) {
    EXPECT_EQ(e.node(), o.node->address()) << e.what();
    EXPECT_NE(std::string(e.what()).find("no answer to pings"), std::string::npos) << e.what();
  }
  o.node->process().signal(SIGCONT);
  o.node->process().kill(SIGKILL);
  EXPECT_THROW(o.engine->check_host_backend(), zenflow::engine::HostBackendLost);

  std::vector<at::Tensor> params = model_params(at::kFloat);  // in-process: nothing to lose
  auto local = engine_for(params, engine_options(4, true), nullptr);
  for (int t = 0; t < 6; ++t) {
    feed(params, t, 0);
    local->step({1e-2, 0});
  }
  EXPECT_NO_THROW(local->check_host_backend());
}

TEST(OptimizerNode, StoppedNodeIsCaughtByThePing) {
  OwnNode o("tcp", "sigstop");
  for (int t = 0; t < 3; ++t) {
    feed(o.params, t, 0);
    o.engine->step({1e-2, 0});
  }
  const auto stopped = std::chrono::steady_clock::now();
  o.node->process().signal(SIGSTOP);
  const auto [error, seconds] = o.step_until_error(stopped);
  o.node->process().signal(SIGCONT);
  ASSERT_FALSE(error.empty());
  EXPECT_NE(error.find("no answer to pings"), std::string::npos) << error;
  EXPECT_NE(error.find(o.node->address()), std::string::npos) << error;
  EXPECT_LT(seconds, 8.0) << error;
  EXPECT_GE(seconds, 4.0) << error;
}

zenflow::engine::HostStateLayout layout_of(int64_t elements, int rank = 0) {
  zenflow::engine::HostStateLayout l;
  l.elements = elements;
  l.huge_pages = false;
  l.rank = rank;
  l.segments = {0};
  return l;
}

// The node's --listen port speaks only the transport's handshake: garbage, truncated and
// oversized handshakes, a proof with the wrong token, a handshake that stalls past the
// node's 5 s deadline and a crowd of connections beyond the 64 it serves at once leave the
// process up, and a real session then runs. Before, one packet of 16 bytes of 0xff killed
// it (UCX's listener: tcp_sockcm_ep.c:825 Assertion 'offset <= length' failed).
TEST(OptimizerNode, GarbageAtItsPortLeavesTheNodeServingARealSession) {
  namespace ts = zenflow::test_support;
  namespace hs = zenflow::transport::handshake;
  Node node("tcp", "garbage");
  const int port = zenflow::transport::parse_address(node.address()).second;
  for (const auto& attack : ts::garbage_attacks()) {
    const int fd = ts::connect_raw(port);
    ASSERT_GE(fd, 0) << "the node stopped listening before " << attack.name << ": " << node.process().output();
    ts::send_all(fd, attack.bytes);
    EXPECT_TRUE(ts::wait_closed(fd, std::chrono::seconds(10))) << attack.name;
    ::close(fd);
    ASSERT_TRUE(node.process().running()) << attack.name << " killed the node: " << node.process().output();
  }
  {  // a wrong proof: the node answers REFUSE and closes
    const int fd = ts::connect_raw(port);
    hs::ClientHandshake wrong("not-the-token", "", {std::string(100, 'x'), 7}, hs::random_nonce());
    std::string out = wrong.start();
    for (int round = 0; round < 4 && wrong.state() == hs::State::kRunning; ++round) {
      ts::send_all(fd, out);
      std::string got;
      ts::wait_closed(fd, std::chrono::milliseconds(2000), &got);
      out = wrong.feed(got.data(), got.size());
    }
    ::close(fd);
    EXPECT_TRUE(wrong.authentication_failed()) << wrong.error();
  }
  std::vector<int> crowd;  // silent, and one stalls mid-frame: held until the deadline
  for (int i = 0; i < 100; ++i) crowd.push_back(ts::connect_raw(port));
  ts::send_all(crowd[0], "ZFNH");
  // UCX's own sockets (tcp's listeners, besides the node's port) hear only addresses that
  // hold a session: the request that aborts UCX 1.13 (tcp_cm.c:688), from 127.0.0.2, is
  // closed unread before the session and during it.
  std::vector<int> ucx_ports;
  for (const std::string& a : ts::listening_sockets(std::to_string(node.process().pid())))
    if (a.rfind("127.0.0.1:", 0) == 0 && a != "127.0.0.1:" + std::to_string(port))
      ucx_ports.push_back(std::stoi(a.substr(a.rfind(':') + 1)));
  ASSERT_FALSE(ucx_ports.empty()) << "the node's UCX opened no socket of its own: nothing is checked";
  auto short_requests_from_a_stranger = [&](const char* when) {
    for (int ucx_port : ucx_ports) {
      const int fd = ts::connect_raw(ucx_port, "127.0.0.2");
      ASSERT_GE(fd, 0) << when << ": UCX's socket " << ucx_port << " is gone: " << node.process().output();
      ts::send_all(fd, ts::ucx_tcp_short_connection_request());
      EXPECT_TRUE(ts::wait_closed(fd, std::chrono::seconds(10))) << when;
      ::close(fd);
    }
  };
  short_requests_from_a_stranger("before the session");
  ASSERT_TRUE(node.process().running()) << node.process().output();
  auto opts = remote({node.address()}, "after-garbage");
  opts.connect_timeout_s = 60;  // it waits for the crowd's deadline (5 s) in the backlog
  auto after = zenflow::transport::make_remote_host_optimizer(opts, layout_of(1000));
  for (int fd : crowd)
    if (fd >= 0) ::close(fd);
  std::vector<float> buf(1000, 2.5f), back(1000, 0.0f);
  after->write(zenflow::engine::HostBuf::kMaster, 0, 1000, buf.data());
  short_requests_from_a_stranger("during the session");
  after->read(zenflow::engine::HostBuf::kMaster, 0, 1000, back.data());
  EXPECT_EQ(back, buf);
  EXPECT_TRUE(node.process().running()) << node.process().output();
  EXPECT_NE(node.process().output().find("closed a connection to UCX's own listening socket from 127.0.0.2"),
            std::string::npos)
      << node.process().output();
}

// A rank's UCX opens its own sockets (tcp's listeners) only on the interfaces it reaches its
// nodes from, whatever UCX_NET_DEVICES says: with a node on loopback, this process (the
// rank) listens on loopback only. Without that, UCX listened on every interface.
TEST(OptimizerNode, ARanksUcxListensOnlyOnTheInterfaceTowardItsNodes) {
  namespace ts = zenflow::test_support;
  if (!ts::has_non_loopback_ipv4()) GTEST_SKIP() << "no interface but lo: nothing to keep UCX off";
  Node node("tcp", "rank-sockets");
  const std::vector<std::string> before = ts::listening_sockets();
  ::unsetenv("UCX_NET_DEVICES");  // use_tls's lo would hide what the rank does
  auto backend = zenflow::transport::make_remote_host_optimizer(remote({node.address()}, "rank-sockets"), layout_of(1000));
  ::setenv("UCX_NET_DEVICES", "lo", 1);
  std::vector<float> buf(1000, 1.5f), back(1000, 0.0f);
  backend->write(zenflow::engine::HostBuf::kMaster, 0, 1000, buf.data());
  backend->read(zenflow::engine::HostBuf::kMaster, 0, 1000, back.data());
  EXPECT_EQ(back, buf);
  int opened = 0;
  for (const std::string& a : ts::listening_sockets()) {
    if (std::find(before.begin(), before.end(), a) != before.end()) continue;
    ++opened;
    EXPECT_EQ(a.rfind("127.0.0.1:", 0), 0u) << "the rank's UCX listens on " << a;
  }
  EXPECT_GT(opened, 0) << "the rank opened no socket: this test checks nothing";
}

// A node registered with a coordinator and given no --token-file serves only the job
// attempts the coordinator granted it: a rank with no secret (key "") is refused, naming the
// key, where before it got a session with an empty secret. Such a node may listen beyond
// loopback (the chart's nodes do: their only credential is the coordinator's grants); one
// with neither a token nor a coordinator may not.
TEST(OptimizerNode, ANodeWithACoordinatorAndNoTokenServesOnlyGrantedAttempts) {
  namespace ts = zenflow::test_support;
  use_tls("tcp");
  const fs::path join = temp_dir() / "join.token";
  std::ofstream(join) << std::string(64, 'j') << "\n";
  fs::permissions(join, fs::perms::owner_read | fs::perms::owner_write);
  const std::string nowhere = "127.0.0.1:1";  // no coordinator there: the node keeps retrying and serving
  auto start = [&](const std::string& host, const std::string& tag, bool with_coordinator) {
    const fs::path port_file = temp_dir() / (tag + ".port");
    std::vector<std::string> argv = {std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow-optimizer", "--listen",
                                     host + ":0", "--port-file", port_file.string()};
    if (with_coordinator) argv.insert(argv.end(), {"--coordinator", nowhere, "--worker-token-file", join.string()});
    auto p = std::make_unique<Process>(argv, temp_dir() / (tag + ".log"));
    wait_until([&] { return fs::exists(port_file) || !p->running(); }, std::chrono::seconds(20));
    return std::make_pair(std::move(p), fs::exists(port_file) ? std::stoi(ts::read_file(port_file)) : 0);
  };
  auto [node, port] = start("127.0.0.1", "granted-only", true);
  ASSERT_GT(port, 0) << node->output();
  auto opts = remote({"127.0.0.1:" + std::to_string(port)}, "tokenless");
  opts.token.clear();
  opts.connect_timeout_s = 2;
  try {
    zenflow::transport::make_remote_host_optimizer(opts, layout_of(100));
    ADD_FAILURE() << "a rank with no secret got a session on a node that serves only grants";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no secret for key ''"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(node->running()) << node->output();
  const std::string own = ts::non_loopback_ipv4();
  if (own.empty()) return;  // the rest needs an address beyond loopback
  auto [beyond, beyond_port] = start(own, "beyond-granted", true);
  EXPECT_GT(beyond_port, 0) << beyond->output();
  auto [bare, bare_port] = start(own, "beyond-bare", false);
  EXPECT_EQ(bare_port, 0);
  EXPECT_EQ(bare->wait_exit(std::chrono::seconds(10)), 2);
  EXPECT_NE(bare->output().find("--token-file (or --coordinator) is required when listening beyond loopback"),
            std::string::npos)
      << bare->output();
}

TEST(OptimizerNode, StaleEpochIsRefusedAndANewerOneFencesTheOlder) {
  use_tls("tcp");
  const std::vector<std::string> nodes = shared_nodes("tcp");
  auto five = zenflow::transport::make_remote_host_optimizer(remote({nodes[0]}, "epochs", 5), layout_of(1000));
  try {
    zenflow::transport::make_remote_host_optimizer(remote({nodes[0]}, "epochs", 4), layout_of(1000));
    FAIL() << "an older epoch was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("epoch 4 is older than epoch 5"), std::string::npos) << e.what();
  }
  std::vector<float> buf(1000, 1.5f), back(1000, 0.0f);
  five->write(zenflow::engine::HostBuf::kMaster, 0, 1000, buf.data());
  five->read(zenflow::engine::HostBuf::kMaster, 0, 1000, back.data());
  EXPECT_EQ(back, buf);
  auto six = zenflow::transport::make_remote_host_optimizer(remote({nodes[0]}, "epochs", 6), layout_of(1000));
  try {
    five->read(zenflow::engine::HostBuf::kMaster, 0, 1000, back.data());
    FAIL() << "a fenced session still answered";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("moved on to epoch 6"), std::string::npos) << e.what();
  }
  six->read(zenflow::engine::HostBuf::kMaster, 0, 1000, back.data());
  EXPECT_EQ(back, std::vector<float>(1000, 0.0f)) << "a new session starts zeroed";
}

TEST(OptimizerNode, RefusesAWrongTokenAndAStateOverItsMemoryLimit) {
  use_tls("tcp");
  auto opts = remote(shared_nodes("tcp"), "token");
  opts.token = "not-the-token";
  try {
    zenflow::transport::make_remote_host_optimizer(opts, layout_of(100));
    FAIL() << "a wrong token was accepted";
  } catch (const zenflow::engine::HostBackendLost& e) {
    FAIL() << "a wrong token reads as a lost node: " << e.what();
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("optimizer node " + opts.addresses[0]), std::string::npos) << m;
    EXPECT_NE(m.find("authentication failed"), std::string::npos) << m;
  }
  Node small("tcp", "memory-limit", {"--memory-limit", "1M"});
  try {
    zenflow::transport::make_remote_host_optimizer(remote({small.address()}, "big"), layout_of(1 << 20));
    FAIL() << "a state over the memory limit was accepted";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("20971520 bytes"), std::string::npos) << m;  // 5 arrays x 4 B x 2^20
    EXPECT_NE(m.find("--memory-limit is 0.00 GiB (1048576 bytes)"), std::string::npos) << m;
  }
  // Offload mode's state has no window accumulators: 80000 elements take 3 x 4 B each
  // (960000 bytes, under the limit) where zenflow's take 5 x 4 B (1600000 bytes, over it).
  zenflow::engine::HostStateLayout offload = layout_of(80000);
  offload.accumulators = false;
  EXPECT_NO_THROW(zenflow::transport::make_remote_host_optimizer(remote({small.address()}, "offload"), offload));
  try {
    zenflow::transport::make_remote_host_optimizer(remote({small.address()}, "zenflow"), layout_of(80000));
    FAIL() << "a state over the memory limit was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("1600000 bytes"), std::string::npos) << e.what();
  }
}

// This process's threads (/proc/self/task), their names and the cores each may run on.
std::set<pid_t> thread_ids() {
  std::set<pid_t> ids;
  for (const auto& e : fs::directory_iterator("/proc/self/task")) ids.insert(std::stoi(e.path().filename()));
  return ids;
}

std::string thread_name(pid_t tid) {
  std::string name = zenflow::test_support::read_file("/proc/self/task/" + std::to_string(tid) + "/comm");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

std::vector<int> cores_of(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(tid, sizeof(set), &set) != 0) return cores;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  return cores;
}

// Every thread the backend starts (its transport's, UCX's own, the sender, the watchdog)
// runs on the cores it is given, the host optimizer's reserved ones: on the training
// thread's, the copies of the gradient stream took its core (bench offload, bf16, a node on
// loopback: compute +20%, step +17%). The training thread keeps its own cores.
TEST(OptimizerNode, BackendThreadsRunOnTheHostCoresAndTheCallerKeepsItsOwn) {
  const std::vector<int> cores = zenflow::engine::available_cores();
  if (cores.size() < 2) GTEST_SKIP() << "needs two cores";
  use_tls("tcp");
  const std::vector<std::string> nodes = shared_nodes("tcp");
  std::thread training([&] {  // as trainer.cpp pins it
    ASSERT_EQ(zenflow::engine::pin_current_thread({cores[0]}), "");
    const std::set<pid_t> before = thread_ids();
    auto opts = remote({nodes[0]}, "pinned");
    opts.cores = {cores[1]};
    auto backend = zenflow::transport::make_remote_host_optimizer(opts, layout_of(1000));
    std::set<std::string> names;
    for (pid_t t : thread_ids()) {
      if (before.count(t)) continue;
      names.insert(thread_name(t));
      EXPECT_EQ(cores_of(t), std::vector<int>{cores[1]}) << "thread " << thread_name(t);
    }
    for (const char* want : {"zf-transport", "zf-node-send", "zf-node-watch"})
      EXPECT_EQ(names.count(want), 1u) << want << " not among the backend's new threads";
    EXPECT_EQ(cores_of(gettid()), std::vector<int>{cores[0]}) << "the training thread was moved";
    std::vector<float> buf(1000, 2.5f), back(1000, 0.0f);
    backend->write(zenflow::engine::HostBuf::kMaster, 0, 1000, buf.data());
    backend->read(zenflow::engine::HostBuf::kMaster, 0, 1000, back.data());
    EXPECT_EQ(back, buf);
  });
  training.join();
}

// Column batches (a re-selection's moves, sent before any is waited for) over blocks of
// both nodes and two arrays leave the state as the in-process backend's and read back the
// same; a batch with a bad block throws once the blocks posted before it are done.
TEST(OptimizerNode, ColumnBatchesMoveLikeTheInProcessBackend) {
  use_tls("tcp");
  using zenflow::engine::ColumnBlock;
  using zenflow::engine::HostBuf;
  const int64_t rows = 48, width = 40, matrix = rows * width;
  zenflow::engine::HostStateLayout l = layout_of(2 * matrix);
  l.segments = {0, matrix};  // one matrix per node
  ASSERT_EQ(zenflow::transport::slice_bounds(l, 2), (std::vector<int64_t>{0, matrix, 2 * matrix}));
  auto remote_backend =
      zenflow::transport::make_remote_host_optimizer(remote(shared_nodes("tcp"), "columns"), l);
  zenflow::engine::InProcessHostOptions in_opts;
  auto local_backend = zenflow::engine::make_in_process_host_optimizer(in_opts, l);

  std::vector<float> init(static_cast<size_t>(2 * matrix));
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.25f * static_cast<float>(i) - 7.0f;
  const std::vector<int64_t> cols0 = {1, 5, 6, 17, 39}, cols1 = {0, 2, 38};
  const HostBuf bufs[2] = {HostBuf::kMaster, HostBuf::kV};
  auto blocks = [&](std::vector<std::vector<float>>& data) {
    std::vector<ColumnBlock> out;
    for (int b = 0; b < 2; ++b)
      for (int m = 0; m < 2; ++m) {
        const std::vector<int64_t>& cols = m == 0 ? cols0 : cols1;
        data.emplace_back(static_cast<size_t>(rows) * cols.size());
        out.push_back(ColumnBlock{bufs[b], m * matrix, rows, width, cols, data.back().data()});
      }
    return out;
  };
  std::vector<std::vector<float>> written;
  written.reserve(4);
  const std::vector<ColumnBlock> writes = blocks(written);
  for (size_t k = 0; k < written.size(); ++k)
    for (size_t i = 0; i < written[k].size(); ++i) written[k][i] = -1.0f - static_cast<float>(k * 1000 + i);

  std::vector<float> remote_state[2], local_state[2];
  for (auto* backend : {remote_backend.get(), local_backend.get()}) {
    for (HostBuf b : bufs)
      for (int64_t m = 0; m < 2; ++m) backend->write(b, m * matrix, matrix, init.data() + m * matrix);
    backend->scatter_columns(writes);
    auto& state = backend == remote_backend.get() ? remote_state : local_state;
    for (int b = 0; b < 2; ++b) {
      state[b].resize(init.size());
      for (int64_t m = 0; m < 2; ++m)
        backend->read(bufs[b], m * matrix, matrix, state[b].data() + m * matrix);
    }
  }
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(remote_state[b], local_state[b]) << "array " << b;
    // Row 3, column 17 of matrix 0 is the 4th of cols0; column 2 of matrix 1 the 2nd of cols1.
    EXPECT_EQ(remote_state[b][3 * width + 17], written[static_cast<size_t>(2 * b)][3 * cols0.size() + 3]);
    EXPECT_EQ(remote_state[b][matrix + 7 * width + 2],
              written[static_cast<size_t>(2 * b + 1)][7 * cols1.size() + 1]);
    EXPECT_EQ(remote_state[b][3 * width + 16], init[3 * width + 16]) << "a column outside the batch moved";
  }

  std::vector<std::vector<float>> got;
  got.reserve(4);
  remote_backend->gather_columns(blocks(got));
  EXPECT_EQ(got, written) << "columns read back are not those written";

  std::vector<std::vector<float>> partial;
  partial.reserve(4);
  std::vector<ColumnBlock> bad = blocks(partial);
  bad[1].offset = 2 * matrix;  // past the state's end
  try {
    remote_backend->gather_columns(bad);
    FAIL() << "a block outside the host state was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the host state"), std::string::npos) << e.what();
  }
  EXPECT_EQ(partial[0], written[0]) << "the block posted before the bad one was not complete when it threw";
}

// A re-pack (a re-selection's new host layout) made by the node, which receives only the
// appended columns, leaves the arrays as the in-process backend's and as a re-pack made
// out of place: narrowing (the first selection: columns leave, none arrive) and widening
// (more columns arrive than leave, so that rows move up in memory).
TEST(OptimizerNode, RepackOnTheNodeMatchesTheInProcessBackend) {
  use_tls("tcp");
  const int64_t rows = 37, width = 50, capacity = rows * 64;
  const zenflow::engine::HostStateLayout l = layout_of(2 * capacity);
  auto remote_backend =
      zenflow::transport::make_remote_host_optimizer(remote({shared_nodes("tcp")[0]}, "repack"), l);
  zenflow::engine::InProcessHostOptions in_opts;
  auto local_backend = zenflow::engine::make_in_process_host_optimizer(in_opts, l);
  std::vector<float> init(static_cast<size_t>(capacity));
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i) * 0.5f + 1.0f;

  struct Case {
    std::vector<int64_t> src;
    int64_t appended;
  };
  std::vector<int64_t> narrow, widen;
  for (int64_t c = width - 1; c >= 0; c -= 3) narrow.push_back(c);              // 17 columns, reversed
  for (int64_t c = 0; c < width; c += 2) widen.push_back(c);                    // 25 kept ...
  for (int64_t a = 0; a < 30; ++a) widen.insert(widen.begin() + a, width + a);  // ... and 30 arrive
  for (const Case& k : {Case{narrow, 0}, Case{widen, 30}}) {
    std::vector<float> appended(static_cast<size_t>(rows * k.appended));
    for (size_t i = 0; i < appended.size(); ++i) appended[i] = -static_cast<float>(i) - 0.25f;
    const int64_t n = static_cast<int64_t>(k.src.size());
    std::vector<float> expected(static_cast<size_t>(rows * n));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t c = k.src[static_cast<size_t>(j)];
        expected[static_cast<size_t>(r * n + j)] =
            c < width ? init[static_cast<size_t>(r * width + c)]
                      : appended[static_cast<size_t>(r * k.appended + c - width)];
      }
    for (auto* backend : {remote_backend.get(), local_backend.get()}) {
      const std::string which = backend == local_backend.get() ? "in-process" : "node";
      backend->write(zenflow::engine::HostBuf::kM, capacity, capacity, init.data());
      backend->repack_columns(zenflow::engine::HostBuf::kM, capacity, rows, width, k.src, appended.data(),
                              k.appended);
      std::vector<float> got(expected.size());
      backend->read(zenflow::engine::HostBuf::kM, capacity, rows * n, got.data());
      EXPECT_EQ(got, expected) << which << ", " << n << " columns from " << width << " + " << k.appended;
      std::vector<float> before(static_cast<size_t>(capacity));
      backend->read(zenflow::engine::HostBuf::kM, 0, capacity, before.data());
      EXPECT_EQ(before, std::vector<float>(before.size(), 0.0f))
          << which << ": the matrix before it was touched";
    }
  }
  const std::vector<int64_t> outside = {0, width + 1};
  std::vector<float> one(static_cast<size_t>(rows));
  try {
    remote_backend->repack_columns(zenflow::engine::HostBuf::kM, capacity, rows, width, outside, one.data(),
                                   1);
    FAIL() << "a re-pack column past the appended ones was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("column 51 outside a matrix 51 wide"), std::string::npos)
        << e.what();
  }
}

// A step's fp32 output (StepJob::Span::master_out, fp32 weights with nodes) is the updated
// master, sent back with the step: the same bits on a node as in-process and as the
// master read afterwards; bf16 outputs in the same job are refused before anything runs.
TEST(OptimizerNode, AStepSendsItsUpdatedMasterBack) {
  using zenflow::engine::HostBuf;
  use_tls("tcp");
  const int64_t n = 3000;  // two spans, the second without an output
  const zenflow::engine::HostStateLayout l = layout_of(2 * n);
  auto remote_backend =
      zenflow::transport::make_remote_host_optimizer(remote({shared_nodes("tcp")[0]}, "master-out"), l);
  zenflow::engine::InProcessHostOptions in_opts;
  auto local_backend = zenflow::engine::make_in_process_host_optimizer(in_opts, l);
  std::vector<float> init(static_cast<size_t>(2 * n)), grad(static_cast<size_t>(2 * n));
  for (size_t i = 0; i < init.size(); ++i) {
    init[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
    grad[i] = 0.002f * static_cast<float>(i % 13) - 0.01f;
  }
  zenflow::engine::AdamWParams p;
  p.lr = 1e-2f;
  p.weight_decay = 0.1f;
  // Step `step` over both spans, with the outputs given (the first span's fp32, the second's bf16).
  auto job = [&](int step, float* master_out, uint16_t* half_out) {
    zenflow::engine::StepJob j;
    for (int k = 0; k < 2; ++k) {
      zenflow::engine::StepJob::Span sp;
      sp.offset = k * n;
      sp.n = n;
      sp.grad = zenflow::engine::GradRef::f32(grad.data() + k * n);
      sp.coeffs = zenflow::engine::AdamWCoeffs::make(p, step);
      if (k == 0) sp.master_out = master_out;
      if (k == 1) sp.half_out = half_out;
      j.spans.push_back(sp);
    }
    return j;
  };
  std::vector<float> outs[2], masters[2];
  for (int which = 0; which < 2; ++which) {
    zenflow::engine::HostOptimizer& b = which == 0 ? *local_backend : *remote_backend;
    b.write(HostBuf::kMaster, 0, 2 * n, init.data());
    outs[which].assign(static_cast<size_t>(n), -1.0f);
    for (int step = 1; step <= 2; ++step) b.submit(job(step, outs[which].data(), nullptr))->wait();
    masters[which].resize(static_cast<size_t>(2 * n));
    b.read(HostBuf::kMaster, 0, 2 * n, masters[which].data());
    EXPECT_EQ(std::vector<float>(masters[which].begin(), masters[which].begin() + n), outs[which])
        << (which == 0 ? "in-process" : "node") << ": the output is not the updated master";
    EXPECT_NE(masters[which], init) << "the step did not run";
  }
  EXPECT_EQ(outs[0], outs[1]) << "a node's fp32 output differs from the in-process backend's";
  EXPECT_EQ(masters[0], masters[1]);

  std::vector<uint16_t> half(static_cast<size_t>(n));
  zenflow::engine::StepJob mixed = job(3, outs[1].data(), half.data());
  try {
    remote_backend->submit(mixed);
    FAIL() << "fp32 and bf16 outputs in one job were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fp32 and low-precision outputs in one job"), std::string::npos)
        << e.what();
  }
  remote_backend->drain();
  std::vector<float> after(static_cast<size_t>(2 * n));
  remote_backend->read(HostBuf::kMaster, 0, 2 * n, after.data());
  EXPECT_EQ(after, masters[1]) << "the refused job ran";
}

// StepJob::after_chunk (what a node streams its PARAMS from): the in-process backend
// reports each chunk of a step in order, covering every element once, and when it does,
// the outputs of every element up to the chunk's end are final and none after it is
// written yet. A callback that throws fails the job; the remote backend refuses one.
TEST(OptimizerNode, InProcessStepsReportEachChunkOnceItsOutputsAreWritten) {
  const int64_t total = 10000;
  const int64_t spans[3][2] = {{0, 3000}, {3000, 1500}, {4500, 5500}};  // the middle one has no output
  zenflow::engine::InProcessHostOptions o;
  o.chunk_elements = 2048;  // 5 chunks, two of them across span boundaries
  const zenflow::engine::HostStateLayout l = layout_of(total);
  std::vector<float> grad(static_cast<size_t>(total));
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.003f * static_cast<float>(i % 29) - 0.04f;
  const uint16_t kUnwritten = 0xffff;  // a NaN: AdamW never writes it
  auto job = [&](std::vector<uint16_t>& out) {
    out.assign(static_cast<size_t>(total), kUnwritten);
    zenflow::engine::StepJob j;
    zenflow::engine::AdamWParams p;
    p.lr = 1e-2f;
    for (const auto& sp : spans) {
      zenflow::engine::StepJob::Span s;
      s.offset = sp[0];
      s.n = sp[1];
      s.grad = zenflow::engine::GradRef::f32(grad.data() + sp[0]);
      s.coeffs = zenflow::engine::AdamWCoeffs::make(p, 1);
      if (sp[0] != 3000) s.half_out = out.data() + sp[0];  // flat order = array order here
      j.spans.push_back(s);
    }
    return j;
  };
  std::vector<uint16_t> expected, out;
  zenflow::engine::make_in_process_host_optimizer(o, l)->submit(job(expected))->wait();
  for (int64_t i = 3000; i < 4500; ++i) ASSERT_EQ(expected[static_cast<size_t>(i)], kUnwritten);
  ASSERT_EQ(std::count(expected.begin(), expected.end(), kUnwritten), 1500)
      << "the reference step wrote nothing";

  auto backend = zenflow::engine::make_in_process_host_optimizer(o, l);
  zenflow::engine::StepJob j = job(out);
  std::vector<std::pair<int64_t, int64_t>> seen;
  std::vector<std::string> wrong;
  j.after_chunk = [&](int64_t lo, int64_t hi) {
    seen.emplace_back(lo, hi);
    for (int64_t i = 0; i < total; ++i) {
      const bool done = i < hi;
      const uint16_t want = done ? expected[static_cast<size_t>(i)] : kUnwritten;
      if (out[static_cast<size_t>(i)] != want) {
        wrong.push_back("at chunk [" + std::to_string(lo) + ", " + std::to_string(hi) + "), element " +
                        std::to_string(i) + (done ? " is not final" : " is written already"));
        return;
      }
    }
  };
  backend->submit(std::move(j))->wait();
  EXPECT_TRUE(wrong.empty()) << wrong.front();
  const std::vector<std::pair<int64_t, int64_t>> chunks = {
      {0, 2048}, {2048, 4096}, {4096, 6144}, {6144, 8192}, {8192, 10000}};
  EXPECT_EQ(seen, chunks);
  EXPECT_EQ(out, expected);

  zenflow::engine::StepJob failing = job(out);
  int calls = 0;
  failing.after_chunk = [&](int64_t, int64_t hi) {
    if (++calls == 2) throw std::runtime_error("the stream's channel is gone at " + std::to_string(hi));
  };
  try {
    backend->submit(std::move(failing))->wait();
    FAIL() << "a step whose after_chunk threw succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "the stream's channel is gone at 4096");
  }
  EXPECT_EQ(calls, 2) << "the step went on after its callback threw";

  use_tls("tcp");
  auto remote_backend =
      zenflow::transport::make_remote_host_optimizer(remote({shared_nodes("tcp")[0]}, "after-chunk"), l);
  zenflow::engine::StepJob refused = job(out);
  refused.after_chunk = [](int64_t, int64_t) {};
  try {
    remote_backend->submit(std::move(refused));
    FAIL() << "the remote backend took a job with after_chunk";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("after_chunk"), std::string::npos) << e.what();
  }
}

// A node streams a window step's PARAMS back as its chunks finish, not after the whole
// step (docs/design.md §10, window pipeline): a raw session whose step spans eight of the
// node's 1M-element chunks (spans across chunk boundaries, one without an output) gets
// PARAMS before the step's COMPUTED, cut where the chunks finished, every output equal to
// the in-process backend's and every element sent exactly once; then DONE counts the bytes.
class StreamedStep : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamedStep, AWindowStepStreamsItsParamsWhileItRuns) {
  namespace tr = zenflow::transport;
  const std::string tls = GetParam();
  use_tls(tls);
  const uint64_t total = 8u << 20;
  const uint64_t spans[3][2] = {{0, 2500000}, {2500000, 700000}, {3200000, total - 3200000}};
  std::vector<uint16_t> grad(total);
  for (size_t i = 0; i < grad.size(); ++i)
    grad[i] = zenflow::engine::float_to_bf16(0.002f * static_cast<float>(i % 31) - 0.03f);
  zenflow::engine::AdamWParams p;
  p.lr = 1e-3f;
  p.weight_decay = 0.1f;

  // The reference: the same step in-process, from the same (zero) state.
  std::vector<uint16_t> expected(total, 0);
  {
    zenflow::engine::InProcessHostOptions o;
    auto local = zenflow::engine::make_in_process_host_optimizer(o, layout_of(static_cast<int64_t>(total)));
    zenflow::engine::StepJob j;
    for (const auto& sp : spans) {
      zenflow::engine::StepJob::Span s;
      s.offset = static_cast<int64_t>(sp[0]);
      s.n = static_cast<int64_t>(sp[1]);
      s.grad = zenflow::engine::GradRef::bf16(grad.data() + sp[0]);
      s.coeffs = zenflow::engine::AdamWCoeffs::make(p, 1);
      if (sp[0] != 2500000) s.half_out = expected.data() + sp[0];
      j.spans.push_back(s);
    }
    local->submit(std::move(j))->wait();
  }

  Node node(tls, "stream-" + tls);
  tr::TransportOptions to;
  to.secret = kToken;
  auto transport = tr::Transport::create(to);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<tr::MsgType, uint64_t>> arrivals;  // type, op
  std::set<std::array<uint64_t, 3>> messages;              // PARAMS: span, offset, count
  std::vector<uint16_t> got(total, 0);
  std::vector<uint8_t> times_sent(total, 0);
  uint64_t done_count = 0, params_bytes = 0;
  bool welcomed = false;
  int dones = 0;
  std::string error;
  tr::ChannelHandler h;
  h.on_message = [&](const void* header, size_t hlen, void* data, size_t len) {
    std::lock_guard<std::mutex> lock(mu);
    try {
      const tr::WireHeader w = tr::decode(header, hlen, len, {}, data);
      arrivals.emplace_back(w.type, w.seq);
      if (w.type == tr::MsgType::kWelcome) welcomed = true;
      if (w.type == tr::MsgType::kError) error = std::string(static_cast<char*>(data), len);
      if (w.type == tr::MsgType::kDone) {
        ++dones;
        done_count = w.count;
      }
      if (w.type == tr::MsgType::kParams) {
        if (w.aux >= 3 || w.offset + w.count > spans[w.aux][1] || len != w.count * 2)
          throw std::runtime_error("PARAMS outside the step's spans");
        messages.insert({w.aux, w.offset, w.count});
        const uint64_t at = spans[w.aux][0] + w.offset;  // span aux's element offset
        std::memcpy(got.data() + at, data, len);
        for (uint64_t i = at; i < at + w.count; ++i) ++times_sent[i];
        params_bytes += len;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    cv.notify_all();
  };
  h.on_error = [&](const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    error = "channel: " + e;
    cv.notify_all();
  };
  const auto [host, port] = tr::parse_address(node.address());
  std::shared_ptr<tr::Channel> ch = transport->connect(host, port, h);
  std::vector<std::shared_ptr<std::string>> keep;
  auto send = [&](tr::WireHeader w, const void* data, size_t len) {
    w.payload_bytes = static_cast<uint32_t>(len);
    unsigned char buf[tr::kWireHeaderBytes];
    tr::encode(w, buf);
    ch->send(buf, sizeof buf, data, len, {});
  };
  auto send_body = [&](tr::WireHeader w, std::string body) {
    keep.push_back(std::make_shared<std::string>(std::move(body)));
    send(w, keep.back()->data(), keep.back()->size());
  };
  tr::Hello hello;
  hello.job = "stream";
  hello.elements = total;
  hello.chunk_bytes = 1u << 20;  // flushes of >= 1 MiB: one per 1M-element chunk of bf16 outputs
  hello.huge_pages = 0;
  hello.host_isa = zenflow::engine::host_isa_name(zenflow::engine::active_host_isa());
  send_body(tr::make_header(tr::MsgType::kHello, 1, 0), tr::encode_hello(hello));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return welcomed || !error.empty(); }));
    ASSERT_TRUE(error.empty()) << error;
  }
  tr::OpDesc desc;
  for (const auto& sp : spans) {
    tr::OpSpan o;
    o.offset = sp[0];
    o.n = sp[1];
    o.grad_type = static_cast<uint32_t>(zenflow::engine::GradRef::Type::kBF16);
    o.out_kind =
        sp[0] == 2500000 ? tr::kOutNone : 1 + static_cast<uint32_t>(zenflow::engine::HalfKind::kBF16);
    o.coeffs = zenflow::engine::AdamWCoeffs::make(p, 1);
    desc.spans.push_back(o);
  }
  tr::WireHeader step = tr::make_header(tr::MsgType::kStep, 1, 0, 1);
  step.scale = 1.0f;
  send_body(step, tr::encode_op(desc, true));
  const uint64_t grad_chunk = 512u << 10;  // elements per GRAD message (1 MiB)
  for (uint32_t k = 0; k < 3; ++k)
    for (uint64_t off = 0; off < spans[k][1]; off += grad_chunk) {
      tr::WireHeader g = tr::make_header(tr::MsgType::kGrad, 1, 0, 1);
      g.aux = k;
      g.offset = off;
      g.count = std::min(grad_chunk, spans[k][1] - off);
      send(g, grad.data() + spans[k][0] + off, g.count * sizeof(uint16_t));
    }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return dones == 1 || !error.empty(); }))
        << "no DONE within 60 s";
    ASSERT_TRUE(error.empty()) << error;
  }
  ch->close(false);
  const uint64_t out_elems = total - spans[1][1];
  EXPECT_EQ(done_count, out_elems * 2);
  EXPECT_EQ(params_bytes, out_elems * 2);
  // Order: the previous node sent COMPUTED before any PARAMS, so none could land first.
  // Streamed, the first seven chunks' PARAMS leave at least a chunk's AdamW before it
  // (4-13 of 15 landed first here, under two CPU hogs too).
  const auto computed =
      std::find(arrivals.begin(), arrivals.end(), std::make_pair(tr::MsgType::kComputed, uint64_t{1}));
  ASSERT_NE(computed, arrivals.end()) << "no COMPUTED";
  EXPECT_GE(std::count(arrivals.begin(), computed, std::make_pair(tr::MsgType::kParams, uint64_t{1})), 1)
      << "every PARAMS came after the step had finished computing";
  // Cuts: each flush sends what finished since the last one, once a chunk's worth
  // (Hello::chunk_bytes) of outputs waits after one of the node's step chunks, or at the
  // end, in messages of at most chunk_bytes from each piece's start. Sent after the whole
  // step, a span's messages would start at multiples of 512K elements.
  const uint64_t step_chunk = static_cast<uint64_t>(zenflow::engine::InProcessHostOptions{}.chunk_elements);
  const uint64_t per_message = hello.chunk_bytes / 2;
  std::set<std::array<uint64_t, 3>> want;  // span, offset, count
  for (uint64_t sent_to = 0, hi = 0; hi < total;) {
    hi = std::min(total, hi + step_chunk);
    uint64_t waiting = 0;
    for (uint32_t k = 0; k < 3; ++k)
      if (k != 1)
        waiting += std::max(sent_to, std::min(hi, spans[k][0] + spans[k][1])) -
                   std::max(sent_to, std::min(hi, spans[k][0]));
    if (waiting * 2 < hello.chunk_bytes && hi < total) continue;
    for (uint32_t k = 0; k < 3; ++k) {
      if (k == 1) continue;
      const uint64_t b = std::max(sent_to, spans[k][0]), e = std::min(hi, spans[k][0] + spans[k][1]);
      for (uint64_t at = b; at < e; at += per_message)
        want.insert({k, at - spans[k][0], std::min(per_message, e - at)});
    }
    sent_to = hi;
  }
  EXPECT_EQ(messages, want) << "the PARAMS were not cut where the step's chunks finished";
  EXPECT_GT(want.size(), 8u);
  for (uint64_t i = 0; i < total; ++i) {
    const bool has_out = i < spans[1][0] || i >= spans[2][0];
    ASSERT_EQ(times_sent[i], has_out ? 1 : 0)
        << "element " << i << " was sent " << int(times_sent[i]) << " times";
    if (has_out) {
      ASSERT_EQ(got[i], expected[i]) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OptimizerNode, StreamedStep, ::testing::Values("tcp", "sm"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Reads started together (start_read: the engine's boundary apply with one rank and fp32
// weights) all land, waited for in any order, on a node as in-process; a read outside the
// state throws from start_read or its wait, and the reads started before it still land.
TEST(OptimizerNode, StartedReadsLandWhateverOrderTheyAreWaitedIn) {
  using zenflow::engine::HostBuf;
  use_tls("tcp");
  const int64_t n = 5000;
  const zenflow::engine::HostStateLayout l = layout_of(3 * n);
  auto remote_backend =
      zenflow::transport::make_remote_host_optimizer(remote({shared_nodes("tcp")[0]}, "start-read"), l);
  zenflow::engine::InProcessHostOptions in_opts;
  auto local_backend = zenflow::engine::make_in_process_host_optimizer(in_opts, l);
  std::vector<float> init(static_cast<size_t>(3 * n));
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i) * 0.125f - 3.0f;
  for (auto* b : {local_backend.get(), remote_backend.get()}) {
    const std::string which = b == local_backend.get() ? "in-process" : "node";
    b->write(HostBuf::kV, 0, 3 * n, init.data());
    std::vector<std::vector<float>> got(3, std::vector<float>(static_cast<size_t>(n), -1.0f));
    std::vector<std::shared_ptr<zenflow::engine::HostWork>> works;
    for (int64_t k = 0; k < 3; ++k) works.push_back(b->start_read(HostBuf::kV, k * n, n, got[k].data()));
    for (int64_t k = 2; k >= 0; --k) {
      works[k]->wait();
      EXPECT_EQ(got[k], std::vector<float>(init.begin() + k * n, init.begin() + (k + 1) * n))
          << which << " " << k;
    }
    std::vector<float> first(static_cast<size_t>(n), -1.0f), bad(static_cast<size_t>(n));
    auto ok = b->start_read(HostBuf::kV, 0, n, first.data());
    try {
      b->start_read(HostBuf::kV, 2 * n + 1, n, bad.data())->wait();
      FAIL() << which << ": a read past the state was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("[10001, +5000)"), std::string::npos) << which << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("15000"), std::string::npos) << which << ": " << e.what();
    }
    ok->wait();
    EXPECT_EQ(first, std::vector<float>(init.begin(), init.begin() + n)) << which;
  }
}

TEST(OptimizerNode, SlicesCutAtSegmentsAndBalance) {
  zenflow::engine::HostStateLayout l = layout_of(100);
  l.segments = {0, 10, 30, 55, 80};
  EXPECT_EQ(zenflow::transport::slice_bounds(l, 1), (std::vector<int64_t>{0, 100}));
  EXPECT_EQ(zenflow::transport::slice_bounds(l, 2), (std::vector<int64_t>{0, 55, 100}));
  EXPECT_EQ(zenflow::transport::slice_bounds(l, 3), (std::vector<int64_t>{0, 30, 55, 100}));
  l.segments = {0};
  EXPECT_EQ(zenflow::transport::slice_bounds(l, 2), (std::vector<int64_t>{0, 0, 100}));
}

TEST(OptimizerProtocol, RoundTripsAndRejectsBadDescriptors) {
  using namespace zenflow::transport;
  Hello h;
  h.job = "j";
  h.rank = 1;
  h.world = 2;
  h.elements = 1000;
  h.accumulators = 0;
  const std::string hb = encode_hello(h);
  const Hello back = decode_hello(hb.data(), hb.size());
  EXPECT_EQ(back.job, "j");
  EXPECT_EQ(back.rank, 1u);
  EXPECT_EQ(back.elements, 1000u);
  EXPECT_EQ(back.accumulators, 0u);
  h.accumulators = 2;
  const std::string bad_acc = encode_hello(h);
  EXPECT_THROW(decode_hello(bad_acc.data(), bad_acc.size()), WireError);
  h.accumulators = 1;
  for (size_t cut = 0; cut < hb.size(); ++cut) EXPECT_THROW(decode_hello(hb.data(), cut), WireError) << cut;
  h.rank = 2;
  const std::string bad_rank = encode_hello(h);
  EXPECT_THROW(decode_hello(bad_rank.data(), bad_rank.size()), WireError);

  OpDesc d;
  d.spans.push_back({10, 20, 1, 1, {}});
  d.spans.push_back({40, 5, kGradNone, 0, {}});
  const std::string op = encode_op(d, true);
  const OpDesc od = decode_op(op.data(), op.size(), true, 100);
  ASSERT_EQ(od.spans.size(), 2u);
  EXPECT_EQ(od.spans[0].offset, 10u);
  EXPECT_EQ(od.spans[1].grad_type, kGradNone);
  try {
    decode_op(op.data(), op.size(), true, 44);
    FAIL();
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("[40, +5) outside the session's 44 elements"), std::string::npos) << e.what();
  }
  const std::string acc = encode_op(d, false);
  EXPECT_THROW(decode_op(acc.data(), acc.size(), false, 100), WireError) << "an accumulate span needs a gradient";
  // Output kinds: fp32 master copies (4 bytes) are one step's outputs, or bf16 (2); never
  // both, and no kind past kOutMaster.
  OpDesc masters;
  masters.spans.push_back({10, 20, 1, kOutMaster, {}});
  masters.spans.push_back({40, 5, kGradNone, kOutNone, {}});
  masters.spans.push_back({60, 5, 1, kOutMaster, {}});
  const std::string mo = encode_op(masters, true);
  const OpDesc mback = decode_op(mo.data(), mo.size(), true, 100);
  EXPECT_EQ(mback.spans[0].out_kind, kOutMaster);
  EXPECT_EQ(mback.spans[1].out_kind, kOutNone);
  EXPECT_EQ(out_kind_bytes(kOutMaster), 4u);
  EXPECT_EQ(out_kind_bytes(1), 2u);
  EXPECT_EQ(out_kind_bytes(kOutNone), 0u);
  EXPECT_THROW(out_kind_bytes(kOutMaster + 1), WireError);
  masters.spans[2].out_kind = 1;  // bf16
  const std::string mixed = encode_op(masters, true);
  try {
    decode_op(mixed.data(), mixed.size(), true, 100);
    FAIL() << "a step with fp32 and bf16 outputs was accepted";
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("outputs of 4 and 2 bytes in one step"), std::string::npos)
        << e.what();
  }
  masters.spans[2].out_kind = kOutMaster + 1;
  const std::string unknown = encode_op(masters, true);
  try {
    decode_op(unknown.data(), unknown.size(), true, 100);
    FAIL() << "output kind 4 was accepted";
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("output kind 4"), std::string::npos) << e.what();
  }

  StateDesc s;
  s.columns = 1;
  s.offset = 8;
  s.rows = 3;
  s.width = 4;
  s.cols = {0, 3};
  s.n = 6;
  const std::string sb = encode_state(s);
  EXPECT_EQ(decode_state(sb.data(), sb.size(), 20).cols, (std::vector<int64_t>{0, 3}));
  EXPECT_THROW(decode_state(sb.data(), sb.size(), 19), WireError);  // 8 + 12 > 19
  s.cols = {4};
  s.n = 3;
  const std::string col_out = encode_state(s);
  EXPECT_THROW(decode_state(col_out.data(), col_out.size(), 100), WireError);
  // A re-pack of the [3, 4] matrix at 8 into [3, 5], with 2 appended columns (n = 3 x 2).
  StateDesc rp;
  rp.columns = 2;
  rp.offset = 8;
  rp.rows = 3;
  rp.width = 4;
  rp.cols = {5, 0, 3, 4, 1};
  rp.n = 6;
  const std::string rpb = encode_state(rp);
  EXPECT_EQ(decode_state(rpb.data(), rpb.size(), 23).cols, rp.cols);  // 8 + 3 x 5 = 23
  auto repack_error = [&](StateDesc bad, uint64_t elements) {
    const std::string b = encode_state(bad);
    try {
      decode_state(b.data(), b.size(), elements);
    } catch (const WireError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(repack_error(rp, 22).find("re-packed matrix [8, +15) outside"), std::string::npos)
      << repack_error(rp, 22);
  StateDesc wide = rp;
  wide.cols = {6, 0};
  EXPECT_NE(repack_error(wide, 100).find("column 6 outside a matrix 6 wide"), std::string::npos);
  StateDesc ragged = rp;
  ragged.n = 7;
  EXPECT_NE(repack_error(ragged, 100).find("not a multiple of the 3 rows"), std::string::npos);
  StateDesc many = rp;
  many.n = 18;  // 6 appended columns for 5 re-packed ones
  EXPECT_NE(repack_error(many, 100).find("6 appended columns for 5"), std::string::npos);
  StateDesc mode3 = rp;
  mode3.columns = 3;
  EXPECT_NE(repack_error(mode3, 100).find("mode 3"), std::string::npos);
  // libFuzzer's find (CI, fuzz_optimizer_protocol): a column read of a matrix with 0 rows and
  // a width past 2^63 took column 2^63 + 5, a negative int64_t index, as inside it.
  StateDesc unbounded;
  unbounded.columns = 1;
  unbounded.offset = 1408;
  unbounded.rows = 0;
  unbounded.width = (uint64_t{1} << 63) + 16;
  unbounded.cols = {static_cast<int64_t>((uint64_t{1} << 63) + 5)};
  unbounded.n = 0;
  EXPECT_NE(repack_error(unbounded, 4096).find("column 9223372036854775813 outside a matrix"), std::string::npos)
      << repack_error(unbounded, 4096);
  StateDesc unbounded_range = unbounded;
  unbounded_range.columns = 0;
  EXPECT_NE(repack_error(unbounded_range, 4096).find("column 9223372036854775813 outside a matrix"),
            std::string::npos)
      << repack_error(unbounded_range, 4096);

  // Fuzz: random mutations of valid payloads never crash and never pass out-of-range spans.
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int i = 0; i < 100000; ++i) {
    std::string m = (i % 3 == 0) ? hb : (i % 3 == 1 ? op : (i % 2 == 0 ? sb : rpb));
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) m[rng() % m.size()] = static_cast<char>(rng());
    if (rng() % 5 == 0) m.resize(rng() % (m.size() + 1));
    try {
      if (i % 3 == 0) {
        decode_hello(m.data(), m.size());
      } else if (i % 3 == 1) {
        for (const OpSpan& sp : decode_op(m.data(), m.size(), true, 100).spans) ASSERT_LE(sp.offset + sp.n, 100u);
      } else {
        const StateDesc st = decode_state(m.data(), m.size(), 100);
        ASSERT_LE(st.offset + (st.columns ? st.rows * st.width : st.n), 100u);
        if (st.columns == 2) {
          ASSERT_LE(st.offset + st.rows * st.cols.size(), 100u);
        }
      }
      ++accepted;
    } catch (const WireError&) {
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace

namespace {

// `zenflow run examples/tiny.yaml --quiet` with checkpoints in `ck`, then `sets` (--set each).
std::vector<std::string> tiny_run(const std::string& ck, const std::vector<std::string>& sets,
                                  const std::vector<std::string>& flags = {}) {
  std::vector<std::string> args = {std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow", "run",
                                   std::string(ZENFLOW_SOURCE_DIR) + "/examples/tiny.yaml", "--quiet"};
  args.insert(args.end(), flags.begin(), flags.end());
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  args.push_back("--set");
  args.push_back("checkpoint.dir=" + ck);
  return args;
}

// The same run's host optimizer on `node`.
std::vector<std::string> on_node(std::vector<std::string> args, const std::string& address) {
  for (const std::string& s :
       {"optimizer.host.addresses=[" + address + "]", "optimizer.host.token_file=" + (temp_dir() / "token").string()}) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

// `zenflow bench offload --vs-node` at a small size: it starts its own node on the host
// optimizer's core, runs the alternating in-process/node pairs it is asked for, every final
// loss identical, and reports what each kept on the worker and sent per step.
TEST(OptimizerNodeRun, BenchOffloadAgainstANodeRunsItsPairsWithIdenticalLosses) {
  const fs::path dir = temp_dir() / "bench-vs-node";
  fs::create_directories(dir);
  Process bench({std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow", "bench", "offload", "--preset", "small-batch",
                 "--modes", "zenflow", "--steps", "6", "--set", "model.config.hidden_size=128", "--set",
                 "model.config.intermediate_size=344", "--set", "train.dtype=bfloat16", "--vs-node", "tcp",
                 "--node-pairs", "2", "--json"},
                dir / "bench.log");
  ASSERT_EQ(bench.wait_exit(std::chrono::seconds(300)), 0) << bench.output();
  std::istringstream lines(bench.output());
  nlohmann::json vs;
  int in_process_runs = 0, node_runs = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;  // progress on stderr
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("vs_node") && j.value("mode", "") == "zenflow") vs = j["vs_node"];  // not the comparison's
    if (j.contains("host_backend")) ++(j["host_backend"] == "in-process" ? in_process_runs : node_runs);
  }
  ASSERT_TRUE(vs.is_object()) << bench.output();
  EXPECT_EQ(in_process_runs, 2);
  EXPECT_EQ(node_runs, 2);
  EXPECT_EQ(vs["pairs"], 2);
  EXPECT_EQ(vs["ucx_tls"], "tcp");
  for (const char* side : {"in_process", "node"}) {
    ASSERT_EQ(vs["step_seconds_median"][side].size(), 2u) << side;
    for (const auto& t : vs["step_seconds_median"][side]) EXPECT_GT(t.get<double>(), 0.0) << side;
  }
  EXPECT_EQ(vs["added_step_time_per_pair"].size(), 2u);
  EXPECT_TRUE(vs["same_final_loss"].get<bool>()) << vs.dump();
  // In-process: master, m, v and two accumulators (20 B per element) and 12 B of staging; the
  // worker keeps only the 2 B bf16 output buffer with a node.
  const int64_t local = vs["host_state_bytes"]["in_process"], remote = vs["host_state_bytes"]["node"];
  EXPECT_GT(remote, 0);
  EXPECT_EQ(local, 16 * remote) << vs.dump();
  EXPECT_GT(vs["network_bytes_per_step"]["sent"].get<double>(), 0.0);
  const std::vector<int> cores = zenflow::engine::available_cores();
  EXPECT_EQ(vs["node_cores"], nlohmann::json(std::vector<int>{cores.back()}));
}

// `zenflow run` with a node that is SIGKILLed after the step-8 checkpoint: the run names
// the node, resumes from that checkpoint in-process (on_node_loss) and ends with exactly
// the weights of a run that never used a node.
TEST(OptimizerNodeRun, LostNodeResumesInProcessFromTheLastCheckpointExactly) {
  use_tls("tcp");
  Node node("tcp", "run-kill");
  const fs::path dir = temp_dir() / "run-kill";
  fs::remove_all(dir);
  auto run_args = [&](const std::string& ck) {
    return tiny_run(ck, {"train.steps=24", "checkpoint.every_steps=8"});
  };
  const std::vector<std::string> remote_args = on_node(run_args((dir / "remote").string()), node.address());
  fs::create_directories(dir);
  Process run(remote_args, dir / "remote.log");
  ASSERT_TRUE(wait_until([&] { return fs::exists(dir / "remote" / "step-00000008"); }, std::chrono::seconds(120)))
      << run.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // into the next window
  node.process().kill(SIGKILL);
  ASSERT_EQ(run.wait_exit(std::chrono::seconds(180)), 0) << run.output();
  const std::string log = run.output();
  EXPECT_NE(log.find("optimizer node " + node.address() + " lost"), std::string::npos) << log;
  EXPECT_NE(log.find("resuming from the last committed checkpoint with the host optimizer in this process"),
            std::string::npos)
      << log;

  Process reference(run_args((dir / "local").string()), dir / "local.log");
  ASSERT_EQ(reference.wait_exit(std::chrono::seconds(180)), 0) << reference.output();
  const std::string a = zenflow::test_support::read_file(dir / "local" / "step-00000024" / "model.safetensors");
  const std::string b = zenflow::test_support::read_file(dir / "remote" / "step-00000024" / "model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the resumed run's final weights differ from the reference's";
}

// An optimizer node named in the spec that cannot be reached when the run starts (a wrong
// address, a transport the node does not serve) is the spec's error: exit 2 naming
// optimizer.host.addresses and the transport's reason. Before, the run took it for a lost
// node and silently trained in-process (on_node_loss), hiding the mistake.
TEST(OptimizerNodeRun, ANodeUnreachableAtStartIsASpecErrorNamingTheKey) {
  use_tls("tcp");
  std::string address;
  {
    Node node("tcp", "unreachable");
    address = node.address();
    node.process().kill(SIGKILL);
    node.process().wait_exit(std::chrono::seconds(20));
  }  // nothing listens on its port now
  const fs::path dir = temp_dir() / "unreachable";
  fs::remove_all(dir);
  fs::create_directories(dir);
  Process run(on_node(tiny_run((dir / "ck").string(), {"train.steps=12"}), address), dir / "run.log");
  EXPECT_EQ(run.wait_exit(std::chrono::seconds(120)), 2) << run.output();
  const std::string log = run.output();
  EXPECT_NE(log.find("optimizer.host.addresses: optimizer node " + address), std::string::npos) << log;
  EXPECT_NE(log.find("cannot connect"), std::string::npos) << log;
  EXPECT_EQ(log.find("in this process"), std::string::npos) << "it fell back in-process: " << log;
}

// A worker that is itself paused (SIGSTOP of the whole run for longer than the 5 s loss
// deadline, as a VM freeze or a debugger would) does not blame its node for the silence
// it could not hear: the run goes on with the same node and ends with exactly the weights
// of a run that never used one.
TEST(OptimizerNodeRun, PausedWorkerDoesNotBlameItsNodeForTheSilence) {
  use_tls("tcp");
  Node node("tcp", "run-pause");
  const fs::path dir = temp_dir() / "run-pause";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto run_args = [&](const std::string& ck) {
    return tiny_run(ck, {"train.steps=24", "checkpoint.every_steps=8"});
  };
  Process run(on_node(run_args((dir / "remote").string()), node.address()), dir / "remote.log");
  ASSERT_TRUE(wait_until([&] { return fs::exists(dir / "remote" / "step-00000008"); }, std::chrono::seconds(120)))
      << run.output();
  run.kill(SIGSTOP);  // the run's process group: every thread, the watchdog's included
  std::this_thread::sleep_for(std::chrono::seconds(7));
  run.kill(SIGCONT);
  ASSERT_EQ(run.wait_exit(std::chrono::seconds(180)), 0) << run.output();
  const std::string log = run.output();
  EXPECT_EQ(log.find("lost"), std::string::npos) << log;
  EXPECT_TRUE(node.process().running()) << node.process().output();

  Process reference(run_args((dir / "local").string()), dir / "local.log");
  ASSERT_EQ(reference.wait_exit(std::chrono::seconds(180)), 0) << reference.output();
  const std::string a = zenflow::test_support::read_file(dir / "local" / "step-00000024" / "model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == zenflow::test_support::read_file(dir / "remote" / "step-00000024" / "model.safetensors"))
      << "the paused run's final weights differ from the reference's\n"
      << log;
}

// Seeded kill points (zenflow-optimizer --die-at KIND:N SIGKILLs the node at the N-th
// event): mid-gradient stream, mid-window step, mid-save (a checkpoint streaming the
// state: the checkpoint is never committed half-written) and between windows. At every
// point the run names the node, resumes in-process from its last committed checkpoint
// (on_node_loss) and ends with exactly the weights of a run that never used a node.
TEST(OptimizerNodeRun, SeededKillPointsNeverLoseAStepBeyondTheLastCheckpoint) {
  use_tls("tcp");
  const fs::path dir = temp_dir() / "kill-points";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto run_args = [&](const std::string& ck) {
    return tiny_run(ck, {"train.steps=16", "checkpoint.every_steps=4", "checkpoint.keep=10"});
  };
  Process reference(run_args((dir / "local").string()), dir / "local.log");
  ASSERT_EQ(reference.wait_exit(std::chrono::seconds(180)), 0) << reference.output();
  const std::string want = zenflow::test_support::read_file(dir / "local" / "step-00000016" / "model.safetensors");
  ASSERT_FALSE(want.empty());

  // 10 distinct points: the kind, and N drawn by a seeded generator from the events a
  // 16-step run has (4 windows, 4 checkpoints, dozens of gradient chunks).
  std::mt19937 rng(20261201);
  std::vector<std::pair<std::string, int64_t>> points;
  auto draw = [&](const std::string& kind, int64_t lo, int64_t hi, size_t k) {
    std::vector<int64_t> all;
    for (int64_t v = lo; v <= hi; ++v) all.push_back(v);
    std::shuffle(all.begin(), all.end(), rng);
    for (size_t i = 0; i < k; ++i) points.emplace_back(kind, all[i]);
  };
  draw("grad", 2, 40, 3);
  draw("step", 1, 3, 3);
  draw("save", 1, 8, 2);
  draw("between", 1, 3, 2);
  int n = 0;
  for (const auto& [kind, at] : points) {
    const std::string tag = kind + "-" + std::to_string(at) + "-" + std::to_string(n++);
    SCOPED_TRACE("--die-at " + kind + ":" + std::to_string(at));
    Node node("tcp", tag, {"--die-at", kind + ":" + std::to_string(at)});
    Process run(on_node(run_args((dir / tag).string()), node.address()), dir / (tag + ".log"));
    ASSERT_EQ(run.wait_exit(std::chrono::seconds(180)), 0) << run.output();
    ASSERT_TRUE(wait_until([&] { return !node.process().running(); }, std::chrono::seconds(10)))
        << "the node did not die at its point: " << node.process().output();
    const std::string log = run.output();
    EXPECT_NE(node.process().output().find("--die-at " + kind + ":" + std::to_string(at) + " reached"),
              std::string::npos)
        << node.process().output();
    EXPECT_NE(log.find("optimizer node " + node.address() + " lost"), std::string::npos) << log;
    EXPECT_NE(log.find("resuming from the last committed checkpoint with the host optimizer in this process"),
              std::string::npos)
        << log;
    // Every checkpoint on disk is whole (a kill mid-save commits nothing), and the final
    // weights are the reference's.
    for (const auto& [step, path] : zenflow::list_checkpoints((dir / tag).string()))
      EXPECT_TRUE(fs::exists(fs::path(path) / "model.safetensors")) << path;
    EXPECT_TRUE(zenflow::test_support::read_file(dir / tag / "step-00000016" / "model.safetensors") == want)
        << "the resumed run's final weights differ from the reference's\n"
        << log;
  }
}

// Data-parallel ranks (--nproc 2) that lose their node all resume in-process: they join
// the rendezvous again under a new generation of keys, and end bit-identical to a 2-rank
// run that never used a node.
TEST(OptimizerNodeRun, DataParallelRanksThatLoseTheirNodeResumeTogetherExactly) {
  use_tls("tcp");
  const fs::path dir = temp_dir() / "dp-kill";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto run_args = [&](const std::string& ck) {
    return tiny_run(ck, {"train.steps=16", "checkpoint.every_steps=4"}, {"--nproc", "2"});
  };
  Node node("tcp", "dp-kill", {"--die-at", "step:2"});
  Process run(on_node(run_args((dir / "remote").string()), node.address()), dir / "remote.log");
  ASSERT_EQ(run.wait_exit(std::chrono::seconds(240)), 0) << run.output();
  EXPECT_FALSE(node.process().running());
  EXPECT_NE(run.output().find("resuming from the last committed checkpoint with the host optimizer in this process"),
            std::string::npos)
      << run.output();
  Process reference(run_args((dir / "local").string()), dir / "local.log");
  ASSERT_EQ(reference.wait_exit(std::chrono::seconds(240)), 0) << reference.output();
  const std::string a = zenflow::test_support::read_file(dir / "local" / "step-00000016" / "model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == zenflow::test_support::read_file(dir / "remote" / "step-00000016" / "model.safetensors"))
      << "the resumed ranks' final weights differ from the reference's\n"
      << run.output();
}

}  // namespace
