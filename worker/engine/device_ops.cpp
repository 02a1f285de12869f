// Device-side engine operations: ATen + host kernel on CPU, CUDA kernels on GPU.
#include "worker/engine/device_ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "worker/engine/cuda_ops.h"

namespace zenflow::engine::device_ops {
namespace {

// The adamw_kernel.h formula with ATen ops (CUDA tensors without the fused kernels).
void adamw_aten(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                const AdamWCoeffs& c, float grad_scale) {
  at::Tensor gs = grad_scale == 1.0f ? g.to(at::kFloat) : g.to(at::kFloat) * grad_scale;
  m.mul_(c.beta1).add_(gs, c.one_minus_beta1);
  v.mul_(c.beta2).add_(gs * gs, c.one_minus_beta2);
  p.mul_(c.decay);
  p.addcdiv_(m, v.sqrt().mul_(c.inv_sqrt_bc2).add_(c.eps), -c.step_size);
}

bool use_cuda_kernels(const at::Tensor& t) { return t.is_cuda() && cuda_ops::available(); }

// a, b and idx fit the CUDA column gather/scatter: one CUDA device, contiguous, one
// weight dtype, int64 indices.
bool cuda_column_path(const at::Tensor& a, const at::Tensor& b, const at::Tensor& idx) {
  const at::ScalarType t = a.scalar_type();
  return use_cuda_kernels(a) && b.device() == a.device() && idx.device() == a.device() && a.is_contiguous() &&
         b.is_contiguous() && idx.is_contiguous() && b.scalar_type() == t && idx.scalar_type() == at::kLong &&
         (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf);
}

bool is_cpu_f32_contig(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

// AdamW on fp32 master p with gradient g (any float dtype, same shape).
void adamw_into(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                const AdamWCoeffs& c, float grad_scale) {
  if (is_cpu_f32_contig(p) && is_cpu_f32_contig(m) && is_cpu_f32_contig(v)) {
    at::Tensor gf = g.to(at::kFloat).contiguous();
    AdamWSpan span;
    span.p = p.data_ptr<float>();
    span.m = m.data_ptr<float>();
    span.v = v.data_ptr<float>();
    span.grad = GradRef::f32(gf.data_ptr<float>());
    span.n = p.numel();
    adamw_step(span, c, grad_scale);
    return;
  }
  adamw_aten(p, g, m, v, c, grad_scale);
}

// Row-major gather/scatter of columns for CPU tensors of one element size (the
// ATen index ops are 3-5x slower here, docs/benchmarks.md §1). Sorted index
// lists are mostly runs of consecutive columns (the unselected 90%): those are copied
// run by run, which the compiler turns into wide moves; scattered lists go element
// by element. Rows are split over LibTorch's compute threads.
struct Runs {
  std::vector<int64_t> start, len;  // idx[c .. c+len) == start .. start+len
};

Runs runs_of(const int64_t* idx, int64_t n) {
  Runs r;
  for (int64_t c = 0; c < n;) {
    int64_t e = c + 1;
    while (e < n && idx[e] == idx[e - 1] + 1) ++e;
    r.start.push_back(idx[c]);
    r.len.push_back(e - c);
    c = e;
  }
  return r;
}

constexpr int64_t kMinMeanRun = 4;  // below this, element-wise copies win

template <typename T>
void gather_rows(const T* src, int64_t rows, int64_t in, const int64_t* idx, int64_t n, T* dst) {
  const Runs runs = runs_of(idx, n);
  const bool by_run = static_cast<int64_t>(runs.start.size()) * kMinMeanRun <= n;
  at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, n)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* r = src + i * in;
      T* d = dst + i * n;
      if (by_run) {
        for (size_t k = 0; k < runs.start.size(); ++k) {
          const T* from = r + runs.start[k];
          for (int64_t c = 0; c < runs.len[k]; ++c) d[c] = from[c];
          d += runs.len[k];
        }
      } else {
        for (int64_t c = 0; c < n; ++c) d[c] = r[idx[c]];
      }
    }
  });
}

