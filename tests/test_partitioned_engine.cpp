// The engine with a data-parallel group (ZeRO-2 partitioned host optimizer, all-reduced
// selection), ranks as threads of this process: on CPU Gloo, and (the equivalence and
// re-shard cases) with in-process collectives on the test device, so that a GPU host
// without Gloo runs the partitioned CUDA path on one GPU.
//
//  * Ranks fed the same gradient must reproduce a single rank fed that gradient (the
//    mean over ranks is then that gradient), for every mode, window length, overlap,
//    selection strategy and top-k ratio below, step by step — which pins the
//    reduce-scatter layout, the shard-wise host updates, the all-gather, migration of
//    columns between ranks on re-selection and the global-norm clipping.
//  * Ranks fed different gradients stay bitwise identical to each other.
//  * Selection uses every rank's scores (crafted gradients whose local top-k differ).
//  * Each rank holds about 1/W of the host state; the ranks' columns partition the
//    host-owned ones.
//  * Engine state re-shards 2 -> 1 and 1 -> 2 ranks and continues exactly.
//  * A non-finite gradient on one rank skips the step on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tests/support/ranks.h"
#include "tests/support/test_device.h"
#include "tests/support/thread_collectives.h"
#include "worker/distributed/engine_collectives.h"
#include "worker/engine/zenflow_optimizer.h"

namespace {

using zenflow::engine::EngineOptions;
using zenflow::engine::OptimizerMode;
using zenflow::engine::ParamSpec;
using zenflow::engine::SelectStrategy;
using zenflow::engine::ZenFlowOptimizer;
using zenflow::test_support::run_ranks;
using zenflow::test_support::run_thread_ranks;
using State = std::vector<std::pair<std::string, at::Tensor>>;

struct Shape {
  const char* name;
  int64_t out, in;  // in == 0: 1-D of `out` elements
};
const Shape kShapes[] = {{"w1", 16, 48}, {"w2", 24, 30}, {"bias", 16, 0}, {"tiny", 8, 9}};

// The in-process tests' device (test_device(): CUDA under ZENFLOW_TEST_DEVICE=cuda, ranks
// as threads on one GPU); the Gloo tests stay on the CPU.
using zenflow::test_support::test_device;

std::vector<at::Tensor> make_params(at::ScalarType dtype = at::kFloat, at::Device device = at::kCPU) {
  std::vector<at::Tensor> ps;
  for (const Shape& s : kShapes) {
    at::Tensor t =
        s.in ? at::arange(s.out * s.in, at::kFloat).view({s.out, s.in}) : at::arange(s.out, at::kFloat);
    t = (t * 0.37).sin() * 0.5;
    ps.push_back(t.to(dtype).to(device).contiguous().set_requires_grad(true));
  }
  return ps;
}

std::vector<at::Tensor> clone_params(const std::vector<at::Tensor>& from, at::Device device = at::kCPU) {
  std::vector<at::Tensor> ps;
  for (auto& p : from) ps.push_back(p.detach().to(device).clone().set_requires_grad(true));
  return ps;
}

// A deterministic gradient whose important columns move every few steps (so the auto
// and step strategies re-select). `variant` makes ranks differ.
at::Tensor grad_for(const Shape& s, int64_t step, int variant) {
  const int64_t cols = s.in ? s.in : 1;
  at::Tensor i = at::arange(s.out, at::kFloat).view({s.out, 1});
  at::Tensor j = at::arange(cols, at::kFloat).view({1, cols});
  at::Tensor g = (i * 1.3 + j * 0.71 + static_cast<double>(step) * 0.37 + variant * 2.1).sin();
  at::Tensor hot = (j.remainder(7) == static_cast<double>((step / 4 + variant) % 7)).to(at::kFloat);
  g = g * (1.0 + 4.0 * hot) * 0.1;
  return s.in ? g.contiguous() : g.view({s.out}).contiguous();
}

void set_grads(const std::vector<at::Tensor>& ps, int64_t step, int variant) {
  for (size_t k = 0; k < ps.size(); ++k)
    ps[k].mutable_grad() = grad_for(kShapes[k], step, variant).to(ps[k].device(), ps[k].scalar_type());
}

std::unique_ptr<ZenFlowOptimizer> make_opt(const std::vector<at::Tensor>& ps, const EngineOptions& o,
                                           zenflow::engine::Collectives* coll = nullptr) {
  std::vector<ParamSpec> specs;
  for (size_t k = 0; k < ps.size(); ++k) {
    ParamSpec p;
    p.name = kShapes[k].name;
    p.param = ps[k];
    p.weight_decay = kShapes[k].in > 0;
    p.weight_decay_value = 0.01;
    specs.push_back(p);
  }
  return std::make_unique<ZenFlowOptimizer>(specs, o, nullptr, coll);
}

EngineOptions base_options() {
  EngineOptions o;
  o.min_split_numel = 64;
  o.host_threads = 1;
  o.huge_pages = false;
  return o;
}

std::vector<at::Tensor> snapshot(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (auto& p : ps) out.push_back(p.detach().to(at::kCPU).clone());
  return out;
}

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).norm().item<double>() / std::max(1e-12, y.norm().item<double>());
}

