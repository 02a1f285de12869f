// The ZenFlow engine against an independent reference implementation of
// docs/semantics.md, for a grid of configurations.
//
// The reference below is deliberately slow and plain: std::vector<float> per parameter,
// one loop per rule, one set of (master, m, v) per element wherever the element's column
// lives, so that "moving a column" is nothing but flipping its owner flag. It shares no
// code with the engine. Its AdamW is the fp32 formula of adamw_kernel.h, evaluated in the
// order written there (the engine's contract: fp32 state, every operation rounded), so
// the comparison tolerance measures schedule errors, not rounding. Everything else
// (norms, clipping coefficient, window sums and means, column scores) is computed in
// double.
//
// Compared after every step: every parameter element (to 1e-6 relative), the selected
// column sets, the step report (boundary, re-selection, staleness) and the engine's
// counters; after finish(): every parameter element and the counters again.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_device.h"
#include "worker/engine/zenflow_optimizer.h"

namespace ze = zenflow::engine;

namespace {

using zenflow::test_support::test_device;

// ---------------------------------------------------------------------------------
// The reference.
// ---------------------------------------------------------------------------------

struct RefConfig {
  ze::OptimizerMode mode = ze::OptimizerMode::kZenFlow;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 0.0;
  double topk_ratio = 0.25;
  int64_t update_interval = 1;   // U
  int64_t warm_up = 0;           // W
  int64_t select_interval = 1;   // S (strategy step)
  bool overlap = false;
  bool l1 = false;
  int64_t min_split_numel = 16;
};

struct RefParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // 1-D or 2-D
  double weight_decay = 0.0;
};

// AdamW coefficients for one call: computed in double, used as floats (adamw_kernel.h).
struct RefCoeffs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, decay, step_size, inv_sqrt_bc2, eps;
};

RefCoeffs ref_coeffs(const RefConfig& c, double lr, double wd, int64_t t) {
  RefCoeffs k;
  k.beta1 = static_cast<float>(c.beta1);
  k.beta2 = static_cast<float>(c.beta2);
  k.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  k.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  k.decay = static_cast<float>(1.0 - lr * wd);
  k.step_size = static_cast<float>(lr / (1.0 - std::pow(c.beta1, static_cast<double>(t))));
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(c.beta2, static_cast<double>(t))));
  k.eps = static_cast<float>(c.eps);
  return k;
}

// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p = p (1 - lr wd) - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
void ref_adamw(float& p, float& m, float& v, float g, const RefCoeffs& c) {
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  const float denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
  p = p * c.decay - c.step_size * m / denom;
}

struct RefReport {
  bool skipped = false;
  bool boundary = false;
  bool reselected = false;
  int64_t staleness = 0;
};

class Reference {
 public:
  Reference(const RefConfig& cfg, const std::vector<RefParamSpec>& specs,
            const std::vector<std::vector<float>>& init)
      : cfg_(cfg) {
    for (size_t i = 0; i < specs.size(); ++i) {
      P p;
      p.name = specs[i].name;
      p.rows = specs[i].shape[0];
      p.cols = specs[i].shape.size() == 2 ? specs[i].shape[1] : 1;  // 1-D: [n, 1]
      p.wd = specs[i].weight_decay;
      const int64_t n = p.rows * p.cols;
      if (cfg.mode == ze::OptimizerMode::kOffload) p.split = true;
      if (cfg.mode == ze::OptimizerMode::kZenFlow)
        p.split = specs[i].shape.size() == 2 && n >= cfg.min_split_numel;
      p.w = init[i];
      p.master = init[i];
      p.m.assign(static_cast<size_t>(n), 0.0f);
      p.v.assign(static_cast<size_t>(n), 0.0f);
      p.on_device.assign(static_cast<size_t>(p.cols), false);
      p.win_sum.assign(static_cast<size_t>(n), 0.0);
      p.win_score.assign(static_cast<size_t>(p.cols), 0.0);
      if (cfg.mode == ze::OptimizerMode::kZenFlow && p.split) {
        const double r = cfg.topk_ratio;
        p.k = r == 0.0 ? 0
                       : std::min<int64_t>(p.cols, std::max<int64_t>(1, static_cast<int64_t>(
                                                                          std::floor(r * p.cols))));
      }
      params_.push_back(std::move(p));
    }
  }

