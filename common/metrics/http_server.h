// The /metrics and /healthz HTTP endpoint of a process, on civetweb.
//
//   GET /metrics  200, Content-Type "text/plain; version=0.0.4; charset=utf-8", body
//                 render_text(registry) (or the render function's text); 500
//                 "metrics: <reason>\n" when a collector (or the render function) throws.
//   GET /healthz  200 "ok\n", or 503 "unhealthy: <reason>\n" when the health check says so
//                 (or throws).
//   HEAD is answered like GET without a body; other methods get 405, other paths 404.
//   Responses carry Content-Length and "Connection: close" (no keep-alive).
//
// Thread-safety: requests are served on the server's own threads (civetweb's listener and
// two workers), which call render_text() (or the render function) and the health check; all
// must tolerate that (MetricsRegistry does), two requests at a time. All member functions may be called from any thread.
// Side effect: civetweb sets SIGPIPE to SIG_IGN for the whole process when it starts, so a
// write to a closed socket or pipe anywhere returns EPIPE instead of killing the process.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics/registry.h"

struct mg_context;
struct mg_connection;

namespace zenflow::metrics {

class MetricsServer {
 public:
  struct Health {
    bool ok = true;
    std::string reason;  // why not ok: the body of the 503
  };
  using HealthCheck = std::function<Health()>;
  // The /metrics body, produced per request: text format 0.0.4.
  using Render = std::function<std::string()>;

  // Listens on listen_host:port and serves until destroyed; `registry` must outlive the
  // server. listen_host is an IPv4 address ("127.0.0.1", "0.0.0.0" for all interfaces) or
  // "localhost" (Debian's civetweb is built without IPv6). Port 0 takes a free port chosen
  // by the kernel; port() reads it back. Throws std::invalid_argument for a port outside
  // [0, 65535], or an empty host or one with ',' or whitespace (civetweb's option syntax);
  // std::runtime_error "metrics server: cannot listen on HOST:PORT: <civetweb's reason>" when
  // it cannot bind, e.g. "... cannot bind to 127.0.0.1:9400: 98 (Address already in use)".
  explicit MetricsServer(const MetricsRegistry& registry, const std::string& listen_host = "127.0.0.1",
                         int port = 0);
  // The same, serving what `render` returns (e.g. a merge of several processes' metrics);
  // whatever it captures must outlive the server.
  explicit MetricsServer(Render render, const std::string& listen_host = "127.0.0.1", int port = 0);

  // Stops accepting, waits for requests in flight to finish and closes the port (about 10 ms
  // when idle). Must not be called from a health check or collector (it waits for them).
  ~MetricsServer();

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound port (the kernel's choice when constructed with 0).
  int port() const { return port_; }
  const std::string& host() const { return host_; }

  // Replaces the /healthz check (none: always healthy). It runs on a server thread per request.
  void set_health_check(HealthCheck check);

  // A page beside /metrics: GET/HEAD of `prefix` + REST is answered with what `handler`
  // returns for REST (e.g. "/jobs/" and "j-000001/report"). Runs on a server thread per
  // request; what it captures must outlive the server. An exception is a 500.
  struct Page {
    int status = 200;
    std::string content_type = "text/html; charset=utf-8";
    std::string body;
  };
  using PageHandler = std::function<Page(const std::string& rest)>;
  void add_page(const std::string& prefix, PageHandler handler);

 private:
  static int handle_metrics(mg_connection* conn, void* self);
  static int handle_healthz(mg_connection* conn, void* self);
  static int handle_page(mg_connection* conn, void* route);
  struct Route {
    std::string prefix;
    PageHandler handler;
  };
  std::list<Route> routes_;  // stable addresses: civetweb holds pointers to them
  Health check_health() const;

  Render render_;
  std::string host_;
  int port_ = 0;
  mutable std::mutex health_mu_;
  HealthCheck health_check_;
  std::atomic<bool> starting_{false};  // true during mg_start2
  std::mutex start_log_mu_;
  std::vector<std::string> start_log_;  // civetweb's log lines during mg_start2
  mg_context* ctx_ = nullptr;
};

}  // namespace zenflow::metrics
