// zenflow-optimizer sessions: the node side of the optimizer-node protocol
// (worker/transport/optimizer_protocol.h).
#include "worker/optimizer_node/optimizer_node.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "worker/engine/host_isa.h"
#include "worker/engine/host_optimizer.h"
#include "worker/transport/optimizer_protocol.h"
#include "worker/transport/transport.h"

namespace zenflow::optimizer_node {
namespace {

using transport::Channel;
using transport::ChannelHandler;
using transport::ErrorCode;
using transport::MsgType;
using transport::WireError;
using transport::WireHeader;

std::string gib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return std::string(b) + " (" + std::to_string(bytes) + " bytes)";
}

// A session's gradient, output and state-read buffers, reused from op to op. A window's
// buffers are hundreds of MB, and a fresh one costs a page fault and a zeroed page per
// 4 KiB (and std::vector zeroed it once more): on a node that shares its cores, that was
// CPU taken from the window step. A buffer is reused for n bytes when its capacity is in
// [n, 2n]; at most kKeep free ones are kept, so the pool never holds more than the ops in
// flight did at their peak. One pool per session: a reused buffer's stale bytes never
// come from another job's session.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr size_t kKeep = 4;
  // n uninitialized bytes, given back to the pool when the last reference goes (freed
  // instead once the pool is gone).
  std::shared_ptr<char> take(size_t n) {
    std::unique_ptr<char[]> p;
    size_t cap = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i)
        if (free_[i].first >= n && free_[i].first / 2 <= n && (best == free_.size() || free_[i].first < free_[best].first))
          best = i;
      if (best < free_.size()) {
        cap = free_[best].first;
        p = std::move(free_[best].second);
        free_.erase(free_.begin() + static_cast<long>(best));
      }
    }
    if (!p) {
      cap = std::max<size_t>(n, 1);
      p.reset(new char[cap]);
    }
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return std::shared_ptr<char>(p.release(), [pool, cap](char* q) {
      std::unique_ptr<char[]> owned(q);
      if (auto self = pool.lock()) self->give_back(cap, std::move(owned));
    });
  }

 private:
  void give_back(size_t cap, std::unique_ptr<char[]> p) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace_back(cap, std::move(p));
    if (free_.size() > kKeep) free_.erase(free_.begin());  // the oldest goes
  }
  std::mutex mu_;
  std::vector<std::pair<size_t, std::unique_ptr<char[]>>> free_;
};

// A state transfer's columns (StateDesc with `columns` set) of host array b, with data at `data`.
engine::ColumnBlock column_block(engine::HostBuf b, const transport::StateDesc& d, float* data) {
  return engine::ColumnBlock{b,
                             static_cast<int64_t>(d.offset),
                             static_cast<int64_t>(d.rows),
                             static_cast<int64_t>(d.width),
                             d.cols,
                             data};
}

// An op being received: its descriptor and the bytes that follow it.
struct Op {
  WireHeader h;
  transport::OpDesc desc;
  transport::StateDesc state;
  std::vector<uint64_t> span_bytes_at;  // byte offset of each span's gradient in `data`
  std::shared_ptr<char> buf;            // `bytes` of gradients or state (from the session's pool)
  uint64_t bytes = 0;
  uint64_t received = 0;
  char* data() const { return buf.get(); }
  bool ready() const { return received == bytes; }
};

// One op's reply: kind (DATA or PARAMS) messages of at most chunk_elems elements each,
// then DONE{seq, count = bytes sent, scale = seconds} once every one of them has been
// sent and the reply is closed (send completions come in any order; the worker places
// each message by span and offset). `keep` holds the memory sent from until then.
class Reply : public std::enable_shared_from_this<Reply> {
 public:
  Reply(std::shared_ptr<Channel> ch, WireHeader proto, MsgType kind, size_t elem_bytes, uint64_t chunk_elems,
        std::shared_ptr<void> keep)
      : ch_(std::move(ch)),
        proto_(proto),
        kind_(kind),
        elem_bytes_(elem_bytes),
        chunk_elems_(std::max<uint64_t>(1, chunk_elems)),
        keep_(std::move(keep)) {}

  // Elements [offset, offset + n) of reply span `span`, read from `data`. One thread at a
  // time, before close().
  void send(uint32_t span, uint64_t offset, const char* data, uint64_t n) {
    for (uint64_t off = 0; off < n; off += chunk_elems_) {
      const uint64_t k = std::min(chunk_elems_, n - off);
      WireHeader m = proto_;
      m.type = kind_;
      m.aux = span;
      m.offset = offset + off;
      m.count = k;
      m.payload_bytes = static_cast<uint32_t>(k * elem_bytes_);
      bytes_ += k * elem_bytes_;
      ++left_;
      unsigned char buf[transport::kWireHeaderBytes];
      transport::encode(m, buf);
      ch_->send(buf, sizeof buf, data + off * elem_bytes_, k * elem_bytes_,
                [self = shared_from_this()](bool ok, const std::string&) {
                  if (ok) self->release();  // a failed send fails the channel: the worker sees on_error
                });
    }
  }
  // No more sends: DONE leaves once those in flight have completed.
  void close(float seconds) {
    seconds_ = seconds;
    release();
  }

