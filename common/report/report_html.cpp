// The report page (see report_html.h).
#include "common/report/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/report/report_assets.h"

namespace zenflow::report {

namespace {

using nlohmann::json;

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Text inside <script>: "</" could end the element early; JSON allows "<\/".
std::string script_safe(std::string s) {
  for (size_t at = 0; (at = s.find("</", at)) != std::string::npos; at += 3) s.replace(at, 2, "<\\/");
  return s;
}

std::string printf_string(const char* fmt, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}
std::string exact(double x) { return printf_string("%.17g", x); }

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return printf_string(u == 0 ? "%.0f" : "%.1f", b) + " " + units[u];
}

std::string format_seconds(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 1) return printf_string("%.1f ms", s * 1000);
  if (s < 120) return printf_string("%.2f s", s);
  if (s < 7200) return printf_string("%.1f min", s / 60);
  return printf_string("%.2f h", s / 3600);
}

std::string format_time(double unix_seconds) {
  if (!std::isfinite(unix_seconds)) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// One headline figure: <div class="tile"><span>label</span><b id
// data-value>shown</b><small>note</small></div>.
std::string tile(const std::string& id, const std::string& label, const std::string& shown,
                 const std::string& value, const std::string& note = "") {
  std::string s =
      "<div class=\"tile\"><span class=\"k\">" + html_escape(label) + "</span><b id=\"" + id + "\"";
  if (!value.empty()) s += " data-value=\"" + value + "\"";
  s += ">" + html_escape(shown) + "</b>";
  if (!note.empty()) s += "<small>" + html_escape(note) + "</small>";
  return s + "</div>\n";
}

// A value or null (JSON has no NaN).
json num(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

// The chart data: one array per series, aligned with "step"; averaged over buckets of
// consecutive steps when there are more than kMaxChartPoints.
json chart_data(const RunRecord& r, size_t* bucket_size) {
  const size_t n = r.steps.size();
  const size_t bucket = n > kMaxChartPoints ? (n + kMaxChartPoints - 1) / kMaxChartPoints : 1;
  *bucket_size = bucket;
  const size_t causes = r.stall_causes.size();
  std::vector<double> step, loss, wall, compute, devopt, other, d2h, h2d, h2dw, cost, lost;
  std::vector<std::vector<double>> stall(causes);
  std::vector<double> val;
  size_t next_eval = 0;
  double cum_cost = 0, cum_lost = 0;
  bool any_times = false, priced = false, streamed = false;
  for (const RunSegment& s : r.segments) priced = priced || s.usd_per_hour.has_value();
  for (size_t b = 0; b < n; b += bucket) {
    const size_t e = std::min(n, b + bucket);
    double sum_loss = 0, k_loss = 0, sw = 0, sc = 0, sd = 0, so = 0, sb0 = 0, sb1 = 0, sb2 = 0;
    std::vector<double> ss(causes, 0.0);
    double v = NAN;
    for (size_t i = b; i < e; ++i) {
      const StepRecord& st = r.steps[i];
      if (std::isfinite(st.loss)) {
        sum_loss += st.loss;
        ++k_loss;
      }
      while (next_eval < r.evals.size() && r.evals[next_eval].first <= st.step) {
        if (r.evals[next_eval].first == st.step) v = r.evals[next_eval].second;
        ++next_eval;
      }
      if (!st.has_times) continue;
      any_times = true;
      sw += st.wall;
      sc += st.compute;
      sd += st.device_optimizer;
      double accounted = st.compute + st.device_optimizer;
      for (size_t c = 0; c < causes && c < st.stall.size(); ++c) {
        ss[c] += st.stall[c];
        accounted += st.stall[c];
      }
      so += std::max(0.0, st.wall - accounted);
      sb0 += static_cast<double>(st.bytes_d2h);
      sb1 += static_cast<double>(st.bytes_h2d);
      sb2 += static_cast<double>(st.bytes_h2d_weights);
      const auto& rate = r.segments[std::min(st.segment, r.segments.size() - 1)].usd_per_hour;
      if (rate) {
        cum_cost += *rate * st.wall / 3600.0;
        double stalled = 0;
        for (double x : st.stall) stalled += x;
        cum_lost += *rate * stalled / 3600.0;
      }
    }
    const double k = static_cast<double>(e - b);
    step.push_back(static_cast<double>(r.steps[e - 1].step));
    loss.push_back(k_loss > 0 ? sum_loss / k_loss : NAN);
    val.push_back(v);
    wall.push_back(sw / k);
    compute.push_back(sc / k);
    devopt.push_back(sd / k);
    other.push_back(so / k);
    for (size_t c = 0; c < causes; ++c) stall[c].push_back(ss[c] / k);
    d2h.push_back(sb0 / k);
    h2d.push_back(sb1 / k);
    h2dw.push_back(sb2 / k);
    cost.push_back(cum_cost);
    lost.push_back(cum_lost);
  }
  auto arr = [](const std::vector<double>& xs) {
    json a = json::array();
    for (double x : xs) a.push_back(num(x));
    return a;
  };
  json d{{"step", arr(step)}, {"loss", arr(loss)}, {"val", arr(val)}, {"has_times", any_times}};
  if (any_times) {
    d["wall"] = arr(wall);
    d["compute"] = arr(compute);
    d["device_optimizer"] = arr(devopt);
    d["other"] = arr(other);
    json st = json::array();
    for (size_t c = 0; c < causes; ++c)
      st.push_back({{"cause", r.stall_causes[c]}, {"seconds", arr(stall[c])}});
    d["stall"] = st;
    d["d2h"] = arr(d2h);
    d["h2d"] = arr(h2d);
    for (double b : h2dw) streamed = streamed || b > 0;
    if (streamed) d["h2d_weights"] = arr(h2dw);  // train.offload_parameters
    if (priced) {
      d["cost"] = arr(cost);
      d["lost"] = arr(lost);
    }
  }
  return d;
}

constexpr const char* kPageCss = R"css(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;padding:20px 24px;color:#1d2330;background:#fff}
h1{font-size:22px;margin:0 0 2px}h2{font-size:15px;margin:0 0 6px}
.sub{color:#5b6475;margin:0 0 14px}.sub code{font-size:12px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:8px;margin:0 0 16px}
.tile{border:1px solid #dde2ea;border-radius:6px;padding:8px 10px;background:#f7f9fc}
.tile .k{display:block;color:#5b6475;font-size:12px}.tile b{display:block;font-size:18px;font-weight:600}
.tile small{display:block;color:#5b6475;font-size:11px}
.warn{background:#fff6e0;border:1px solid #f0d48a;border-radius:6px;padding:6px 10px;margin:0 0 12px;font-size:12px}
.chart{margin:0 0 18px}.chart .note{color:#5b6475;font-size:12px;margin:0 0 4px}
.na{color:#5b6475;border:1px dashed #c9d0db;border-radius:6px;padding:10px}
.mem{display:flex;height:26px;border-radius:4px;overflow:hidden;border:1px solid #dde2ea;max-width:1200px}
.mem div{height:100%}.legend{display:flex;flex-wrap:wrap;gap:14px;margin:6px 0 0;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:5px;border-radius:2px}
table{border-collapse:collapse;font-size:12px;margin:0 0 16px}td,th{border-bottom:1px solid #e6e9ef;padding:3px 10px 3px 0;text-align:left}
)css";

// Draws the charts from #run-data (see report_html.h for the attributes it sets).
constexpr const char* kPageJs = R"js(
(function () {
  const body = document.body;
  try {
    const D = JSON.parse(document.getElementById('run-data').textContent);
    const W = Math.max(560, Math.min(1200, document.documentElement.clientWidth - 48));
    const H = 240;
    const palette = {
      loss: '#2563eb', val: '#e11d48', wall: '#0f766e', compute: '#3b82f6', device_optimizer: '#8b5cf6',
      host_optimizer: '#f97316', transfer_d2h: '#eab308', transfer_h2d: '#84cc16', network: '#06b6d4',
      allreduce: '#ec4899', data: '#a16207', checkpoint: '#64748b', checkpoint_upload: '#94a3b8', weight_stream: '#7c3aed',
      other: '#cbd5e1',
      d2h: '#db2777', h2d: '#0891b2', h2d_weights: '#7c3aed', cost: '#16a34a', lost: '#dc2626'
    };
    const extra = ['#9333ea', '#0d9488', '#b91c1c', '#4d7c0f'];
    const colour = (k, i) => palette[k] || extra[i % extra.length];
    const bytes = v => {
      if (v == null) return '-';
      const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
      let i = 0;
      while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
      return (i ? v.toFixed(1) : v.toFixed(0)) + ' ' + u[i];
    };
    const secs = v => v == null ? '-' : (Math.abs(v) < 1 ? (v * 1000).toPrecision(3) + ' ms' : v.toPrecision(4) + ' s');
    const usd = v => v == null ? '-' : '$' + v.toFixed(6);
    const plain = v => v == null ? '-' : (+v).toPrecision(5);
    const plots = [];
    // Whole steps on the x axis.
    const stepIncrs = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000,
                       25000, 50000, 100000, 200000, 250000, 500000, 1000000];
    function draw(id, series, data, yfmt, fromZero) {
      const el = document.getElementById(id);
      if (!el) return;
      const y = fromZero ? { range: (u, min, max) => [0, max > 0 ? max * 1.05 : 1] } : {};
      const opts = {
        width: W, height: H,
        scales: { x: { time: false }, y: y },
        legend: { live: true },
        axes: [{ label: 'step', incrs: stepIncrs }, { size: 84, values: (u, vals) => vals.map(v => yfmt(v)) }],
        series: [{ label: 'step', value: (u, v) => v == null ? '-' : String(v) }].concat(series),
      };
      plots.push([el, new uPlot(opts, data, el)]);
    }
    const line = (label, key, fmt, extraOpts) =>
      Object.assign({ label: label, stroke: colour(key), width: 2, value: (u, v) => fmt(v) }, extraOpts || {});
    const x = D.step;
    if (x.length) draw('chart-loss', [
      line('train loss', 'loss', plain),
      line('validation loss', 'val', plain, { paths: () => null, points: { show: true, size: 9, fill: palette.val } }),
    ], [x, D.loss, D.val], plain);
    if (D.has_times) {
      draw('chart-step-time', [line('step time', 'wall', secs)], [x, D.wall], secs, true);
      // Stacked: each band is drawn from zero to its running total, the topmost first,
      // opaque, so each visible band is that part's share; the legend shows the part itself.
      const parts = [['compute', 'compute', D.compute], ['device optimizer', 'device_optimizer', D.device_optimizer]];
      D.stall.forEach(s => parts.push(['stall: ' + s.cause, s.cause, s.seconds]));
      parts.push(['rest of the loop', 'other', D.other]);
      const totals = [];
      let acc = x.map(() => 0);
      parts.forEach(p => { acc = acc.map((a, i) => a + (p[2][i] || 0)); totals.push(acc); });
      const series = [], data = [x];
      for (let k = parts.length - 1; k >= 0; k--) {
        const raw = parts[k][2];
        series.push({ label: parts[k][0], stroke: colour(parts[k][1], k), fill: colour(parts[k][1], k), width: 1,
                      value: (u, v, si, i) => i == null ? '-' : secs(raw[i]) });
        data.push(totals[k]);
      }
      draw('chart-time', series, data, secs, true);
      if (D.h2d_weights)
        draw('chart-bytes', [line('device → host (d2h)', 'd2h', bytes), line('host → device (h2d)', 'h2d', bytes),
                             line('host → device, weights (h2d_weights)', 'h2d_weights', bytes)],
             [x, D.d2h, D.h2d, D.h2d_weights], bytes, true);
      else
        draw('chart-bytes', [line('device → host (d2h)', 'd2h', bytes), line('host → device (h2d)', 'h2d', bytes)],
             [x, D.d2h, D.h2d], bytes, true);
      if (D.cost)
        draw('chart-cost', [line('spent in steps', 'cost', usd, { fill: 'rgba(22,163,74,0.12)' }),
                            line('lost to stalls', 'lost', usd, { fill: 'rgba(220,38,38,0.15)' })],
             [x, D.cost, D.lost], usd, true);
    }
    // uPlot sizes its canvases in a microtask: measure once they are laid out.
    setTimeout(() => {
      plots.forEach(([el, u]) => {
        const r = u.root.querySelector('canvas').getBoundingClientRect();
        el.dataset.rect = [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height].map(Math.round).join(',');
      });
      body.dataset.charts = String(plots.length);
    }, 0);
  } catch (e) {
    body.dataset.error = String(e && e.stack || e);
    throw e;
  }
})();
)js";

}  // namespace

std::string render_report_html(const RunRecord& r) {
  const RunTotals t = run_totals(r);
  size_t bucket = 1;
  const json data = chart_data(r, &bucket);
  const bool has_times = data.at("has_times").get<bool>();
  const std::string title = r.job.empty() ? r.dir : r.job;

  std::ostringstream h;
  h << "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n"
    << "<title>zenflow report: " << html_escape(title) << "</title>\n"
    << "<!-- Charts drawn with uPlot (https://github.com/leeoniya/uPlot), inlined below under its license:\n"
    << html_escape(kUplotLicense) << "\n-->\n"
    << "<style>" << kUplotCss << "</style>\n<style>" << kPageCss << "</style>\n</head>\n<body>\n";
  h << "<h1>" << html_escape(title) << "</h1>\n<p class=\"sub\">" << html_escape(t.state)
    << " · run directory <code>" << html_escape(r.dir) << "</code> · from <code>" << html_escape(r.source)
    << "</code></p>\n";

  // Headline figures.
  h << "<section class=\"tiles\">\n";
  const std::string of = t.total_steps > 0 ? " of " + std::to_string(t.total_steps) : "";
  h << tile("steps", "steps", std::to_string(t.steps) + of, std::to_string(t.steps));
  h << tile("final-loss", "final train loss",
            std::isfinite(t.final_loss) ? printf_string("%.4f", t.final_loss) : "-",
            std::isfinite(t.final_loss) ? exact(t.final_loss) : "");
  h << tile("val-loss", "validation loss",
            std::isfinite(t.val_loss) ? printf_string("%.4f", t.val_loss) : "not evaluated",
            std::isfinite(t.val_loss) ? exact(t.val_loss) : "",
            std::isfinite(t.val_loss) ? "at step " + std::to_string(t.val_step) + ", perplexity " +
                                            printf_string("%.2f", std::exp(t.val_loss))
                                      : "");
  h << tile("tokens", "tokens trained", std::to_string(t.tokens), std::to_string(t.tokens));
  if (has_times) {
    h << tile("step-seconds-median", "median step time", format_seconds(t.step_seconds_median),
              exact(t.step_seconds_median));
    h << tile("stall-seconds", "exposed stalls", format_seconds(t.stall_seconds), exact(t.stall_seconds),
              t.wall_seconds > 0
                  ? printf_string("%.1f%% of the time in steps", 100 * t.stall_seconds / t.wall_seconds)
                  : "");
    h << tile("bytes-d2h", "PCIe device → host", format_bytes(static_cast<double>(t.bytes_d2h)),
              std::to_string(t.bytes_d2h));
    h << tile("bytes-h2d", "PCIe host → device", format_bytes(static_cast<double>(t.bytes_h2d)),
              std::to_string(t.bytes_h2d));
    if (t.bytes_h2d_weights > 0)  // train.offload_parameters
      h << tile("bytes-h2d-weights", "PCIe host → device, weights streamed",
                format_bytes(static_cast<double>(t.bytes_h2d_weights)), std::to_string(t.bytes_h2d_weights));
  }
  if (t.priced) {
    h << tile("cost-usd", "cost so far", printf_string("$%.6f", t.cost_usd), exact(t.cost_usd),
              printf_string("at $%.4f/h", t.usd_per_hour));
    h << tile("usd-per-1m-tokens", "per 1M tokens",
              t.usd_per_1m_tokens ? printf_string("$%.6f", *t.usd_per_1m_tokens) : "-",
              t.usd_per_1m_tokens ? exact(*t.usd_per_1m_tokens) : "");
    h << tile("usd-lost-to-stalls", "lost to stalls", printf_string("$%.6f", t.usd_lost_to_stalls),
              exact(t.usd_lost_to_stalls));
  } else {
    const std::string hint = "set cost.instance_type or cost.usd_per_hour";
    h << tile("cost-usd", "cost so far", "not priced", "", hint);
    h << tile("usd-per-1m-tokens", "per 1M tokens", "not priced", "");
    h << tile("usd-lost-to-stalls", "lost to stalls", "not priced", "");
  }
  h << "</section>\n";
  for (const std::string& w : r.warnings) h << "<p class=\"warn\">" << html_escape(w) << "</p>\n";

  // Charts (drawn by the script) or why not.
  const std::string averaged =
      bucket > 1 ? " Each point is the mean of " + std::to_string(bucket) + " consecutive steps." : "";
  auto chart = [&](const std::string& id, const std::string& heading, const std::string& note) {
    h << "<section class=\"chart\"><h2>" << html_escape(heading) << "</h2><p class=\"note\">"
      << html_escape(note) << "</p><div id=\"" << id << "\"></div></section>\n";
  };
  auto absent = [&](const std::string& heading, const std::string& why) {
    h << "<section class=\"chart\"><h2>" << html_escape(heading) << "</h2><p class=\"na\">"
      << html_escape(why) << "</p></section>\n";
  };
  const std::string no_times =
      r.from_step_log
          ? "No step recorded yet."
          : "Not recorded: this run directory has no steps.jsonl (the losses come from a checkpoint).";
  if (r.steps.empty())
    absent("Loss", no_times);
  else
    chart("chart-loss", "Loss", "Training loss per step; validation loss where it was measured." + averaged);
  if (has_times) {
    chart("chart-step-time", "Step time", "Wall time of each step on rank 0." + averaged);
    chart("chart-time", "Where each step's time went",
          "Compute, device optimizer, each stall cause and the rest of the loop, stacked to the step's wall "
          "time." +
              averaged);
    chart("chart-bytes", "Bytes moved over PCIe", "Per step, each direction (rank 0)." + averaged);
    if (t.priced)
      chart("chart-cost", "Cost",
            "Dollars accumulated over the steps at the job's rate, and the part of them spent in exposed "
            "stalls. "
            "The total above is the runs' own figure, which also counts setup and the end of each run.");
    else
      absent("Cost", "Not priced: the job has no cost.instance_type or cost.usd_per_hour.");
  } else {
    absent("Step time", no_times);
    absent("Where each step's time went", no_times);
    absent("Bytes moved over PCIe", no_times);
    absent("Cost",
           t.priced ? no_times : "Not priced: the job has no cost.instance_type or cost.usd_per_hour.");
  }

  // Host memory by kind: fixed for a run, so a bar, not a chart.
  h << "<section class=\"chart\" id=\"host-memory\"><h2>Host memory</h2>\n";
  const RunSegment* last = r.segments.empty() ? nullptr : &r.segments.back();
  int64_t state_bytes = 0, machine = 0;
  std::vector<std::pair<std::string, int64_t>> kinds;
  if (last) {
    // The engine's kinds (step_log_lines.h) in their order and words, then any other.
    const std::pair<const char*, const char*> known[] = {
        {host_memory_kind::kMaster, "fp32 master weights"},
        {host_memory_kind::kMoments, "Adam moments"},
        {host_memory_kind::kAccumulators, "gradient accumulators"},
        {host_memory_kind::kPinned, "pinned transfer buffers"},
        {host_memory_kind::kStaging, "transfer buffers"}};
    std::vector<std::pair<std::string, int64_t>> rest = last->host_memory;
    for (const auto& [kind, words] : known)
      for (auto it = rest.begin(); it != rest.end(); ++it)
        if (it->first == kind) {
          kinds.emplace_back(words, it->second);
          rest.erase(it);
          break;
        }
    for (const auto& [kind, bytes] : rest) {
      if (kind == host_memory_kind::kHostTotal)
        machine = bytes;
      else
        kinds.emplace_back(kind, bytes);
    }
    kinds.erase(std::remove_if(kinds.begin(), kinds.end(), [](const auto& k) { return k.second <= 0; }),
                kinds.end());
    for (const auto& k : kinds) state_bytes += k.second;
  }
  if (state_bytes <= 0) {
    h << "<p class=\"na\">"
      << (last && !last->host_memory.empty() ? "No host optimizer state (optimizer.mode: device)."
                                             : "Not recorded.")
      << "</p>\n";
  } else {
    const char* colours[] = {"#3b82f6", "#8b5cf6", "#f97316", "#16a34a", "#eab308", "#64748b"};
    h << "<p class=\"note\">" << format_bytes(static_cast<double>(state_bytes)) << " of host state on rank 0"
      << (machine > 0 ? " (the machine has " + format_bytes(static_cast<double>(machine)) + ")" : "")
      << ".</p>\n";
    h << "<div class=\"mem\">";
    for (size_t i = 0; i < kinds.size(); ++i)
      h << "<div style=\"width:"
        << printf_string("%.3f",
                         100.0 * static_cast<double>(kinds[i].second) / static_cast<double>(state_bytes))
        << "%;background:" << colours[i % 6] << "\" title=\"" << html_escape(kinds[i].first) << "\"></div>";
    h << "</div>\n<div class=\"legend\">";
    for (size_t i = 0; i < kinds.size(); ++i)
      h << "<span><i style=\"background:" << colours[i % 6] << "\"></i>" << html_escape(kinds[i].first) << " "
        << format_bytes(static_cast<double>(kinds[i].second)) << "</span>";
    h << "</div>\n";
  }
  h << "</section>\n";

  // The processes that ran the job.
  if (r.from_step_log && !r.segments.empty()) {
    h << "<section><h2>Runs</h2><table><tr><th>started</th><th>from step</th><th>to step</th><th>ranks</th>"
         "<th>price</th><th>ended</th></tr>\n";
    for (const RunSegment& s : r.segments) {
      const std::string price = s.usd_per_hour
                                    ? printf_string("$%.4f/h", *s.usd_per_hour) + " (" +
                                          (s.price_instance.empty() ? s.price_source : s.price_instance) + ")"
                                    : "not priced";
      const std::string ended = !s.finished     ? "no end recorded (running, or killed)"
                                : s.interrupted ? "interrupted"
                                                : "finished";
      h << "<tr><td>" << format_time(s.started_unix_seconds) << "</td><td>" << s.start_step << "</td><td>"
        << s.last_step << "</td><td>" << s.world_size << (s.device_is_cuda ? " GPU" : " CPU") << "</td><td>"
        << html_escape(price) << "</td><td>" << ended << "</td></tr>\n";
    }
    h << "</table></section>\n";
  }

  h << "<script type=\"application/json\" id=\"run-data\">"
    << script_safe(data.dump(-1, ' ', false, json::error_handler_t::replace)) << "</script>\n";
  h << "<script>" << kUplotJs << "</script>\n<script>" << kPageJs << "</script>\n</body>\n</html>\n";
  return h.str();
}

}  // namespace zenflow::report
