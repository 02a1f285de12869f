// The /metrics and /healthz HTTP endpoint on civetweb: start, handlers, port read-back, stop.
#include "common/metrics/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dlfcn.h>
#include <link.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>
#include <utility>

#include "common/metrics/exposition.h"

// civetweb's threads in a LibTorch process. glibc carves a process's static TLS out of each
// thread's stack size (glibc bug 11787), and Debian's civetweb asks for 100 KiB stacks
// (built with USE_STACK_SIZE=102400, no run-time option). LibTorch + glog + OpenBLAS bring
// about 100 KiB of static TLS, so pthread_create fails with EINVAL and mg_start2 reports
// "Cannot create threads". This definition interposes libc's for the whole process (the
// executable's symbol wins) and, for calls from libcivetweb only, adds the static TLS on top
// of the request, leaving civetweb the stack it asked for; every other caller is untouched.
namespace {
size_t static_tls_bytes() {
  size_t total = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_TLS) *static_cast<size_t*>(data) += ph.p_memsz + ph.p_align;
        }
        return 0;
      },
      &total);
  return total;
}
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stacksize) noexcept {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  static const SetStackSize libc_set = reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (libc_set == nullptr) return ENOSYS;
  Dl_info caller;
  if (dladdr(__builtin_return_address(0), &caller) != 0 && caller.dli_fname != nullptr &&
      std::strstr(caller.dli_fname, "libcivetweb") != nullptr) {
    static const size_t tls = static_tls_bytes();
    stacksize += tls;
  }
  return libc_set(attr, stacksize);
}

namespace zenflow::metrics {
namespace {

// civetweb wants mg_init_library once per process before the first mg_start.
void init_civetweb_once() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

int send_response(mg_connection* conn, int status, const char* content_type, const std::string& body,
                  const char* allow = nullptr) {
  const mg_request_info* request = mg_get_request_info(conn);
  const bool head = request != nullptr && std::strcmp(request->request_method, "HEAD") == 0;
  mg_response_header_start(conn, status);
  mg_response_header_add(conn, "Content-Type", content_type, -1);
  mg_response_header_add(conn, "Content-Length", std::to_string(body.size()).c_str(), -1);
  mg_response_header_add(conn, "Cache-Control", "no-store", -1);
  if (allow != nullptr) mg_response_header_add(conn, "Allow", allow, -1);
  mg_response_header_send(conn);
  if (!head && !body.empty()) mg_write(conn, body.data(), body.size());
  return status;  // civetweb: a value in 1..999 means "handled", and it logs it as the status
}

// Whether the request is a GET/HEAD of exactly `path`; otherwise answers 404 or 405.
bool accept_request(mg_connection* conn, const char* path, int* status) {
  const mg_request_info* request = mg_get_request_info(conn);
  // civetweb routes "/metrics/..." and "/metricsX" to the "/metrics" handler too.
  if (request->local_uri == nullptr || std::strcmp(request->local_uri, path) != 0) {
    *status = send_response(conn, 404, "text/plain; charset=utf-8", "not found\n");
    return false;
  }
  if (std::strcmp(request->request_method, "GET") != 0 && std::strcmp(request->request_method, "HEAD") != 0) {
    *status = send_response(conn, 405, "text/plain; charset=utf-8", "method not allowed\n", "GET, HEAD");
    return false;
  }
  return true;
}

// Opens and closes a TCP connection to the server's own listening address.
void wake_listener(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  // A wildcard or a host name ("localhost") is reachable on loopback.
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 || addr.sin_addr.s_addr == htonl(INADDR_ANY)) {
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);  // refused once closed: fine
  close(fd);
}

}  // namespace

MetricsServer::MetricsServer(const MetricsRegistry& registry, const std::string& listen_host, int port)
    : MetricsServer([&registry] { return render_text(registry); }, listen_host, port) {}

