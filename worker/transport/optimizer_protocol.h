// The payloads of the optimizer-node protocol (wire.h has the header): what a worker's
// remote host optimizer and a zenflow-optimizer node say to each other.
//
// A session is one (job, epoch, rank, node) connection holding one contiguous slice of a
// rank's host state (HostStateLayout, the five fp32 arrays). Ops carry a sequence number
// (WireHeader::seq, from 1, no gaps) and the node runs them in that order, with the rule
// the in-process backend has: accumulates may overtake a running step. The node's token is
// not in any message: the transport's handshake proved it before the channel existed
// (transport.h, handshake.h). Messages:
//   HELLO{Hello} -> WELCOME{Welcome} | ERROR
//   ACCUMULATE{OpDesc} + GRAD per span chunk        -> DONE
//   STEP{OpDesc} + GRAD per span chunk with a grad   -> PARAMS per span chunk with an output
//                                                       (each as soon as its AdamW is done),
//                                                       COMPUTED, DONE
//   STATE_READ{StateDesc}                             -> DATA chunks, DONE
//   STATE_WRITE{StateDesc} + DATA chunks              -> DONE
//   PING -> PONG;  BYE
// Data chunks are at most Hello::chunk_bytes; their header's offset/count place them
// (elements within the span, or within the state op's flat data).
//
// Every decode_* validates what it reads against the session's limits and throws
// WireError naming the field (a node never trusts a worker's counts, nor the reverse).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/engine/adamw_kernel.h"
#include "worker/engine/half.h"
#include "worker/transport/wire.h"

namespace zenflow::transport {

constexpr uint32_t kGradNone = 0xffffffffu;  // OpSpan::grad_type: the span has no gradient data

// OpSpan::out_kind: a step span's output, sent back in PARAMS as the step runs:
// none, the updated master in low precision (1 + engine::HalfKind: bf16, fp16), or the
// updated master itself (fp32 weights). The spans of one STEP with an output all have
// outputs of one element size (decode_op checks it).
constexpr uint32_t kOutNone = 0;
constexpr uint32_t kOutMaster = 3;
// Bytes per element of an output kind (0 for none); throws WireError for an unknown one.
size_t out_kind_bytes(uint32_t kind);

struct Hello {
  std::string job;     // job id or name
  uint32_t rank = 0;   // data-parallel rank
  uint32_t world = 1;
  uint32_t slice = 0;  // which of the rank's node slices this session holds
  uint64_t elements = 0;      // per array (the slice's length)
  uint64_t chunk_bytes = 8u << 20;
  uint32_t huge_pages = 1;
  std::string host_isa;  // the worker's host kernel ISA (bit-identity needs the same)
  // HostStateLayout::accumulators: 0 when the engine opens no windows (offload mode), so
  // the session holds master, m and v only (12 B per element instead of 20).
  uint32_t accumulators = 1;
};

struct Welcome {
  std::string node;      // the node's name (its listen address)
  uint32_t threads = 1;  // compute threads of the session
  uint32_t credits = 4;  // ops with data the worker may have outstanding
  std::string host_isa;
  uint64_t memory_limit = 0;  // bytes (0 = unlimited)
  uint64_t memory_used = 0;   // bytes, this session included
};

struct OpSpan {
  uint64_t offset = 0;  // into the session's arrays
  uint64_t n = 0;
  uint32_t grad_type = kGradNone;  // engine::GradRef::Type, or kGradNone
  uint32_t out_kind = kOutNone;    // steps only: what PARAMS carry back for the span
  engine::AdamWCoeffs coeffs;      // steps only
};

// ACCUMULATE (aux = accumulator HostBuf, flags kFlagOverwrite, scale) and STEP (aux =
// accumulator HostBuf + 1, 0 = none; scale = grad_scale).
struct OpDesc {
  std::vector<OpSpan> spans;
};

struct StateDesc {
  // 0: the range [offset, offset + n); 1: columns `cols` of a [rows, width] matrix;
  // 2 (writes only): a re-pack of that matrix (HostOptimizer::repack_columns), `cols` its
  // source columns, the data its appended columns, [rows, n / rows].
  uint32_t columns = 0;
  uint64_t offset = 0;
  uint64_t n = 0;  // the data's length: the range's; rows * cols.size(); rows * appended
  uint64_t rows = 0, width = 0;
  std::vector<int64_t> cols;
};

size_t grad_type_bytes(uint32_t grad_type);  // 4 or 2; throws WireError for an unknown type

std::string encode_hello(const Hello& h);
Hello decode_hello(const void* data, size_t len);
std::string encode_welcome(const Welcome& w);
Welcome decode_welcome(const void* data, size_t len);
std::string encode_op(const OpDesc& d, bool step);
// `elements`: the session's array length; every span must lie inside it.
OpDesc decode_op(const void* data, size_t len, bool step, uint64_t elements);
std::string encode_state(const StateDesc& d);
StateDesc decode_state(const void* data, size_t len, uint64_t elements);

// A header for session `session` of epoch `epoch`.
WireHeader make_header(MsgType type, uint64_t epoch, uint32_t session, uint64_t seq = 0);

}  // namespace zenflow::transport