  RefReport step(std::vector<std::vector<float>> g, double lr) {
    RefReport rep;
    // Staleness: host results computed but not yet in the weights.
    rep.staleness = has_pending_ ? 1 : 0;
    double sq = 0.0;
    for (auto& gp : g)
      for (float x : gp) sq += static_cast<double>(x) * static_cast<double>(x);
    const double norm = std::sqrt(sq);
    if (!std::isfinite(norm)) {
      rep.skipped = true;
      ++skipped_;
      return rep;
    }
    if (cfg_.grad_clip > 0) {
      const double coef = cfg_.grad_clip / (norm + 1e-6);
      if (coef < 1.0)
        for (auto& gp : g)
          for (float& x : gp) x = static_cast<float>(static_cast<double>(x) * coef);
    }
    last_lr_ = lr;

    // Device updater: every non-skipped step.
    ++device_t_;
    for (size_t i = 0; i < params_.size(); ++i) {
      P& p = params_[i];
      if (p.split) continue;
      const RefCoeffs c = ref_coeffs(cfg_, lr, p.wd, device_t_);
      for (size_t e = 0; e < p.w.size(); ++e) ref_adamw(p.w[e], p.m[e], p.v[e], g[i][e], c);
    }

    const bool warm = cfg_.mode == ze::OptimizerMode::kOffload ||
                      (cfg_.mode == ze::OptimizerMode::kZenFlow && s_ < cfg_.warm_up);
    if (cfg_.mode == ze::OptimizerMode::kDevice) {
      ++s_;
      return rep;
    }
    if (warm) {
      // Synchronous offload step: every column of every split parameter on the host.
      ++host_t_;
      for (size_t i = 0; i < params_.size(); ++i) {
        P& p = params_[i];
        if (!p.split) continue;
        const RefCoeffs c = ref_coeffs(cfg_, lr, p.wd, host_t_);
        for (size_t e = 0; e < p.w.size(); ++e) {
          ref_adamw(p.master[e], p.m[e], p.v[e], g[i][e], c);
          p.w[e] = p.master[e];
        }
      }
      ++s_;
      return rep;
    }

    if (!selected_) {
      // First selection: this step's gradient, before this step's update.
      for (size_t i = 0; i < params_.size(); ++i)
        if (params_[i].split) choose(params_[i], column_scores(params_[i], g[i]));
      selected_ = true;
      since_selection_ = 0;
    }
    // Device updater on the selected columns.
    for (size_t i = 0; i < params_.size(); ++i) {
      P& p = params_[i];
      if (!p.split) continue;
      const RefCoeffs c = ref_coeffs(cfg_, lr, p.wd, device_t_);
      for (int64_t j = 0; j < p.cols; ++j) {
        if (!p.on_device[static_cast<size_t>(j)]) continue;
        for (int64_t r = 0; r < p.rows; ++r) {
          const size_t e = static_cast<size_t>(r * p.cols + j);
          ref_adamw(p.master[e], p.m[e], p.v[e], g[i][e], c);
          p.w[e] = p.master[e];
        }
      }
    }
    // Window accumulation: scores of every column, gradients of host columns.
    for (size_t i = 0; i < params_.size(); ++i) {
      P& p = params_[i];
      if (!p.split) continue;
      const std::vector<double> sc = column_scores(p, g[i]);
      for (int64_t j = 0; j < p.cols; ++j) {
        p.win_score[static_cast<size_t>(j)] += sc[static_cast<size_t>(j)];
        if (p.on_device[static_cast<size_t>(j)]) continue;
        for (int64_t r = 0; r < p.rows; ++r) {
          const size_t e = static_cast<size_t>(r * p.cols + j);
          p.win_sum[e] += static_cast<double>(g[i][e]);
        }
      }
    }
    ++win_len_;
    ++since_selection_;
    if (win_len_ == cfg_.update_interval) {
      rep.boundary = true;
      host_window_step(lr);
      if (cfg_.overlap) {
        apply_pending();       // the previous window's host step reaches the weights now
        snapshot_pending();    // this one's waits for the next boundary
      } else {
        write_host_columns();
      }
      if (since_selection_ >= cfg_.select_interval) {
        // No drain: the in-flight step of the previous window was applied above; this
        // window's results stay pending for the columns that stay on the host.
        for (auto& p : params_)
          if (p.split && choose(p, p.win_score)) rep.reselected = true;
        since_selection_ = 0;
      }
      clear_window();
    }
    ++s_;
    return rep;
  }

