#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "helios/metrics.h"

namespace helios {
namespace {

using Clock = std::chrono::steady_clock;

// A connected TCP client to 127.0.0.1:port, closed on destruction.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{10, 0};  // a broken server fails the test instead of hanging it
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }
  void send_all(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  void close_write() { shutdown(fd_, SHUT_WR); }
  std::string read_all() {
    std::string out;
    char buf[4096];
    for (;;) {
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

struct Response {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

Response parse(const std::string& raw) {
  Response r;
  size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.head = raw.substr(0, end + 2);
  r.body = raw.substr(end + 4);
  return r;
}

Response http_exchange(int port, const std::string& request) {
  Client c(port);
  EXPECT_TRUE(c.connected());
  c.send_all(request);
  return parse(c.read_all());
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.counter("helios_requests_total", "Requests.", {{"model", "m\"1"}})->inc(5);
    registry_.gauge("helios_requests_running", "Running.")->set(3);
    registry_.histogram("helios_ttft_seconds", "TTFT.", {0.1, 1})->observe(0.5);
    auto server = MetricsHttpServer::start("127.0.0.1:0", registry_);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
    port_ = server_->port();
    ASSERT_GT(port_, 0);
  }

  MetricsRegistry registry_;  // outlives the server
  std::unique_ptr<MetricsHttpServer> server_;
  int port_ = 0;
};

TEST_F(MetricsHttpServerTest, GetMetricsReturnsTheRenderedRegistry) {
  Response r = http_exchange(port_, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, registry_.render());
  EXPECT_NE(r.head.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), std::string::npos) << r.head;
  EXPECT_NE(r.head.find("\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n"), std::string::npos) << r.head;
  EXPECT_NE(r.head.find("\r\nConnection: close\r\n"), std::string::npos) << r.head;
}

TEST_F(MetricsHttpServerTest, SeesUpdatesAndIgnoresTheQueryString) {
  registry_.gauge("helios_requests_running", "Running.")->set(7);
  Response r = http_exchange(port_, "GET /metrics?name[]=helios_requests_running HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, registry_.render());
  EXPECT_NE(r.body.find("helios_requests_running 7\n"), std::string::npos);
}

TEST_F(MetricsHttpServerTest, OtherPathsAre404) {
  EXPECT_EQ(http_exchange(port_, "GET /nope HTTP/1.1\r\n\r\n").status, 404);
  EXPECT_EQ(http_exchange(port_, "GET / HTTP/1.1\r\n\r\n").status, 404);
  EXPECT_EQ(http_exchange(port_, "GET /metricsx HTTP/1.1\r\n\r\n").status, 404);
  EXPECT_EQ(http_exchange(port_, "GET /metrics/ HTTP/1.1\r\n\r\n").status, 404);
}

TEST_F(MetricsHttpServerTest, OtherMethodsAre405) {
  Response r = http_exchange(port_, "POST /metrics HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello=world");
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.head.find("\r\nAllow: GET\r\n"), std::string::npos) << r.head;
  EXPECT_EQ(http_exchange(port_, "DELETE /metrics HTTP/1.1\r\n\r\n").status, 405);
}

TEST_F(MetricsHttpServerTest, GarbageDoesNotStopTheServer) {
  EXPECT_EQ(http_exchange(port_, std::string("\x00\xff\x01garbage", 10) + "\r\n\r\n").status, 400);
  EXPECT_EQ(http_exchange(port_, "GET\r\n\r\n").status, 400);
  EXPECT_EQ(http_exchange(port_, "GET /metrics  HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(http_exchange(port_, "GET /metrics SPDY/3\r\n\r\n").status, 400);
  EXPECT_EQ(http_exchange(port_, "get /metrics HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(http_exchange(port_, std::string(20000, 'A')).status, 431);  // head over the size limit
  {
    Client c(port_);  // connects and leaves without a word
  }
  {
    Client c(port_);  // sends half a request line, then closes
    c.send_all("GET /met");
    c.close_write();
    EXPECT_EQ(c.read_all(), "");
  }
  Response r = http_exchange(port_, "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, registry_.render());
}

TEST_F(MetricsHttpServerTest, RequestLineWithoutHeadersAnsweredWhenClientHalfCloses) {
  Client c(port_);
  c.send_all("GET /metrics HTTP/1.0\n");
  c.close_write();
  EXPECT_EQ(parse(c.read_all()).status, 200);
}

TEST_F(MetricsHttpServerTest, SlowClientTimesOutAndTheNextIsServed) {
  Client slow(port_);
  slow.send_all("GET /metr");  // ... and nothing more
  auto t0 = Clock::now();
  Response r = http_exchange(port_, "GET /metrics HTTP/1.1\r\n\r\n");
  double waited_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(r.status, 200);
  EXPECT_LT(waited_s, 5.0);
  EXPECT_EQ(parse(slow.read_all()).status, 408);
}

TEST_F(MetricsHttpServerTest, DestructionIsPromptEvenWithAClientConnected) {
  Client idle(port_);
  idle.send_all("GET /metrics HTTP/1.1\r\n");  // head never finished
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto t0 = Clock::now();
  server_.reset();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
}

TEST(MetricsHttpServer, BindErrorsNameTheAddressAndTheReason) {
  MetricsRegistry registry;
  auto first = MetricsHttpServer::start("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsHttpServer::start(taken, registry);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(taken), std::string::npos) << second.status().to_string();
  EXPECT_NE(second.status().message().find("Address already in use"), std::string::npos)
      << second.status().to_string();

  // An address this host does not have (TEST-NET-1).
  auto foreign = MetricsHttpServer::start("192.0.2.1:0", registry);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(foreign.status().message().find("192.0.2.1:0"), std::string::npos) << foreign.status().to_string();
}

TEST(MetricsHttpServer, MalformedListenAddressesAreInvalidArguments) {
  MetricsRegistry registry;
  for (const char* listen : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:-1",
                             "127.0.0.1:http", "300.1.1.1:80", "example.com:80", "[::1]:80"}) {
    auto s = MetricsHttpServer::start(listen, registry);
    ASSERT_FALSE(s.ok()) << listen;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << listen;
    EXPECT_NE(s.status().message().find(std::string("\"") + listen + "\""), std::string::npos)
        << s.status().to_string();
  }
}

TEST(MetricsHttpServer, LocalhostWorks) {
  MetricsRegistry registry;
  registry.counter("up_total", "Up.")->inc();
  auto s = MetricsHttpServer::start("localhost:0", registry);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  Response r = http_exchange((*s)->port(), "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "# HELP up_total Up.\n# TYPE up_total counter\nup_total 1\n");
}

}  // namespace
}  // namespace helios