void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double tol,
                  const std::string& where) {
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_LE(rel_err(got[k], want[k]), tol) << where << " " << kShapes[k].name;
}

void expect_bitwise(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                    const std::string& where) {
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(at::equal(a[k], b[k])) << where << " " << kShapes[k].name;
}

// What the trainer's GradReducer does for the parameters the engine does not split.
void average_dense_grads(zenflow::distributed::Communicator& comm, ZenFlowOptimizer& opt,
                         const std::vector<at::Tensor>& ps) {
  for (size_t k = 0; k < ps.size(); ++k)
    if (!opt.is_split(kShapes[k].name)) comm.allreduce_mean_(ps[k].mutable_grad());
}

// Steps [first, last) on one rank, each rank's gradient of variant `variant`.
void dp_steps(zenflow::distributed::Communicator& comm, ZenFlowOptimizer& opt,
              const std::vector<at::Tensor>& ps, int64_t first, int64_t last, int variant) {
  for (int64_t s = first; s < last; ++s) {
    set_grads(ps, s, variant);
    average_dense_grads(comm, opt, ps);
    opt.step({1e-2, 0});
  }
}

// One rank's trajectory: weights after every step (and after finish(), last).
using Trajectory = std::vector<std::vector<at::Tensor>>;

Trajectory run_single(const EngineOptions& o, int64_t steps, int variant, at::ScalarType dtype = at::kFloat,
                      at::Device device = at::kCPU) {
  auto ps = make_params(dtype, device);
  auto opt = make_opt(ps, o);
  Trajectory t;
  for (int64_t s = 0; s < steps; ++s) {
    set_grads(ps, s, variant);
    opt->step({1e-2, 0});
    t.push_back(snapshot(ps));
  }
  opt->finish();
  t.push_back(snapshot(ps));
  return t;
}

// One rank's trajectory in a group; `average` averages a gradient the engine does not split.
Trajectory rank_trajectory(zenflow::engine::Collectives& coll, const EngineOptions& o, int64_t steps, int variant,
                           at::ScalarType dtype, at::Device device, const std::function<void(at::Tensor&)>& average) {
  auto ps = make_params(dtype, device);
  auto opt = make_opt(ps, o, &coll);
  EXPECT_EQ(opt->world_size(), coll.world_size());
  Trajectory t;
  for (int64_t s = 0; s < steps; ++s) {
    set_grads(ps, s, variant);
    for (size_t k = 0; k < ps.size(); ++k)
      if (!opt->is_split(kShapes[k].name)) average(ps[k].mutable_grad());
    opt->step({1e-2, 0});
    t.push_back(snapshot(ps));
  }
  opt->finish();
  t.push_back(snapshot(ps));
  return t;
}

