// Window schedule (semantics §4): warm-up, windows and their boundaries, and how many
// windows of host updates the device weights miss (the one-deep pipeline's staleness).
//
// No tensors: Zen-auto's mass criterion (zen_auto_ready) takes the window's score masses
// as numbers. ZenFlowOptimizer owns one and calls it from the training thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/engine_defaults.h"

namespace zenflow::engine {

struct WindowSchedule {
  // Settings (EngineOptions): full_warm_up_rounds synchronous offload steps first, then
  // windows of update_interval steps (0 = Zen-auto, bounded by max_update_interval).
  int64_t warm_up_rounds = engine_defaults::kFullWarmUpRounds;
  int64_t update_interval = engine_defaults::kUpdateInterval;
  int64_t max_update_interval = engine_defaults::kMaxUpdateInterval;

  // Progress; steps, windows, position, windows_applied and max_staleness are persisted
  // (engine state), last_window_steps is not (restore).
  int64_t steps = 0;              // non-skipped steps taken
  int64_t windows = 0;            // windows closed since warm-up
  int64_t position = 0;           // steps accumulated in the open window
  int64_t windows_applied = 0;    // closed windows whose host step reached the device weights
  int64_t last_window_steps = 0;  // length of the last closed window
  int64_t max_staleness = 0;      // the most stale_windows() a step's gradient saw

  bool warming_up() const { return steps < warm_up_rounds; }
  bool zen_auto() const { return update_interval == 0; }
  // The accumulator (0 or 1) of the open window: consecutive windows alternate, so the
  // host step of window k reads one while window k+1 fills the other.
  int parity() const { return static_cast<int>(windows % 2); }
  // Windows of host updates missing from the device weights: 1 while a host step is in
  // flight (overlap_step), else 0; in steps, as long as those windows were (0 after a
  // resume with Zen-auto until the next boundary: their length is not persisted).
  int64_t stale_windows() const { return windows - windows_applied; }
  int64_t stale_steps() const { return stale_windows() * last_window_steps; }
  void note_staleness(int64_t stale) { max_staleness = std::max(max_staleness, stale); }

  void step_taken() { ++steps; }
  // A post-warm-up step joins the open window; returns its position in it (from 1).
  int64_t add_to_window() { return ++position; }
  // Whether the step just added closes the window: a fixed interval when the window is
  // full; Zen-auto at max_update_interval steps, else as `zen_auto_ready()` (called only
  // then: it reads the window's masses) decides — the decision at step t closes at step t.
  template <class Ready>
  bool closes_window(Ready&& zen_auto_ready) const {
    if (!zen_auto()) return position >= update_interval;
    return position >= max_update_interval || zen_auto_ready();
  }
  // Closes the open window (a boundary, or finish() flushing it); returns its length.
  int64_t close_window() {
    last_window_steps = position;
    ++windows;
    position = 0;
    return last_window_steps;
  }
  void window_applied() { ++windows_applied; }
  // Back to a persisted state. The last window's length is known only with a fixed interval.
  void restore(int64_t steps_taken, int64_t windows_closed, int64_t open_position, int64_t applied,
               int64_t max_stale) {
    steps = steps_taken;
    windows = windows_closed;
    position = open_position;
    windows_applied = applied;
    max_staleness = max_stale;
    last_window_steps = update_interval > 0 ? update_interval : 0;
  }
};

// One split matrix's score mass in the open window (semantics §2 scores, summed).
struct WindowMass {
  double selected = 0;  // of its selected columns
  double total = 0;     // of all its columns
  int64_t k = 0;        // selected columns
  int64_t n_host = 0;   // host-owned columns
};

// Zen-auto (§4): the window is ready to close when, for at least `auto_ratio` of the
// matrices, the unselected mass per host column has reached the selected mass per
// selected column and step. A matrix with no selected or no host columns counts as ready.
bool zen_auto_ready(const std::vector<WindowMass>& masses, int64_t window_steps, double auto_ratio);

}  // namespace zenflow::engine