 private:
  void release() {
    if (--left_ != 0) return;
    WireHeader d = proto_;
    d.type = MsgType::kDone;
    d.count = bytes_;
    d.scale = seconds_;
    unsigned char buf[transport::kWireHeaderBytes];
    transport::encode(d, buf);
    ch_->send(buf, sizeof buf, nullptr, 0, {});
  }

  std::shared_ptr<Channel> ch_;
  WireHeader proto_;  // epoch, session and seq
  MsgType kind_;
  size_t elem_bytes_;
  uint64_t chunk_elems_;
  std::shared_ptr<void> keep_;
  std::atomic<int64_t> left_{1};  // sends in flight, plus one until close()
  uint64_t bytes_ = 0;            // written before the sends they count (and close) release
  float seconds_ = -1;
};

// A window step's outputs, streamed while the step runs (StepJob::after_chunk, on the
// host optimizer's thread): the finished elements' outputs leave once at least
// `flush_bytes` of them are waiting, and the rest with the last chunk, so that the return
// transfer overlaps the AdamW of the chunks after them instead of following the whole step.
struct StepStream {
  std::shared_ptr<Reply> reply;
  std::vector<uint64_t> starts, sizes;  // each span's first element, end to end, and count
  std::vector<const char*> out;         // each span's output (null: none)
  size_t elem_bytes = 0;
  uint64_t total = 0, flush_bytes = 0;
  uint64_t sent_to = 0;  // elements [0, sent_to) are sent
  size_t span = 0;       // the span holding element sent_to

  void finished(int64_t lo, int64_t hi) {
    (void)lo;  // chunks finish in order: [sent_to, hi) is done
    const uint64_t done = static_cast<uint64_t>(hi);
    if (done > total || done < sent_to) throw std::logic_error("a step chunk out of order");
    if (done < total && waiting_bytes(done) < flush_bytes) return;
    for (; span < sizes.size() && starts[span] < done; ++span) {
      const uint64_t b = std::max(sent_to, starts[span]) - starts[span];
      const uint64_t e = std::min(done, starts[span] + sizes[span]) - starts[span];
      if (out[span] && e > b) reply->send(static_cast<uint32_t>(span), b, out[span] + b * elem_bytes, e - b);
      if (starts[span] + sizes[span] > done) break;  // this span goes on in the next chunk
    }
    sent_to = done;
  }
  // Output bytes of the elements [sent_to, done).
  uint64_t waiting_bytes(uint64_t done) const {
    uint64_t n = 0;
    for (size_t i = span; i < sizes.size() && starts[i] < done; ++i)
      if (out[i]) n += std::min(done, starts[i] + sizes[i]) - std::max(sent_to, starts[i]);
    return n * elem_bytes;
  }
};

}  // namespace

std::string session_key(const transport::Hello& h) { return h.job + "#" + std::to_string(h.rank); }