  void finish() {
    apply_pending();
    if (win_len_ > 0) {
      host_window_step(last_lr_);
      write_host_columns();
      clear_window();
    }
  }

  size_t size() const { return params_.size(); }
  const std::vector<float>& weights(size_t i) const { return params_[i].w; }
  const std::string& name(size_t i) const { return params_[i].name; }
  bool split(size_t i) const { return params_[i].split; }
  std::vector<int64_t> selected(size_t i) const {
    std::vector<int64_t> out;
    for (int64_t j = 0; j < params_[i].cols; ++j)
      if (params_[i].on_device[static_cast<size_t>(j)]) out.push_back(j);
    return out;
  }
  int64_t steps() const { return s_; }
  int64_t skipped() const { return skipped_; }
  int64_t host_steps() const { return host_t_; }
  int64_t windows() const { return windows_; }

 private:
  struct P {
    std::string name;
    int64_t rows = 0, cols = 0, k = 0;
    double wd = 0;
    bool split = false;
    std::vector<float> w;       // the model's weights (what the next gradient sees)
    std::vector<float> master;  // the owner's fp32 value of every element (split params)
    std::vector<float> m, v;
    std::vector<bool> on_device;     // per column
    std::vector<double> win_sum;     // per element, host columns: sum of this window's gradients
    std::vector<double> win_score;   // per column: sum of this window's scores
    std::vector<std::pair<size_t, float>> pending;  // host results not yet in w
  };