template <typename T>
void scatter_rows(const T* src, int64_t rows, int64_t in, const int64_t* idx, int64_t n, T* dst) {
  const Runs runs = runs_of(idx, n);
  const bool by_run = static_cast<int64_t>(runs.start.size()) * kMinMeanRun <= n;
  at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, n)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* s = src + i * n;
      T* r = dst + i * in;
      if (by_run) {
        for (size_t k = 0; k < runs.start.size(); ++k) {
          T* to = r + runs.start[k];
          for (int64_t c = 0; c < runs.len[k]; ++c) to[c] = s[c];
          s += runs.len[k];
        }
      } else {
        for (int64_t c = 0; c < n; ++c) r[idx[c]] = s[c];
      }
    }
  });
}

bool cpu_fast_path(const at::Tensor& a, const at::Tensor& b, const at::Tensor& idx) {
  return a.device().is_cpu() && b.device().is_cpu() && idx.device().is_cpu() && a.is_contiguous() &&
         b.is_contiguous() && idx.is_contiguous() && a.scalar_type() == b.scalar_type() &&
         idx.scalar_type() == at::kLong && (a.element_size() == 4 || a.element_size() == 2);
}

// idx == [0, 1, ..., n-1]. A CPU index is checked; a device index is not read (that
// would synchronise): device callers pass ascending unique indices, for which n
// entries out of n columns are the identity.
bool every_column_in_order(const at::Tensor& idx, int64_t n) {
  if (idx.numel() != n) return false;
  if (!idx.device().is_cpu()) return true;
  const at::Tensor c = idx.contiguous();
  const int64_t* ix = c.data_ptr<int64_t>();
  for (int64_t j = 0; j < n; ++j)
    if (ix[j] != j) return false;
  return true;
}

}  // namespace

void accumulate_column_scores(const at::Tensor& grad2d, bool l1, const at::Tensor& scores) {
  if (grad2d.device().is_cpu() && grad2d.scalar_type() == at::kFloat && grad2d.is_contiguous() &&
      scores.is_contiguous() && scores.scalar_type() == at::kFloat) {
    // Each column summed row by row from the first, whatever the threads and whichever
    // columns share the tensor: the engine's gradient norm relies on these bits (threads take
    // ranges of columns).
    const int64_t rows = grad2d.size(0), in = grad2d.size(1);
    const float* g = grad2d.data_ptr<float>();
    float* out = scores.data_ptr<float>();
    const int64_t grain = std::max<int64_t>(64, (1 << 16) / std::max<int64_t>(1, rows));
    at::parallel_for(0, in, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = 0; i < rows; ++i) {
        const float* r = g + i * in;
        if (l1)
          for (int64_t j = b; j < e; ++j) out[j] += r[j] < 0 ? -r[j] : r[j];
        else
          for (int64_t j = b; j < e; ++j) out[j] += r[j] * r[j];
      }
    });
    return;
  }
  if (use_cuda_kernels(grad2d) && grad2d.is_contiguous()) {
    scores.add_(cuda_ops::column_scores(grad2d, l1));
    return;
  }
  scores.add_(column_scores(grad2d, l1));
}

at::Tensor column_scores(const at::Tensor& grad2d, bool l1) {
  at::Tensor g = grad2d.scalar_type() == at::kFloat ? grad2d : grad2d.to(at::kFloat);
  if (l1) return g.abs().sum(0);
  return (g * g).sum(0);
}