// One worker connection: one slice of one rank's host state.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(OptimizerNode::Impl& node, std::shared_ptr<Channel> ch, uint32_t id) : node_(node), ch_(std::move(ch)), id_(id) {}
  ~Session() { shutdown(); }

  ChannelHandler handler();
  void start() {
    op_thread_ = std::thread([this] { run_ops(); });
    acc_thread_ = std::thread([this] { run_completions(acc_done_); });
    step_thread_ = std::thread([this] { run_completions(step_done_); });
  }
  // Ends the session: no more ops; the state is freed. Safe to call repeatedly.
  void shutdown();
  // Refuses and ends the session (a newer epoch of its job arrived).
  void fence(const std::string& why) {
    send_error(ErrorCode::kStaleEpoch, why);
    end(why);
  }
  // The (job, rank) key and epoch; written and read under the node's mutex.
  const std::string& job() const { return job_; }
  transport::ChannelStats channel_stats() const { return ch_->stats(); }
  void bind(const std::string& key) { job_ = key; }
  uint64_t epoch() const { return epoch_; }
  int64_t state_bytes() const { return state_bytes_; }

 private:
  struct Completion {
    uint64_t seq = 0;
    std::shared_ptr<engine::HostWork> work;
    std::shared_ptr<Op> op;
    std::shared_ptr<Reply> reply;  // STEP: its PARAMS, streamed while it runs
  };
  struct CompletionQueue {
    std::deque<Completion> q;
  };

  void* place(const void* header, size_t hlen, size_t len);
  void on_message(const void* header, size_t hlen, void* data, size_t len);
  void run_ops();
  void run_completions(CompletionQueue& cq);
  void hello(const WireHeader& h, const std::vector<char>& body);
  void run_op(const std::shared_ptr<Op>& op);
  void send(const WireHeader& h, const void* payload, size_t len, transport::SendDone done = {}) {
    unsigned char buf[transport::kWireHeaderBytes];
    transport::encode(h, buf);
    ch_->send(buf, sizeof buf, payload, len, std::move(done));
  }
  void send_error(ErrorCode code, const std::string& text) {
    WireHeader h = transport::make_header(MsgType::kError, epoch_, id_);
    h.aux = static_cast<uint32_t>(code);
    auto keep = std::make_shared<std::string>(text);
    h.payload_bytes = static_cast<uint32_t>(keep->size());
    send(h, keep->data(), keep->size(), [keep](bool, const std::string&) {});
  }
  // Sends `bytes` of `data` as kind messages in chunks, then DONE{seq, count = bytes, scale}.
  void send_reply(MsgType kind, uint64_t seq, const std::vector<std::pair<const char*, uint64_t>>& parts,
                  size_t elem_bytes, std::shared_ptr<void> keep, float seconds);
  void end(const std::string& why);
  void fail(ErrorCode code, const std::string& why) {
    send_error(code, why);
    end(why);
  }

  OptimizerNode::Impl& node_;
  std::shared_ptr<Channel> ch_;
  uint32_t id_;
  std::string job_;
  std::atomic<uint64_t> epoch_{0};
  int64_t state_bytes_ = 0;
  transport::Hello hello_;
  std::unique_ptr<engine::HostOptimizer> local_;
  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool greeted_ = false;  // a HELLO arrived (the op thread may still be allocating)
  std::deque<std::pair<WireHeader, std::vector<char>>> control_;  // HELLO
  std::map<uint64_t, std::shared_ptr<Op>> ops_;  // by seq, until run
  uint64_t last_desc_seq_ = 0;
  uint64_t next_run_ = 1;
  CompletionQueue acc_done_, step_done_;
  std::condition_variable done_cv_;
  std::thread op_thread_, acc_thread_, step_thread_;
};

struct OptimizerNode::Impl {
  NodeOptions opt;
  std::unique_ptr<transport::Transport> tr;
  int port = 0;
  mutable std::mutex mu;
  std::map<uint32_t, std::shared_ptr<Session>> sessions;
  std::map<std::string, uint64_t> epochs;  // job -> newest epoch seen
  uint32_t next_id = 1;
  int64_t memory_used = 0;
  std::atomic<int64_t> refused{0}, ops{0};
  int64_t ended_sent = 0, ended_received = 0;  // bytes of sessions gone
  std::vector<std::shared_ptr<Session>> ended;  // joined off the progress thread
  std::thread reaper;
  std::condition_variable reap_cv;
  bool stopping = false;
  std::atomic<int64_t> fault_events{0};

  // NodeOptions::die_at_kind: at the die_at_count-th event of that kind, SIGKILL this
  // process (after `delay`: "between" lets the DONE just sent leave first).
  void fault_point(const char* kind, std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    if (opt.die_at_kind != kind || ++fault_events != opt.die_at_count) return;
    std::fprintf(stderr, "zenflow-optimizer: --die-at %s:%lld reached: SIGKILL\n", kind,
                 static_cast<long long>(opt.die_at_count));
    std::fflush(stderr);
    if (delay.count() == 0) ::raise(SIGKILL);
    std::thread([delay] {
      std::this_thread::sleep_for(delay);
      ::raise(SIGKILL);
    }).detach();
  }

