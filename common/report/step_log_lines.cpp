// steps.jsonl's lines, written and read (see step_log_lines.h).
#include "common/report/step_log_lines.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace zenflow::report {

namespace {

using Json = nlohmann::ordered_json;  // keys in the order written: "event" first

// Every key of every line, spelled here only: format_line and from_json both use these, so
// a key renamed is renamed for the writer and the reader at once (the tests pin the text).
namespace key {
constexpr const char* kEvent = "event";
constexpr const char* kJob = "job";
constexpr const char* kStartStep = "start_step";
constexpr const char* kTotalSteps = "total_steps";
constexpr const char* kFresh = "fresh";
constexpr const char* kWorldSize = "world_size";
constexpr const char* kDeviceIsCuda = "device_is_cuda";
constexpr const char* kTokensPerStep = "tokens_per_step";
constexpr const char* kTime = "time";
constexpr const char* kHostMemory = "host_memory";
constexpr const char* kPrice = "price";
constexpr const char* kUsdPerHour = "usd_per_hour";
constexpr const char* kInstanceUsdPerHour = "instance_usd_per_hour";
constexpr const char* kGpusOfInstance = "gpus_of_instance";
constexpr const char* kInstance = "instance";
constexpr const char* kSource = "source";
constexpr const char* kStep = "step";
constexpr const char* kLoss = "loss";
constexpr const char* kLr = "lr";
constexpr const char* kTokens = "tokens";
constexpr const char* kSkipped = "skipped";
constexpr const char* kStalenessSteps = "staleness_steps";
constexpr const char* kSelectedRatio = "selected_ratio";
constexpr const char* kWall = "wall";
constexpr const char* kCompute = "compute";
constexpr const char* kDeviceOptimizer = "device_optimizer";
constexpr const char* kStall = "stall";
constexpr const char* kBytes = "bytes";
constexpr const char* kD2H = "d2h";
constexpr const char* kH2D = "h2d";
constexpr const char* kH2DWeights = "h2d_weights";
constexpr const char* kValLoss = "val_loss";
constexpr const char* kSteps = "steps";
constexpr const char* kInterrupted = "interrupted";
constexpr const char* kSummary = "summary";
}  // namespace key

// A stall cause is written between quotes as it is (no escaping on the per-step path), so
// only names that need none are accepted.
bool plain_name(const std::string& name) noexcept {
  if (name.empty()) return false;
  for (const char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  return true;
}

// One line's JSON object, printed into a fixed buffer: no allocation, so the training
// thread can write a step line per step. Once a piece does not fit, every later call does
// nothing and finish() returns -1.
class LineWriter {
 public:
  LineWriter(char* buf, int cap, const char* event) noexcept : buf_(buf), cap_(cap) {
    put("{\"%s\":\"%s\"", key::kEvent, event);
  }

  void integer(const char* name, int64_t value) noexcept {
    key(name);
    put("%lld", static_cast<long long>(value));
  }
  void boolean(const char* name, bool value) noexcept {
    key(name);
    put("%s", value ? "true" : "false");
  }
  // Shortest text that reads back as the same double is not available to printf, so 17
  // significant digits (an exact round trip); null when not finite.
  void number(const char* name, double value) noexcept {
    key(name);
    put_number(value);
  }
  void stall(const std::vector<StallSeconds>& stall) noexcept {
    key(key::kStall);
    put("{");
    for (size_t i = 0; i < stall.size(); ++i) {
      if (!plain_name(stall[i].cause)) {
        at_ = -1;
        return;
      }
      put("%s\"%s\":", i ? "," : "", stall[i].cause.c_str());
      put_number(stall[i].seconds);
    }
    put("}");
  }
  void bytes(int64_t d2h, int64_t h2d, int64_t h2d_weights) noexcept {
    key(key::kBytes);
    put("{\"%s\":%lld,\"%s\":%lld,\"%s\":%lld}", key::kD2H, static_cast<long long>(d2h), key::kH2D,
        static_cast<long long>(h2d), key::kH2DWeights, static_cast<long long>(h2d_weights));
  }

  // Closes the object and the line: the line's length, or -1.
  int finish() noexcept {
    put("}\n");
    return at_;
  }

 private:
  void key(const char* name) noexcept { put(",\"%s\":", name); }
  void put_number(double x) noexcept {
    if (std::isfinite(x))
      put("%.17g", x);
    else
      put("null");
  }
  [[gnu::format(printf, 2, 3)]] void put(const char* fmt, ...) noexcept {
    if (at_ < 0 || at_ >= cap_) {
      at_ = -1;
      return;
    }
    va_list ap;
    va_start(ap, fmt);
    const int n = std::vsnprintf(buf_ + at_, static_cast<size_t>(cap_ - at_), fmt, ap);
    va_end(ap);
    at_ = n < 0 || n >= cap_ - at_ ? -1 : at_ + n;
  }

  char* buf_;
  int cap_;
  int at_ = 0;
};

std::string dump_line(const Json& line) {
  return line.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::vector<StallSeconds> stall_of(const Json& j) {
  std::vector<StallSeconds> out;
  if (const auto st = j.find(key::kStall); st != j.end() && st->is_object())
    for (const auto& [cause, seconds] : st->items())
      out.push_back({cause, seconds.is_number() ? seconds.get<double>() : kNotRecorded});
  return out;
}

void bytes_of(const Json& j, int64_t* d2h, int64_t* h2d, int64_t* h2d_weights) {
  if (const auto b = j.find(key::kBytes); b != j.end() && b->is_object()) {
    *d2h = integer_field(*b, key::kD2H);
    *h2d = integer_field(*b, key::kH2D);
    *h2d_weights = integer_field(*b, key::kH2DWeights);  // logs before it: 0
  }
}

}  // namespace

int format_line(const StepLine& s, char* buf, int cap) noexcept {
  LineWriter w(buf, cap, StepLine::kEvent);
  w.integer(key::kStep, s.step);
  w.number(key::kLoss, s.loss);
  w.number(key::kLr, s.lr);
  w.integer(key::kTokens, s.tokens);
  w.boolean(key::kSkipped, s.skipped);
  w.integer(key::kStalenessSteps, s.staleness_steps);
  w.number(key::kSelectedRatio, s.selected_ratio);
  w.number(key::kWall, s.wall);
  w.number(key::kCompute, s.compute);
  w.number(key::kDeviceOptimizer, s.device_optimizer);
  w.stall(s.stall);
  w.bytes(s.bytes_d2h, s.bytes_h2d, s.bytes_h2d_weights);
  return w.finish();
}

int format_line(const EvalLine& e, char* buf, int cap) noexcept {
  LineWriter w(buf, cap, EvalLine::kEvent);
  w.integer(key::kStep, e.step);
  w.number(key::kValLoss, e.val_loss);
  return w.finish();
}

int format_line(const FinishLine& f, char* buf, int cap) noexcept {
  LineWriter w(buf, cap, FinishLine::kEvent);
  w.integer(key::kSteps, f.steps);
  w.boolean(key::kInterrupted, f.interrupted);
  w.number(key::kWall, f.wall);
  w.stall(f.stall);
  w.bytes(f.bytes_d2h, f.bytes_h2d, f.bytes_h2d_weights);
  return w.finish();
}

std::string format_line(const StartLine& s) {
  Json host_memory = Json::object();
  for (const auto& [kind, bytes] : s.host_memory) host_memory[kind] = bytes;
  Json price(nullptr);
  if (s.price) {
    const StartPrice& p = *s.price;
    price = Json{{key::kUsdPerHour, p.usd_per_hour},
                 {key::kInstanceUsdPerHour, p.instance_usd_per_hour},
                 {key::kGpusOfInstance, p.gpus_of_instance},
                 {key::kInstance, p.instance.empty() ? Json(nullptr) : Json(p.instance)},
                 {key::kSource, p.source}};
  }
  // nlohmann::json writes a non-finite number as null, as the fixed-buffer lines do.
  return dump_line(Json{{key::kEvent, StartLine::kEvent},
                        {key::kJob, s.job},
                        {key::kStartStep, s.start_step},
                        {key::kTotalSteps, s.total_steps},
                        {key::kFresh, s.fresh},
                        {key::kWorldSize, s.world_size},
                        {key::kDeviceIsCuda, s.device_is_cuda},
                        {key::kTokensPerStep, s.tokens_per_step},
                        {key::kTime, s.time},
                        {key::kHostMemory, host_memory},
                        {key::kPrice, price}});
}

std::string format_line(const SummaryLine& s) {
  return dump_line(Json{{key::kEvent, SummaryLine::kEvent}, {key::kSummary, s.summary}});
}

std::string event_of(const Json& line) { return text_field(line, key::kEvent); }

void from_json(const Json& j, StartLine& out) {
  out = StartLine{};
  out.job = text_field(j, key::kJob);
  out.start_step = integer_field(j, key::kStartStep);
  out.total_steps = integer_field(j, key::kTotalSteps);
  out.fresh = boolean_field(j, key::kFresh);
  out.world_size = integer_field(j, key::kWorldSize, 1);
  out.device_is_cuda = boolean_field(j, key::kDeviceIsCuda);
  out.tokens_per_step = integer_field(j, key::kTokensPerStep);
  out.time = number_field(j, key::kTime);
  if (const auto m = j.find(key::kHostMemory); m != j.end() && m->is_object())
    for (const auto& [kind, bytes] : m->items())
      if (bytes.is_number_integer()) out.host_memory.emplace_back(kind, bytes.get<int64_t>());
  if (const auto p = j.find(key::kPrice); p != j.end() && p->is_object()) {
    StartPrice price;
    price.usd_per_hour = number_field(*p, key::kUsdPerHour);
    price.instance_usd_per_hour = number_field(*p, key::kInstanceUsdPerHour);
    price.gpus_of_instance = integer_field(*p, key::kGpusOfInstance);
    price.instance = text_field(*p, key::kInstance);
    price.source = text_field(*p, key::kSource);
    out.price = std::move(price);
  }
}

void from_json(const Json& j, StepLine& out) {
  out = StepLine{};
  out.step = integer_field(j, key::kStep);
  out.loss = number_field(j, key::kLoss);
  out.lr = number_field(j, key::kLr);
  out.tokens = integer_field(j, key::kTokens);
  out.skipped = boolean_field(j, key::kSkipped);
  out.staleness_steps = integer_field(j, key::kStalenessSteps);
  out.selected_ratio = number_field(j, key::kSelectedRatio);
  out.wall = number_field(j, key::kWall);
  out.compute = number_field(j, key::kCompute);
  out.device_optimizer = number_field(j, key::kDeviceOptimizer);
  out.stall = stall_of(j);
  bytes_of(j, &out.bytes_d2h, &out.bytes_h2d, &out.bytes_h2d_weights);
}

void from_json(const Json& j, EvalLine& out) {
  out = EvalLine{};
  out.step = integer_field(j, key::kStep);
  out.val_loss = number_field(j, key::kValLoss);
}

void from_json(const Json& j, FinishLine& out) {
  out = FinishLine{};
  out.steps = integer_field(j, key::kSteps);
  out.interrupted = boolean_field(j, key::kInterrupted);
  out.wall = number_field(j, key::kWall);
  out.stall = stall_of(j);
  bytes_of(j, &out.bytes_d2h, &out.bytes_h2d, &out.bytes_h2d_weights);
}

void from_json(const Json& j, SummaryLine& out) {
  out = SummaryLine{};
  // Through text: the record keeps nlohmann::json (keys sorted), the line was read ordered.
  if (const auto it = j.find(key::kSummary); it != j.end() && it->is_object())
    out.summary = nlohmann::json::parse(it->dump());
}

}  // namespace zenflow::report
