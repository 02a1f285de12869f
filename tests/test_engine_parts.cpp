// The engine's pure parts (worker/engine/): the shard layout, the window schedule, the
// selection plan and the engine state's counters, with concrete numbers and no tensors. ZenFlowOptimizer's
// own tests pin what they do inside the engine.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "worker/engine/engine_scalars.h"
#include "worker/engine/selection_plan.h"
#include "worker/engine/shard_layout.h"
#include "worker/engine/window_schedule.h"

namespace zenflow::engine {
namespace {

using Cols = std::vector<int64_t>;

TEST(ShardLayout, UnevenWidthGivesTheFirstRanksOneColumnMore) {
  const std::vector<ColumnRanges> r = assign_column_ranges({{2, 10}}, 3);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].lo, (Cols{0, 4, 7}));
  EXPECT_EQ(r[0].hi, (Cols{4, 7, 10}));
  EXPECT_EQ(r[0].width(0), 4);
  EXPECT_EQ(r[0].width(2), 3);
}

TEST(ShardLayout, EvenWidthSplitsEqually) {
  const std::vector<ColumnRanges> r = assign_column_ranges({{5, 12}, {1, 4}}, 4);
  EXPECT_EQ(r[0].lo, (Cols{0, 3, 6, 9}));
  EXPECT_EQ(r[0].hi, (Cols{3, 6, 9, 12}));
  EXPECT_EQ(r[1].lo, (Cols{0, 1, 2, 3}));  // exactly W columns: one each
  EXPECT_EQ(r[1].hi, (Cols{1, 2, 3, 4}));
}

TEST(ShardLayout, NarrowMatricesGoWholeToTheLeastLoadedRank) {
  // After the 8x8 matrix every rank holds 16 elements; the ties go to the lowest rank,
  // and each narrow matrix raises its rank's load, so they spread over ranks 0, 1, 2.
  const std::vector<ColumnRanges> r = assign_column_ranges({{8, 8}, {1, 1}, {3, 1}, {5, 2}, {1, 1}}, 4);
  EXPECT_EQ(r[1].lo, (Cols{0, 0, 0, 0}));
  EXPECT_EQ(r[1].hi, (Cols{1, 0, 0, 0}));
  EXPECT_EQ(r[2].hi, (Cols{0, 1, 0, 0}));
  EXPECT_EQ(r[3].hi, (Cols{0, 0, 2, 0}));
  // Loads now 17, 19, 26, 16: rank 3.
  EXPECT_EQ(r[4].hi, (Cols{0, 0, 0, 1}));
  EXPECT_EQ(r[3].owner(1), 2);
}

TEST(ShardLayout, OneRankOwnsEverything) {
  const std::vector<ColumnRanges> r = assign_column_ranges({{4, 6}, {2, 1}}, 1);
  EXPECT_EQ(r[0].lo, (Cols{0}));
  EXPECT_EQ(r[0].hi, (Cols{6}));
  EXPECT_EQ(r[1].hi, (Cols{1}));
}

TEST(ShardLayout, SplitKeepsEachRanksColumnsInTheGivenOrder) {
  const ColumnRanges r = assign_column_ranges({{2, 10}}, 3)[0];  // [0,4) [4,7) [7,10)
  EXPECT_EQ(r.owner(3), 0);
  EXPECT_EQ(r.owner(4), 1);
  EXPECT_EQ(r.owner(6), 1);
  EXPECT_EQ(r.owner(7), 2);
  EXPECT_TRUE(r.holds(1, 6));
  EXPECT_FALSE(r.holds(1, 7));
  const std::vector<Cols> parts = r.split({9, 1, 5, 4, 0, 8});
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], (Cols{1, 0}));
  EXPECT_EQ(parts[1], (Cols{5, 4}));
  EXPECT_EQ(parts[2], (Cols{9, 8}));
}

