// Column selection bookkeeping: re-selection due, column moves, host storage order.
#include "worker/engine/selection_plan.h"

#include <algorithm>
#include <iterator>

namespace zenflow::engine {

bool SelectionSchedule::all_due(int64_t epoch) const {
  switch (strategy) {
    case SelectStrategy::kStep:
      return interval > 0 ? steps_since >= interval : windows_since >= 10;
    case SelectStrategy::kEpoch:
      return epoch - epoch_at >= std::max<int64_t>(1, interval);
    case SelectStrategy::kAuto:
      return epoch > epoch_at;
  }
  return false;
}

bool selection_drifted(const WindowMass& m, double fresh, double threshold) {
  if (m.k == 0 || m.n_host == 0 || m.total <= 0) return false;
  return m.selected / m.total < threshold * (fresh / m.total);
}

ColumnMoves column_moves(const std::vector<int64_t>& old_selected, const std::vector<int64_t>& new_selected) {
  ColumnMoves m;
  std::set_difference(new_selected.begin(), new_selected.end(), old_selected.begin(), old_selected.end(),
                      std::back_inserter(m.entering));
  std::set_difference(old_selected.begin(), old_selected.end(), new_selected.begin(), new_selected.end(),
                      std::back_inserter(m.leaving));
  return m;
}

namespace {

std::vector<int64_t> in_range(const ColumnRanges& ranges, int rank, const std::vector<int64_t>& cols) {
  std::vector<int64_t> out;
  for (int64_t c : cols)
    if (ranges.holds(rank, c)) out.push_back(c);
  return out;
}

}  // namespace

std::vector<int64_t> part_order_after(const ColumnRanges& ranges, int rank,
                                      const std::vector<int64_t>& old_order, const ColumnMoves& moves) {
  const std::vector<int64_t> leave_r = in_range(ranges, rank, moves.leaving);
  auto entering = [&](int64_t c) {
    return std::binary_search(moves.entering.begin(), moves.entering.end(), c);
  };
  std::vector<int64_t> out;
  if (in_range(ranges, rank, moves.entering).size() == leave_r.size()) {
    out = old_order;
    size_t next = 0;
    for (int64_t& c : out)
      if (entering(c)) c = leave_r[next++];
    return out;
  }
  for (int64_t c : old_order)
    if (!entering(c)) out.push_back(c);
  out.insert(out.end(), leave_r.begin(), leave_r.end());
  std::sort(out.begin(), out.end());
  return out;
}

bool slot_for_slot(const ColumnRanges& ranges, const ColumnMoves& moves) {
  for (int r = 0; r < static_cast<int>(ranges.lo.size()); ++r)
    if (in_range(ranges, r, moves.entering).size() != in_range(ranges, r, moves.leaving).size()) return false;
  return true;
}

}  // namespace zenflow::engine