  // HELLO admission (the token was proved in the transport's handshake): epoch fence,
  // memory. Returns "" or the refusal.
  std::string admit(Session* s, const transport::Hello& h, uint64_t epoch, int64_t bytes, ErrorCode* code) {
    // Each rank's attempts are fenced on their own (ranks start at different times).
    const std::string key = session_key(h);
    const std::string who = "job '" + h.job + "' rank " + std::to_string(h.rank);
    std::vector<std::shared_ptr<Session>> fenced;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = epochs.find(key);
      if (it != epochs.end() && epoch < it->second) {
        *code = ErrorCode::kStaleEpoch;
        return who + ": epoch " + std::to_string(epoch) + " is older than epoch " + std::to_string(it->second) +
               ", which this node serves";
      }
      if (it == epochs.end() || epoch > it->second) {
        epochs[key] = epoch;
        for (auto& [id, other] : sessions)
          if (other.get() != s && other->job() == key && other->epoch() < epoch) fenced.push_back(other);
      }
    }
    for (auto& f : fenced) f->fence(who + " moved on to epoch " + std::to_string(epoch));
    std::lock_guard<std::mutex> lock(mu);
    if (epochs[key] != epoch) {  // a newer HELLO of this rank came in meanwhile
      *code = ErrorCode::kStaleEpoch;
      return who + ": epoch " + std::to_string(epoch) + " is older than epoch " + std::to_string(epochs[key]) +
             ", which this node serves";
    }
    if (opt.memory_limit > 0 && memory_used + bytes > opt.memory_limit) {
      *code = ErrorCode::kNoMemory;
      return "the session's host state needs " + gib(bytes) + " but this node's --memory-limit is " +
             gib(opt.memory_limit) + " with " + gib(memory_used) + " in use";
    }
    memory_used += bytes;
    s->bind(key);
    return "";
  }
  void release(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    memory_used -= bytes;
  }
  void ended_session(uint32_t id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = sessions.find(id);
    if (it == sessions.end()) return;
    const transport::ChannelStats cs = it->second->channel_stats();
    ended_sent += cs.bytes_sent;
    ended_received += cs.bytes_received;
    ended.push_back(it->second);
    sessions.erase(it);
    reap_cv.notify_all();
  }
};

ChannelHandler Session::handler() {
  ChannelHandler h;
  std::weak_ptr<Session> self = weak_from_this();
  h.place = [self](const void* header, size_t hlen, size_t len) -> void* {
    auto s = self.lock();
    return s ? s->place(header, hlen, len) : nullptr;
  };
  h.on_message = [self](const void* header, size_t hlen, void* data, size_t len) {
    if (auto s = self.lock()) s->on_message(header, hlen, data, len);
  };
  h.on_error = [self](const std::string& error) {
    if (auto s = self.lock()) s->end("connection lost: " + error);
  };
  return h;
}

void* Session::place(const void* header, size_t hlen, size_t len) {
  WireHeader h;
  try {
    h = transport::decode(header, hlen, len);
  } catch (const WireError&) {
    return nullptr;  // on_message reports it
  }
  if (h.type != MsgType::kGrad && h.type != MsgType::kData) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(h.seq);
  if (it == ops_.end()) return nullptr;
  Op& op = *it->second;
  uint64_t at = 0, esize = 4, limit = 0;
  if (h.type == MsgType::kGrad) {
    if (op.h.type != MsgType::kAccumulate && op.h.type != MsgType::kStep) return nullptr;
    if (h.aux >= op.desc.spans.size() || op.desc.spans[h.aux].grad_type == transport::kGradNone) return nullptr;
    const auto& sp = op.desc.spans[h.aux];
    esize = transport::grad_type_bytes(sp.grad_type);
    at = op.span_bytes_at[h.aux];
    limit = sp.n;
  } else {
    if (op.h.type != MsgType::kStateWrite) return nullptr;
    limit = op.state.n;
  }
  if (h.count > limit || h.offset > limit - h.count || h.count * esize != len) return nullptr;
  return op.data() + at + h.offset * esize;
}