TEST(ShardLayout, StagingIsRankByRankThenMatrixByMatrix) {
  // Matrix 0: 2 rows, ranks hold 2 and 1 columns; matrix 1: 3 rows, 0 and 4 columns.
  const StagingLayout l = pack_staging({2, 3}, {{2, 1}, {0, 4}}, 2);
  EXPECT_EQ(l.offset[0], (Cols{0, 4}));
  EXPECT_EQ(l.offset[1], (Cols{4, 6}));
  EXPECT_EQ(l.shard_begin, (Cols{0, 4}));
  EXPECT_EQ(l.shard_size, (Cols{4, 14}));
  EXPECT_EQ(l.total, 18);
  EXPECT_EQ(l.local_offset(0, 1), 0);
  EXPECT_EQ(l.local_offset(1, 1), 2);
  EXPECT_EQ(l.local_offset(1, 0), 4);
}

TEST(ShardLayout, OneRankStagingIsTheMatricesBackToBack) {
  const StagingLayout l = pack_staging({4, 2, 3}, {{5}, {1}, {0}}, 1);
  EXPECT_EQ(l.offset[0], (Cols{0}));
  EXPECT_EQ(l.offset[1], (Cols{20}));
  EXPECT_EQ(l.offset[2], (Cols{22}));
  EXPECT_EQ(l.shard_size, (Cols{22}));
  EXPECT_EQ(l.total, 22);
  EXPECT_EQ(l.local_offset(1, 0), 20);
}

// Matrices 4x5, 2x1, 3x0 (no packed column), 3x2 in chunks of 12 elements: whole rows
// only, so the first chunk holds two rows of width 5 (10 elements), the next the last two
// rows of the first matrix and both rows of the second (12), the last the third matrix's
// 3 rows of width 2 (6); offsets follow the packed layout (pack_staging's with one rank).
TEST(ShardLayout, StagingChunksCutThePackedLayoutAtRowBoundaries) {
  const std::vector<int64_t> rows = {4, 2, 3, 3}, widths = {5, 1, 0, 2};
  const std::vector<StagingChunk> c = plan_staging_chunks(rows, widths, 12);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].offset, 0);
  EXPECT_EQ(c[0].elems, 10);
  ASSERT_EQ(c[0].pieces.size(), 1u);
  EXPECT_EQ(c[0].pieces[0].matrix, 0u);
  EXPECT_EQ(c[0].pieces[0].row, 0);
  EXPECT_EQ(c[0].pieces[0].rows, 2);
  EXPECT_EQ(c[1].offset, 10);
  EXPECT_EQ(c[1].elems, 12);
  ASSERT_EQ(c[1].pieces.size(), 2u);
  EXPECT_EQ(c[1].pieces[0].row, 2);
  EXPECT_EQ(c[1].pieces[0].rows, 2);
  EXPECT_EQ(c[1].pieces[1].matrix, 1u);
  EXPECT_EQ(c[1].pieces[1].rows, 2);
  EXPECT_EQ(c[1].pieces[1].at, 10);
  EXPECT_EQ(c[2].offset, 22);
  EXPECT_EQ(c[2].elems, 6);
  ASSERT_EQ(c[2].pieces.size(), 1u);
  EXPECT_EQ(c[2].pieces[0].matrix, 3u);
  EXPECT_EQ(c[2].pieces[0].rows, 3);
  // Every element of the packed layout is in exactly one chunk, in order.
  const StagingLayout l = pack_staging(rows, {{5}, {1}, {0}, {2}}, 1);
  EXPECT_EQ(c.back().offset + c.back().elems, l.total);
  EXPECT_EQ(l.offset[3][0], c[2].offset);
}

TEST(ShardLayout, AChunkSmallerThanARowGrowsToTheWidestRow) {
  EXPECT_EQ(staging_chunk_elems({3, 7, 2}, 4), 7);
  EXPECT_EQ(staging_chunk_elems({3, 7, 2}, 100), 100);
  const std::vector<StagingChunk> c = plan_staging_chunks({2, 1}, {3, 7}, 4);
  ASSERT_EQ(c.size(), 2u);  // chunks of 7: both rows of width 3, then the row of 7
  EXPECT_EQ(c[0].elems, 6);
  EXPECT_EQ(c[0].pieces[0].rows, 2);
  EXPECT_EQ(c[1].elems, 7);
  EXPECT_EQ(c[1].offset, 6);
  EXPECT_TRUE(plan_staging_chunks({}, {}, 4).empty());
  EXPECT_TRUE(plan_staging_chunks({5}, {0}, 4).empty());
}

