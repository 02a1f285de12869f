// Device-side engine operations: ATen + host kernel on CPU, CUDA kernels on GPU.
#include "worker/engine/device_ops.h"

#include <stdexcept>

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

}  // namespace

at::Tensor column_scores(const at::Tensor& grad2d, bool l1) {
  at::Tensor g = grad2d.scalar_type() == at::kFloat ? grad2d : grad2d.to(at::kFloat);
  if (l1) return g.abs().sum(0);
  return (g * g).sum(0);
}

void selected_adamw(const at::Tensor& weight2d, const at::Tensor& grad2d, const at::Tensor& sel,
                    const at::Tensor& master, const at::Tensor& m, const at::Tensor& v,
                    const AdamWCoeffs& c, float grad_scale) {
  if (sel.numel() == 0) return;
  at::Tensor g = grad2d.index_select(1, sel);
  if (master.defined()) {
    adamw_into(master, g, m, v, c, grad_scale);
    weight2d.index_copy_(1, sel, master.to(weight2d.scalar_type()));
  } else {
    at::Tensor p = weight2d.index_select(1, sel);  // contiguous fp32 copy
    adamw_into(p, g, m, v, c, grad_scale);
    weight2d.index_copy_(1, sel, p);
  }
}

void dense_adamw(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& master,
                 const at::Tensor& m, const at::Tensor& v, const AdamWCoeffs& c, float grad_scale) {
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

void gather_columns_t(const at::Tensor& grad2d, const at::Tensor& idx, const at::Tensor& staging) {
  at::Tensor out = staging;
  at::index_select_out(out, grad2d.t(), 0, idx);
}

void scatter_columns_t(const at::Tensor& weight2d, const at::Tensor& idx, const at::Tensor& src) {
  weight2d.t().index_copy_(0, idx, src.to(weight2d.scalar_type()));
}

}  // namespace zenflow::engine::device_ops
