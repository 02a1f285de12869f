// Window schedule: Zen-auto's mass criterion.
#include "worker/engine/window_schedule.h"

namespace zenflow::engine {

bool zen_auto_ready(const std::vector<WindowMass>& masses, int64_t window_steps, double auto_ratio) {
  int64_t ready = 0;
  for (const WindowMass& m : masses) {
    if (m.k == 0 || m.n_host == 0) {
      ++ready;
      continue;
    }
    const double unsel = m.total - m.selected;
    const double unsel_per_col = unsel / static_cast<double>(m.n_host);
    const double sel_per_col_step = m.selected / static_cast<double>(m.k) / static_cast<double>(window_steps);
    if (unsel_per_col >= sel_per_col_step) ++ready;
  }
  return static_cast<double>(ready) >= auto_ratio * static_cast<double>(masses.size());
}

}  // namespace zenflow::engine