TEST(ShardLayout, NothingSplitIsAnEmptyLayout) {
  const StagingLayout l = pack_staging({}, {}, 3);
  EXPECT_EQ(l.shard_size, (Cols{0, 0, 0}));
  EXPECT_EQ(l.total, 0);
}

// Runs `n` steps the way the engine does (warm-up steps take no window position) and
// returns the 0-based steps that closed a window. `overlap`: a window's host step is
// applied at the next boundary, before that window closes; else at once.
std::vector<int64_t> run_windows(WindowSchedule& w, int n, bool overlap, const std::function<bool()>& ready,
                                 std::vector<int64_t>* stale = nullptr) {
  std::vector<int64_t> boundaries;
  bool in_flight = false;
  for (int i = 0; i < n; ++i) {
    if (stale) stale->push_back(w.stale_windows());
    const bool warm = w.warming_up();
    w.step_taken();
    if (warm) continue;
    w.add_to_window();
    if (!w.closes_window(ready)) continue;
    boundaries.push_back(i);
    w.close_window();
    if (overlap && in_flight) w.window_applied();
    if (!overlap) w.window_applied();
    in_flight = overlap;
  }
  return boundaries;
}

TEST(WindowSchedule, FixedIntervalClosesEveryUStepsAfterWarmUp) {
  WindowSchedule w;
  w.warm_up_rounds = 2;
  w.update_interval = 3;
  bool asked = false;
  EXPECT_TRUE(w.warming_up());
  const std::vector<int64_t> b = run_windows(w, 9, false, [&] { return asked = true; });
  EXPECT_EQ(b, (Cols{4, 7}));  // steps 0-1 warm up; windows 2-4 and 5-7; step 8 opens the third
  EXPECT_FALSE(asked);         // a fixed interval never reads the masses
  EXPECT_EQ(w.steps, 9);
  EXPECT_EQ(w.windows, 2);
  EXPECT_EQ(w.position, 1);
  EXPECT_EQ(w.parity(), 0);
  EXPECT_EQ(w.last_window_steps, 3);
  EXPECT_EQ(w.stale_windows(), 0);
}

TEST(WindowSchedule, ParityAlternatesWithEachClosedWindow) {
  WindowSchedule w;
  w.update_interval = 1;
  EXPECT_EQ(w.parity(), 0);
  w.add_to_window();
  EXPECT_EQ(w.close_window(), 1);
  EXPECT_EQ(w.parity(), 1);
  w.add_to_window();
  w.close_window();
  EXPECT_EQ(w.parity(), 0);
}

TEST(WindowSchedule, ZenAutoClosesAtTheBoundWhenTheMassIsNeverReady) {
  WindowSchedule w;
  w.warm_up_rounds = 0;
  w.update_interval = 0;
  w.max_update_interval = 4;
  int asked = 0;
  const std::vector<int64_t> b = run_windows(w, 10, false, [&] {
    ++asked;
    return false;
  });
  EXPECT_EQ(b, (Cols{3, 7}));
  EXPECT_EQ(asked, 3 + 3 + 2);  // positions 1-3 of each window; never at the bound
}

TEST(WindowSchedule, ZenAutoClosesAtTheStepItsMassIsReady) {
  WindowSchedule w;
  w.warm_up_rounds = 0;
  w.update_interval = 0;
  w.max_update_interval = 16;
  const std::vector<int64_t> b = run_windows(w, 7, false, [&] { return w.position == 2; });
  EXPECT_EQ(b, (Cols{1, 3, 5}));
  EXPECT_EQ(w.last_window_steps, 2);
}

