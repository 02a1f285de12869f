// `zenflow report`'s page: a run record (run_record.h) as one self-contained HTML page.
//
// The page needs nothing but itself: uPlot (embedded at build time, report_assets.h), its
// stylesheet, the run's data (a JSON script element) and the page's script are inline, so
// it opens offline, from a file or from an HTTP response alike. It shows the headline
// figures (steps, losses, tokens, step time, stalls, PCIe bytes, cost or "not priced"),
// then charts: loss and validation loss; step time; where each step's time went (compute,
// device optimizer, each stall cause, the rest of the loop, stacked); bytes moved each way
// per step; the cost accumulating over the steps; and the host memory by kind.
//
// Machine-readable too: every headline figure is an element with an id (steps, final-loss,
// val-loss, tokens, step-seconds-median, stall-seconds, bytes-d2h, bytes-h2d, cost-usd,
// usd-per-hour, usd-per-1m-tokens, usd-lost-to-stalls) whose data-value attribute holds the
// number exactly (17 significant digits; absent when not known or not priced). Once its
// script has drawn the charts, <body> carries data-charts="N" and each chart's container
// data-rect="x,y,width,height" (its plot canvas, CSS pixels from the page's top left);
// data-error="..." when the script failed.
//
// Long runs are drawn from at most kMaxChartPoints points: consecutive steps are averaged
// into buckets (the page says so). Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <string>

#include "common/report/run_record.h"

namespace zenflow::report {

constexpr size_t kMaxChartPoints = 4000;

std::string render_report_html(const RunRecord& record);

}  // namespace zenflow::report
