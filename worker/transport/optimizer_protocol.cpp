// Optimizer-node payload codecs (see optimizer_protocol.h).
#include "worker/transport/optimizer_protocol.h"

#include <cstring>

namespace zenflow::transport {
namespace {

constexpr size_t kMaxString = 4096;
constexpr uint64_t kMaxSpans = 1u << 20;
constexpr uint64_t kMaxElements = uint64_t{1} << 40;  // 4 TiB of fp32 per array

class Writer {
 public:
  void u32(uint32_t v) { put(&v, 4); }
  void u64(uint64_t v) { put(&v, 8); }
  void f32(float v) { put(&v, 4); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string take() { return std::move(out_); }

 private:
  void put(const void* p, size_t n) {  // little-endian hosts only (x86-64, aarch64)
    out_.append(static_cast<const char*>(p), n);
  }
  std::string out_;
};

class Reader {
 public:
  Reader(const void* data, size_t len, const char* what) : p_(static_cast<const char*>(data)), len_(len), what_(what) {}
  uint32_t u32(const char* field) {
    uint32_t v;
    get(&v, 4, field);
    return v;
  }
  uint64_t u64(const char* field) {
    uint64_t v;
    get(&v, 8, field);
    return v;
  }
  float f32(const char* field) {
    float v;
    get(&v, 4, field);
    return v;
  }
  std::string str(const char* field) {
    const uint32_t n = u32(field);
    if (n > kMaxString) fail(std::string(field) + " is " + std::to_string(n) + " bytes (at most " + std::to_string(kMaxString) + ")");
    need(n, field);
    std::string s(p_ + at_, n);
    at_ += n;
    return s;
  }
  void done() {
    if (at_ != len_) fail(std::to_string(len_ - at_) + " trailing bytes");
  }
  [[noreturn]] void fail(const std::string& why) const { throw WireError(std::string("wire: ") + what_ + ": " + why); }