void Session::on_message(const void* header, size_t hlen, void* data, size_t len) {
  WireHeader h;
  try {
    h = transport::decode(header, hlen, len, {}, data);
    if (h.type != MsgType::kHello && h.type != MsgType::kPing && h.job_epoch != epoch_)
      throw WireError("wire: message of epoch " + std::to_string(h.job_epoch) + " in a session of epoch " +
                      std::to_string(epoch_));
    switch (h.type) {
      case MsgType::kPing: {
        WireHeader r = transport::make_header(MsgType::kPong, epoch_, id_);
        r.offset = h.offset;
        send(r, nullptr, 0);
        return;
      }
      case MsgType::kHello: {
        std::lock_guard<std::mutex> lock(mu_);
        if (greeted_) throw WireError("wire: a second HELLO in one session");
        greeted_ = true;
        epoch_ = h.job_epoch;
        control_.emplace_back(h, std::vector<char>(static_cast<char*>(data), static_cast<char*>(data) + len));
        cv_.notify_all();
        return;
      }
      case MsgType::kBye:
        end("the worker said BYE");
        return;
      case MsgType::kAccumulate:
      case MsgType::kStep:
      case MsgType::kStateRead:
      case MsgType::kStateWrite: {
        auto op = std::make_shared<Op>();
        op->h = h;
        std::lock_guard<std::mutex> lock(mu_);
        if (!greeted_) throw WireError(std::string("wire: ") + transport::msg_type_name(h.type) + " before HELLO");
        if (h.seq != last_desc_seq_ + 1)
          throw WireError("wire: op " + std::to_string(h.seq) + " after op " + std::to_string(last_desc_seq_) +
                          " (sequence numbers have no gaps)");
        const uint64_t elements = hello_.elements;
        if (h.type == MsgType::kAccumulate || h.type == MsgType::kStep) {
          const bool step = h.type == MsgType::kStep;
          op->desc = transport::decode_op(data, len, step, elements);
          if (step ? h.aux > engine::kNumHostBufs : (h.aux < 3 || h.aux >= engine::kNumHostBufs))
            throw WireError("wire: accumulator " + std::to_string(h.aux));
          uint64_t bytes = 0;
          for (const auto& sp : op->desc.spans) {
            op->span_bytes_at.push_back(bytes);
            if (sp.grad_type != transport::kGradNone) bytes += sp.n * transport::grad_type_bytes(sp.grad_type);
          }
          op->bytes = bytes;
          op->buf = pool_->take(bytes);
        } else {
          if (h.aux >= engine::kNumHostBufs) throw WireError("wire: state array " + std::to_string(h.aux));
          op->state = transport::decode_state(data, len, elements);
          op->bytes = h.type == MsgType::kStateWrite ? op->state.n * 4 : 0;
          if (op->bytes > 0) op->buf = pool_->take(op->bytes);
        }
        last_desc_seq_ = h.seq;
        ops_[h.seq] = op;
        cv_.notify_all();
        return;
      }
      case MsgType::kGrad:
      case MsgType::kData: {
        if (h.type == MsgType::kGrad) node_.fault_point("grad");
        std::lock_guard<std::mutex> lock(mu_);
        auto it = ops_.find(h.seq);
        if (it == ops_.end() || data == nullptr)
          throw WireError(std::string("wire: ") + transport::msg_type_name(h.type) + " for op " + std::to_string(h.seq) +
                          " that expects no such data");
        // place() put it in the op's buffer; a buffer of the transport's means it did not fit.
        Op& op = *it->second;
        const char* begin = op.data();
        if (begin == nullptr || static_cast<const char*>(data) < begin ||
            static_cast<const char*>(data) + len > begin + op.bytes)
          throw WireError(std::string("wire: ") + transport::msg_type_name(h.type) + " [" + std::to_string(h.offset) +
                          ", +" + std::to_string(h.count) + ") does not fit op " + std::to_string(h.seq));
        op.received += len;
        if (op.received > op.bytes) throw WireError("wire: more data than op " + std::to_string(h.seq) + " expects");
        if (op.ready()) cv_.notify_all();
        return;
      }
      default:
        throw WireError(std::string("wire: unexpected ") + transport::msg_type_name(h.type) + " at a node");
    }
  } catch (const std::exception& e) {
    fail(ErrorCode::kBadMessage, e.what());
  }
}

void Session::hello(const WireHeader& h, const std::vector<char>& body) {
  transport::Hello hi;
  try {
    hi = transport::decode_hello(body.data(), body.size());
  } catch (const WireError& e) {
    fail(ErrorCode::kBadMessage, e.what());
    return;
  }
  // Offload mode's sessions hold no window accumulators (HostStateLayout::accumulators).
  const int64_t arrays = hi.accumulators != 0 ? engine::kNumHostBufs : engine::kNumHostBufs - 2;
  const int64_t bytes = static_cast<int64_t>(hi.elements) * arrays * 4;
  ErrorCode code = ErrorCode::kNone;
  const std::string refusal = node_.admit(this, hi, h.job_epoch, bytes, &code);
  if (!refusal.empty()) {
    node_.refused++;
    fail(code, refusal);
    return;
  }
  state_bytes_ = bytes;
  engine::InProcessHostOptions o;
  o.threads = std::max(1, node_.opt.threads);
  o.cores = node_.opt.cores;
  o.first_touch = true;
  engine::HostStateLayout layout;
  layout.elements = static_cast<int64_t>(hi.elements);
  layout.huge_pages = hi.huge_pages != 0;
  layout.rank = static_cast<int>(hi.rank);
  layout.world = static_cast<int>(hi.world);
  layout.accumulators = hi.accumulators != 0;
  try {
    local_ = engine::make_in_process_host_optimizer(o, layout);
  } catch (const std::exception& e) {
    fail(ErrorCode::kNoMemory, std::string("cannot allocate the session's state: ") + e.what());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    hello_ = hi;
  }
  transport::Welcome w;
  w.node = node_.opt.name;
  w.threads = static_cast<uint32_t>(local_->threads());
  w.credits = node_.opt.credits;
  w.host_isa = engine::host_isa_name(engine::active_host_isa());
  w.memory_limit = static_cast<uint64_t>(node_.opt.memory_limit);
  {
    std::lock_guard<std::mutex> lock(node_.mu);
    w.memory_used = static_cast<uint64_t>(node_.memory_used);
  }
  auto body_out = std::make_shared<std::string>(transport::encode_welcome(w));
  WireHeader r = transport::make_header(MsgType::kWelcome, epoch_, id_);
  r.payload_bytes = static_cast<uint32_t>(body_out->size());
  send(r, body_out->data(), body_out->size(), [body_out](bool, const std::string&) {});
}