  std::vector<double> column_scores(const P& p, const std::vector<float>& g) const {
    std::vector<double> s(static_cast<size_t>(p.cols), 0.0);
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t j = 0; j < p.cols; ++j) {
        const double x = g[static_cast<size_t>(r * p.cols + j)];
        s[static_cast<size_t>(j)] += cfg_.l1 ? std::fabs(x) : x * x;
      }
    return s;
  }

  // Sets the device-owned columns to the top k by score; returns whether the set changed.
  // A column entering the device brings its master value — this window's host step
  // included — into the weights at once (its pending result is dropped: the device owns
  // it now); its m and v are the element's own. A column leaving keeps its weights until
  // its first host step.
  bool choose(P& p, const std::vector<double>& scores) {
    std::vector<int64_t> order(static_cast<size_t>(p.cols));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return scores[static_cast<size_t>(a)] > scores[static_cast<size_t>(b)];
    });
    std::vector<bool> next(static_cast<size_t>(p.cols), false);
    for (int64_t q = 0; q < p.k; ++q) next[static_cast<size_t>(order[static_cast<size_t>(q)])] = true;
    const bool changed = next != p.on_device;
    std::vector<bool> entering(static_cast<size_t>(p.cols), false);
    for (int64_t j = 0; j < p.cols; ++j) {
      if (next[static_cast<size_t>(j)] && !p.on_device[static_cast<size_t>(j)]) {
        entering[static_cast<size_t>(j)] = true;
        for (int64_t r = 0; r < p.rows; ++r) {
          const size_t e = static_cast<size_t>(r * p.cols + j);
          p.w[e] = p.master[e];
        }
      }
    }
    p.pending.erase(std::remove_if(p.pending.begin(), p.pending.end(),
                                   [&](const std::pair<size_t, float>& pe) {
                                     return entering[pe.first % static_cast<size_t>(p.cols)];
                                   }),
                    p.pending.end());
    p.on_device = next;
    return changed;
  }

  // One host AdamW step on every host column with the window's mean gradient.
  void host_window_step(double lr) {
    ++host_t_;
    for (auto& p : params_) {
      if (!p.split) continue;
      const RefCoeffs c = ref_coeffs(cfg_, lr, p.wd, host_t_);
      for (int64_t j = 0; j < p.cols; ++j) {
        if (p.on_device[static_cast<size_t>(j)]) continue;
        for (int64_t r = 0; r < p.rows; ++r) {
          const size_t e = static_cast<size_t>(r * p.cols + j);
          const float mean = static_cast<float>(p.win_sum[e] / static_cast<double>(win_len_));
          ref_adamw(p.master[e], p.m[e], p.v[e], mean, c);
        }
      }
    }
    ++windows_;
  }

  void write_host_columns() {
    for (auto& p : params_) {
      if (!p.split) continue;
      for (int64_t j = 0; j < p.cols; ++j) {
        if (p.on_device[static_cast<size_t>(j)]) continue;
        for (int64_t r = 0; r < p.rows; ++r) {
          const size_t e = static_cast<size_t>(r * p.cols + j);
          p.w[e] = p.master[e];
        }
      }
    }
  }

  void snapshot_pending() {
    for (auto& p : params_) {
      if (!p.split) continue;
      p.pending.clear();
      for (int64_t j = 0; j < p.cols; ++j) {
        if (p.on_device[static_cast<size_t>(j)]) continue;
        for (int64_t r = 0; r < p.rows; ++r) {
          const size_t e = static_cast<size_t>(r * p.cols + j);
          p.pending.emplace_back(e, p.master[e]);
        }
      }
    }
    has_pending_ = true;
  }

  void apply_pending() {
    if (!has_pending_) return;
    for (auto& p : params_) {
      for (auto& [e, val] : p.pending) p.w[e] = val;
      p.pending.clear();
    }
    has_pending_ = false;
  }

  void clear_window() {
    for (auto& p : params_) {
      std::fill(p.win_sum.begin(), p.win_sum.end(), 0.0);
      std::fill(p.win_score.begin(), p.win_score.end(), 0.0);
    }
    win_len_ = 0;
  }

  RefConfig cfg_;
  std::vector<P> params_;
  int64_t s_ = 0, skipped_ = 0;
  int64_t device_t_ = 0, host_t_ = 0;
  bool selected_ = false;
  int64_t win_len_ = 0, windows_ = 0, since_selection_ = 0;
  bool has_pending_ = false;
  double last_lr_ = 0;
};

// ---------------------------------------------------------------------------------
// The problem: tiny parameters, seeded gradients, a varying learning rate.
// ---------------------------------------------------------------------------------

std::vector<RefParamSpec> problem_specs() {
  return {
      {"w1", {6, 8}, 0.1},    // split (48 >= 16)
      {"b1", {6}, 0.0},       // 1-D: always-device
      {"w2", {5, 12}, 0.1},   // split
      {"w3", {4, 4}, 0.1},    // split: numel == min_split_numel
      {"small", {3, 5}, 0.1}, // 15 < 16: always-device
      {"tiny", {2, 3}, 0.1},  // always-device
  };
}

int64_t numel_of(const RefParamSpec& s) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  return n;
}

double lr_at(int64_t s) { return 1e-2 * (1.0 + 0.5 * std::sin(1.3 * static_cast<double>(s))); }