MetricsServer::MetricsServer(Render render, const std::string& listen_host, int port)
    : render_(std::move(render)), host_(listen_host) {
  if (port < 0 || port > 65535) {
    throw std::invalid_argument("metrics server: port must be in [0, 65535], got " + std::to_string(port));
  }
  if (listen_host.empty() || listen_host.find_first_of(", \t\r\n") != std::string::npos) {
    throw std::invalid_argument("metrics server: invalid listen host \"" + listen_host + "\"");
  }
  init_civetweb_once();
  const std::string address = listen_host + ":" + std::to_string(port);
  const char* options[] = {
      "listening_ports",
      address.c_str(),
      // A scrape every few seconds and a health probe: two workers leave room for both
      // without taking threads from training.
      "num_threads",
      "2",
      // A stuck client must not hold a worker forever.
      "request_timeout_ms",
      "10000",
      nullptr,
  };
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof callbacks);
  // mg_start2's error text is only "Failed to setup server ports"; the reason (the errno of
  // bind) arrives through the log callback, on this thread, before mg_start2 returns.
  callbacks.log_message = [](const mg_connection* conn, const char* message) -> int {
    auto* self = static_cast<MetricsServer*>(mg_get_user_data(mg_get_context(conn)));
    if (self != nullptr && self->starting_) {
      std::lock_guard<std::mutex> lock(self->start_log_mu_);
      self->start_log_.push_back(message);
    }
    return 1;  // handled: civetweb writes nothing itself
  };
  mg_init_data init;
  init.callbacks = &callbacks;
  init.user_data = this;
  init.configuration_options = options;
  char error_text[256] = "";
  unsigned error_code = 0;
  mg_error_data error;
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof error_text;
  starting_ = true;
  ctx_ = mg_start2(&init, &error);
  starting_ = false;
  if (ctx_ == nullptr) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(start_log_mu_);
      for (const std::string& line : start_log_) {
        if (line != error_text) reason += (reason.empty() ? "" : "; ") + line;
      }
    }
    if (reason.empty()) reason = error_text[0] ? error_text : "civetweb failed to start";
    throw std::runtime_error("metrics server: cannot listen on " + address + ": " + reason);
  }
  mg_server_port bound;
  if (mg_get_server_ports(ctx_, 1, &bound) != 1) {
    mg_stop(ctx_);
    throw std::runtime_error("metrics server: cannot listen on " + address +
                             ": no listening port after start");
  }
  port_ = bound.port;
  // civetweb has no way to install handlers before it listens; a request in the moment
  // between gets its default 404, which a scraper simply retries.
  mg_set_request_handler(ctx_, "/metrics", &MetricsServer::handle_metrics, this);
  mg_set_request_handler(ctx_, "/healthz", &MetricsServer::handle_healthz, this);
}

MetricsServer::~MetricsServer() {
  if (ctx_ == nullptr) return;
  // civetweb's listener thread sees the stop flag only when its poll() returns, which
  // without traffic is after 2 s: a bare mg_stop would add up to 2 s to every process exit.
  // Connecting to our own port wakes it; repeat until mg_stop is done, since a connection
  // that lands before the flag is set just gets served and the poll starts over.
  std::atomic<bool> stopped{false};
  std::thread stopper([this, &stopped] {
    mg_stop(ctx_);
    stopped = true;
  });
  while (!stopped) {
    wake_listener(host_, port_);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stopper.join();
}

void MetricsServer::set_health_check(HealthCheck check) {
  std::lock_guard<std::mutex> lock(health_mu_);
  health_check_ = std::move(check);
}

MetricsServer::Health MetricsServer::check_health() const {
  HealthCheck check;
  {
    std::lock_guard<std::mutex> lock(health_mu_);
    check = health_check_;
  }
  if (!check) return {};
  try {
    return check();
  } catch (const std::exception& e) {
    return {false, std::string("health check failed: ") + e.what()};
  }
}

int MetricsServer::handle_metrics(mg_connection* conn, void* self) {
  int status = 0;
  if (!accept_request(conn, "/metrics", &status)) return status;
  std::string body;
  try {
    body = static_cast<MetricsServer*>(self)->render_();
  } catch (const std::exception& e) {
    return send_response(conn, 500, "text/plain; charset=utf-8", std::string("metrics: ") + e.what() + "\n");
  }
  return send_response(conn, 200, kTextContentType, body);
}

void MetricsServer::add_page(const std::string& prefix, PageHandler handler) {
  routes_.push_back(Route{prefix, std::move(handler)});
  mg_set_request_handler(ctx_, prefix.c_str(), &MetricsServer::handle_page, &routes_.back());
}

int MetricsServer::handle_page(mg_connection* conn, void* route) {
  const Route& r = *static_cast<const Route*>(route);
  const mg_request_info* request = mg_get_request_info(conn);
  if (std::strcmp(request->request_method, "GET") != 0 && std::strcmp(request->request_method, "HEAD") != 0)
    return send_response(conn, 405, "text/plain; charset=utf-8", "method not allowed\n", "GET, HEAD");
  const std::string uri = request->local_uri ? request->local_uri : "";
  if (uri.compare(0, r.prefix.size(), r.prefix) != 0)
    return send_response(conn, 404, "text/plain; charset=utf-8", "not found\n");
  try {
    const Page page = r.handler(uri.substr(r.prefix.size()));
    return send_response(conn, page.status, page.content_type.c_str(), page.body);
  } catch (const std::exception& e) {
    return send_response(conn, 500, "text/plain; charset=utf-8", std::string("error: ") + e.what() + "\n");
  }
}

int MetricsServer::handle_healthz(mg_connection* conn, void* self) {
  int status = 0;
  if (!accept_request(conn, "/healthz", &status)) return status;
  const Health health = static_cast<MetricsServer*>(self)->check_health();
  if (health.ok) return send_response(conn, 200, "text/plain; charset=utf-8", "ok\n");
  return send_response(conn, 503, "text/plain; charset=utf-8", "unhealthy: " + health.reason + "\n");
}

}  // namespace zenflow::metrics
