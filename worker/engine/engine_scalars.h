// The engine state's counters (semantics §7): the "engine/scalars" entry of
// ZenFlowOptimizer::state_dict(), one int64 each, in to_vector()'s order.
//
// The order is the checkpoint format: checkpoints written by earlier builds are read
// with it, so a counter is never moved or removed. Pure integers: the tensor entries
// (selected sets, host state, moments) are written by the engine itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/engine/selection_plan.h"
#include "worker/engine/window_schedule.h"

namespace zenflow::engine {

struct EngineScalars {
  static constexpr size_t kCount = 14;

  WindowSchedule schedule;      // its progress: steps, windows, position, windows_applied, max_staleness
  SelectionSchedule selection;  // its progress: selected, the counts since, reselections
  int64_t skipped = 0;          // steps skipped for a non-finite gradient
  int64_t device_step = 0;      // the device updater's bias-correction count
  int64_t host_step = 0;        // the host updater's
  bool pending_apply = false;   // a host step was in flight: applied at the next boundary

  std::vector<int64_t> to_vector() const;
  // From kCount values (the caller checks the count), into copies of the running
  // engine's schedules: their settings are kept, and the last window's length follows
  // them (WindowSchedule::restore).
  static EngineScalars from_vector(const std::vector<int64_t>& v, const WindowSchedule& schedule_settings,
                                   const SelectionSchedule& selection_settings);
};

}  // namespace zenflow::engine