void selected_adamw(const at::Tensor& weight2d, const at::Tensor& grad2d, const at::Tensor& sel,
                    const at::Tensor& master, const at::Tensor& m, const at::Tensor& v,
                    const AdamWCoeffs& c, float grad_scale) {
  if (sel.numel() == 0) return;
  if (use_cuda_kernels(weight2d) && grad2d.is_contiguous() && weight2d.is_contiguous()) {
    at::Tensor w = weight2d, mm = m, vv = v, ms = master;
    cuda_ops::selected_adamw(w, grad2d, sel, ms.defined() ? &ms : nullptr, mm, vv, c, grad_scale);
    return;
  }
  at::Tensor g = at::empty({grad2d.size(0), sel.numel()}, grad2d.options());
  gather_columns(grad2d, sel, g);
  if (master.defined()) {
    adamw_into(master, g, m, v, c, grad_scale);
    scatter_columns(weight2d, sel, master);
  } else {
    at::Tensor p = at::empty({weight2d.size(0), sel.numel()}, weight2d.options());
    gather_columns(weight2d, sel, p);
    adamw_into(p, g, m, v, c, grad_scale);
    scatter_columns(weight2d, sel, p);
  }
}

void dense_adamw(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& master,
                 const at::Tensor& m, const at::Tensor& v, const AdamWCoeffs& c, float grad_scale) {
  if (use_cuda_kernels(param) && param.is_contiguous() && grad.is_contiguous()) {
    at::Tensor p = param, mm = m, vv = v, ms = master;
    cuda_ops::dense_adamw(p, ms.defined() ? &ms : nullptr, grad, mm, vv, c, grad_scale);
    return;
  }
  if (master.defined()) {
    adamw_into(master, grad.reshape(master.sizes()), m, v, c, grad_scale);
    param.copy_(master.view(param.sizes()));
  } else if (param.is_contiguous()) {
    adamw_into(param.view(m.sizes()), grad.reshape(m.sizes()), m, v, c, grad_scale);
  } else {
    at::Tensor p = param.contiguous();
    adamw_into(p.view(m.sizes()), grad.reshape(m.sizes()), m, v, c, grad_scale);
    param.copy_(p);
  }
}

void gather_columns(const at::Tensor& grad2d, const at::Tensor& idx, const at::Tensor& staging) {
  if (every_column_in_order(idx, grad2d.size(1))) {  // offload, warm-up: a plain copy
    staging.copy_(grad2d);
    return;
  }
  if (cpu_fast_path(grad2d, staging, idx)) {
    const int64_t rows = grad2d.size(0), in = grad2d.size(1), n = idx.numel();
    const int64_t* ix = idx.data_ptr<int64_t>();
    if (grad2d.element_size() == 4)
      gather_rows(static_cast<const uint32_t*>(grad2d.data_ptr()), rows, in, ix, n,
                  static_cast<uint32_t*>(staging.data_ptr()));
    else
      gather_rows(static_cast<const uint16_t*>(grad2d.data_ptr()), rows, in, ix, n,
                  static_cast<uint16_t*>(staging.data_ptr()));
    return;
  }
  if (cuda_column_path(grad2d, staging, idx)) {
    cuda_ops::gather_columns(grad2d, idx, staging);
    return;
  }
  at::Tensor out = staging;
  at::index_select_out(out, grad2d, 1, idx);
}

void scatter_columns(const at::Tensor& weight2d, const at::Tensor& idx, const at::Tensor& src) {
  if (every_column_in_order(idx, weight2d.size(1))) {
    weight2d.copy_(src);
    return;
  }
  at::Tensor s = src.to(weight2d.scalar_type());
  if (cpu_fast_path(weight2d, s, idx)) {
    const int64_t rows = weight2d.size(0), in = weight2d.size(1), n = idx.numel();
    const int64_t* ix = idx.data_ptr<int64_t>();
    if (weight2d.element_size() == 4)
      scatter_rows(static_cast<const uint32_t*>(s.data_ptr()), rows, in, ix, n,
                   static_cast<uint32_t*>(weight2d.data_ptr()));
    else
      scatter_rows(static_cast<const uint16_t*>(s.data_ptr()), rows, in, ix, n,
                   static_cast<uint16_t*>(weight2d.data_ptr()));
    return;
  }
  if (cuda_column_path(weight2d, s, idx)) {
    cuda_ops::scatter_columns(weight2d, idx, s);
    return;
  }
  weight2d.index_copy_(1, idx, s);
}

}  // namespace zenflow::engine::device_ops
