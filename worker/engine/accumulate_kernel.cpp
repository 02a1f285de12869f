// Accumulate kernel (acc += g * scale): the portable scalar build and ISA dispatch.
#include "worker/engine/accumulate_kernel.h"

#include "worker/engine/host_kernels.h"
#include "worker/engine/host_thread_pool.h"

namespace zenflow::engine {
namespace host_kernels {
namespace {

template <typename Load>
void accumulate_loop(float* __restrict acc, int64_t n, float scale, bool overwrite, Load load) {
  if (overwrite) {
    for (int64_t i = 0; i < n; ++i) acc[i] = 0.0f + load(i) * scale;
  } else {
    for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + load(i) * scale;
  }
}

}  // namespace

void accumulate_scalar(float* acc, GradRef g, int64_t n, float scale, bool overwrite) {
  switch (g.type) {
    case GradRef::Type::kF32: {
      const float* __restrict x = static_cast<const float*>(g.data);
      return accumulate_loop(acc, n, scale, overwrite, [x](int64_t i) { return x[i]; });
    }
    case GradRef::Type::kBF16: {
      const uint16_t* __restrict x = static_cast<const uint16_t*>(g.data);
      return accumulate_loop(acc, n, scale, overwrite, [x](int64_t i) { return bf16_to_float(x[i]); });
    }
    case GradRef::Type::kFP16: {
      const uint16_t* __restrict x = static_cast<const uint16_t*>(g.data);
      return accumulate_loop(acc, n, scale, overwrite, [x](int64_t i) { return fp16_to_float(x[i]); });
    }
  }
}

}  // namespace host_kernels

void accumulate(float* acc, GradRef g, int64_t n, float scale, bool overwrite) {
  if (n <= 0) return;
  host_kernels::active_table().accumulate(acc, g, n, scale, overwrite);
}

void accumulate(HostThreadPool& pool, float* acc, GradRef g, int64_t n, float scale, bool overwrite) {
  if (n <= 0) return;
  // Captured by one pointer so the std::function needs no allocation.
  struct Job {
    float* acc;
    GradRef g;
    float scale;
    bool overwrite;
    host_kernels::AccumulateFn fn;
  } const job{acc, g, scale, overwrite, host_kernels::active_table().accumulate};
  pool.parallel_for(n, kHostChunkAlign, [&job](int64_t begin, int64_t end) {
    job.fn(job.acc + begin, job.g.offset(begin), end - begin, job.scale, job.overwrite);
  });
}

}  // namespace zenflow::engine