void Session::run_ops() {
  for (;;) {
    std::shared_ptr<Op> op;
    std::pair<WireHeader, std::vector<char>> ctl;
    bool have_ctl = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        if (stopping_ || !control_.empty()) return true;
        auto it = ops_.find(next_run_);
        return local_ && it != ops_.end() && it->second->ready();
      });
      if (stopping_) return;
      if (!control_.empty()) {
        ctl = std::move(control_.front());
        control_.pop_front();
        have_ctl = true;
      } else {
        auto it = ops_.find(next_run_);
        op = it->second;
        ops_.erase(it);
        ++next_run_;
      }
    }
    if (have_ctl) {
      hello(ctl.first, ctl.second);
      continue;
    }
    node_.ops++;
    try {
      run_op(op);
    } catch (const std::exception& e) {
      fail(ErrorCode::kInternal, std::string("op ") + std::to_string(op->h.seq) + ": " + e.what());
      return;
    }
  }
}

void Session::run_op(const std::shared_ptr<Op>& op) {
  const WireHeader& h = op->h;
  auto grad_of = [&](size_t i) {
    const auto& sp = op->desc.spans[i];
    const void* p = op->data() + op->span_bytes_at[i];
    return engine::GradRef{p, static_cast<engine::GradRef::Type>(sp.grad_type)};
  };
  if (h.type == MsgType::kAccumulate) {
    engine::AccumulateJob job;
    job.acc = static_cast<engine::HostBuf>(h.aux);
    job.scale = h.scale;
    job.overwrite = (h.flags & transport::kFlagOverwrite) != 0;
    for (size_t i = 0; i < op->desc.spans.size(); ++i)
      job.spans.push_back({static_cast<int64_t>(op->desc.spans[i].offset), grad_of(i),
                           static_cast<int64_t>(op->desc.spans[i].n)});
    Completion c{h.seq, local_->submit(std::move(job)), op, nullptr};
    std::lock_guard<std::mutex> lock(mu_);
    acc_done_.q.push_back(std::move(c));
    done_cv_.notify_all();
    return;
  }
  if (h.type == MsgType::kStep) {
    node_.fault_point("step");
    engine::StepJob job;
    job.acc = h.aux == 0 ? -1 : static_cast<int>(h.aux) - 1;
    job.grad_scale = h.scale;
    size_t out_bytes = 0;  // one element size per step (decode_op)
    uint64_t out_n = 0;
    for (const auto& sp : op->desc.spans) {
      out_bytes = std::max(out_bytes, transport::out_kind_bytes(sp.out_kind));
      if (sp.out_kind != transport::kOutNone) out_n += sp.n;
    }
    const size_t elem_bytes = out_bytes != 0 ? out_bytes : 2;
    auto stream = std::make_shared<StepStream>();
    stream->elem_bytes = elem_bytes;
    std::shared_ptr<char> out = pool_->take(out_n * elem_bytes);
    stream->reply =
        std::make_shared<Reply>(ch_, transport::make_header(MsgType::kParams, epoch_, id_, h.seq),
                                MsgType::kParams, elem_bytes, hello_.chunk_bytes / elem_bytes, out);
    stream->flush_bytes = hello_.chunk_bytes;
    uint64_t out_at = 0;
    for (size_t i = 0; i < op->desc.spans.size(); ++i) {
      const auto& sp = op->desc.spans[i];
      engine::StepJob::Span s;
      s.offset = static_cast<int64_t>(sp.offset);
      s.n = static_cast<int64_t>(sp.n);
      if (sp.grad_type != transport::kGradNone) s.grad = grad_of(i);
      char* const o = out.get() + out_at * elem_bytes;
      if (sp.out_kind == transport::kOutMaster) {
        s.master_out = reinterpret_cast<float*>(o);
      } else if (sp.out_kind != transport::kOutNone) {
        s.half_out = reinterpret_cast<uint16_t*>(o);
        s.half_kind = static_cast<engine::HalfKind>(sp.out_kind - 1);
      }
      // PARAMS messages name their span; spans without output send nothing.
      stream->starts.push_back(stream->total);
      stream->sizes.push_back(sp.n);
      stream->out.push_back(sp.out_kind != transport::kOutNone ? o : nullptr);
      stream->total += sp.n;
      if (sp.out_kind != transport::kOutNone) out_at += sp.n;
      s.coeffs = sp.coeffs;
      job.spans.push_back(s);
    }
    if (job.acc < 0)
      for (const auto& s : job.spans)
        if (s.grad.data == nullptr) throw std::runtime_error("a step span with neither gradient nor accumulator");
    job.after_chunk = [stream](int64_t lo, int64_t hi) { stream->finished(lo, hi); };
    Completion c{h.seq, nullptr, op, stream->reply};
    c.work = local_->submit(std::move(job));
    std::lock_guard<std::mutex> lock(mu_);
    step_done_.q.push_back(std::move(c));
    done_cv_.notify_all();
    return;
  }
  // State transfers see every earlier op's effect: the node drains first.
  local_->drain();
  const auto b = static_cast<engine::HostBuf>(h.aux);
  const transport::StateDesc& d = op->state;
  if (d.columns == 2 && h.type != MsgType::kStateWrite) throw WireError("wire: a re-pack in a state read");
  if (h.type == MsgType::kStateWrite) {
    float* const src = reinterpret_cast<float*>(op->data());
    if (d.columns == 2)
      local_->repack_columns(b, static_cast<int64_t>(d.offset), static_cast<int64_t>(d.rows),
                             static_cast<int64_t>(d.width), d.cols, src, static_cast<int64_t>(d.n / d.rows));
    else if (d.columns == 1)
      local_->scatter_columns({column_block(b, d, src)});
    else
      local_->write(b, static_cast<int64_t>(d.offset), static_cast<int64_t>(d.n), src);
    send_reply(MsgType::kData, h.seq, {}, 4, nullptr, -1);
    return;
  }
  if (!d.columns) node_.fault_point("save");  // whole buffers: a checkpoint streaming the state
  std::shared_ptr<char> out = pool_->take(d.n * sizeof(float));  // every element written below
  float* const dst = reinterpret_cast<float*>(out.get());
  if (d.columns)
    local_->gather_columns({column_block(b, d, dst)});
  else
    local_->read(b, static_cast<int64_t>(d.offset), static_cast<int64_t>(d.n), dst);
  send_reply(MsgType::kData, h.seq, {{out.get(), d.n}}, 4, out, -1);
}

