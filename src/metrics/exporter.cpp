// MetricsHttpServer: a minimal blocking HTTP/1.1 server for Prometheus scrapes.
//
// One thread accepts and serves connections one at a time: scrapes are rare (seconds apart) and
// rendering is fast, so a thread per connection would buy nothing. Each connection has bounded
// time and size budgets, so a slow or hostile client delays scrapes by at most kReadTimeout and
// never stops the server. Every blocking wait also watches a wake pipe, which the destructor
// writes to, so destruction is prompt even in the middle of a connection.
//
// Listen address: "HOST:PORT" where HOST is an IPv4 address, "localhost" (127.0.0.1), or
// "", "*" or "0.0.0.0" for all interfaces; PORT is 0..65535, 0 picks a free port (see port()).
// IPv6 is not supported.
//
// Responses: GET /metrics (query string ignored) → 200 with the registry's render();
// other paths → 404; methods other than GET → 405; a malformed request line → 400; a request
// head over kMaxRequestHeadBytes → 431; no complete head within kReadTimeout → 408.
// Every response carries Content-Length and Connection: close.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <string_view>
#include <system_error>
#include <thread>

#include "helios/metrics.h"

namespace helios {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kReadTimeout = 2s;          // whole request head, from accept
constexpr auto kWriteTimeout = 5s;         // whole response
constexpr auto kDrainTimeout = 200ms;      // reading what the client still sends after the response
constexpr int kAcceptPollMs = 250;         // the stop flag is also checked this often
constexpr size_t kMaxRequestHeadBytes = 8192;
constexpr size_t kMaxDrainBytes = 64 * 1024;

std::string errno_text(int err) { return std::system_category().message(err); }

Status parse_listen(const std::string& listen, sockaddr_in* addr) {
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return invalid_argument("metrics listen address \"" + listen + "\": expected HOST:PORT");
  }
  std::string host = listen.substr(0, colon);
  std::string port = listen.substr(colon + 1);
  bool port_ok = !port.empty() && port.size() <= 5 &&
                 std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                 std::stoi(port) <= 65535;
  if (!port_ok) {
    return invalid_argument("metrics listen address \"" + listen + "\": port \"" + port +
                            "\" is not a number in 0..65535");
  }
  *addr = {};
  addr->sin_family = AF_INET;
  addr->sin_port = htons(static_cast<uint16_t>(std::stoi(port)));
  if (host.empty() || host == "*" || host == "0.0.0.0") {
    addr->sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (host == "localhost") {
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (inet_pton(AF_INET, host.c_str(), &addr->sin_addr) != 1) {
    return invalid_argument("metrics listen address \"" + listen + "\": host \"" + host +
                            "\" is not an IPv4 address or \"localhost\"");
  }
  return ok_status();
}

std::string make_response(int code, const char* reason, const char* content_type,
                          const std::string& body, const char* extra_header = "") {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\n" +
         "Content-Type: " + content_type + "\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n" + extra_header +
         "Connection: close\r\n\r\n" + body;
}

std::string error_response(int code, const char* reason, const char* extra_header = "") {
  return make_response(code, reason, "text/plain; charset=utf-8", std::string(reason) + "\n",
                       extra_header);
}

class HttpExporter final : public MetricsHttpServer {
 public:
  HttpExporter(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
               const MetricsRegistry& registry)
      : listen_fd_(listen_fd), wake_read_fd_(wake_read_fd), wake_write_fd_(wake_write_fd),
        port_(port), registry_(registry) {}

  ~HttpExporter() override {
    stop_.store(true);
    if (thread_.joinable()) {
      char byte = 1;
      ssize_t ignored = write(wake_write_fd_, &byte, 1);  // wakes every poll below
      (void)ignored;
      thread_.join();
    }
    close(listen_fd_);
    close(wake_read_fd_);
    close(wake_write_fd_);
  }

  void start_thread() { thread_ = std::thread([this] { serve_loop(); }); }
  int port() const override { return port_; }

 private:
  enum class Wait { kReady, kTimeout, kStopped };

  // Waits until `fd` has `events` or `deadline` passes; kStopped once the destructor has run.
  Wait wait_for(int fd, short events, Clock::time_point deadline) const {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return Wait::kTimeout;
      pollfd fds[2] = {{fd, events, 0}, {wake_read_fd_, POLLIN, 0}};
      int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), kAcceptPollMs)));
      if (stop_.load() || fds[1].revents) return Wait::kStopped;
      if (n > 0) return Wait::kReady;  // readiness, error or hangup: the next call reports which
      if (n < 0 && errno != EINTR) return Wait::kTimeout;
    }
  }

  void serve_loop() {
    while (!stop_.load()) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_fd_, POLLIN, 0}};
      int n = poll(fds, 2, kAcceptPollMs);
      if (stop_.load() || (n > 0 && fds[1].revents)) break;
      if (n <= 0 || !(fds[0].revents & POLLIN)) continue;
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // EAGAIN: the client went away first. EMFILE and friends: back off instead of spinning.
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) std::this_thread::sleep_for(50ms);
        continue;
      }
      try {
        serve_connection(fd);
      } catch (const std::exception&) {
        // Out of memory while rendering, most likely; drop this connection and keep serving.
      }
      close(fd);
    }
  }

  // Reads until the blank line that ends the request head. Returns the HTTP status to answer
  // with on failure (0 when the head, or at least a whole request line, was read; -1 when the
  // connection should just be closed).
  int read_request_head(int fd, Clock::time_point deadline, std::string* head) const {
    char buf[1024];
    for (;;) {
      if (head->find("\r\n\r\n") != std::string::npos || head->find("\n\n") != std::string::npos) return 0;
      if (head->size() >= kMaxRequestHeadBytes) return 431;
      Wait w = wait_for(fd, POLLIN, deadline);
      if (w == Wait::kStopped) return -1;
      if (w == Wait::kTimeout) return 408;
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        head->append(buf, static_cast<size_t>(n));
      } else if (n == 0) {  // the client stopped sending: answer if the request line is whole
        return head->find('\n') != std::string::npos ? 0 : -1;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return -1;
      }
    }
  }

  std::string respond(std::string_view head) const {
    std::string_view line = head.substr(0, head.find('\n'));
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // request-line = method SP request-target SP HTTP-version
    size_t sp1 = line.find(' ');
    size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
      return error_response(400, "Bad Request");
    }
    std::string_view method = line.substr(0, sp1);
    std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    std::string_view version = line.substr(sp2 + 1);
    bool method_ok = !method.empty() &&
                     std::all_of(method.begin(), method.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
    if (!method_ok || target.empty() || !version.starts_with("HTTP/1.")) {
      return error_response(400, "Bad Request");
    }
    if (method != "GET") return error_response(405, "Method Not Allowed", "Allow: GET\r\n");
    if (target.substr(0, target.find('?')) != "/metrics") return error_response(404, "Not Found");
    return make_response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry_.render());
  }

  void serve_connection(int fd) {
    std::string head;
    int failure = read_request_head(fd, Clock::now() + kReadTimeout, &head);
    if (failure < 0) return;
    std::string response;
    switch (failure) {
      case 0: response = respond(head); break;
      case 408: response = error_response(408, "Request Timeout"); break;
      default: response = error_response(431, "Request Header Fields Too Large"); break;
    }
    if (!write_all(fd, response, Clock::now() + kWriteTimeout)) return;
    // Half-close and read what the client still sends (the rest of a body, say): closing with
    // unread input would reset the connection and could destroy the response in flight.
    shutdown(fd, SHUT_WR);
    drain(fd, Clock::now() + kDrainTimeout);
  }

  bool write_all(int fd, std::string_view data, Clock::time_point deadline) const {
    while (!data.empty()) {
      ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (wait_for(fd, POLLOUT, deadline) != Wait::kReady) return false;
      } else {
        return false;
      }
    }
    return true;
  }

  void drain(int fd, Clock::time_point deadline) const {
    char buf[4096];
    size_t total = 0;
    while (total < kMaxDrainBytes && wait_for(fd, POLLIN, deadline) == Wait::kReady) {
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
      if (n > 0) total += static_cast<size_t>(n);
    }
  }

  const int listen_fd_;
  const int wake_read_fd_;   // readable once the destructor wants the thread to stop
  const int wake_write_fd_;
  const int port_;
  const MetricsRegistry& registry_;  // must outlive the server
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::start(const std::string& listen,
                                                                      const MetricsRegistry& registry) {
  sockaddr_in addr;
  HELIOS_RETURN_IF_ERROR(parse_listen(listen, &addr));
  auto fail = [&](const char* call, int err, int fd) -> Status {
    if (fd >= 0) close(fd);
    return Status(StatusCode::kUnavailable,
                  "cannot serve metrics on " + listen + ": " + call + ": " + errno_text(err));
  };

  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail("socket", errno, -1);
  int one = 1;  // so a restarted daemon can rebind while old connections sit in TIME_WAIT
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) return fail("bind", errno, fd);
  if (::listen(fd, 16) != 0) return fail("listen", errno, fd);
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) return fail("getsockname", errno, fd);

  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return fail("pipe2", errno, fd);
  auto server = std::make_unique<HttpExporter>(fd, wake[0], wake[1], ntohs(bound.sin_port), registry);
  try {
    server->start_thread();
  } catch (const std::system_error& e) {
    return internal_error("cannot serve metrics on " + listen + ": starting a thread: " + e.what());
  }
  return std::unique_ptr<MetricsHttpServer>(std::move(server));
}

}  // namespace helios