// Initial values of magnitude in [0.5, 1.5] with random sign: far from zero after
// 12 steps of lr <= 1.5e-2, so a relative comparison is meaningful for every element.
std::vector<std::vector<float>> initial_values(const std::vector<RefParamSpec>& specs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mag(0.5, 1.5);
  std::bernoulli_distribution sign(0.5);
  std::vector<std::vector<float>> out;
  for (auto& s : specs) {
    std::vector<float> v(static_cast<size_t>(numel_of(s)));
    for (float& x : v) x = static_cast<float>(sign(rng) ? mag(rng) : -mag(rng));
    out.push_back(std::move(v));
  }
  return out;
}

// Per step: N(0,1) entries times a per-column factor (so some columns matter more, and
// the ranking changes from window to window) times a per-step scale between 0.03 and 1.2
// (global norms from ~0.3 to ~15: a clip of 2 clips some steps and not others).
class GradientSource {
 public:
  GradientSource(const std::vector<RefParamSpec>& specs, uint64_t seed) : specs_(specs), rng_(seed) {
    std::normal_distribution<double> n01(0.0, 1.0);
    for (auto& s : specs_) {
      const int64_t cols = s.shape.size() == 2 ? s.shape[1] : 1;
      std::vector<double> f(static_cast<size_t>(cols));
      for (double& x : f) x = std::exp(0.5 * n01(rng_));
      col_factor_.push_back(std::move(f));
    }
  }
  std::vector<std::vector<float>> next() {
    std::normal_distribution<double> n01(0.0, 1.0);
    std::uniform_real_distribution<double> logscale(std::log(0.03), std::log(1.2));
    const double scale = std::exp(logscale(rng_));
    std::vector<std::vector<float>> g;
    for (size_t i = 0; i < specs_.size(); ++i) {
      const int64_t cols = specs_[i].shape.size() == 2 ? specs_[i].shape[1] : 1;
      std::vector<float> v(static_cast<size_t>(numel_of(specs_[i])));
      for (size_t e = 0; e < v.size(); ++e)
        v[e] = static_cast<float>(scale * col_factor_[i][e % static_cast<size_t>(cols)] * n01(rng_));
      g.push_back(std::move(v));
    }
    return g;
  }

 private:
  std::vector<RefParamSpec> specs_;
  std::mt19937_64 rng_;
  std::vector<std::vector<double>> col_factor_;
};

at::Tensor to_tensor(const std::vector<float>& v, const std::vector<int64_t>& shape, at::Device dev) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  std::copy(v.begin(), v.end(), t.data_ptr<float>());
  return t.to(dev);
}