void Session::send_reply(MsgType kind, uint64_t seq, const std::vector<std::pair<const char*, uint64_t>>& parts,
                         size_t elem_bytes, std::shared_ptr<void> keep, float seconds) {
  // COMPUTED first (eager): from here on, what the worker waits for is the network.
  send(transport::make_header(MsgType::kComputed, epoch_, id_, seq), nullptr, 0);
  auto reply = std::make_shared<Reply>(ch_, transport::make_header(kind, epoch_, id_, seq), kind, elem_bytes,
                                       hello_.chunk_bytes / elem_bytes, std::move(keep));
  for (size_t i = 0; i < parts.size(); ++i)
    reply->send(static_cast<uint32_t>(i), 0, parts[i].first, parts[i].second);
  reply->close(seconds);
}

void Session::run_completions(CompletionQueue& cq) {
  for (;;) {
    Completion c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return stopping_ || !cq.q.empty(); });
      if (stopping_) return;
      c = std::move(cq.q.front());
      cq.q.pop_front();
    }
    try {
      c.work->wait();
    } catch (const std::exception& e) {
      fail(ErrorCode::kInternal, std::string("op ") + std::to_string(c.seq) + ": " + e.what());
      return;
    }
    const float seconds = static_cast<float>(c.work->run_seconds());
    if (node_.opt.on_step && seconds >= 0) node_.opt.on_step(seconds);
    if (!c.reply) {
      send_reply(MsgType::kData, c.seq, {}, 2, nullptr, seconds);  // an accumulate: DONE alone
      continue;
    }
    // A step: its outputs left as its chunks finished (StepStream); what the worker still
    // waits for is their transfer.
    send(transport::make_header(MsgType::kComputed, epoch_, id_, c.seq), nullptr, 0);
    c.reply->close(seconds);
    node_.fault_point("between", std::chrono::milliseconds(100));  // a window step's DONE
  }
}

void Session::end(const std::string& why) {
  (void)why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  done_cv_.notify_all();
  ch_->close(false);
  node_.ended_session(id_);
}

void Session::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  done_cv_.notify_all();
  for (std::thread* t : {&op_thread_, &acc_thread_, &step_thread_})
    if (t->joinable() && t->get_id() != std::this_thread::get_id()) t->join();
  if (local_) {
    local_->drain();
    local_.reset();
    node_.release(state_bytes_);
    state_bytes_ = 0;
  }
}

OptimizerNode::OptimizerNode(NodeOptions options) : impl_(new Impl) { impl_->opt = std::move(options); }

OptimizerNode::~OptimizerNode() { stop(); }

