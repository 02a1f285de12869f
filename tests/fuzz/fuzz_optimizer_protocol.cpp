// libFuzzer target: the optimizer-node protocol's parsers (wire.h's header, the payload
// decoders of optimizer_protocol.h) on arbitrary bytes, as a node or a worker receives
// them from the network. Run by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
//
// Properties, each a crash (abort) when broken:
//  * every input is either accepted or refused with a WireError: no other exception, no
//    out-of-bounds read, no undefined behaviour (the sanitizers);
//  * what is accepted respects the limits it was decoded against (spans and state ranges
//    inside the session's elements, the header's payload length as received);
//  * what is accepted re-encodes to bytes that decode to the same values (round trip).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "worker/transport/optimizer_protocol.h"
#include "worker/transport/wire.h"

namespace {

using namespace zenflow::transport;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_optimizer_protocol: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) broken(what);
}

bool same(const OpDesc& a, const OpDesc& b, bool step) {
  if (a.spans.size() != b.spans.size()) return false;
  for (size_t i = 0; i < a.spans.size(); ++i) {
    const OpSpan &x = a.spans[i], &y = b.spans[i];
    if (x.offset != y.offset || x.n != y.n || x.grad_type != y.grad_type) return false;
    if (step && (x.out_kind != y.out_kind || std::memcmp(&x.coeffs, &y.coeffs, sizeof x.coeffs) != 0))
      return false;
  }
  return true;
}

void fuzz_header(const uint8_t* data, size_t size) {
  if (size < kWireHeaderBytes) {
    try {
      decode(data, size, 0);
      broken("a truncated header was accepted");
    } catch (const WireError&) {
    }
    return;
  }
  const size_t payload_len = size - kWireHeaderBytes;
  WireLimits limits;
  limits.max_payload_bytes = 1 << 20;
  limits.max_offset_plus_count = uint64_t{1} << 40;
  WireHeader h;
  try {
    h = decode(data, kWireHeaderBytes, payload_len, limits, data + kWireHeaderBytes);
  } catch (const WireError&) {
    return;
  }
  check(h.payload_bytes == payload_len, "a header whose payload length differs from what arrived was accepted");
  check(h.payload_bytes < limits.max_payload_bytes, "a payload over the limit was accepted");
  check(h.offset <= limits.max_offset_plus_count && h.count <= limits.max_offset_plus_count - h.offset,
        "offset + count over the limit was accepted");
  unsigned char again[kWireHeaderBytes];
  encode(h, again, data + kWireHeaderBytes, payload_len);
  const WireHeader h2 = decode(again, kWireHeaderBytes, payload_len, limits, data + kWireHeaderBytes);
  check(h2.type == h.type && h2.seq == h.seq && h2.offset == h.offset && h2.count == h.count &&
            h2.job_epoch == h.job_epoch && h2.aux == h.aux && h2.flags == h.flags,
        "a header did not survive its round trip");
}

void fuzz_payload(uint8_t which, uint64_t elements, const uint8_t* data, size_t size) {
  try {
    switch (which % 5) {
      case 0: {
        const Hello h = decode_hello(data, size);
        const std::string e = encode_hello(h);
        const Hello h2 = decode_hello(e.data(), e.size());
        check(h2.job == h.job && h2.rank == h.rank && h2.world == h.world &&
                  h2.elements == h.elements && h2.chunk_bytes == h.chunk_bytes && h2.host_isa == h.host_isa,
              "HELLO did not survive its round trip");
        break;
      }
      case 1: {
        const Welcome w = decode_welcome(data, size);
        const std::string e = encode_welcome(w);
        const Welcome w2 = decode_welcome(e.data(), e.size());
        check(w2.node == w.node && w2.threads == w.threads && w2.credits == w.credits &&
                  w2.memory_limit == w.memory_limit && w2.memory_used == w.memory_used,
              "WELCOME did not survive its round trip");
        break;
      }
      case 2:
      case 3: {
        const bool step = which % 5 == 3;
        const OpDesc d = decode_op(data, size, step, elements);
        size_t out_bytes = 0;
        for (const OpSpan& s : d.spans) {
          check(s.offset <= elements && s.n <= elements - s.offset, "a span outside the session was accepted");
          const size_t b = out_kind_bytes(s.out_kind);  // throws for an unknown kind: not accepted
          check(b == 0 || out_bytes == 0 || b == out_bytes, "a step with outputs of two sizes was accepted");
          if (b != 0) out_bytes = b;
        }
        const std::string e = encode_op(d, step);
        check(same(decode_op(e.data(), e.size(), step, elements), d, step), "an op did not survive its round trip");
        break;
      }
      case 4: {
        const StateDesc d = decode_state(data, size, elements);
        if (d.columns == 0) {
          check(d.offset <= elements && d.n <= elements - d.offset, "a state range outside the session was accepted");
        } else {
          check(d.columns <= 2, "an unknown state mode was accepted");
          check(d.width == 0 || d.rows <= elements / d.width, "a matrix larger than the session was accepted");
          check(d.offset <= elements && d.rows * d.width <= elements - d.offset,
                "a matrix outside the session was accepted");
          uint64_t bound = d.width;
          if (d.columns == 1) {
            check(d.n == d.rows * d.cols.size(), "a column read whose length is not rows x columns");
          } else {  // a re-pack: its result and its appended columns fit too
            check(d.rows > 0 && d.n % d.rows == 0 && d.n / d.rows <= d.cols.size(),
                  "a re-pack whose appended columns are not [rows, at most its columns]");
            check(d.cols.size() <= elements / d.rows && d.rows * d.cols.size() <= elements - d.offset,
                  "a re-packed matrix outside the session was accepted");
            bound += d.n / d.rows;
          }
          for (int64_t c : d.cols)
            check(c >= 0 && static_cast<uint64_t>(c) < bound, "a column outside its matrix");
        }
        const std::string e = encode_state(d);
        const StateDesc d2 = decode_state(e.data(), e.size(), elements);
        check(d2.columns == d.columns && d2.offset == d.offset && d2.n == d.n && d2.cols == d.cols,
              "a state descriptor did not survive its round trip");
        break;
      }
    }
  } catch (const WireError&) {
  }
}

