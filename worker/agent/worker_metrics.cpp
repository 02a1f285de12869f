// The worker agent's /metrics: its own series, its ranks' fetched over loopback, merged
// (see worker_metrics.h).
#include "worker/agent/worker_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <utility>

#include "common/metrics/exposition.h"
#include "common/metrics/exposition_merge.h"
#include "common/version.h"

namespace zenflow::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kScrapeErrorReasons[] = {"unreachable", "timeout", "bad_response", "malformed",
                                               "conflict"};

// One loopback HTTP/1.0 GET in flight.
struct Connection {
  int fd = -1;
  bool connecting = false;
  size_t sent = 0;
  std::string received;
  bool done = false;
};

// The body of a complete HTTP/1.x 200 response whose length is right, else kBadResponse.
RankFetch parse_response(const std::string& raw, size_t max_bytes) {
  RankFetch r;
  r.outcome = RankFetch::Outcome::kBadResponse;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos || raw.compare(0, 7, "HTTP/1.") != 0 || raw.size() < 12 ||
      raw.compare(9, 3, "200") != 0)
    return r;
  const size_t body_size = raw.size() - end - 4;
  if (body_size > max_bytes) return r;
  // Content-Length, when given, must match: a short body is a truncated response.
  std::string headers = raw.substr(0, end + 2);
  for (char& c : headers) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  const size_t cl = headers.find("\r\ncontent-length:");
  if (cl != std::string::npos) {
    const long long declared = std::atoll(headers.c_str() + cl + 17);
    if (declared < 0 || static_cast<size_t>(declared) != body_size) return r;
  }
  r.outcome = RankFetch::Outcome::kOk;
  r.body = raw.substr(end + 4);
  return r;
}

int read_port_file(const std::string& path) {
  std::ifstream in(path);
  long port = 0;
  if (!(in >> port) || port <= 0 || port > 65535) return 0;
  return static_cast<int>(port);
}

}  // namespace

std::vector<RankFetch> fetch_rank_metrics(const std::vector<int>& ports, std::chrono::milliseconds timeout,
                                          size_t max_bytes) {
  static const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n";
  std::vector<RankFetch> results(ports.size());
  std::vector<Connection> conns(ports.size());
  auto finish = [&](size_t i, RankFetch::Outcome outcome) {
    conns[i].done = true;
    results[i].outcome = outcome;
  };
  for (size_t i = 0; i < ports.size(); ++i) {
    Connection& c = conns[i];
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) {
      finish(i, RankFetch::Outcome::kUnreachable);
      continue;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(ports[i]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) continue;
    if (errno == EINPROGRESS) {
      c.connecting = true;
    } else {
      finish(i, RankFetch::Outcome::kUnreachable);
    }
  }
  const auto deadline = Clock::now() + timeout;
  std::vector<pollfd> fds;
  std::vector<size_t> owner;
  char buf[65536];
  while (true) {
    fds.clear();
    owner.clear();
    for (size_t i = 0; i < conns.size(); ++i) {
      const Connection& c = conns[i];
      if (c.done) continue;
      const bool writing = c.connecting || c.sent < request.size();
      fds.push_back({c.fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0});
      owner.push_back(i);
    }
    if (fds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left));
    if (ready < 0 && errno != EINTR) break;
    for (size_t k = 0; ready > 0 && k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const size_t i = owner[k];
      Connection& c = conns[i];
      if (c.connecting) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          finish(i, RankFetch::Outcome::kUnreachable);
          continue;
        }
        c.connecting = false;
      }
      if (c.sent < request.size()) {
        const ssize_t n = ::send(c.fd, request.data() + c.sent, request.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) c.sent += static_cast<size_t>(n);
        if (n < 0 && errno != EAGAIN && errno != EINTR) finish(i, RankFetch::Outcome::kUnreachable);
        continue;
      }
      while (true) {
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n > 0) {
          c.received.append(buf, static_cast<size_t>(n));
          if (c.received.size() > max_bytes + 65536) {
            finish(i, RankFetch::Outcome::kBadResponse);
            break;
          }
          continue;
        }
        if (n == 0) {  // HTTP/1.0: the end of the body is the end of the connection
          results[i] = parse_response(c.received, max_bytes);
          c.done = true;
        } else if (errno != EAGAIN && errno != EINTR) {
          finish(i, c.received.empty() ? RankFetch::Outcome::kUnreachable : RankFetch::Outcome::kBadResponse);
        }
        break;
      }
    }
  }
  for (size_t i = 0; i < conns.size(); ++i) {
    if (!conns[i].done) results[i].outcome = RankFetch::Outcome::kTimeout;
    if (conns[i].fd >= 0) ::close(conns[i].fd);
  }
  return results;
}