// Gloo ranks on the CPU; `variant_of_rank(r)`: which gradient rank r sees.
std::vector<Trajectory> run_ranks_engine(int world, const EngineOptions& o, int64_t steps,
                                         const std::function<int(int)>& variant_of_rank,
                                         at::ScalarType dtype = at::kFloat) {
  std::vector<Trajectory> out(static_cast<size_t>(world));
  run_ranks(world, [&](zenflow::distributed::Communicator& comm) {
    zenflow::distributed::EngineCollectives coll(comm);
    out[static_cast<size_t>(comm.rank())] =
        rank_trajectory(coll, o, steps, variant_of_rank(comm.rank()), dtype, at::kCPU,
                        [&](at::Tensor& g) { comm.allreduce_mean_(g); });
  });
  return out;
}

// Ranks as threads on `device` with in-process collectives, every rank fed variant 0.
std::vector<Trajectory> run_thread_ranks_engine(int world, const EngineOptions& o, int64_t steps,
                                                at::ScalarType dtype, at::Device device) {
  std::vector<Trajectory> out(static_cast<size_t>(world));
  run_thread_ranks(world, [&](zenflow::test_support::ThreadCollectives& coll, int rank) {
    out[static_cast<size_t>(rank)] =
        rank_trajectory(coll, o, steps, 0, dtype, device, [&](at::Tensor& g) { coll.allreduce_mean_(g); });
  });
  return out;
}

struct Case {
  const char* name;
  OptimizerMode mode;
  double r;
  int64_t U;
  bool overlap;
  SelectStrategy strategy;
  int64_t S;
  double clip;
  at::ScalarType dtype = at::kFloat;
};

class SameGradientsOnEveryRank : public ::testing::TestWithParam<Case> {};

EngineOptions case_options(const Case& c) {
  EngineOptions o = base_options();
  o.mode = c.mode;
  o.topk_ratio = c.r;
  o.update_interval = c.U;
  o.overlap_step = c.overlap;
  o.select_strategy = c.strategy;
  o.select_interval = c.S;
  o.grad_clip = c.clip;
  return o;
}

void expect_two_ranks_reproduce_one(const Trajectory& one, const std::vector<Trajectory>& two) {
  ASSERT_EQ(two[0].size(), one.size());
  ASSERT_EQ(two[1].size(), one.size());
  for (size_t s = 0; s < one.size(); ++s) {
    const std::string where = "step " + std::to_string(s + 1);
    expect_close(two[0][s], one[s], 1e-6, where);
    expect_bitwise(two[0][s], two[1][s], where + " rank 1 vs rank 0");
  }
}

TEST_P(SameGradientsOnEveryRank, TwoRanksReproduceOneRankStepByStep) {
  REQUIRE_GLOO();
  const Case c = GetParam();
  const EngineOptions o = case_options(c);
  const int64_t steps = 14;
  expect_two_ranks_reproduce_one(run_single(o, steps, 0, c.dtype),
                                 run_ranks_engine(2, o, steps, [](int) { return 0; }, c.dtype));
}

// The same with ranks as threads on the test device (in-process collectives): on a GPU
// host, the partitioned engine's CUDA path (reduce-scattered staging, the all-gather of
// the host results, re-selection moves between ranks) on one GPU.
TEST_P(SameGradientsOnEveryRank, TwoThreadRanksOnTheTestDeviceReproduceOneRank) {
  const Case c = GetParam();
  const EngineOptions o = case_options(c);
  const int64_t steps = 14;
  const at::Device device = test_device();
  expect_two_ranks_reproduce_one(run_single(o, steps, 0, c.dtype, device),
                                 run_thread_ranks_engine(2, o, steps, c.dtype, device));
}

