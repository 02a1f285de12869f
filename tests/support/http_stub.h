// A scripted HTTP/1.1 server on 127.0.0.1 (a free port) for tests of HTTP clients: each
// request (method, target, headers, body) goes to a handler whose reply is sent as is, one
// connection per request (Connection: close). A reply can lie about its length to cut a
// body short. Requests are handled one at a time on the server's thread; the server stops
// (and joins it) when destroyed.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zenflow::test_support {

struct HttpRequest {
  std::string method;
  std::string target;                          // path and query, as sent
  std::map<std::string, std::string> headers;  // names lower-case
  std::string body;
};

struct HttpReply {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  int64_t content_length = -1;  // -1: body.size(); more than that: the body is cut short
};

class HttpStub {
 public:
  explicit HttpStub(std::function<HttpReply(const HttpRequest&)> handler) : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 64);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~HttpStub() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<HttpRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void run() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      serve(c);
      ::close(c);
    }
  }

  // Reads until `pred` holds on what arrived or the peer is quiet for 5 s.
  static bool read_until(int c, std::string& in, const std::function<bool()>& pred) {
    char buf[65536];
    while (!pred()) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return false;
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) return false;
      in.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

  static void send_all(int c, const std::string& s) {
    size_t at = 0;
    while (at < s.size()) {
      const ssize_t n = ::send(c, s.data() + at, s.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return;
      at += static_cast<size_t>(n);
    }
  }

  void serve(int c) {
    std::string in;
    if (!read_until(c, in, [&] { return in.find("\r\n\r\n") != std::string::npos; })) return;
    const size_t end = in.find("\r\n\r\n");
    HttpRequest req;
    size_t line_end = in.find("\r\n");
    const std::string first = in.substr(0, line_end);
    const size_t sp1 = first.find(' '), sp2 = first.rfind(' ');
    req.method = first.substr(0, sp1);
    req.target = first.substr(sp1 + 1, sp2 - sp1 - 1);
    for (size_t at = line_end + 2; at < end;) {
      const size_t e = in.find("\r\n", at);
      const std::string line = in.substr(at, e - at);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
        size_t v = colon + 1;
        while (v < line.size() && line[v] == ' ') ++v;
        req.headers[name] = line.substr(v);
      }
      at = e + 2;
    }
    size_t length = 0;
    if (auto it = req.headers.find("content-length"); it != req.headers.end()) length = std::stoul(it->second);
    if (auto it = req.headers.find("expect"); it != req.headers.end() && length > 0)
      send_all(c, "HTTP/1.1 100 Continue\r\n\r\n");
    in.erase(0, end + 4);
    if (!read_until(c, in, [&] { return in.size() >= length; })) return;
    req.body = in.substr(0, length);
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(req);
    }
    const HttpReply r = handler_(req);
    std::string out = "HTTP/1.1 " + std::to_string(r.status) + " X\r\n";
    for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
    const int64_t cl = r.content_length >= 0 ? r.content_length : static_cast<int64_t>(r.body.size());
    out += "Content-Length: " + std::to_string(cl) + "\r\nConnection: close\r\n\r\n";
    if (req.method != "HEAD") out += r.body;
    send_all(c, out);
  }

  std::function<HttpReply(const HttpRequest&)> handler_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<HttpRequest> requests_;
};

}  // namespace zenflow::test_support
