// The engine's hyper-parameter defaults, spelled once.
//
// The job spec (common/job_spec.h: OptimizerSpec, ZenflowSpec, HostSpec) and the engine's
// own options (worker/engine/zenflow_optimizer.h: EngineOptions; adamw_kernel.h:
// AdamWParams) both start from these, so a spec that omits a key and an engine built
// without a spec behave the same. It lives in common/ because common/ must not include
// worker/ (the coordinator parses specs without the engine); it includes nothing, so the
// engine does not link anything of common/ for it. Meanings: docs/spec.md.
#pragma once

#include <cstdint>

namespace zenflow::engine_defaults {

// AdamW (torch.optim.AdamW's defaults).
inline constexpr double kBeta1 = 0.9;
inline constexpr double kBeta2 = 0.999;
inline constexpr double kEps = 1e-8;

// ZenFlow (docs/semantics.md).
inline constexpr double kTopkRatio = 0.1;
inline constexpr int64_t kUpdateInterval = 4;
inline constexpr int64_t kFullWarmUpRounds = 1;
inline constexpr bool kOverlapStep = true;
inline constexpr double kReselectThreshold = 0.9;
inline constexpr double kAutoRatio = 0.99;
inline constexpr int64_t kMaxUpdateInterval = 16;
inline constexpr int64_t kMinSplitNumel = 4096;

// The host optimizer.
inline constexpr bool kHugePages = true;

}  // namespace zenflow::engine_defaults