INSTANTIATE_TEST_SUITE_P(
    Engine, SameGradientsOnEveryRank,
    ::testing::Values(
        Case{"zenflow_U1_sync", OptimizerMode::kZenFlow, 0.25, 1, false, SelectStrategy::kStep, 1, 1.0},
        Case{"zenflow_U3_overlap_step", OptimizerMode::kZenFlow, 0.25, 3, true, SelectStrategy::kStep, 6,
             0.0},
        Case{"zenflow_U2_sync_step", OptimizerMode::kZenFlow, 0.2, 2, false, SelectStrategy::kStep, 2, 0.0},
        Case{"zenflow_U4_overlap_auto", OptimizerMode::kZenFlow, 0.1, 4, true, SelectStrategy::kAuto, 0, 0.0},
        Case{"zenflow_all_host", OptimizerMode::kZenFlow, 0.0, 2, true, SelectStrategy::kStep, 2, 1.0},
        Case{"zenflow_all_device", OptimizerMode::kZenFlow, 1.0, 2, true, SelectStrategy::kStep, 2, 1.0},
        Case{"offload", OptimizerMode::kOffload, 0.0, 1, false, SelectStrategy::kAuto, 0, 1.0},
        // bf16 weights: the host step's low-precision output is what the ranks all-gather
        // (and what a re-selection with a step in flight must fix or re-pack).
        Case{"zenflow_U3_overlap_step_bf16", OptimizerMode::kZenFlow, 0.25, 3, true, SelectStrategy::kStep, 3, 0.0,
             at::kBFloat16},
        Case{"zenflow_U2_overlap_auto_bf16", OptimizerMode::kZenFlow, 0.1, 2, true, SelectStrategy::kAuto, 0, 1.0,
             at::kBFloat16}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(PartitionedEngine, DifferentGradientsKeepRanksBitwiseIdentical) {
  REQUIRE_GLOO();
  EngineOptions o = base_options();
  o.topk_ratio = 0.1;
  o.update_interval = 4;
  o.overlap_step = true;
  o.grad_clip = 1.0;
  const auto t = run_ranks_engine(3, o, 13, [](int r) { return r; });
  for (size_t s = 0; s < t[0].size(); ++s) {
    expect_bitwise(t[1][s], t[0][s], "step " + std::to_string(s + 1) + " rank 1");
    expect_bitwise(t[2][s], t[0][s], "step " + std::to_string(s + 1) + " rank 2");
  }
  // The weights moved (the comparison above is not vacuous).
  EXPECT_GT(rel_err(t[0].back()[0], make_params()[0].detach()), 1e-3);
}

// Column scores are summed over ranks before top-k: rank 0's gradient favours columns
// A = {0..5} and rank 1's B = {20..25} (local top-6 each), but both put mass on
// C = {10..15}, which wins only in the sum: 2 * 8 * 2.5^2 = 100 > 8 * 3^2 = 72.
TEST(PartitionedEngine, SelectionUsesEveryRanksScores) {
  REQUIRE_GLOO();
  EngineOptions o = base_options();
  o.topk_ratio = 0.125;  // k = 6 of 48 columns
  o.full_warm_up_rounds = 0;
  o.update_interval = 1;
  o.overlap_step = false;
  std::vector<std::vector<int64_t>> chosen(2);
  run_ranks(2, [&](zenflow::distributed::Communicator& comm) {
    zenflow::distributed::EngineCollectives coll(comm);
    auto ps = make_params();
    auto opt = make_opt(ps, o, &coll);
    set_grads(ps, 0, 0);
    at::Tensor g = at::zeros({16, 48});
    const int64_t own = comm.rank() == 0 ? 0 : 20;
    g.narrow(1, own, 6).fill_(3.0);
    g.narrow(1, 10, 6).fill_(2.5);
    ps[0].mutable_grad() = g;
    // Locally, this rank alone would pick its own block.
    const at::Tensor local_top = std::get<1>(at::topk(g.pow(2).sum(0), 6));
    EXPECT_EQ(local_top.min().item<int64_t>(), own);
    opt->step({1e-2, 0});
    chosen[static_cast<size_t>(comm.rank())] = opt->selected_columns("w1");
  });
  const std::vector<int64_t> c = {10, 11, 12, 13, 14, 15};
  EXPECT_EQ(chosen[0], c);
  EXPECT_EQ(chosen[1], c);
}

TEST(PartitionedEngine, EachRankHoldsItsShareOfTheHostState) {
  REQUIRE_GLOO();
  EngineOptions o = base_options();
  o.topk_ratio = 0.25;
  o.update_interval = 2;
  auto single_ps = make_params();
  const int64_t single = make_opt(single_ps, o)->host_state_bytes();
  std::vector<int64_t> bytes(2);
  std::vector<std::vector<std::vector<int64_t>>> owned(2);  // rank -> matrix -> columns
  std::vector<std::vector<std::vector<int64_t>>> selected(2);
  run_ranks(2, [&](zenflow::distributed::Communicator& comm) {
    zenflow::distributed::EngineCollectives coll(comm);
    auto ps = make_params();
    auto opt = make_opt(ps, o, &coll);
    dp_steps(comm, *opt, ps, 0, 5, comm.rank());
    const size_t r = static_cast<size_t>(comm.rank());
    bytes[r] = opt->host_state_bytes();
    for (const char* n : {"w1", "w2", "tiny"}) {
      EXPECT_TRUE(opt->is_split(n)) << n;
      owned[r].push_back(opt->owned_host_columns(n));
      selected[r].push_back(opt->selected_columns(n));
    }
  });
  // master, m, v, two accumulators, staging: all 1/W, plus one packed send buffer.
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(static_cast<double>(bytes[r]), 0.56 * static_cast<double>(single)) << "rank " << r;
    EXPECT_GE(static_cast<double>(bytes[r]), 0.45 * static_cast<double>(single)) << "rank " << r;
  }
  const int64_t in[3] = {48, 30, 9};
  for (size_t m = 0; m < 3; ++m) {
    EXPECT_EQ(selected[0][m], selected[1][m]);
    std::set<int64_t> all(selected[0][m].begin(), selected[0][m].end());
    size_t count = selected[0][m].size();
    for (int r = 0; r < 2; ++r) {
      for (int64_t c : owned[static_cast<size_t>(r)][m]) all.insert(c);
      count += owned[static_cast<size_t>(r)][m].size();
    }
    EXPECT_EQ(count, static_cast<size_t>(in[m])) << "matrix " << m << ": a column is held twice";
    EXPECT_EQ(all.size(), static_cast<size_t>(in[m])) << "matrix " << m << ": a column is held nowhere";
  }
  // w1's 48 columns split 24/24 by range: each rank owns host columns only from its half.
  for (int64_t c : owned[0][0]) EXPECT_LT(c, 24);
  for (int64_t c : owned[1][0]) EXPECT_GE(c, 24);
}

// Runs `first` steps on `from` ranks, re-shards the state onto `to` ranks and finishes
// `total` steps there; every rank sees the same gradient, so the result must match one
// uninterrupted rank.
// fn(collectives, rank) on `world` ranks: one rank alone (no collectives), rank threads
// with in-process collectives, or rank threads on Gloo.
void run_group(int world, bool thread_ranks, const std::function<void(zenflow::engine::Collectives*, int)>& fn) {
  if (world == 1) {
    fn(nullptr, 0);
  } else if (thread_ranks) {
    run_thread_ranks(world, [&](zenflow::test_support::ThreadCollectives& coll, int rank) { fn(&coll, rank); });
  } else {
    run_ranks(world, [&](zenflow::distributed::Communicator& comm) {
      zenflow::distributed::EngineCollectives coll(comm);
      fn(&coll, comm.rank());
    });
  }
}

void reshard_case(int from, int to, bool thread_ranks) {
  const at::Device device = thread_ranks ? test_device() : at::Device(at::kCPU);
  EngineOptions o = base_options();
  o.topk_ratio = 0.25;
  o.update_interval = 3;
  o.overlap_step = true;
  o.select_strategy = SelectStrategy::kStep;
  o.select_interval = 3;
  const int64_t first = 7, total = 13;  // 7: mid-window, with a host step in flight
  const Trajectory straight = run_single(o, total, 0, at::kFloat, device);

  std::vector<State> shards(static_cast<size_t>(from));
  std::vector<at::Tensor> weights;
  std::mutex mu;
  auto phase1 = [&](zenflow::engine::Collectives* coll, int rank) {
    auto ps = make_params(at::kFloat, device);
    auto opt = make_opt(ps, o, coll);
    for (int64_t s = 0; s < first; ++s) {
      set_grads(ps, s, 0);
      opt->step({1e-2, 0});
    }
    State st = opt->state_dict();
    std::lock_guard<std::mutex> lk(mu);
    shards[static_cast<size_t>(rank)] = st;
    if (rank == 0) weights = snapshot(ps);
  };
  run_group(from, thread_ranks, phase1);
  std::vector<std::vector<at::Tensor>> result(static_cast<size_t>(to));
  auto phase2 = [&](zenflow::engine::Collectives* coll, int rank) {
    auto ps = clone_params(weights, device);
    auto opt = make_opt(ps, o, coll);
    opt->load_state_shards(shards);
    for (int64_t s = first; s < total; ++s) {
      set_grads(ps, s, 0);
      opt->step({1e-2, 0});
    }
    opt->finish();
    result[static_cast<size_t>(rank)] = snapshot(ps);
  };
  run_group(to, thread_ranks, phase2);
  expect_close(result[0], straight.back(), 1e-6, std::to_string(from) + " -> " + std::to_string(to));
  for (int r = 1; r < to; ++r)
    expect_bitwise(result[static_cast<size_t>(r)], result[0], "rank " + std::to_string(r));
}

TEST(PartitionedEngine, StateReshardsTwoRanksToOne) {
  REQUIRE_GLOO();
  reshard_case(2, 1, false);
}

TEST(PartitionedEngine, StateReshardsOneRankToTwo) {
  REQUIRE_GLOO();
  reshard_case(1, 2, false);
}

// Ranks as threads on the test device (on a GPU host: restores with a pending apply on CUDA).
TEST(PartitionedEngine, StateReshardsBetweenThreadRanksOnTheTestDevice) {
  reshard_case(2, 1, true);
  reshard_case(1, 2, true);
}

TEST(PartitionedEngine, MissingShardIsNamed) {
  REQUIRE_GLOO();
  EngineOptions o = base_options();
  o.topk_ratio = 0.25;
  std::vector<State> shards(2);
  run_ranks(2, [&](zenflow::distributed::Communicator& comm) {
    zenflow::distributed::EngineCollectives coll(comm);
    auto ps = make_params();
    auto opt = make_opt(ps, o, &coll);
    dp_steps(comm, *opt, ps, 0, 3, 0);
    shards[static_cast<size_t>(comm.rank())] = opt->state_dict();
  });
  auto ps = make_params();
  auto opt = make_opt(ps, o);
  try {
    opt->load_state_shards({shards[0]});  // rank 1's shard left out
    FAIL() << "loading half of the host state must fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("in no shard"), std::string::npos) << e.what();
  }
}

TEST(PartitionedEngine, NonFiniteGradientOnOneRankSkipsTheStepEverywhere) {
  REQUIRE_GLOO();
  EngineOptions o = base_options();
  o.topk_ratio = 0.25;
  o.update_interval = 2;
  std::vector<int> skipped(2, -1);
  std::vector<int> equal_after(2, 0);
  run_ranks(2, [&](zenflow::distributed::Communicator& comm) {
    zenflow::distributed::EngineCollectives coll(comm);
    auto ps = make_params();
    auto opt = make_opt(ps, o, &coll);
    dp_steps(comm, *opt, ps, 0, 3, comm.rank());
    const auto before = snapshot(ps);
    set_grads(ps, 3, comm.rank());
    average_dense_grads(comm, *opt, ps);
    if (comm.rank() == 1) ps[1].mutable_grad()[5][7] = std::nan("");
    const auto rep = opt->step({1e-2, 0});
    skipped[static_cast<size_t>(comm.rank())] = rep.skipped ? 1 : 0;
    bool same = true;
    for (size_t k = 0; k < ps.size(); ++k) same = same && at::equal(ps[k].detach(), before[k]);
    equal_after[static_cast<size_t>(comm.rank())] = same ? 1 : 0;
    EXPECT_EQ(opt->skipped_steps(), 1);
  });
  EXPECT_EQ(skipped[0], 1);
  EXPECT_EQ(skipped[1], 1);
  EXPECT_EQ(equal_after[0], 1);
  EXPECT_EQ(equal_after[1], 1);
}

}  // namespace
