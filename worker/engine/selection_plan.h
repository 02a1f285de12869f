// Column selection bookkeeping (semantics §2, §3): when a re-selection is due, which
// columns enter and leave the device, and the host storage order afterwards.
//
// No tensors: the top-k itself is taken from the score tensors by ZenFlowOptimizer; what
// follows from the chosen sets is decided here, on sorted column indices.
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine_defaults.h"
#include "worker/engine/shard_layout.h"
#include "worker/engine/window_schedule.h"

namespace zenflow::engine {

enum class SelectStrategy { kAuto, kStep, kEpoch };

// When to re-select (EngineOptions::select_strategy, select_interval, reselect_threshold)
// and the progress since the last selection. Decisions are taken at window boundaries.
struct SelectionSchedule {
  SelectStrategy strategy = SelectStrategy::kAuto;
  int64_t interval = 0;  // select_interval; 0 = auto (10 windows for kStep, 1 epoch for kEpoch)
  double threshold = engine_defaults::kReselectThreshold;  // reselect_threshold (kAuto's drift rule)

  // Progress; every field is persisted (engine state).
  bool selected = false;      // the first selection was made
  int64_t steps_since = 0;    // post-warm-up steps since the last selection
  int64_t windows_since = 0;  // boundaries since the last selection
  int64_t epoch_at = 0;       // data epoch of the last selection
  int64_t reselections = 0;   // re-selections that changed a selected set

  // Whether every matrix is due at a boundary in `epoch` (kStep: S steps, or 10 windows
  // with auto; kEpoch: S epochs, at least 1; kAuto: a new epoch). Otherwise only kAuto
  // re-selects, the matrices that drifted.
  bool all_due(int64_t epoch) const;
  bool drift_decides() const { return strategy == SelectStrategy::kAuto; }
  void step_in_window() { ++steps_since; }
  void window_closed() { ++windows_since; }
  void first_selection_made(int64_t epoch) {
    selected = true;
    restart(epoch);
  }
  // A due re-selection was decided in `epoch` (changed or not): counting starts again.
  void restart(int64_t epoch) {
    steps_since = 0;
    windows_since = 0;
    epoch_at = epoch;
  }
};

// kAuto's drift rule for one matrix: due when its selected columns' share of the
// window's score mass fell below `threshold` times the share the fresh top-k would hold
// (`fresh`: that top-k's mass). Never for a matrix with no selected or no host columns
// or no mass.
bool selection_drifted(const WindowMass& m, double fresh, double threshold);

// The change from one selected set to another of a matrix (both ascending).
struct ColumnMoves {
  std::vector<int64_t> entering;  // host -> device, ascending
  std::vector<int64_t> leaving;   // device -> host, ascending
  bool empty() const { return entering.empty() && leaving.empty(); }
};
ColumnMoves column_moves(const std::vector<int64_t>& old_selected, const std::vector<int64_t>& new_selected);

// Storage order of rank `rank`'s host-owned columns (`old_order`, within its range)
// after `moves`: when as many of the rank's columns leave the device as enter it (always,
// with one rank: k is fixed), the leaving columns take the slots of the entering ones in
// order, so a re-selection touches O(changed columns), not the whole host state;
// otherwise ascending (a full re-pack).
std::vector<int64_t> part_order_after(const ColumnRanges& ranges, int rank,
                                      const std::vector<int64_t>& old_order, const ColumnMoves& moves);

// Whether on every rank as many of its columns leave the device as enter it, so that
// part_order_after keeps every rank's slots (the leaving columns go into the entering
// ones' host slots) and nothing else moves.
bool slot_for_slot(const ColumnRanges& ranges, const ColumnMoves& moves);

}  // namespace zenflow::engine