 private:
  void need(size_t n, const char* field) const {
    if (len_ - at_ < n)
      fail(std::string("truncated at ") + field + " (" + std::to_string(len_) + " bytes, " + field + " needs " +
           std::to_string(at_ + n) + ")");
  }
  void get(void* v, size_t n, const char* field) {
    need(n, field);
    std::memcpy(v, p_ + at_, n);
    at_ += n;
  }
  const char* p_;
  size_t len_;
  size_t at_ = 0;
  const char* what_;
};

void check_extent(Reader& r, const char* field, uint64_t offset, uint64_t n, uint64_t elements) {
  if (n > elements || offset > elements - n)
    r.fail(std::string(field) + " [" + std::to_string(offset) + ", +" + std::to_string(n) + ") outside the session's " +
           std::to_string(elements) + " elements");
}

}  // namespace

size_t grad_type_bytes(uint32_t t) {
  switch (t) {
    case static_cast<uint32_t>(engine::GradRef::Type::kF32): return 4;
    case static_cast<uint32_t>(engine::GradRef::Type::kBF16):
    case static_cast<uint32_t>(engine::GradRef::Type::kFP16): return 2;
  }
  throw WireError("wire: unknown gradient type " + std::to_string(t));
}

std::string encode_hello(const Hello& h) {
  Writer w;
  w.str(h.job);
  w.u32(h.rank);
  w.u32(h.world);
  w.u32(h.slice);
  w.u64(h.elements);
  w.u64(h.chunk_bytes);
  w.u32(h.huge_pages);
  w.str(h.host_isa);
  w.u32(h.accumulators);
  return w.take();
}

Hello decode_hello(const void* data, size_t len) {
  Reader r(data, len, "HELLO");
  Hello h;
  h.job = r.str("job");
  h.rank = r.u32("rank");
  h.world = r.u32("world");
  h.slice = r.u32("slice");
  h.elements = r.u64("elements");
  h.chunk_bytes = r.u64("chunk_bytes");
  h.huge_pages = r.u32("huge_pages");
  h.host_isa = r.str("host_isa");
  h.accumulators = r.u32("accumulators");
  r.done();
  if (h.accumulators > 1) r.fail("accumulators " + std::to_string(h.accumulators) + " (0 or 1)");
  if (h.world == 0 || h.rank >= h.world) r.fail("rank " + std::to_string(h.rank) + " of world " + std::to_string(h.world));
  if (h.elements > kMaxElements) r.fail("elements " + std::to_string(h.elements) + " (at most 2^40)");
  if (h.chunk_bytes < 4096 || h.chunk_bytes > (uint64_t{1} << 30))
    r.fail("chunk_bytes " + std::to_string(h.chunk_bytes) + " outside [4096, 2^30]");
  return h;
}

std::string encode_welcome(const Welcome& x) {
  Writer w;
  w.str(x.node);
  w.u32(x.threads);
  w.u32(x.credits);
  w.str(x.host_isa);
  w.u64(x.memory_limit);
  w.u64(x.memory_used);
  return w.take();
}

Welcome decode_welcome(const void* data, size_t len) {
  Reader r(data, len, "WELCOME");
  Welcome x;
  x.node = r.str("node");
  x.threads = r.u32("threads");
  x.credits = r.u32("credits");
  x.host_isa = r.str("host_isa");
  x.memory_limit = r.u64("memory_limit");
  x.memory_used = r.u64("memory_used");
  r.done();
  if (x.credits == 0 || x.credits > 1024) r.fail("credits " + std::to_string(x.credits) + " outside [1, 1024]");
  return x;
}

size_t out_kind_bytes(uint32_t kind) {
  switch (kind) {
    case kOutNone:
      return 0;
    case 1 + static_cast<uint32_t>(engine::HalfKind::kBF16):
    case 1 + static_cast<uint32_t>(engine::HalfKind::kFP16):
      return 2;
    case kOutMaster:
      return 4;
    default:
      throw WireError("wire: output kind " + std::to_string(kind));
  }
}

std::string encode_op(const OpDesc& d, bool step) {
  Writer w;
  w.u64(d.spans.size());
  for (const OpSpan& s : d.spans) {
    w.u64(s.offset);
    w.u64(s.n);
    w.u32(s.grad_type);
    if (step) {
      w.u32(s.out_kind);
      const engine::AdamWCoeffs& c = s.coeffs;
      for (float f : {c.beta1, c.beta2, c.one_minus_beta1, c.one_minus_beta2, c.decay, c.step_size, c.inv_sqrt_bc2, c.eps})
        w.f32(f);
    }
  }
  return w.take();
}

OpDesc decode_op(const void* data, size_t len, bool step, uint64_t elements) {
  Reader r(data, len, step ? "STEP" : "ACCUMULATE");
  OpDesc d;
  const uint64_t n = r.u64("span count");
  if (n > kMaxSpans) r.fail("span count " + std::to_string(n) + " (at most 2^20)");
  const size_t per = step ? 8 + 8 + 4 + 4 + 32 : 8 + 8 + 4;
  if (n * per != len - 8) r.fail(std::to_string(n) + " spans need " + std::to_string(8 + n * per) + " bytes, got " + std::to_string(len));
  d.spans.resize(n);
  size_t out_bytes = 0;  // of the step's outputs
  for (OpSpan& s : d.spans) {
    s.offset = r.u64("span offset");
    s.n = r.u64("span length");
    s.grad_type = r.u32("gradient type");
    check_extent(r, "span", s.offset, s.n, elements);
    if (s.grad_type != kGradNone) grad_type_bytes(s.grad_type);
    else if (!step) r.fail("an accumulate span without a gradient");
    if (step) {
      s.out_kind = r.u32("output kind");
      if (s.out_kind > kOutMaster) r.fail("output kind " + std::to_string(s.out_kind));
      const size_t bytes = out_kind_bytes(s.out_kind);
      if (bytes != 0 && out_bytes != 0 && bytes != out_bytes)
        r.fail("outputs of " + std::to_string(out_bytes) + " and " + std::to_string(bytes) +
               " bytes in one step");
      if (bytes != 0) out_bytes = bytes;
      engine::AdamWCoeffs& c = s.coeffs;
      for (float* f : {&c.beta1, &c.beta2, &c.one_minus_beta1, &c.one_minus_beta2, &c.decay, &c.step_size, &c.inv_sqrt_bc2, &c.eps})
        *f = r.f32("coefficient");
    }
  }
  r.done();
  return d;
}

std::string encode_state(const StateDesc& d) {
  Writer w;
  w.u32(d.columns);
  w.u64(d.offset);
  w.u64(d.n);
  w.u64(d.rows);
  w.u64(d.width);
  w.u64(d.cols.size());
  for (int64_t c : d.cols) w.u64(static_cast<uint64_t>(c));
  return w.take();
}

StateDesc decode_state(const void* data, size_t len, uint64_t elements) {
  Reader r(data, len, "STATE");
  StateDesc d;
  d.columns = r.u32("mode");
  d.offset = r.u64("offset");
  d.n = r.u64("length");
  d.rows = r.u64("rows");
  d.width = r.u64("width");
  const uint64_t nc = r.u64("column count");
  if (d.columns > 2) r.fail("mode " + std::to_string(d.columns) + " (0 range, 1 columns, 2 re-pack)");
  if (nc > (len - 44) / 8 || nc * 8 != len - 44)
    r.fail(std::to_string(nc) + " columns need " + std::to_string(44 + nc * 8) + " bytes, got " + std::to_string(len));
  d.cols.resize(nc);
  for (int64_t& c : d.cols) c = static_cast<int64_t>(r.u64("column"));
  r.done();
  // A column is an int64_t index below the matrix's width: one past 2^63 - 1 (negative as an
  // index) is refused whatever the width, which a matrix of 0 rows leaves unbounded.
  if (d.columns == 0) {
    for (int64_t c : d.cols)
      if (c < 0 || static_cast<uint64_t>(c) >= d.width)
        r.fail("column " + std::to_string(static_cast<uint64_t>(c)) + " outside a matrix " +
               std::to_string(d.width) + " wide");
    check_extent(r, "range", d.offset, d.n, elements);
    return d;
  }
  if (d.width != 0 && d.rows > elements / d.width)
    r.fail("matrix " + std::to_string(d.rows) + " x " + std::to_string(d.width) + " too large");
  check_extent(r, "matrix", d.offset, d.rows * d.width, elements);
  uint64_t bound = d.width;  // columns are below it
  if (d.columns == 1) {
    if (d.n != d.rows * nc) r.fail("length " + std::to_string(d.n) + " is not rows x columns = " + std::to_string(d.rows * nc));
  } else {
    if (d.rows == 0) r.fail("a re-pack of 0 rows");
    if (d.n % d.rows != 0)
      r.fail("length " + std::to_string(d.n) + " is not a multiple of the " + std::to_string(d.rows) +
             " rows");
    if (d.n / d.rows > nc)
      r.fail(std::to_string(d.n / d.rows) + " appended columns for " + std::to_string(nc) +
             " re-packed ones");
    if (nc != 0 && d.rows > elements / nc)
      r.fail("re-packed matrix " + std::to_string(d.rows) + " x " + std::to_string(nc) + " too large");
    check_extent(r, "re-packed matrix", d.offset, d.rows * nc, elements);
    bound += d.n / d.rows;  // the appended columns
  }
  for (int64_t c : d.cols)
    if (c < 0 || static_cast<uint64_t>(c) >= bound)
      r.fail("column " + std::to_string(static_cast<uint64_t>(c)) + " outside a matrix " +
             std::to_string(bound) + " wide");
  return d;
}

WireHeader make_header(MsgType type, uint64_t epoch, uint32_t session, uint64_t seq) {
  WireHeader h;
  h.type = type;
  h.job_epoch = epoch;
  h.session = session;
  h.seq = seq;
  return h;
}

}  // namespace zenflow::transport
