// The engine state's counters in their checkpoint order.
#include "worker/engine/engine_scalars.h"

namespace zenflow::engine {

std::vector<int64_t> EngineScalars::to_vector() const {
  const WindowSchedule& w = schedule;
  const SelectionSchedule& s = selection;
  // Index, and the counter's name in the format where the field's differs.
  return {w.steps,                 // 0  "t"
          skipped,                 // 1
          device_step,             // 2
          host_step,               // 3
          s.selected ? 1 : 0,      // 4
          w.windows,               // 5  "window"
          w.position,              // 6  "window_pos"
          w.windows_applied,       // 7
          w.max_staleness,         // 8
          s.steps_since,           // 9  "steps_since_selection"
          s.windows_since,         // 10 "windows_since_selection"
          s.epoch_at,              // 11 "epoch_at_selection"
          s.reselections,          // 12
          pending_apply ? 1 : 0};  // 13
}

EngineScalars EngineScalars::from_vector(const std::vector<int64_t>& v,
                                         const WindowSchedule& schedule_settings,
                                         const SelectionSchedule& selection_settings) {
  EngineScalars e;
  e.schedule = schedule_settings;
  e.schedule.restore(v[0], v[5], v[6], v[7], v[8]);
  e.skipped = v[1];
  e.device_step = v[2];
  e.host_step = v[3];
  e.selection = selection_settings;
  e.selection.selected = v[4] != 0;
  e.selection.steps_since = v[9];
  e.selection.windows_since = v[10];
  e.selection.epoch_at = v[11];
  e.selection.reselections = v[12];
  e.pending_apply = v[13] != 0;
  return e;
}

}  // namespace zenflow::engine
