// `zenflow bench transport`: the UCX transport's rendezvous stream, measured at the receiver,
// against `ucx_perftest -t ucp_am_bw -e` (the yardstick, docs/benchmarks.md)
// in the same run.
//
// The receiver is a child process (this binary, re-executed in a hidden mode) listening on
// 127.0.0.1:0; the sender streams chunks from one registered buffer with at most --inflight
// sends outstanding into a ring of registered landing buffers. The receiver times from the
// first landed chunk after warm-up to the last and reports bytes/time as JSON on a pipe
// (send completion is not arrival: openucx/ucx #10184). zenflow and perftest runs alternate,
// so a drifting machine affects both; every child runs under a deadline and is killed by PID.
// --same-core puts both ends of both on core 0, as a node sharing its worker's host core.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client/commands.h"
#include "worker/transport/transport.h"

namespace zenflow::cli {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;
using transport::Channel;
using transport::ChannelHandler;
using transport::Transport;

struct TransportBenchArgs {
  std::vector<std::string> tls{"tcp", "sm"};
  std::vector<std::string> chunks{"4M", "64M"};
  double seconds = 0;  // > 0: stream this long instead of a message count
  int messages = 0;    // 0: the per-TLS/size defaults below
  int repeats = 3;
  // The remote backend posts every chunk of an op at once, up to Welcome::credits (4) ops
  // per node: a window step's gradients are tens of 8 MiB chunks outstanding. 16 is below
  // that; at 8, 64 MiB chunks over tcp reached only 74-84% of perftest (which streams with
  // no limit, -O 0) while 16 matches it.
  int inflight = 16;
  double timeout_s = 180;  // per run
  // Sender and receiver (and perftest's two ends) on one core, as a node sharing the
  // worker's host core: what a spinning progress loop costs a peer that needs the core.
  bool same_core = false;
  // Hidden: the receiver child.
  int receive_fd = -1;
  int warmup = 0;
};

constexpr int kLandingSlots = 4;
constexpr char kWarmup = 'W', kData = 'D', kEnd = 'E';

size_t parse_bytes(const std::string& text) {
  if (text.empty()) throw std::invalid_argument("--chunk: empty value");
  size_t mult = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      mult = size_t{1} << 10;
      break;
    case 'M':
    case 'm':
      mult = size_t{1} << 20;
      break;
    case 'G':
    case 'g':
      mult = size_t{1} << 30;
      break;
    default:
      break;
  }
  if (mult != 1) digits.pop_back();
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (digits.empty() || used != digits.size() || v <= 0)
    throw std::invalid_argument("--chunk: '" + text + "' is not a size (e.g. 4M, 64M, 1048576)");
  return static_cast<size_t>(v) * mult;
}

