// The agent's HTTP server over real sockets, against what a hostile or broken client does: junk,
// a request that is not HTTP/1.1, a head too large, a slowloris holding connections open, a client
// that never reads its response, a handler that throws. Each is answered or dropped within its
// bound, and a legitimate request is answered meanwhile.
#include "health/http_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"

namespace dist::agent {
namespace http_endpoint_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A connected socket from `source` (0: any) to 127.0.0.1:port, with receive and send timeouts; -1
// when refused. Closed by its destructor.
class Client {
 public:
  explicit Client(int port, const std::string& source = "", const std::string& to = "127.0.0.1",
                  int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval limit{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    if (receive_buffer > 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    }
    if (!source.empty()) {
      sockaddr_in s{};
      s.sin_family = AF_INET;
      ::inet_pton(AF_INET, source.c_str(), &s.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&s), sizeof s) != 0) close();
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, to.c_str(), &a.sin_addr);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) close();
  }
  ~Client() { close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  Client(Client&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

  bool connected() const { return fd_ >= 0; }
  bool send(const std::string& bytes) {
    return fd_ >= 0 && ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
                           static_cast<ssize_t>(bytes.size());
  }
  // Everything until the server closes (or 5 s without a byte); `closed` says whether it did.
  std::string read_all(bool* closed = nullptr) {
    std::string raw;
    char buffer[65536];
    ssize_t n = 0;
    while (fd_ >= 0 && (n = ::recv(fd_, buffer, sizeof buffer, 0)) > 0) {
      raw.append(buffer, static_cast<std::size_t>(n));
    }
    if (closed) *closed = n == 0 || (n < 0 && errno == ECONNRESET);
    return raw;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

int status_of(const std::string& reply) {
  if (!reply.starts_with("HTTP/1.1 ") || reply.size() < 12) return -1;
  return std::stoi(reply.substr(9, 3));
}

// An endpoint on 127.0.0.1 with /ok, /boom (a handler that throws, as a strict JSON dump of a name
// that is not UTF-8 did) and /big (32 MiB), served by a thread of its own.
class HttpEndpointTest : public ::testing::Test {
 protected:
  static constexpr std::size_t kBigBytes = 32u << 20;

  void serve(HttpLimits limits,
             HttpListen listen = {{boost::asio::ip::make_address("127.0.0.1")}, 0}) {
    std::map<std::string, HttpEndpoint::Handler> routes = {
        {"/ok", [](const HttpRequest&) { return HttpResponse(200, "text/plain", "ok\n"); }},
        {"/boom",
         [](const HttpRequest&) -> HttpResponse {
           return {200, "application/json", nlohmann::json{{"script", "caf\xE9.py"}}.dump()};
         }},
        {"/big", [](const HttpRequest&) {
           return HttpResponse(200, "text/plain", std::string(kBigBytes, 'x'));
         }}};
    endpoint_ = std::make_unique<HttpEndpoint>(io_, listen, std::move(routes), limits);
    port_ = endpoint_->port();
    serving_ = std::thread([this] {
      auto work = boost::asio::make_work_guard(io_);
      io_.run();
    });
  }
  void TearDown() override {
    io_.stop();
    if (serving_.joinable()) serving_.join();
    endpoint_.reset();
  }

  std::size_t open_connections() {
    std::promise<std::size_t> open;
    boost::asio::post(io_, [&] { open.set_value(endpoint_->open_connections()); });
    return open.get_future().get();
  }

  // GET /ok on a new connection: its status and how long it took.
  std::pair<int, Clock::duration> get_ok(const std::string& source = "") {
    const auto start = Clock::now();
    Client c(port_, source);
    c.send("GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    return {status_of(c.read_all()), Clock::now() - start};
  }

  boost::asio::io_context io_;
  std::unique_ptr<HttpEndpoint> endpoint_;
  std::thread serving_;
  int port_ = 0;
};

TEST_F(HttpEndpointTest, AHandlerThatThrowsIsAnswered500AndTheEndpointServesOn) {
  serve({});
  for (int i = 0; i < 3; ++i) {
    const auto reply = testing::http_request(port_, "GET /boom HTTP/1.1");
    EXPECT_EQ(reply.status, 500) << reply.head;
    EXPECT_EQ(reply.body.find("caf"), std::string::npos) << "nothing of the handler's leaks";
  }
  EXPECT_EQ(get_ok().first, 200);
}

// Each is answered at once (not at the head timeout, a minute here) and the next client served.
TEST_F(HttpEndpointTest, WhatIsNotAnHttp11RequestIsAnsweredAtOnce) {
  serve({.head_timeout = 60s, .write_timeout = 60s, .max_connections = 8});
  struct Case {
    const char* name;
    std::string bytes;
    int status;
  };
  const Case cases[] = {
      {"binary junk", std::string("\x16\x03\x01\x02\x00\x01\x00\xff\xfe", 9), 400},
      {"a request line without spaces", "GARBAGE\r\n\r\n", 400},
      {"HTTP/0.9", "GET /ok\r\n", 400},
      {"a request line of four words", "GET /ok HTTP/1.1 x\r\n\r\n", 400},
      {"another version", "GET /ok HTTP/2.0\r\n\r\n", 505},
      {"HTTP/2's preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505},
      {"a method other than GET", "POST /ok HTTP/1.1\r\nHost: a\r\n\r\n", 405},
      {"a header line without a colon", "GET /ok HTTP/1.1\r\nnocolon\r\n\r\n", 400},
      {"a folded header line", "GET /ok HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400},
      {"two Hosts", "GET /ok HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"a huge header", "GET /ok HTTP/1.1\r\nX-Big: " + std::string(20000, 'a'), 431},
      {"an unknown path", "GET /nowhere HTTP/1.1\r\n\r\n", 404},
      {"HTTP/1.0 without a Host", "GET /ok HTTP/1.0\r\n\r\n", 200},
      {"bare newlines", "GET /ok HTTP/1.1\nHost: a\n\n", 200},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto start = Clock::now();
    Client client(port_);
    ASSERT_TRUE(client.connected());
    client.send(c.bytes);
    bool closed = false;
    const std::string reply = client.read_all(&closed);
    EXPECT_EQ(status_of(reply), c.status) << reply;
    EXPECT_TRUE(closed);
    EXPECT_LT(Clock::now() - start, 2s);
    EXPECT_EQ(get_ok().first, 200);
  }
}

TEST_F(HttpEndpointTest, AHeadTrickledInIsCutAtTheHeadTimeout) {
  serve({.head_timeout = 300ms, .write_timeout = 60s, .max_connections = 8});
  const auto start = Clock::now();
  Client slow(port_);
  bool open = slow.send("GET /ok HTTP/1.1\r\n");
  for (int i = 0; open && i < 100; ++i) {  // a header byte every 50 ms: never a whole head
    std::this_thread::sleep_for(50ms);
    open = slow.send("X");
  }
  const auto cut = Clock::now() - start;
  EXPECT_FALSE(open) << "the connection was kept for 5 s of trickling";
  EXPECT_LT(cut, 3s) << "the connection was kept past its head timeout";
  EXPECT_EQ(get_ok().first, 200);
}

// A slowloris: far more connections than allowed, each holding an unfinished head. A client that
// then sends its request at once is answered, promptly.
TEST_F(HttpEndpointTest, ASlowlorisCannotKeepALegitimateRequestOut) {
  serve({.head_timeout = 60s, .write_timeout = 60s, .max_connections = 16});
  std::vector<Client> held;
  for (int i = 0; i < 200; ++i) {
    Client c(port_);
    ASSERT_TRUE(c.connected()) << i;
    c.send("GET /ok HTTP/1.1\r\nX-Slow: ");
    held.push_back(std::move(c));
  }
  for (int i = 0; i < 5; ++i) {
    const auto [status, took] = get_ok();
    EXPECT_EQ(status, 200);
    EXPECT_LT(took, 2s);
  }
  EXPECT_LE(open_connections(), 16u);
}

// The slowloris from another address (127.0.0.2) than a client that connected before it and sends
// its head only afterwards: the connections taken back are the slowloris's, which holds the most.
TEST_F(HttpEndpointTest, TheAddressHoldingTheMostConnectionsLosesThemFirst) {
  serve({.head_timeout = 60s, .write_timeout = 60s, .max_connections = 16});
  Client early(port_, "127.0.0.1");
  ASSERT_TRUE(early.connected());
  std::vector<Client> held;
  for (int i = 0; i < 100; ++i) {
    Client c(port_, "127.0.0.2");
    ASSERT_TRUE(c.connected()) << i;
    c.send("GET /ok HTTP/1.1\r\nX-Slow: ");
    held.push_back(std::move(c));
  }
  ASSERT_EQ(get_ok("127.0.0.2").first, 200);  // the endpoint has seen every one of them
  early.send("GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(status_of(early.read_all()), 200);
}

// A client that asks for 32 MiB and reads none of it: dropped at the write timeout, while other
// clients are answered meanwhile.
TEST_F(HttpEndpointTest, AClientThatNeverReadsIsDroppedAtTheWriteTimeout) {
  serve({.head_timeout = 60s, .write_timeout = 500ms, .max_connections = 8});
  Client idle(port_, "", "127.0.0.1", 4096);
  ASSERT_TRUE(idle.send("GET /big HTTP/1.1\r\n\r\n"));
  for (int i = 0; i < 3; ++i) {
    const auto [status, took] = get_ok();
    EXPECT_EQ(status, 200);
    EXPECT_LT(took, 2s);
  }
  std::this_thread::sleep_for(1500ms);  // past the write timeout, reading nothing
  bool closed = false;
  const std::string got = idle.read_all(&closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(status_of(got), 200);
  EXPECT_LT(got.size(), kBigBytes) << "the whole response was written: nothing was cut";
  EXPECT_EQ(open_connections(), 0u);
}

TEST_F(HttpEndpointTest, ItListensOnlyOnTheAddressItWasGiven) {
  serve({});
  EXPECT_TRUE(Client(port_, "", "127.0.0.1").connected());
  EXPECT_FALSE(Client(port_, "", "127.0.0.2").connected())
      << "127.0.0.2 is another loopback address: bound to 127.0.0.1, it must be refused";
}

TEST_F(HttpEndpointTest, WithoutAnAddressItListensOnEveryInterface) {
  serve({}, {{}, 0});
  EXPECT_TRUE(Client(port_, "", "127.0.0.1").connected());
  EXPECT_TRUE(Client(port_, "", "127.0.0.2").connected());
}

TEST(ListenAddresses, AddressesNamesAndEveryInterface) {
  EXPECT_EQ(listen_addresses("127.0.0.2").front().to_string(), "127.0.0.2");
  EXPECT_EQ(listen_addresses("[::1]").front().to_string(), "::1");
  EXPECT_TRUE(listen_addresses("0.0.0.0").front().is_unspecified());
  EXPECT_TRUE(listen_addresses("::").front().is_unspecified());
  EXPECT_TRUE(listen_addresses("localhost").front().is_loopback());
  EXPECT_THROW(listen_addresses("no-such-host.invalid"), std::runtime_error);
  EXPECT_THROW(listen_addresses(""), std::runtime_error);
}

HttpRequest with(std::map<std::string, std::string> headers, std::string query = "") {
  HttpRequest r;
  r.method = "GET";
  r.path = "/metrics";
  r.headers = std::move(headers);
  r.query = std::move(query);
  return r;
}

TEST(HttpRequest, TheTokenIsPresentedAsABearerABasicPasswordOrAParameter) {
  const std::string token = "s3cr3t-t0ken";
  struct Case {
    const char* name;
    HttpRequest request;
    bool presents;
  };
  const Case cases[] = {
      {"nothing", with({}), false},
      {"bearer", with({{"authorization", "Bearer s3cr3t-t0ken"}}), true},
      {"bearer, any case", with({{"authorization", "bearer s3cr3t-t0ken"}}), true},
      {"a wrong bearer", with({{"authorization", "Bearer s3cr3t-t0kem"}}), false},
      {"a prefix", with({{"authorization", "Bearer s3cr3t"}}), false},
      {"longer", with({{"authorization", "Bearer s3cr3t-t0ken-"}}), false},
      // base64("prometheus:s3cr3t-t0ken"), base64(":s3cr3t-t0ken")
      {"basic", with({{"authorization", "Basic cHJvbWV0aGV1czpzM2NyM3QtdDBrZW4="}}), true},
      {"basic, no user", with({{"authorization", "Basic OnMzY3IzdC10MGtlbg=="}}), true},
      {"basic, the token as the user", with({{"authorization", "Basic czNjcjN0LXQwa2VuOg=="}}),
       false},
      {"basic, not base64", with({{"authorization", "Basic !!!"}}), false},
      {"the parameter", with({}, "since=1&token=s3cr3t-t0ken"), true},
      {"the parameter, percent-encoded", with({}, "token=s3cr3t%2Dt0ken"), true},
      {"a wrong parameter", with({}, "token=nope"), false},
      {"an empty parameter", with({}, "token="), false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(c.request.presents(token), c.presents);
  }
}

TEST(HttpRequest, TheHostsALoopbackPageAnswers) {
  struct Case {
    const char* host;
    bool loopback;
  };
  const Case cases[] = {
      {"", true},
      {"localhost", true},
      {"LOCALHOST:8080", true},
      {"app.localhost:1", true},
      {"127.0.0.1:9100", true},
      {"127.0.0.1", true},
      {"[::1]:9100", true},
      {"192.0.2.7:80", true},  // an address: a rebinding page has a name
      {"evil.example:9100", false},
      {"localhost.evil.example", false},
      {"vm", false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.host);
    HttpRequest r = std::string(c.host).empty() ? with({}) : with({{"host", c.host}});
    EXPECT_EQ(r.names_loopback_or_address(), c.loopback);
  }
}

}  // namespace http_endpoint_test
}  // namespace dist::agent
