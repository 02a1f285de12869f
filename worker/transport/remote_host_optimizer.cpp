// Remote host optimizer: jobs and host state on zenflow-optimizer nodes (see the header).
#include "worker/transport/remote_host_optimizer.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "worker/engine/host_isa.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/engine/stall_clock.h"
#include "worker/transport/handshake.h"
#include "worker/transport/optimizer_protocol.h"
#include "worker/transport/transport.h"

namespace zenflow::transport {
namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A job or transfer: done when every node's part is.
class RemoteWork : public engine::HostWork {
 public:
  double wait() override {
    const int64_t began = now_us();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return remaining_ == 0 || !error_.empty(); });
    if (!error_.empty()) throw engine::HostBackendLost(error_, error_node_);
    const int64_t ended = now_us();
    // Network: from the last node's COMPUTED (or the wait's start, if later) to the end.
    network_wait_s_ = computed_us_ > 0 ? static_cast<double>(ended - std::max(began, computed_us_)) / 1e6 : 0.0;
    if (network_wait_s_ < 0) network_wait_s_ = 0;
    return static_cast<double>(ended - began) / 1e6;
  }
  double network_wait_seconds() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return network_wait_s_;
  }
  void computed() {
    std::lock_guard<std::mutex> lock(mu_);
    computed_us_ = std::max(computed_us_, now_us());
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return remaining_ == 0 || !error_.empty();
  }
  double run_seconds() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return remaining_ == 0 ? run_ : -1;
  }
  void add_parts(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    remaining_ += n;
  }
  // Returns true when this finished the work (the caller counts it out once).
  bool part_done(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty() || remaining_ == 0) return false;
    run_ = std::max(run_, seconds);
    if (--remaining_ > 0) return false;
    cv_.notify_all();
    return true;
  }
  bool fail(const std::string& why, const std::string& node) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty() || remaining_ == 0) return false;
    error_ = why;
    error_node_ = node;
    cv_.notify_all();
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int remaining_ = 0;
  double run_ = -1;
  std::string error_;
  std::string error_node_;  // the lost node's HOST:PORT
  int64_t computed_us_ = 0;  // when the last COMPUTED of its parts arrived
  double network_wait_s_ = 0;
};

// One op on one node, until its DONE and all its reply bytes arrived.
struct SubOp {
  uint64_t seq = 0;
  std::shared_ptr<RemoteWork> work;
  std::vector<std::pair<char*, uint64_t>> targets;  // per reply span: where, elements
  size_t elem_bytes = 2;
  uint64_t got = 0;
  bool done_msg = false;
  uint64_t done_bytes = 0;
  double seconds = -1;
};

// A message to post: header fields plus what to send after it.
struct Message {
  WireHeader h;
  std::shared_ptr<std::string> body;  // descriptor (owned)
  const char* data = nullptr;         // or the caller's data (kept alive by the caller)
  size_t len = 0;
  // Or elements [source_offset, + h.count) of a job's GradSource, copied out when posted.
  std::shared_ptr<engine::GradSource> source;
  int64_t source_offset = -1;
};

}  // namespace

class RemoteHostOptimizer : public engine::HostOptimizer {
 public:
  RemoteHostOptimizer(const RemoteHostOptions& o, const engine::HostStateLayout& layout) : opt_(o), layout_(layout) {
    if (o.addresses.empty()) throw std::invalid_argument("remote host optimizer: no node addresses");
    // Every thread this backend starts, UCX's own included, runs on the host cores.
    const engine::ScopedCores on_host_cores(o.cores);
    if (!on_host_cores.error().empty())
      std::fprintf(stderr,
                   "zenflow: remote host optimizer: cannot run its threads on %s; they share the "
                   "training thread's cores\n",
                   on_host_cores.error().c_str());
    TransportOptions to;
    to.name = "worker rank " + std::to_string(layout.rank);
    to.secret = o.token;  // proved in the handshake, never sent
    to.key = o.key;
    // UCX's own sockets (tcp's listeners) only on the interfaces that lead to the nodes.
    for (const std::string& address : o.addresses) {
      const std::string local = local_address_toward(parse_address(address).first);
      if (local.empty()) {  // unresolvable: connecting says so, naming the node
        to.local_host.clear();
        break;
      }
      if (("," + to.local_host + ",").find("," + local + ",") == std::string::npos)
        to.local_host += (to.local_host.empty() ? "" : ",") + local;
    }
    tr_ = Transport::create(to);
    const std::vector<int64_t> bounds = slice_bounds(layout, o.addresses.size());
    for (size_t k = 0; k < o.addresses.size(); ++k) {
      auto n = std::make_unique<Node>();
      n->address = o.addresses[k];
      n->begin = bounds[k];
      n->end = bounds[k + 1];
      nodes_.push_back(std::move(n));
    }
    for (size_t k = 0; k < nodes_.size(); ++k) open(k);
    sender_ = std::thread([this] { run_sender(); });
    watchdog_ = std::thread([this] { run_watchdog(); });
    pthread_setname_np(sender_.native_handle(), "zf-node-send");
    pthread_setname_np(watchdog_.native_handle(), "zf-node-watch");
  }