Clock::time_point after_seconds(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The UCX environment for --tls. "sm": 1.13's client-server wireup needs a tcp interface on
// the listener's device (lo); with tcp put disabled tcp offers no data lane, so all data moves
// over shared memory. perftest gets the same environment.
void set_ucx_env(const std::string& tls) {
  if (tls == "tcp") {
    setenv("UCX_TLS", "tcp", 1);
    unsetenv("UCX_TCP_PUT_ENABLE");
    unsetenv("UCX_MM_ERROR_HANDLING");  // unread by tcp; UCX would warn about it on stdout
  } else if (tls == "sm") {
    setenv("UCX_TLS", "sm,tcp", 1);
    setenv("UCX_TCP_PUT_ENABLE", "n", 1);
    setenv("UCX_MM_ERROR_HANDLING", "y", 1);  // perftest -e needs it as much as zenflow
  } else {
    throw std::invalid_argument("--tls: '" + tls + "' is not tcp or sm");
  }
  setenv("UCX_NET_DEVICES", "lo", 1);
}

// Defaults sized like the yardstick runs (docs/benchmarks.md): messages and warm-up per TLS and size.
void default_counts(const std::string& tls, size_t chunk, int* messages, int* warmup) {
  const bool big = chunk >= (size_t{32} << 20);
  if (tls == "sm") {
    *messages = big ? 200 : 3000;
    *warmup = big ? 10 : 100;
  } else {
    *messages = big ? 50 : 500;
    *warmup = big ? 3 : 20;
  }
}

void pin_to_core(int core) {
  if (std::thread::hardware_concurrency() < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  sched_setaffinity(0, sizeof set, &set);
}

void unpin() {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned c = 0; c < std::thread::hardware_concurrency(); ++c) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof set, &set);
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    throw std::runtime_error("bench transport: cannot bind a port on 127.0.0.1");
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A child process with its stdout on a pipe (or /dev/null), killed by PID if still running.
class ChildProcess {
 public:
  // stderr goes to /dev/null when `quiet`; `keep_fd` stays open in the child.
  ChildProcess(const std::vector<std::string>& args, bool capture_stdout, bool quiet, int keep_fd = -1) {
    int out[2] = {-1, -1};
    if (capture_stdout && pipe(out) != 0) throw std::runtime_error("bench transport: pipe failed");
    std::vector<char*> argv;
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("bench transport: fork failed");
    if (pid_ == 0) {
      const int devnull = open("/dev/null", O_RDWR);
      dup2(capture_stdout ? out[1] : devnull, 1);
      if (quiet) dup2(devnull, 2);
      for (int fd = 3; fd < 1024; ++fd)
        if (fd != keep_fd) ::close(fd);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    if (capture_stdout) {
      ::close(out[1]);
      out_fd_ = out[0];
    }
  }
  ~ChildProcess() {
    kill_now();
    if (out_fd_ >= 0) ::close(out_fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Everything the child writes to stdout until it closes it or the deadline passes.
  std::string read_all(Clock::time_point deadline) { return read_fd(out_fd_, deadline, false); }
  // Waits for exit until the deadline; kills it then. Returns the exit status or -1.
  int wait(Clock::time_point deadline) {
    while (pid_ > 0) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill_now();
    return -1;
  }
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }
  void kill_now() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  // Reads from fd until EOF, the deadline, or (one_line) a newline.
  static std::string read_fd(int fd, Clock::time_point deadline, bool one_line) {
    std::string text;
    while (fd >= 0 && Clock::now() < deadline) {
      if (one_line && text.find('\n') != std::string::npos) break;
      pollfd p{fd, POLLIN, 0};
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (poll(&p, 1, std::max(1, std::min(left, 200))) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    return text;
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
};

// ---- The receiver child ------------------------------------------------------------------

transport::TransportOptions bench_options(const char* name) {
  transport::TransportOptions o;
  o.name = name;
  return o;
}

int run_receiver(const TransportBenchArgs& a) {
  const size_t chunk = parse_bytes(a.chunks.at(0));
  pin_to_core(a.same_core ? 0 : 1);
  // Everything the handlers touch is declared before the Transport, so it outlives the
  // progress thread (joined when `t` is destroyed, first).
  std::vector<unsigned char> landing(chunk * kLandingSlots);
  std::mutex mu;
  std::condition_variable cv;
  int64_t data_landed = 0, warmup_landed = 0, expected = -1;
  Clock::time_point first, last;
  std::string error;
  std::shared_ptr<Channel> channel;
  int slot = 0;
  auto t = Transport::create(bench_options("bench receiver"));
  t->register_memory(landing.data(), landing.size());
  const int port = t->listen("127.0.0.1", 0, [&](std::shared_ptr<Channel> ch) {
    channel = ch;
    ChannelHandler h;
    h.place = [&](const void*, size_t, size_t len) -> void* {
      if (len != chunk) return nullptr;
      return landing.data() + static_cast<size_t>(slot++ % kLandingSlots) * chunk;
    };
    h.on_message = [&](const void* header, size_t header_len, void*, size_t len) {
      const auto now = Clock::now();
      std::lock_guard<std::mutex> lock(mu);
      const char kind = header_len ? static_cast<const char*>(header)[0] : '?';
      if (kind == kWarmup) {
        ++warmup_landed;
      } else if (kind == kData && len == chunk) {
        if (data_landed == 0) first = now;
        last = now;
        ++data_landed;
      } else if (kind == kEnd && header_len == 1 + sizeof(int64_t)) {
        std::memcpy(&expected, static_cast<const char*>(header) + 1, sizeof(int64_t));
      }
      cv.notify_all();
    };
    h.on_error = [&](const std::string& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (error.empty()) error = e;
      cv.notify_all();
    };
    return h;
  });
  const std::string hello = Json{{"port", port}}.dump() + "\n";
  if (write(a.receive_fd, hello.data(), hello.size()) != static_cast<ssize_t>(hello.size()))
    return kExitFailure;

  std::unique_lock<std::mutex> lock(mu);
  const bool done = cv.wait_for(lock, std::chrono::duration<double>(a.timeout_s),
                                [&] { return !error.empty() || (expected >= 0 && data_landed >= expected); });
  Json out;
  out["data_landed"] = data_landed;
  out["warmup_landed"] = warmup_landed;
  out["expected"] = expected;
  if (!done) error = "receiver timed out after " + std::to_string(a.timeout_s) + " s";
  if (!error.empty() && !(expected >= 0 && data_landed >= expected)) out["error"] = error;
  const double s = std::chrono::duration<double>(last - first).count();
  out["seconds"] = s;
  // The first landing starts the clock: the bytes counted are those of the chunks after it.
  out["gb_per_s"] = data_landed > 1 && s > 0 ? static_cast<double>(data_landed - 1) * chunk / s / 1e9 : 0.0;
  out["transports"] = t->transports();
  lock.unlock();
  const std::string text = out.dump() + "\n";
  const bool wrote = write(a.receive_fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  return wrote && !out.contains("error") ? kExitOk : kExitFailure;
}

// ---- One zenflow run ---------------------------------------------------------------------

struct ZenflowRun {
  double gb_per_s = 0;
  int64_t messages = 0;
  std::string transports;
};

ZenflowRun run_zenflow(const std::string& self, const std::string& tls, size_t chunk, int messages,
                       int warmup, double seconds, int inflight, double timeout_s, bool same_core,
                       unsigned char* source, Transport& sender) {
  int report[2];
  if (pipe(report) != 0) throw std::runtime_error("bench transport: pipe failed");
  const Clock::time_point deadline = after_seconds(timeout_s);
  std::vector<std::string> args = {
      self, "bench",   "transport",           "--receive-fd", std::to_string(report[1]), "--tls",
      tls,  "--chunk", std::to_string(chunk), "--timeout",    std::to_string(timeout_s)};
  if (same_core) args.push_back("--same-core");
  ChildProcess child(args, /*capture_stdout=*/false, /*quiet=*/false, report[1]);
  ::close(report[1]);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{report[0]};
  const std::string hello = ChildProcess::read_fd(report[0], Clock::now() + std::chrono::seconds(30), true);
  Json h = Json::parse(hello, nullptr, /*allow_exceptions=*/false);
  if (!h.is_object() || !h.contains("port"))
    throw std::runtime_error("bench transport: the receiver did not report its port (got '" + hello + "')");

  // Shared with the callbacks, which may run after this function returned (the sender lives on).
  struct Credits {
    std::mutex mu;
    std::condition_variable cv;
    int outstanding = 0;
    std::string error;
  };
  auto state = std::make_shared<Credits>();
  Credits& st = *state;
  ChannelHandler handler;
  handler.on_error = [state](const std::string& e) {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->error.empty()) state->error = e;
    state->cv.notify_all();
  };
  auto ch = sender.connect("127.0.0.1", h["port"].get<int>(), handler, 30.0);
  auto done = [state](bool ok, const std::string& e) {
    std::lock_guard<std::mutex> lock(state->mu);
    --state->outstanding;
    if (!ok && state->error.empty()) state->error = e;
    state->cv.notify_all();
  };
  auto send_one = [&](char kind) {
    std::unique_lock<std::mutex> lock(st.mu);
    st.cv.wait(lock, [&] { return st.outstanding < inflight || !st.error.empty(); });
    if (!st.error.empty()) throw std::runtime_error("bench transport: " + st.error);
    ++st.outstanding;
    lock.unlock();
    ch->send(&kind, 1, source, chunk, done);
  };
  for (int i = 0; i < warmup; ++i) send_one(kWarmup);
  int64_t sent = 0;
  const auto t0 = Clock::now();
  while (seconds > 0 ? Clock::now() - t0 < std::chrono::duration<double>(seconds) : sent < messages) {
    if (Clock::now() > deadline) throw std::runtime_error("bench transport: zenflow run timed out");
    send_one(kData);
    ++sent;
  }
  {
    std::unique_lock<std::mutex> lock(st.mu);
    if (!st.cv.wait_until(lock, deadline, [&] { return st.outstanding == 0 || !st.error.empty(); }))
      throw std::runtime_error("bench transport: sends did not complete in time");
    if (!st.error.empty()) throw std::runtime_error("bench transport: " + st.error);
  }
  char end[1 + sizeof(int64_t)];
  end[0] = kEnd;
  std::memcpy(end + 1, &sent, sizeof sent);
  ch->send(end, sizeof end, nullptr, 0, nullptr);
  const std::string text = ChildProcess::read_fd(report[0], deadline, true);
  child.wait(deadline);
  ch->close();
  Json r = Json::parse(text, nullptr, false);
  if (!r.is_object()) throw std::runtime_error("bench transport: no report from the receiver");
  if (r.contains("error"))
    throw std::runtime_error("bench transport: receiver: " + r["error"].get<std::string>());
  ZenflowRun run;
  run.gb_per_s = r["gb_per_s"].get<double>();
  run.messages = sent;
  run.transports = r["transports"].get<std::string>();
  return run;
}

// ---- One ucx_perftest run ------------------------------------------------------------------

// The last "Final:" line's overall bandwidth (MiB/s), as GB/s; < 0 if it did not run.
double run_perftest(size_t chunk, int messages, int warmup, double timeout_s, bool same_core,
                    std::string* note) {
  const Clock::time_point deadline = after_seconds(timeout_s);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string port = std::to_string(free_port());
    ChildProcess server({"ucx_perftest", "-p", port, "-c", same_core ? "0" : "1"}, /*capture_stdout=*/false,
                        /*quiet=*/true);
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + 300 * attempt));
    ChildProcess client(
        {"ucx_perftest", "127.0.0.1", "-p", port, "-t", "ucp_am_bw", "-s", std::to_string(chunk), "-n",
         std::to_string(messages), "-w", std::to_string(warmup), "-c", "0", "-e"},
        /*capture_stdout=*/true, /*quiet=*/true);
    const std::string out = client.read_all(deadline);
    client.wait(deadline);
    server.wait(std::min(deadline, Clock::now() + std::chrono::seconds(5)));
    const size_t at = out.rfind("Final:");
    if (at == std::string::npos) {
      *note = "ucx_perftest printed no Final line (attempt " + std::to_string(attempt + 1) + ")";
      if (Clock::now() >= deadline) break;
      continue;
    }
    // Final: iterations typical average overall bw_average bw_overall rate_average rate_overall
    std::vector<double> fields;
    size_t pos = at + 6;
    const size_t end = out.find('\n', at);
    while (pos < end) {
      char* stop = nullptr;
      const double v = std::strtod(out.c_str() + pos, &stop);
      if (stop == out.c_str() + pos) break;
      fields.push_back(v);
      pos = static_cast<size_t>(stop - out.c_str());
    }
    if (fields.size() < 6) {
      *note = "cannot parse ucx_perftest's Final line";
      return -1;
    }
    return fields[5] * 1048576.0 / 1e9;
  }
  return -1;
}

// ---- The bench -----------------------------------------------------------------------------

int run_transport_bench(const TransportBenchArgs& a, const CommandContext& ctx) {
  if (a.receive_fd >= 0) {
    set_ucx_env(a.tls.at(0));
    return run_receiver(a);
  }
  const std::string self = "/proc/self/exe";
  Json results = Json::array();
  bool all_ok = true;
  for (const std::string& tls : a.tls) {
    set_ucx_env(tls);  // before the sender's Transport: UCX reads it at context creation
    if (a.same_core) pin_to_core(0);  // before it: its threads inherit the core
    auto sender = Transport::create(bench_options("bench sender"));
    for (const std::string& chunk_text : a.chunks) {
      const size_t chunk = parse_bytes(chunk_text);
      int messages = 0, warmup = 0;
      default_counts(tls, chunk, &messages, &warmup);
      if (a.messages > 0) messages = a.messages;
      std::vector<unsigned char> source(chunk);
      for (size_t i = 0; i < chunk; ++i) source[i] = static_cast<unsigned char>(i * 131);
      sender->register_memory(source.data(), chunk);
      Json entry;
      entry["tls"] = tls;
      entry["ucx_tls"] = std::getenv("UCX_TLS");
      entry["chunk_bytes"] = chunk;
      entry["warmup"] = warmup;
      std::vector<double> zf, pt;
      std::vector<int64_t> counts;
      std::string note;
      try {
        for (int r = 0; r < a.repeats; ++r) {
          pin_to_core(0);
          const ZenflowRun z = run_zenflow(self, tls, chunk, messages, warmup, a.seconds, a.inflight,
                                           a.timeout_s, a.same_core, source.data(), *sender);
          if (!a.same_core) unpin();
          zf.push_back(z.gb_per_s);
          counts.push_back(z.messages);
          entry["transports"] = z.transports;
          // In --seconds mode perftest moves as many chunks as zenflow just did.
          const int n = a.seconds > 0 ? static_cast<int>(std::max<int64_t>(z.messages, 1)) : messages;
          const double p = run_perftest(chunk, n, warmup, a.timeout_s, a.same_core, &note);
          if (p > 0) pt.push_back(p);
        }
      } catch (const std::exception& e) {
        if (!a.same_core) unpin();
        entry["error"] = e.what();
        all_ok = false;
      }
      sender->unregister_memory(source.data());
      entry["messages"] = counts;
      entry["zenflow_gb_per_s"] = zf;
      entry["zenflow_median"] = median(zf);
      entry["perftest_gb_per_s"] = pt;
      entry["perftest_median"] = pt.empty() ? Json() : Json(median(pt));
      entry["ratio"] = pt.empty() || median(pt) <= 0 ? Json() : Json(median(zf) / median(pt));
      if (!note.empty() && pt.size() < zf.size()) entry["perftest_note"] = note;
      results.push_back(entry);
    }
  }
  Json out;
  out["bench"] = "transport";
  out["inflight"] = a.inflight;
  out["repeats"] = a.repeats;
  out["mode"] = a.seconds > 0 ? "seconds" : "messages";
  out["same_core"] = a.same_core;
  out["perftest"] = std::string("ucx_perftest -t ucp_am_bw -e (PEER), server -c ") +
                    (a.same_core ? "0" : "1") + ", client -c 0; overall MiB/s as GB/s";
  out["results"] = results;
  std::cout << out.dump(2) << std::endl;
  (void)ctx;
  return all_ok ? kExitOk : kExitFailure;
}

const CommandRegistrar kTransportBench(65, [](CommandContext& ctx) {
  auto args = std::make_shared<TransportBenchArgs>();
  CLI::App* cmd = ctx.bench->add_subcommand(
      "transport", "UCX rendezvous stream measured at the receiver vs ucx_perftest ucp_am_bw (JSON)");
  cmd->add_option("--tls", args->tls, "Transports: tcp (lo) and/or sm")->delimiter(',');
  cmd->add_option("--chunk", args->chunks, "Chunk sizes (e.g. 4M,64M)")->delimiter(',');
  auto* secs = cmd->add_option("--seconds", args->seconds,
                               "Stream this long per run (perftest then moves as many chunks)")
                   ->check(CLI::Range(0.1, 600.0));
  cmd->add_option("--messages", args->messages, "Chunks per run (default: sized per TLS and chunk)")
      ->check(CLI::Range(2, 10000000))
      ->excludes(secs);
  cmd->add_option("--repeats", args->repeats, "Alternating zenflow/perftest runs (medians are printed)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--inflight", args->inflight, "Sends outstanding at once (credits)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--timeout", args->timeout_s, "Deadline per run, seconds")->check(CLI::Range(1.0, 3600.0));
  cmd->add_flag("--same-core", args->same_core, "Sender and receiver (and perftest's ends) on one core");
  cmd->add_option("--receive-fd", args->receive_fd, "internal: run as the receiver, reporting on this fd")
      ->group("");
  CommandContext* context = &ctx;
  cmd->callback([args, context] {
    try {
      for (const auto& t : args->tls)
        if (t != "tcp" && t != "sm") throw std::invalid_argument("--tls: '" + t + "' is not tcp or sm");
      for (const auto& c : args->chunks) parse_bytes(c);
    } catch (const std::invalid_argument& e) {
      std::cerr << "zenflow bench transport: " << e.what() << "\n";
      context->exit_code = kExitBadInput;
      return;
    }
    try {
      context->exit_code = run_transport_bench(*args, *context);
    } catch (const std::exception& e) {
      std::cerr << "zenflow bench transport: " << e.what() << "\n";
      context->exit_code = kExitFailure;
    }
  });
});

}  // namespace
}  // namespace zenflow::cli