int OptimizerNode::start() {
  Impl& i = *impl_;
  transport::TransportOptions to;
  to.name = "optimizer node";
  // Key "": the node's own token (--token-file; workers given its address in their spec).
  // Any other key: a coordinator's grant of one job attempt placed on this node.
  to.secret_for = [token = i.opt.token, tokenless = i.opt.tokenless_sessions,
                   grant_for = i.opt.grant_for](const std::string& key) -> std::optional<std::string> {
    if (key.empty()) return token.empty() && !tokenless ? std::nullopt : std::optional<std::string>(token);
    return grant_for ? grant_for(key) : std::nullopt;
  };
  to.local_host = i.opt.host;  // UCX's own sockets on this interface only
  i.tr = transport::Transport::create(to);
  i.reaper = std::thread([&i] {
    std::unique_lock<std::mutex> lock(i.mu);
    for (;;) {
      i.reap_cv.wait(lock, [&] { return i.stopping || !i.ended.empty(); });
      std::vector<std::shared_ptr<Session>> done = std::move(i.ended);
      i.ended.clear();
      lock.unlock();
      for (auto& s : done) s->shutdown();
      done.clear();
      lock.lock();
      if (i.stopping && i.ended.empty()) return;
    }
  });
  i.port = i.tr->listen(i.opt.host, i.opt.port, [&i](std::shared_ptr<Channel> ch) {
    std::shared_ptr<Session> s;
    {
      std::lock_guard<std::mutex> lock(i.mu);
      s = std::make_shared<Session>(i, ch, i.next_id++);
      i.sessions[i.next_id - 1] = s;
    }
    s->start();
    return s->handler();
  });
  if (i.opt.name.empty()) i.opt.name = i.opt.host + ":" + std::to_string(i.port);
  return i.port;
}

void OptimizerNode::stop() {
  Impl& i = *impl_;
  std::vector<std::shared_ptr<Session>> all;
  {
    std::lock_guard<std::mutex> lock(i.mu);
    if (i.stopping) return;
    i.stopping = true;
    for (auto& [id, s] : i.sessions) all.push_back(s);
    i.sessions.clear();
    i.reap_cv.notify_all();
  }
  if (i.reaper.joinable()) i.reaper.join();
  for (auto& s : all) s->shutdown();
  i.tr.reset();
  for (auto& s : i.ended) s->shutdown();
  i.ended.clear();
}

int OptimizerNode::drop_all_sessions(const std::string& why) {
  Impl& i = *impl_;
  std::vector<std::shared_ptr<Session>> all;
  {
    std::lock_guard<std::mutex> lock(i.mu);
    for (auto& [id, s] : i.sessions) all.push_back(s);
  }
  for (auto& s : all) s->fence(why);  // ends it: ended_session() frees its state
  return static_cast<int>(all.size());
}

NodeStats OptimizerNode::stats() const {
  const Impl& i = *impl_;
  NodeStats s;
  std::lock_guard<std::mutex> lock(i.mu);
  s.sessions = static_cast<int>(i.sessions.size());
  s.memory_used = i.memory_used;
  s.sessions_refused = i.refused.load();
  s.ops = i.ops.load();
  s.bytes_sent = i.ended_sent;
  s.bytes_received = i.ended_received;
  for (const auto& [id, session] : i.sessions) {
    const transport::ChannelStats cs = session->channel_stats();
    s.bytes_sent += cs.bytes_sent;
    s.bytes_received += cs.bytes_received;
  }
  return s;
}

const std::string& OptimizerNode::name() const { return impl_->opt.name; }

std::pair<std::string, int64_t> parse_die_at(const std::string& text) {
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  int64_t n = 0;
  bool ok = colon != std::string::npos && colon + 1 < text.size() &&
            (kind == "grad" || kind == "step" || kind == "save" || kind == "between");
  for (size_t i = colon + 1; ok && i < text.size(); ++i) {
    ok = text[i] >= '0' && text[i] <= '9' && n < (int64_t{1} << 40);
    n = n * 10 + (text[i] - '0');
  }
  if (!ok || n < 1)
    throw std::invalid_argument("--die-at " + text + ": expected KIND:N with KIND grad, step, save or between and N >= 1");
  return {kind, n};
}

int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("'" + text + "' is not a size (examples: 64G, 512M, 1.5T, 1000000)");
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (!unit.empty() && unit.back() == 'i') unit.pop_back();
  double mult = 1;
  if (unit == "K" || unit == "k") mult = 1024.0;
  else if (unit == "M" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty()) throw std::invalid_argument("'" + text + "': unknown unit '" + unit + "' (K, M, G or T)");
  if (!(v >= 0) || !std::isfinite(v * mult)) throw std::invalid_argument("'" + text + "' is not a size >= 0");
  return static_cast<int64_t>(v * mult);
}

}  // namespace zenflow::optimizer_node
