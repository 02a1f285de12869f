// Window accumulation of unselected-column gradients on the host.
#pragma once

#include <cstdint>

#include "worker/engine/half.h"

namespace zenflow::engine {

class HostThreadPool;

// acc[i] = (overwrite ? 0 : acc[i]) + g[i] * scale, for i in [0, n), in fp32 (the
// product is rounded, then the sum: no FMA; so 0 + (-0) gives +0 with overwrite).
// overwrite=true starts a window without a separate zeroing sweep. `g` must not overlap
// `acc`. Runs the active ISA's build (host_isa.h);
// every build gives bitwise-identical results. Pure over its arguments: callers may run
// it concurrently on disjoint ranges.
void accumulate(float* acc, GradRef g, int64_t n, float scale, bool overwrite);

// The same split over `pool` (bitwise identical to the single call; see
// HostThreadPool for the threading contract).
void accumulate(HostThreadPool& pool, float* acc, GradRef g, int64_t n, float scale, bool overwrite);

}  // namespace zenflow::engine