void write_seed(const std::string& dir, const std::string& name, uint8_t which, const std::string& body) {
  std::string bytes = {static_cast<char>(which), 0x10, 0x00};  // 4096 elements
  bytes += body;
  if (FILE* f = std::fopen((dir + "/" + name).c_str(), "wb")) {
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
}

}  // namespace

// With ZENFLOW_FUZZ_SEEDS=DIR: one valid message of every kind into DIR (the corpus).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("ZENFLOW_FUZZ_SEEDS");
  if (dir == nullptr) return 0;
  Hello h;
  h.job = "job-1";
  h.rank = 1;
  h.world = 2;
  h.elements = 4096;
  h.host_isa = "avx2";
  Welcome w;
  w.node = "127.0.0.1:7400";
  w.memory_limit = 1 << 30;
  OpDesc op;
  OpSpan a;
  a.offset = 16;
  a.n = 100;
  a.grad_type = 1;
  a.out_kind = 1;
  op.spans = {a, a};
  op.spans[1].offset = 1000;
  OpDesc master_op = op;  // fp32 weights: the master comes back
  for (OpSpan& s : master_op.spans) s.out_kind = kOutMaster;
  StateDesc range;
  range.offset = 8;
  range.n = 64;
  StateDesc cols;
  cols.columns = 1;
  cols.offset = 128;
  cols.rows = 4;
  cols.width = 16;
  cols.cols = {0, 3, 15};
  cols.n = 12;
  StateDesc repack = cols;  // [4, 16] -> [4, 4], one appended column
  repack.columns = 2;
  repack.cols = {16, 0, 3, 15};
  repack.n = 4;
  const std::string payload = "0123456789abcdef";
  WireHeader hd = make_header(MsgType::kGrad, 3, 1, 7);
  hd.offset = 32;
  hd.count = 8;
  hd.payload_bytes = static_cast<uint32_t>(payload.size());
  hd.flags = kFlagCrc;
  unsigned char hb[kWireHeaderBytes];
  encode(hd, hb, payload.data(), payload.size());
  write_seed(dir, "header", 0, std::string(reinterpret_cast<char*>(hb), sizeof hb) + payload);
  write_seed(dir, "hello", 1, encode_hello(h));
  write_seed(dir, "welcome", 2, encode_welcome(w));
  write_seed(dir, "accumulate", 3, encode_op(op, false));
  write_seed(dir, "step", 4, encode_op(op, true));
  write_seed(dir, "step-master", 4, encode_op(master_op, true));
  write_seed(dir, "state-range", 5, encode_state(range));
  write_seed(dir, "state-columns", 5, encode_state(cols));
  write_seed(dir, "state-repack", 5, encode_state(repack));
  return 0;
}

// Byte 0 chooses the parser (0: the header, else a payload decoder), bytes 1-2 the
// session's elements for the ones that take it; the rest is the message.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t which = data[0];
  const uint64_t elements = uint64_t{data[1]} << 8 | data[2];
  try {
    if (which % 6 == 0)
      fuzz_header(data + 3, size - 3);
    else
      fuzz_payload(static_cast<uint8_t>(which % 6 - 1), elements, data + 3, size - 3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_optimizer_protocol: %s\n", e.what());
    broken("an exception other than WireError");
  }
  return 0;
}