std::vector<float> to_vector(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU).to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// Every element within 1e-6 relative (to max(|ref|, 1e-3)); describes the first misfits.
::testing::AssertionResult weights_match(const std::vector<at::Tensor>& params, const Reference& ref) {
  std::ostringstream os;
  int64_t bad = 0, worst_i = -1;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const std::vector<float> got = to_vector(params[i]);
    const std::vector<float>& want = ref.weights(i);
    for (size_t e = 0; e < want.size(); ++e) {
      const double a = got[e], b = want[e];
      const double err = std::fabs(a - b) / std::max(std::fabs(b), 1e-3);
      if (!(err <= 1e-6)) {
        if (bad < 4) os << "\n  " << ref.name(i) << "[" << e << "]: engine " << a << " reference " << b
                        << " (rel " << err << ")";
        ++bad;
        if (err > worst || std::isnan(err)) {
          worst = err;
          worst_i = static_cast<int64_t>(i);
        }
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements differ (worst relative error " << worst
                                       << " in " << (worst_i >= 0 ? ref.name(static_cast<size_t>(worst_i)) : "?")
                                       << ")" << os.str();
}

// Runs engine and reference side by side for `steps` steps, then finish().
void run_against_reference(const ze::EngineOptions& eo, const RefConfig& rc, int64_t steps, uint64_t seed) {
  const at::Device dev = test_device();
  const std::vector<RefParamSpec> specs = problem_specs();
  const std::vector<std::vector<float>> init = initial_values(specs, seed);
  std::vector<at::Tensor> tensors;
  std::vector<ze::ParamSpec> ps;
  for (size_t i = 0; i < specs.size(); ++i) {
    at::Tensor t = to_tensor(init[i], specs[i].shape, dev).requires_grad_(true);
    tensors.push_back(t);
    ze::ParamSpec p;
    p.name = specs[i].name;
    p.param = t;
    p.weight_decay = specs[i].weight_decay > 0;
    p.weight_decay_value = specs[i].weight_decay;
    ps.push_back(p);
  }
  ze::ZenFlowOptimizer opt(ps, eo);
  Reference ref(rc, specs, init);
  GradientSource source(specs, seed * 7919 + 17);

  for (size_t i = 0; i < specs.size(); ++i)
    ASSERT_EQ(opt.is_split(specs[i].name), ref.split(i)) << "is_split(" << specs[i].name << ")";

  for (int64_t s = 0; s < steps; ++s) {
    SCOPED_TRACE("after step " + std::to_string(s) + " (0-based)");
    const std::vector<std::vector<float>> g = source.next();
    for (size_t i = 0; i < specs.size(); ++i) tensors[i].mutable_grad() = to_tensor(g[i], specs[i].shape, dev);
    const double lr = lr_at(s);
    ze::StepContext ctx;
    ctx.lr = lr;
    ctx.epoch = 0;
    const ze::StepReport got = opt.step(ctx);
    const RefReport want = ref.step(g, lr);

    ASSERT_FALSE(got.skipped);
    EXPECT_EQ(got.boundary, want.boundary);
    EXPECT_EQ(got.reselected, want.reselected);
    EXPECT_EQ(got.staleness_windows, want.staleness);
    EXPECT_EQ(opt.steps(), ref.steps());
    EXPECT_EQ(opt.host_steps(), ref.host_steps());
    EXPECT_EQ(opt.windows_completed(), ref.windows());
    for (size_t i = 0; i < specs.size(); ++i)
      if (ref.split(i)) {
        EXPECT_EQ(opt.selected_columns(specs[i].name), ref.selected(i)) << specs[i].name;
      }
    ASSERT_TRUE(weights_match(tensors, ref));
  }
  opt.finish();
  ref.finish();
  SCOPED_TRACE("after finish()");
  EXPECT_EQ(opt.host_steps(), ref.host_steps());
  EXPECT_EQ(opt.windows_completed(), ref.windows());
  EXPECT_TRUE(weights_match(tensors, ref));
}

// ---------------------------------------------------------------------------------
// The grid.
// ---------------------------------------------------------------------------------

struct GridCase {
  double r;
  int64_t U;
  int64_t W;
  bool overlap;
  int64_t S_windows;  // S = S_windows * U
  bool clip;
  bool l1;
};

std::string case_name(const ::testing::TestParamInfo<GridCase>& info) {
  const GridCase& c = info.param;
  std::ostringstream os;
  os << "r" << (c.r == 0 ? "0" : c.r == 1 ? "1" : "0p25") << "_U" << c.U << "_W" << c.W
     << (c.overlap ? "_overlap" : "_sync") << "_S" << c.S_windows << "U" << (c.clip ? "_clip" : "_noclip")
     << (c.l1 ? "_l1" : "");
  return os.str();
}

std::vector<GridCase> grid() {
  std::vector<GridCase> out;
  for (double r : {0.0, 0.25, 1.0})
    for (int64_t U : {1, 2, 3})
      for (int64_t W : {0, 1, 2})
        for (bool overlap : {false, true})
          for (int64_t sw : {1, 2})
            for (bool clip : {false, true}) out.push_back({r, U, W, overlap, sw, clip, false});
  return out;
}

class ZenflowAgainstReference : public ::testing::TestWithParam<GridCase> {};

TEST_P(ZenflowAgainstReference, ParametersAgreeAfterEveryStepAndAfterFinish) {
  const GridCase& c = GetParam();
  ze::EngineOptions eo;
  eo.mode = ze::OptimizerMode::kZenFlow;
  eo.topk_ratio = c.r;
  eo.update_interval = c.U;
  eo.full_warm_up_rounds = c.W;
  eo.overlap_step = c.overlap;
  eo.select_strategy = ze::SelectStrategy::kStep;
  eo.select_interval = c.S_windows * c.U;
  eo.grad_clip = c.clip ? 2.0 : 0.0;
  eo.importance = c.l1 ? ze::Importance::kL1 : ze::Importance::kL2;
  eo.min_split_numel = 16;
  eo.huge_pages = false;

  RefConfig rc;
  rc.mode = ze::OptimizerMode::kZenFlow;
  rc.topk_ratio = c.r;
  rc.update_interval = c.U;
  rc.warm_up = c.W;
  rc.overlap = c.overlap;
  rc.select_interval = c.S_windows * c.U;
  rc.grad_clip = eo.grad_clip;
  rc.l1 = c.l1;
  rc.min_split_numel = 16;
  run_against_reference(eo, rc, 12, 1000 + static_cast<uint64_t>(c.U * 100 + c.W * 10 + c.S_windows));
}

INSTANTIATE_TEST_SUITE_P(Grid, ZenflowAgainstReference, ::testing::ValuesIn(grid()), case_name);

// l1 importance ranks columns differently; a few configurations with it.
INSTANTIATE_TEST_SUITE_P(L1Importance, ZenflowAgainstReference,
                         ::testing::Values(GridCase{0.25, 1, 0, false, 1, false, true},
                                           GridCase{0.25, 2, 1, true, 1, true, true},
                                           GridCase{0.25, 3, 0, true, 2, false, true}),
                         case_name);

// The clip of the grid must clip some steps and not others, or clipping on/off would
// test nothing: the gradient source's norms straddle 2.
TEST(ZenflowReferenceProblem, ClipThresholdSplitsTheStepsOfTheGrid) {
  const std::vector<RefParamSpec> specs = problem_specs();
  for (uint64_t seed : {1000ull + 111, 1000ull + 322}) {
    GradientSource source(specs, seed * 7919 + 17);
    int clipped = 0;
    for (int s = 0; s < 12; ++s) {
      double sq = 0;
      for (auto& gp : source.next())
        for (float x : gp) sq += static_cast<double>(x) * x;
      if (std::sqrt(sq) > 2.0) ++clipped;
    }
    EXPECT_GE(clipped, 2) << "seed " << seed;
    EXPECT_LE(clipped, 10) << "seed " << seed;
  }
}

// device and offload modes against the same reference.
struct ModeCase {
  ze::OptimizerMode mode;
  bool clip;
};

class OtherModesAgainstReference : public ::testing::TestWithParam<ModeCase> {};

TEST_P(OtherModesAgainstReference, ParametersAgreeAfterEveryStep) {
  const ModeCase& c = GetParam();
  ze::EngineOptions eo;
  eo.mode = c.mode;
  eo.grad_clip = c.clip ? 2.0 : 0.0;
  eo.min_split_numel = 16;
  eo.huge_pages = false;
  RefConfig rc;
  rc.mode = c.mode;
  rc.grad_clip = eo.grad_clip;
  rc.min_split_numel = 16;
  run_against_reference(eo, rc, 12, 77);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, OtherModesAgainstReference,
    ::testing::Values(ModeCase{ze::OptimizerMode::kDevice, false}, ModeCase{ze::OptimizerMode::kDevice, true},
                      ModeCase{ze::OptimizerMode::kOffload, false}, ModeCase{ze::OptimizerMode::kOffload, true}),
    [](const ::testing::TestParamInfo<ModeCase>& info) {
      return std::string(info.param.mode == ze::OptimizerMode::kDevice ? "device" : "offload") +
             (info.param.clip ? "_clip" : "_noclip");
    });

}  // namespace