TEST(WindowSchedule, OverlapLeavesEveryStepAfterTheFirstBoundaryOneWindowStale) {
  WindowSchedule w;
  w.warm_up_rounds = 1;
  w.update_interval = 2;
  std::vector<int64_t> stale;
  EXPECT_EQ(run_windows(
                w, 7, true, [] { return false; }, &stale),
            (Cols{2, 4, 6}));
  EXPECT_EQ(stale, (Cols{0, 0, 0, 1, 1, 1, 1}));  // as each step begins
  EXPECT_EQ(w.stale_windows(), 1);
  EXPECT_EQ(w.stale_steps(), 2);
  EXPECT_EQ(w.windows_applied, 2);
}

TEST(WindowSchedule, WithoutOverlapNothingIsStale) {
  WindowSchedule w;
  w.warm_up_rounds = 0;
  w.update_interval = 3;
  std::vector<int64_t> stale;
  run_windows(
      w, 7, false, [] { return false; }, &stale);
  EXPECT_EQ(stale, (Cols{0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(w.stale_steps(), 0);
}

TEST(WindowSchedule, MaxStalenessKeepsTheLargest) {
  WindowSchedule w;
  w.note_staleness(1);
  w.note_staleness(0);
  EXPECT_EQ(w.max_staleness, 1);
}

TEST(WindowSchedule, RestoreKnowsTheLastWindowLengthOnlyForAFixedInterval) {
  WindowSchedule fixed;
  fixed.update_interval = 4;
  fixed.restore(30, 7, 2, 6, 1);
  EXPECT_EQ(fixed.steps, 30);
  EXPECT_EQ(fixed.windows, 7);
  EXPECT_EQ(fixed.position, 2);
  EXPECT_EQ(fixed.parity(), 1);
  EXPECT_EQ(fixed.stale_windows(), 1);
  EXPECT_EQ(fixed.stale_steps(), 4);
  EXPECT_EQ(fixed.max_staleness, 1);
  WindowSchedule zen_auto;
  zen_auto.update_interval = 0;
  zen_auto.restore(30, 7, 2, 6, 1);
  EXPECT_EQ(zen_auto.stale_windows(), 1);
  EXPECT_EQ(zen_auto.stale_steps(), 0);
}

TEST(ZenAuto, ReadyWhenUnselectedMassPerColumnReachesSelectedMassPerColumnAndStep) {
  // k = 2 selected columns with mass 10 over 2 steps: 2.5 per column and step.
  // 8 host columns with mass 4: 0.5 each, not ready; with mass 40: 5 each, ready.
  EXPECT_FALSE(zen_auto_ready({{10, 14, 2, 8}}, 2, 0.99));
  EXPECT_TRUE(zen_auto_ready({{10, 50, 2, 8}}, 2, 0.99));
  // Equal is ready: 4 / 2 / 1 = 2 per selected column and step, 6 / 3 = 2 per host column.
  EXPECT_TRUE(zen_auto_ready({{4, 10, 2, 3}}, 1, 0.99));
  EXPECT_FALSE(zen_auto_ready({{4, 9.9, 2, 3}}, 1, 0.99));  // 5.9 / 3 per host column
}

TEST(ZenAuto, NeedsAutoRatioOfTheMatricesAndCountsMatricesWithNothingToCompareAsReady) {
  const std::vector<WindowMass> one_of_two = {{10, 50, 2, 8}, {10, 14, 2, 8}};
  EXPECT_TRUE(zen_auto_ready(one_of_two, 2, 0.5));    // 1 >= 0.5 * 2
  EXPECT_FALSE(zen_auto_ready(one_of_two, 2, 0.99));  // 1 < 1.98
  // No selected columns (k = 0) or no host columns: ready whatever the masses.
  EXPECT_TRUE(zen_auto_ready({{0, 100, 0, 8}, {100, 100, 4, 0}}, 1, 0.99));
  EXPECT_FALSE(zen_auto_ready({{0, 100, 0, 8}, {10, 14, 2, 8}}, 2, 0.99));
}

TEST(SelectionSchedule, StepStrategyIsDueEverySStepsOrTenWindowsWhenAuto) {
  SelectionSchedule s;
  s.strategy = SelectStrategy::kStep;
  s.interval = 4;
  s.steps_since = 3;
  EXPECT_FALSE(s.all_due(0));
  s.step_in_window();
  EXPECT_TRUE(s.all_due(0));
  EXPECT_FALSE(s.drift_decides());
  s.interval = 0;
  s.windows_since = 9;
  EXPECT_FALSE(s.all_due(0));
  s.window_closed();
  EXPECT_TRUE(s.all_due(0));
}

TEST(SelectionSchedule, EpochStrategyIsDueEverySEpochsAtLeastOne) {
  SelectionSchedule s;
  s.strategy = SelectStrategy::kEpoch;
  s.epoch_at = 2;
  EXPECT_FALSE(s.all_due(2));
  EXPECT_TRUE(s.all_due(3));  // auto: every epoch
  s.interval = 2;
  EXPECT_FALSE(s.all_due(3));
  EXPECT_TRUE(s.all_due(4));
}

TEST(SelectionSchedule, AutoStrategyReselectsEverythingInANewEpochElseByDrift) {
  SelectionSchedule s;
  s.epoch_at = 1;
  s.steps_since = 1000;
  s.windows_since = 1000;
  EXPECT_FALSE(s.all_due(1));
  EXPECT_TRUE(s.drift_decides());
  EXPECT_TRUE(s.all_due(2));
}

TEST(SelectionSchedule, ASelectionRestartsTheCounts) {
  SelectionSchedule s;
  s.steps_since = 7;
  s.windows_since = 3;
  s.first_selection_made(4);
  EXPECT_TRUE(s.selected);
  EXPECT_EQ(s.steps_since, 0);
  EXPECT_EQ(s.windows_since, 0);
  EXPECT_EQ(s.epoch_at, 4);
  s.steps_since = 5;
  s.restart(6);
  EXPECT_EQ(s.steps_since, 0);
  EXPECT_EQ(s.epoch_at, 6);
  EXPECT_EQ(s.reselections, 0);  // counted by the engine, only when a set changed
}

TEST(SelectionDrift, DueWhenTheSelectedShareFallsBelowThresholdTimesTheFreshShare) {
  // Selected 8 of 20 (0.4) against a fresh top-k of 10 (0.5): 0.4 < 0.9 * 0.5.
  EXPECT_TRUE(selection_drifted({8, 20, 2, 6}, 10, 0.9));
  EXPECT_FALSE(selection_drifted({9.5, 20, 2, 6}, 10, 0.9));  // 0.475 >= 0.45
  EXPECT_FALSE(selection_drifted({8, 20, 0, 6}, 10, 0.9));    // nothing selected
  EXPECT_FALSE(selection_drifted({8, 20, 2, 0}, 10, 0.9));    // nothing on the host
  EXPECT_FALSE(selection_drifted({0, 0, 2, 6}, 0, 0.9));      // no mass
}

TEST(ColumnMoves, EnteringAndLeavingAreTheTwoSetDifferences) {
  const ColumnMoves m = column_moves({1, 3, 5, 7}, {1, 2, 5, 8});
  EXPECT_EQ(m.entering, (Cols{2, 8}));
  EXPECT_EQ(m.leaving, (Cols{3, 7}));
  EXPECT_FALSE(m.empty());
  EXPECT_TRUE(column_moves({1, 2}, {1, 2}).empty());
  EXPECT_EQ(column_moves({}, {0, 4}).entering, (Cols{0, 4}));  // the first selection
}

TEST(PartOrder, OneRankLeavingColumnsTakeTheEnteringOnesSlotsInOrder) {
  const ColumnRanges one = assign_column_ranges({{3, 10}}, 1)[0];
  const ColumnMoves m = column_moves({1, 3, 5, 7}, {1, 2, 5, 8});
  EXPECT_EQ(part_order_after(one, 0, {0, 2, 4, 6, 8, 9}, m), (Cols{0, 3, 4, 6, 7, 9}));
  // A storage order that is not ascending stays as it is, but for the replaced slots.
  EXPECT_EQ(part_order_after(one, 0, {9, 0, 6}, column_moves({2, 5}, {5, 6})), (Cols{9, 0, 2}));
  EXPECT_TRUE(slot_for_slot(one, m));
}

TEST(PartOrder, UnevenMovesAcrossRanksRepackThoseRanksAscending) {
  const ColumnRanges two = assign_column_ranges({{3, 10}}, 2)[0];  // [0,5) [5,10)
  // Selected {1,3,6,8}: rank 0 holds {0,2,4}, rank 1 {5,7,9}. Column 2 enters, 6 leaves.
  const ColumnMoves m = column_moves({1, 3, 6, 8}, {1, 2, 3, 8});
  EXPECT_FALSE(slot_for_slot(two, m));
  EXPECT_EQ(part_order_after(two, 0, {0, 2, 4}, m), (Cols{0, 4}));
  EXPECT_EQ(part_order_after(two, 1, {9, 5, 7}, m), (Cols{5, 6, 7, 9}));
}

TEST(PartOrder, BalancedMovesOnEveryRankStaySlotForSlot) {
  const ColumnRanges two = assign_column_ranges({{3, 10}}, 2)[0];
  // Column 2 enters and 1 leaves, both rank 0's; rank 1 is untouched.
  const ColumnMoves m = column_moves({1, 3, 6, 8}, {2, 3, 6, 8});
  EXPECT_TRUE(slot_for_slot(two, m));
  EXPECT_EQ(part_order_after(two, 0, {4, 2, 0}, m), (Cols{4, 1, 0}));
  EXPECT_EQ(part_order_after(two, 1, {9, 5, 7}, m), (Cols{9, 5, 7}));
}

TEST(EngineScalars, CountersKeepTheirCheckpointPositions) {
  EngineScalars e;
  e.schedule.steps = 101;
  e.skipped = 102;
  e.device_step = 103;
  e.host_step = 104;
  e.selection.selected = true;
  e.schedule.windows = 106;
  e.schedule.position = 107;
  e.schedule.windows_applied = 108;
  e.schedule.max_staleness = 109;
  e.selection.steps_since = 110;
  e.selection.windows_since = 111;
  e.selection.epoch_at = 112;
  e.selection.reselections = 113;
  e.pending_apply = true;
  EXPECT_EQ(e.to_vector(), (Cols{101, 102, 103, 104, 1, 106, 107, 108, 109, 110, 111, 112, 113, 1}));
  EXPECT_EQ(e.to_vector().size(), EngineScalars::kCount);
}

TEST(EngineScalars, ReadBackIntoTheRunningEnginesSettings) {
  const Cols saved = {40, 2, 38, 12, 1, 9, 3, 8, 1, 5, 2, 1, 4, 1};
  WindowSchedule w;
  w.warm_up_rounds = 2;
  w.update_interval = 4;
  SelectionSchedule s;
  s.strategy = SelectStrategy::kStep;
  s.interval = 8;
  const EngineScalars e = EngineScalars::from_vector(saved, w, s);
  EXPECT_EQ(e.to_vector(), saved);
  EXPECT_EQ(e.schedule.warm_up_rounds, 2);
  EXPECT_EQ(e.schedule.update_interval, 4);
  EXPECT_EQ(e.schedule.last_window_steps, 4);  // not saved: the fixed interval's
  EXPECT_EQ(e.schedule.stale_steps(), 4);      // windows 9, applied 8
  EXPECT_EQ(e.selection.strategy, SelectStrategy::kStep);
  EXPECT_EQ(e.selection.interval, 8);
  EXPECT_TRUE(e.selection.selected);
  EXPECT_TRUE(e.pending_apply);
  EXPECT_FALSE(EngineScalars::from_vector({40, 2, 38, 12, 0, 9, 3, 8, 1, 5, 2, 1, 4, 0}, w, s).pending_apply);
}

}  // namespace
}  // namespace zenflow::engine