WorkerMetrics::WorkerMetrics(int64_t slots)
    : registrations(registry_
                        .counter("zenflow_worker_registrations_total",
                                 "Incarnations this worker agent registered with the coordinator")
                        .with({})),
      heartbeat_failures(
          registry_.counter("zenflow_worker_heartbeat_failures_total", "Liveness heartbeats that failed")
              .with({})),
      heartbeat_rtt(
          registry_
              .histogram("zenflow_worker_heartbeat_rtt_seconds",
                         "Round trip of a liveness heartbeat to the coordinator, failed ones included", {},
                         metrics::exponential_buckets(0.0005, 2, 13))
              .with({})),
      lease_renewals(registry_
                         .counter("zenflow_worker_lease_renewals_total",
                                  "Lease renewals written to the ranks (one per rank every 500 ms)")
                         .with({})),
      ranks_(registry_.gauge("zenflow_worker_ranks", "Rank processes this worker runs").with({})),
      rank_scrape_duration_(registry_
                                .gauge("zenflow_worker_rank_scrape_duration_seconds",
                                       "Time the last scrape took to fetch the ranks' metrics")
                                .with({})),
      scrape_errors_(registry_.counter(
          "zenflow_worker_scrape_errors_total",
          "Rank metrics a scrape left out, by reason: a rank unreachable, timed out, answering badly or "
          "malformed; conflict: a family or series an earlier source already gave",
          {"reason"})) {
  metrics::register_build_info(registry_, kVersion);
  registry_.gauge("zenflow_worker_slots", "Slots this worker offers (GPUs, or CPU slots)")
      .with({})
      .set(static_cast<double>(slots));
  for (const char* reason : kScrapeErrorReasons) scrape_errors_.with({reason});  // at 0 from the start
}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::serve(const std::string& host, int port) {
  server_ = std::make_unique<metrics::MetricsServer>([this] { return scrape(); }, host, port);
}

void WorkerMetrics::add_rank(const std::string& job_id, int64_t attempt, int rank,
                             const std::string& port_file) {
  std::lock_guard<std::mutex> lock(mu_);
  targets_[Key{job_id, -attempt, rank}] = Target{port_file, 0};
  ranks_.set(static_cast<double>(targets_.size()));
}

void WorkerMetrics::remove_rank(const std::string& job_id, int64_t attempt, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  targets_.erase(Key{job_id, -attempt, rank});
  ranks_.set(static_cast<double>(targets_.size()));
}

std::string WorkerMetrics::scrape() {
  const auto start = Clock::now();
  std::vector<Key> keys;
  std::vector<int> ports;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, target] : targets_) {
      if (target.port == 0) target.port = read_port_file(target.port_file);  // 0 until the rank listens
      if (target.port == 0) continue;
      keys.push_back(key);
      ports.push_back(target.port);
    }
  }
  const std::vector<RankFetch> fetched = fetch_rank_metrics(ports, kRankTimeout);
  std::vector<metrics::ParsedExposition> sources(1);  // [0]: the agent's own, read last
  for (size_t i = 0; i < fetched.size(); ++i) {
    const char* error = nullptr;
    switch (fetched[i].outcome) {
      case RankFetch::Outcome::kOk:
        try {
          metrics::ParsedExposition rank = metrics::parse_exposition(fetched[i].body);
          metrics::add_missing_labels(
              rank, {{"job_id", std::get<0>(keys[i])}, {"rank", std::to_string(std::get<2>(keys[i]))}});
          sources.push_back(std::move(rank));
        } catch (const metrics::ExpositionError&) {
          error = "malformed";
        }
        break;
      case RankFetch::Outcome::kUnreachable:
        error = "unreachable";
        break;
      case RankFetch::Outcome::kTimeout:
        error = "timeout";
        break;
      case RankFetch::Outcome::kBadResponse:
        error = "bad_response";
        break;
    }
    if (error != nullptr) scrape_errors_.with({error}).inc();
  }
  rank_scrape_duration_.set(std::chrono::duration<double>(Clock::now() - start).count());
  // The agent's series after the fetches, so this scrape's errors and duration are in it.
  sources[0] = metrics::parse_exposition(metrics::render_text(registry_));
  metrics::MergeStats stats;
  std::string text = metrics::merge_expositions(sources, &stats);
  // A family or series two sources disagree on: counted from the next scrape on.
  if (stats.families_dropped + stats.samples_dropped > 0)
    scrape_errors_.with({"conflict"})
        .inc(static_cast<double>(stats.families_dropped + stats.samples_dropped));
  return text;
}

}  // namespace zenflow::agent