  ~RemoteHostOptimizer() override {
    try {
      drain();
    } catch (...) {
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (sender_.joinable()) sender_.join();
    if (watchdog_.joinable()) watchdog_.join();
    for (auto& n : nodes_) {
      if (!n->ch || is_lost(*n)) continue;
      WireHeader h = make_header(MsgType::kBye, opt_.epoch, 0);
      unsigned char buf[kWireHeaderBytes];
      encode(h, buf);
      n->ch->send(buf, sizeof buf, nullptr, 0, {});
      n->ch->close(false);
    }
    tr_.reset();
  }

  std::shared_ptr<engine::HostWork> submit(engine::AccumulateJob job) override {
    auto work = start_work();
    std::vector<std::vector<Message>> per(nodes_.size());
    std::vector<std::vector<std::pair<char*, uint64_t>>> none(nodes_.size());
    std::vector<OpDesc> descs(nodes_.size());
    std::vector<std::vector<const engine::AccumulateJob::Span*>> spans(nodes_.size());
    for (const auto& s : job.spans) {
      const size_t k = node_of(s.offset, s.n);
      OpSpan o;
      o.offset = static_cast<uint64_t>(s.offset - nodes_[k]->begin);
      o.n = static_cast<uint64_t>(s.n);
      o.grad_type = static_cast<uint32_t>(s.grad.type);
      descs[k].spans.push_back(o);
      spans[k].push_back(&s);
    }
    for (size_t k = 0; k < nodes_.size(); ++k) {
      if (descs[k].spans.empty()) continue;
      Message d;
      d.h = make_header(MsgType::kAccumulate, opt_.epoch, 0);
      d.h.aux = static_cast<uint32_t>(job.acc);
      d.h.scale = job.scale;
      d.h.flags = job.overwrite ? uint32_t{kFlagOverwrite} : 0u;
      d.body = std::make_shared<std::string>(encode_op(descs[k], false));
      per[k].push_back(d);
      for (size_t i = 0; i < spans[k].size(); ++i)
        add_grad_chunks(per[k], static_cast<uint32_t>(i), job.source, spans[k][i]->grad, spans[k][i]->source_offset,
                        static_cast<uint64_t>(spans[k][i]->n), grad_type_bytes(descs[k].spans[i].grad_type));
    }
    job.source.reset();  // the messages hold it until they are posted
    post(work, std::move(job.before), std::move(per), std::move(none), 2);
    return work;
  }

  std::shared_ptr<engine::HostWork> submit(engine::StepJob job) override {
    if (job.after_chunk)
      throw std::invalid_argument("remote host step: after_chunk is the in-process backend's");
    size_t out_bytes = 0;  // of the outputs (PARAMS elements), one size per job
    for (const auto& s : job.spans) {
      if (s.half_out && s.master_out)
        throw std::invalid_argument("remote host step: a span with two outputs");
      const size_t bytes = s.master_out ? sizeof(float) : s.half_out ? sizeof(uint16_t) : 0;
      if (bytes != 0 && out_bytes != 0 && bytes != out_bytes)
        throw std::invalid_argument("remote host step: fp32 and low-precision outputs in one job");
      if (bytes != 0) out_bytes = bytes;
    }
    auto work = start_work();
    std::vector<std::vector<Message>> per(nodes_.size());
    std::vector<std::vector<std::pair<char*, uint64_t>>> targets(nodes_.size());
    std::vector<OpDesc> descs(nodes_.size());
    std::vector<std::vector<const engine::StepJob::Span*>> spans(nodes_.size());
    for (const auto& s : job.spans) {
      const size_t k = node_of(s.offset, s.n);
      OpSpan o;
      o.offset = static_cast<uint64_t>(s.offset - nodes_[k]->begin);
      o.n = static_cast<uint64_t>(s.n);
      o.grad_type = s.has_grad() ? static_cast<uint32_t>(s.grad.type) : kGradNone;
      o.out_kind = s.master_out ? kOutMaster : s.half_out ? 1 + static_cast<uint32_t>(s.half_kind) : kOutNone;
      o.coeffs = s.coeffs;
      descs[k].spans.push_back(o);
      spans[k].push_back(&s);
      char* const out =
          s.master_out ? reinterpret_cast<char*>(s.master_out) : reinterpret_cast<char*>(s.half_out);
      targets[k].emplace_back(out, out ? o.n : 0);
    }
    for (size_t k = 0; k < nodes_.size(); ++k) {
      if (descs[k].spans.empty()) continue;
      Message d;
      d.h = make_header(MsgType::kStep, opt_.epoch, 0);
      d.h.aux = job.acc < 0 ? 0 : static_cast<uint32_t>(job.acc) + 1;
      d.h.scale = job.grad_scale;
      d.body = std::make_shared<std::string>(encode_op(descs[k], true));
      per[k].push_back(d);
      for (size_t i = 0; i < spans[k].size(); ++i)
        if (spans[k][i]->has_grad())
          add_grad_chunks(per[k], static_cast<uint32_t>(i), job.source, spans[k][i]->grad, spans[k][i]->source_offset,
                          static_cast<uint64_t>(spans[k][i]->n), grad_type_bytes(descs[k].spans[i].grad_type));
    }
    job.source.reset();
    post(work, std::move(job.before), std::move(per), std::move(targets), out_bytes == 0 ? 2 : out_bytes);
    return work;
  }

  double drain() override {
    engine::Stopwatch sw;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return works_ == 0; });
    return sw.seconds();
  }

  int64_t gradient_chunk_bytes() const override { return static_cast<int64_t>(opt_.chunk_bytes); }

  int threads() const override {
    int t = 0;
    for (const auto& n : nodes_) t += static_cast<int>(n->welcome.threads);
    return std::max(1, t);
  }

  void read(engine::HostBuf b, int64_t offset, int64_t n, float* dst) override {
    start_read(b, offset, n, dst)->wait();
  }
  std::shared_ptr<engine::HostWork> start_read(engine::HostBuf b, int64_t offset, int64_t n,
                                               float* dst) override {
    StateDesc d;
    d.offset = static_cast<uint64_t>(offset);
    d.n = static_cast<uint64_t>(n);
    return start_transfer(MsgType::kStateRead, b, offset, n, d, reinterpret_cast<char*>(dst), nullptr);
  }
  void write(engine::HostBuf b, int64_t offset, int64_t n, const float* src) override {
    StateDesc d;
    d.offset = static_cast<uint64_t>(offset);
    d.n = static_cast<uint64_t>(n);
    transfer(MsgType::kStateWrite, b, offset, n, d, nullptr, reinterpret_cast<const char*>(src));
  }
  void gather_columns(const std::vector<engine::ColumnBlock>& blocks) override {
    transfer_columns(MsgType::kStateRead, blocks);
  }
  void scatter_columns(const std::vector<engine::ColumnBlock>& blocks) override {
    transfer_columns(MsgType::kStateWrite, blocks);
  }
  void repack_columns(engine::HostBuf b, int64_t offset, int64_t rows, int64_t width,
                      const std::vector<int64_t>& src, const float* appended, int64_t n_appended) override {
    StateDesc d = column_desc(offset, rows, width, src);
    d.columns = 2;
    d.n = static_cast<uint64_t>(rows * n_appended);
    const int64_t extent = rows * std::max<int64_t>(width, static_cast<int64_t>(src.size()));
    transfer(MsgType::kStateWrite, b, offset, extent, d, nullptr, reinterpret_cast<const char*>(appended));
  }
  int64_t resident_state_bytes() const override { return 0; }
  int64_t network_bytes_sent() const override {
    int64_t s = 0;
    for (const auto& n : nodes_)
      if (n->ch) s += n->ch->stats().bytes_sent;
    return s;
  }
  int64_t network_bytes_received() const override {
    int64_t s = 0;
    for (const auto& n : nodes_)
      if (n->ch) s += n->ch->stats().bytes_received;
    return s;
  }
  std::string describe() const override {
    std::string out;
    for (const auto& n : nodes_) {
      if (!out.empty()) out += ", ";
      out += "node " + n->address + " [" + std::to_string(n->begin) + ", " + std::to_string(n->end) + ")";
    }
    return out;
  }

 private:
  struct Node {
    std::string address;
    int64_t begin = 0, end = 0;
    std::shared_ptr<Channel> ch;
    Welcome welcome;
    std::mutex mu;
    std::condition_variable cv;
    std::map<uint64_t, std::shared_ptr<SubOp>> outstanding;
    uint64_t next_seq = 1;
    bool lost = false;
    std::string why;
    std::atomic<int64_t> last_heard_us{0};  // any message from it: a pong, a reply, data
    std::atomic<int> last_type{-1};           // the MsgType of that message
    std::atomic<int> unanswered_pings{0};     // pings sent since its last pong
    std::promise<std::string> hello;  // "" on WELCOME, else the refusal
    bool hello_set = false;
  };
  struct Task {
    std::shared_ptr<RemoteWork> work;
    std::function<void()> before;
    std::vector<std::vector<Message>> per;
    std::vector<std::vector<std::pair<char*, uint64_t>>> targets;
    size_t elem_bytes = 2;
  };

  static StateDesc column_desc(int64_t offset, int64_t rows, int64_t width, const std::vector<int64_t>& cols) {
    StateDesc d;
    d.columns = 1;
    d.offset = static_cast<uint64_t>(offset);
    d.rows = static_cast<uint64_t>(rows);
    d.width = static_cast<uint64_t>(width);
    d.cols = cols;
    d.n = static_cast<uint64_t>(rows) * cols.size();
    return d;
  }

  std::string lost_text(const Node& n) const { return "optimizer node " + n.address + " lost: " + n.why; }
  bool is_lost(Node& n) {
    std::lock_guard<std::mutex> lock(n.mu);
    return n.lost;
  }

  size_t node_of(int64_t offset, int64_t n) const {
    for (size_t k = 0; k < nodes_.size(); ++k)
      if (offset >= nodes_[k]->begin && offset < nodes_[k]->end) {
        if (offset + n > nodes_[k]->end)
          throw std::logic_error("remote host optimizer: [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                 ") crosses the slice boundary " + std::to_string(nodes_[k]->end));
        return k;
      }
    if (n == 0) return 0;
    throw std::logic_error("remote host optimizer: offset " + std::to_string(offset) + " outside the host state");
  }

  void add_chunks(std::vector<Message>& out, MsgType type, uint32_t span, const char* data, uint64_t n, size_t esize) {
    const uint64_t chunk = std::max<uint64_t>(1, opt_.chunk_bytes / esize);
    for (uint64_t off = 0; off < n; off += chunk) {
      Message m;
      m.h = make_header(type, opt_.epoch, 0);
      m.h.aux = span;
      m.h.offset = off;
      m.h.count = std::min(chunk, n - off);
      m.data = data + off * esize;
      m.len = static_cast<size_t>(m.h.count * esize);
      out.push_back(m);
    }
  }

  // A span's gradient: from the job's GradSource when it has one, else the GradRef's memory.
  void add_grad_chunks(std::vector<Message>& out, uint32_t span, const std::shared_ptr<engine::GradSource>& source,
                       const engine::GradRef& grad, int64_t source_offset, uint64_t n, size_t esize) {
    const size_t first = out.size();
    add_chunks(out, MsgType::kGrad, span, source ? nullptr : static_cast<const char*>(grad.data), n, esize);
    if (!source) return;
    if (source_offset < 0) throw std::logic_error("remote host optimizer: a streamed span without a source offset");
    for (size_t i = first; i < out.size(); ++i) {
      out[i].source = source;
      out[i].source_offset = source_offset + static_cast<int64_t>(out[i].h.offset);
    }
  }

  std::shared_ptr<RemoteWork> start_work() {
    auto w = std::make_shared<RemoteWork>();
    w->add_parts(1);  // the sender's own part: done once everything is posted
    std::lock_guard<std::mutex> lock(mu_);
    ++works_;
    return w;
  }
  void work_ended() {
    std::lock_guard<std::mutex> lock(mu_);
    --works_;
    cv_.notify_all();
  }
  void finish_part(const std::shared_ptr<RemoteWork>& w, double seconds) {
    if (w->part_done(seconds)) work_ended();
  }
  void fail_work(const std::shared_ptr<RemoteWork>& w, const std::string& why, const std::string& node = {}) {
    if (w->fail(why, node)) work_ended();
  }

  void post(const std::shared_ptr<RemoteWork>& work, std::function<void()> before, std::vector<std::vector<Message>> per,
            std::vector<std::vector<std::pair<char*, uint64_t>>> targets, size_t elem_bytes) {
    Task t{work, std::move(before), std::move(per), std::move(targets), elem_bytes};
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(t));
    }
    cv_.notify_all();
  }

  void transfer(MsgType type, engine::HostBuf b, int64_t offset, int64_t extent, const StateDesc& d, char* dst,
                const char* src) {
    start_transfer(type, b, offset, extent, d, dst, src)->wait();
  }

  // Every block's transfer is posted before any is waited for (each node answers them in
  // order, credits permitting), then all are waited for, even after one failed: until
  // then the node may still write into or read from a block's data.
  void transfer_columns(MsgType type, const std::vector<engine::ColumnBlock>& blocks) {
    std::vector<std::shared_ptr<RemoteWork>> works;
    works.reserve(blocks.size());
    std::exception_ptr first;
    for (const engine::ColumnBlock& c : blocks) {
      try {
        const StateDesc d = column_desc(c.offset, c.rows, c.width, c.cols);
        works.push_back(start_transfer(type, c.buf, c.offset, c.rows * c.width, d,
                                       reinterpret_cast<char*>(c.data),
                                       reinterpret_cast<const char*>(c.data)));
      } catch (...) {
        first = std::current_exception();
        break;
      }
    }
    for (const auto& w : works) {
      try {
        w->wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  std::shared_ptr<RemoteWork> start_transfer(MsgType type, engine::HostBuf b, int64_t offset, int64_t extent,
                                             const StateDesc& d, char* dst, const char* src) {
    const size_t k = node_of(offset, extent);
    Node& n = *nodes_[k];
    StateDesc local = d;
    local.offset = static_cast<uint64_t>(offset - n.begin);
    auto work = start_work();
    std::vector<std::vector<Message>> per(nodes_.size());
    std::vector<std::vector<std::pair<char*, uint64_t>>> targets(nodes_.size());
    Message m;
    m.h = make_header(type, opt_.epoch, 0);
    m.h.aux = static_cast<uint32_t>(b);
    m.body = std::make_shared<std::string>(encode_state(local));
    per[k].push_back(m);
    if (type == MsgType::kStateWrite) add_chunks(per[k], MsgType::kData, 0, src, d.n, 4);
    else targets[k].emplace_back(dst, d.n);
    post(work, {}, std::move(per), std::move(targets), 4);
    return work;
  }

  void run_sender() {
    for (;;) {
      Task t;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        t = std::move(tasks_.front());
        tasks_.pop_front();
      }
      try {
        if (t.before) t.before();
      } catch (const std::exception& e) {
        fail_work(t.work, std::string("before the host job: ") + e.what());
        continue;
      }
      for (size_t k = 0; k < nodes_.size() && !t.work->done(); ++k) {
        if (t.per[k].empty()) continue;
        Node& n = *nodes_[k];
        auto sub = std::make_shared<SubOp>();
        sub->work = t.work;
        sub->targets = std::move(t.targets[k]);
        sub->elem_bytes = t.elem_bytes;
        {
          std::unique_lock<std::mutex> lock(n.mu);
          n.cv.wait(lock, [&] { return n.lost || n.outstanding.size() < n.welcome.credits; });
          if (n.lost) {
            lock.unlock();
            fail_work(t.work, lost_text(n), n.address);
            break;
          }
          sub->seq = n.next_seq++;
          t.work->add_parts(1);
          n.outstanding[sub->seq] = sub;
        }
        for (Message& m : t.per[k]) {
          m.h.seq = sub->seq;
          std::shared_ptr<const void> chunk;  // a streamed gradient's staging chunk, until sent
          if (m.source) {
            try {
              chunk = m.source->chunk(m.source_offset, static_cast<int64_t>(m.h.count));
            } catch (const std::exception& e) {
              lose(n, std::string("cannot stage the gradient: ") + e.what());
              break;
            }
            m.source.reset();
            m.data = static_cast<const char*>(chunk.get());
          }
          const char* payload = m.body ? m.body->data() : m.data;
          const size_t len = m.body ? m.body->size() : m.len;
          m.h.payload_bytes = static_cast<uint32_t>(len);
          unsigned char buf[kWireHeaderBytes];
          encode(m.h, buf);
          std::shared_ptr<std::string> keep = m.body;
          n.ch->send(buf, sizeof buf, payload, len, [keep, chunk](bool, const std::string&) {});
        }
      }
      finish_part(t.work, -1);
    }
  }

  // Silence is counted only over time this side could hear. When this process was paused
  // (SIGSTOP, a VM freeze: the watchdog itself woke late) or its transport's progress
  // thread did not run (nothing arriving could be delivered), the nodes' silence meanwhile
  // proves nothing: it is counted again from now. A progress thread stuck for longer than
  // lost_after_s no longer holds judgement back, so a wedged transport still ends in an
  // error instead of a hang.
  void run_watchdog() {
    constexpr double kDeafS = 0.5;
    const double interval = opt_.ping_interval_s;
    int64_t last_round = now_us();
    int64_t heard_floor_us = last_round;  // silence before this is not counted
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait_for(lock, std::chrono::duration<double>(interval), [&] { return stop_; });
      if (stop_) return;
      lock.unlock();
      const int64_t now = now_us();
      const double late = static_cast<double>(now - last_round) / 1e6 - interval;
      const double deaf = tr_->seconds_since_progress();
      last_round = now;
      if (late > kDeafS || (deaf > kDeafS && deaf <= opt_.lost_after_s)) heard_floor_us = now;
      for (auto& np : nodes_) {
        Node& n = *np;
        if (is_lost(n)) continue;
        const int64_t heard = n.last_heard_us.load();
        const double silent = static_cast<double>(now - std::max(heard, heard_floor_us)) / 1e6;
        if (silent > opt_.lost_after_s) {
          const int last = n.last_type.load();
          const int unanswered = n.unanswered_pings.load();
          char pings[48] = "no ping sent meanwhile";
          if (unanswered > 0) std::snprintf(pings, sizeof pings, "no answer to pings: %d unanswered", unanswered);
          char b[256];
          std::snprintf(b, sizeof b,
                        "nothing from it for %.1f s (%s; its last message, %s, came %.1f s ago; this worker's "
                        "transport last ran %.1f s ago)",
                        silent, pings, last < 0 ? "none" : msg_type_name(static_cast<MsgType>(last)),
                        static_cast<double>(now - heard) / 1e6, deaf);
          lose(n, b);
          continue;
        }
        WireHeader h = make_header(MsgType::kPing, opt_.epoch, 0);
        h.offset = static_cast<uint64_t>(now);
        unsigned char buf[kWireHeaderBytes];
        encode(h, buf);
        ++n.unanswered_pings;
        n.ch->send(buf, sizeof buf, nullptr, 0, {});
      }
      lock.lock();
    }
  }

  void lose(Node& n, const std::string& why) {
    std::map<uint64_t, std::shared_ptr<SubOp>> failed;
    {
      std::lock_guard<std::mutex> lock(n.mu);
      if (n.lost) return;
      n.lost = true;
      n.why = why;
      failed.swap(n.outstanding);
      if (!n.hello_set) {
        n.hello_set = true;
        n.hello.set_value(why);
      }
    }
    n.cv.notify_all();
    for (auto& [seq, sub] : failed) fail_work(sub->work, lost_text(n), n.address);
    if (n.ch) n.ch->close(true);
  }

  ChannelHandler handler(Node& n) {
    ChannelHandler h;
    h.place = [this, &n](const void* header, size_t hlen, size_t len) -> void* {
      WireHeader w;
      try {
        w = decode(header, hlen, len);
      } catch (const WireError&) {
        return nullptr;
      }
      if (w.type != MsgType::kParams && w.type != MsgType::kData) return nullptr;
      std::lock_guard<std::mutex> lock(n.mu);
      auto it = n.outstanding.find(w.seq);
      if (it == n.outstanding.end()) return nullptr;
      SubOp& s = *it->second;
      if (w.aux >= s.targets.size()) return nullptr;
      const auto& [at, elems] = s.targets[w.aux];
      if (at == nullptr || w.count > elems || w.offset > elems - w.count || w.count * s.elem_bytes != len) return nullptr;
      return at + w.offset * s.elem_bytes;
    };
    h.on_message = [this, &n](const void* header, size_t hlen, void* data, size_t len) {
      try {
        on_message(n, header, hlen, data, len);
      } catch (const std::exception& e) {
        lose(n, std::string("protocol error: ") + e.what());
      }
    };
    h.on_error = [this, &n](const std::string& error) { lose(n, "connection failed: " + error); };
    return h;
  }

  void on_message(Node& n, const void* header, size_t hlen, void* data, size_t len) {
    const WireHeader w = decode(header, hlen, len, {}, data);
    // Whatever arrives shows the node alive: a pong can trail bulk transfers on the same
    // endpoint for seconds (a re-selection's state moves), while their replies keep coming.
    n.last_heard_us = now_us();
    n.last_type = static_cast<int>(w.type);
    switch (w.type) {
      case MsgType::kWelcome: {
        Welcome x = decode_welcome(data, len);
        std::lock_guard<std::mutex> lock(n.mu);
        n.welcome = x;
        if (!n.hello_set) {
          n.hello_set = true;
          n.hello.set_value("");
        }
        return;
      }
      case MsgType::kError: {
        const std::string text(static_cast<const char*>(data), len);
        lose(n, "it said: " + text);
        return;
      }
      case MsgType::kPong:
        n.unanswered_pings = 0;
        return;
      case MsgType::kPing:
        return;
      case MsgType::kComputed: {
        std::shared_ptr<RemoteWork> work;
        {
          std::lock_guard<std::mutex> lock(n.mu);
          auto it = n.outstanding.find(w.seq);
          if (it != n.outstanding.end()) work = it->second->work;
        }
        if (work) work->computed();
        return;
      }
      case MsgType::kParams:
      case MsgType::kData:
      case MsgType::kDone: {
        std::shared_ptr<SubOp> finished;
        {
          std::lock_guard<std::mutex> lock(n.mu);
          auto it = n.outstanding.find(w.seq);
          if (it == n.outstanding.end())
            throw WireError(std::string(msg_type_name(w.type)) + " for op " + std::to_string(w.seq) + ", which is not outstanding");
          SubOp& s = *it->second;
          if (w.type == MsgType::kDone) {
            s.done_msg = true;
            s.done_bytes = w.count;
            s.seconds = w.scale;
          } else {
            if (w.aux >= s.targets.size() || data == nullptr ||
                static_cast<char*>(data) != s.targets[w.aux].first + w.offset * s.elem_bytes)
              throw WireError(std::string(msg_type_name(w.type)) + " [" + std::to_string(w.offset) + ", +" +
                              std::to_string(w.count) + ") of span " + std::to_string(w.aux) + " does not fit op " +
                              std::to_string(w.seq));
            s.got += len;
          }
          if (s.done_msg && s.got > s.done_bytes)
            throw WireError("op " + std::to_string(w.seq) + " got " + std::to_string(s.got) + " bytes, DONE says " +
                            std::to_string(s.done_bytes));
          if (s.done_msg && s.got == s.done_bytes) {
            finished = it->second;
            n.outstanding.erase(it);
          }
        }
        if (finished) {
          n.cv.notify_all();
          finish_part(finished->work, finished->seconds);
        }
        return;
      }
      default:
        throw WireError(std::string("unexpected ") + msg_type_name(w.type) + " from a node");
    }
  }

  void open(size_t k) {
    Node& n = *nodes_[k];
    const auto [host, port] = parse_address(n.address);
    // A coordinator's grant of this attempt reaches the node with the node's next heartbeat,
    // which may come after this rank starts: a node that holds no secret for the key yet is
    // asked again until the connect timeout.
    const auto grant_deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(opt_.connect_timeout_s);
    try {
      for (;;) {
        try {
          n.ch = tr_->connect(host, port, handler(n), opt_.connect_timeout_s);
          break;
        } catch (const AuthenticationError& e) {
          const bool ungranted = !opt_.key.empty() && std::string(e.what()).find(handshake::kNoSecretForKey) != std::string::npos;
          if (!ungranted || std::chrono::steady_clock::now() >= grant_deadline) throw;
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
      }
    } catch (const AuthenticationError& e) {
      // Reached, but the secret does not match: a spec or deployment error, not a lost node.
      throw std::runtime_error(
          "optimizer node " + n.address + " refused the session: " + e.what() +
          (opt_.key.empty() ? " (optimizer.host.token_file must hold the node's --token-file)"
                            : " (the coordinator did not place attempt " + opt_.key + " on that node)"));
    } catch (const std::exception& e) {
      throw engine::HostBackendLost("optimizer node " + n.address + " lost: cannot connect: " + e.what(), n.address,
                                    /*unreachable_at_start=*/true);
    }
    n.last_heard_us = now_us();
    Hello h;
    h.job = opt_.job;
    h.rank = static_cast<uint32_t>(layout_.rank);
    h.world = static_cast<uint32_t>(layout_.world);
    h.slice = static_cast<uint32_t>(k);
    h.elements = static_cast<uint64_t>(n.end - n.begin);
    h.chunk_bytes = opt_.chunk_bytes;
    h.huge_pages = layout_.huge_pages ? 1 : 0;
    h.host_isa = engine::host_isa_name(engine::active_host_isa());
    h.accumulators = layout_.accumulators ? 1 : 0;
    auto body = std::make_shared<std::string>(encode_hello(h));
    WireHeader w = make_header(MsgType::kHello, opt_.epoch, 0);
    w.payload_bytes = static_cast<uint32_t>(body->size());
    unsigned char buf[kWireHeaderBytes];
    encode(w, buf);
    std::future<std::string> answer = n.hello.get_future();
    n.ch->send(buf, sizeof buf, body->data(), body->size(), [body](bool, const std::string&) {});
    // Allocating (and first-touching) a large state takes the node a while.
    const double wait_s = opt_.connect_timeout_s + static_cast<double>(h.elements) * 20 / 1e9;
    if (answer.wait_for(std::chrono::duration<double>(wait_s)) != std::future_status::ready) {
      lose(n, "no WELCOME within " + std::to_string(static_cast<int>(wait_s)) + " s");
      throw engine::HostBackendLost(lost_text(n), n.address, /*unreachable_at_start=*/true);
    }
    const std::string refusal = answer.get();
    if (!refusal.empty()) throw std::runtime_error("optimizer node " + n.address + " refused the session: " + refusal);
  }

  RemoteHostOptions opt_;
  engine::HostStateLayout layout_;
  std::unique_ptr<Transport> tr_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  int64_t works_ = 0;
  bool stop_ = false;
  std::thread sender_, watchdog_;
};

std::unique_ptr<engine::HostOptimizer> make_remote_host_optimizer(const RemoteHostOptions& options,
                                                                  const engine::HostStateLayout& layout) {
  return std::make_unique<RemoteHostOptimizer>(options, layout);
}

std::vector<int64_t> slice_bounds(const engine::HostStateLayout& layout, size_t nodes) {
  std::vector<int64_t> cuts = layout.segments;
  if (cuts.empty() || cuts.front() != 0) cuts.insert(cuts.begin(), 0);
  std::vector<int64_t> out = {0};
  for (size_t k = 1; k < nodes; ++k) {
    const int64_t ideal = layout.elements * static_cast<int64_t>(k) / static_cast<int64_t>(nodes);
    int64_t best = out.back();
    for (int64_t c : cuts)
      if (c >= out.back() && std::llabs(c - ideal) < std::llabs(best - ideal)) best = c;
    out.push_back(best);
  }
  out.push_back(layout.elements);
  return out;
}

std::pair<std::string, int> parse_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    throw std::invalid_argument("optimizer node address '" + address + "': expected HOST:PORT");
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw std::invalid_argument("optimizer node address '" + address + "': port is not a number");
  }
  if (port < 1 || port > 65535) throw std::invalid_argument("optimizer node address '" + address + "': port outside 1-65535");
  return {host, port};
}

}  // namespace zenflow::transport
