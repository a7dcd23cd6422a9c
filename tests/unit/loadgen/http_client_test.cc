// The benchmark client's HTTP/SSE client against a plain socket server (fake_server.h): the
// SSE rules on every split of a stream, URLs, chunked streams delivered event by event,
// errors with their bodies, refused connections, a stream cut short, many at once.
#include "loadgen/http_client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>

#include "fake_server.h"

namespace xds::loadgen {
namespace {

using testing::FakeRequest;
using testing::FakeServer;
using testing::http_chunk;
using testing::send_all;
using testing::sse_head;

constexpr auto kWait = std::chrono::seconds(10);

TEST(SseParser, EventsOnEverySplitOfTheStream) {
  const std::string stream =
      ": a comment\r\n"
      "data: {\"a\":1}\r\n\r\n"
      "event: ping\n\n"  // no data: not an event
      "data:x\n"
      "data:  y\n\n"  // two lines joined; one space only is stripped
      "id: 7\rdata: [DONE]\r\r";
  const std::vector<std::string> want = {"{\"a\":1}", "x\n y", "[DONE]"};
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseParser p;
    std::vector<std::string> got;
    p.feed(std::string_view(stream).substr(0, cut), got);
    p.feed(std::string_view(stream).substr(cut), got);
    EXPECT_EQ(got, want) << "cut at " << cut;
  }
  SseParser p;
  std::vector<std::string> got;
  for (char c : stream) p.feed(std::string_view(&c, 1), got);
  EXPECT_EQ(got, want);
}

TEST(Url, HostPortPrefix) {
  auto u = parse_url("http://127.0.0.1:8123/api/");
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8123);
  EXPECT_EQ(u->prefix, "/api");
  auto d = parse_url("http://localhost");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->port, 80);
  EXPECT_EQ(d->prefix, "");
  auto v6 = parse_url("http://[::1]:9000");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 9000);
  for (const char* bad : {"localhost:8000", "https://x", "http://", "http://h:0", "http://h:x",
                          "http://h:70000", "http://h:"}) {
    EXPECT_FALSE(parse_url(bad).ok()) << bad;
  }
}

std::unique_ptr<HttpClient> client_for(uint16_t port, std::string prefix = "") {
  Url url;
  url.host = "127.0.0.1";
  url.port = port;
  url.prefix = std::move(prefix);
  auto c = HttpClient::create(url, HttpClientOptions{});
  XDS_CHECK(c.ok(), "{}", c.status().to_string());
  return std::move(*c);
}

TEST(HttpClient, StreamsEventsOneByOneAsTheyArrive) {
  // The server sends the first event, then waits until the client has seen it before sending
  // the rest: a client that buffered the stream would never see it and the test would fail
  // after the wait.
  std::promise<void> first_seen;
  std::shared_future<void> first_seen_f = first_seen.get_future().share();
  std::mutex mu;
  FakeRequest got_req;
  FakeServer server([&](const FakeRequest& req, int fd) {
    {
      std::lock_guard<std::mutex> lock(mu);
      got_req = req;
    }
    send_all(fd, sse_head() + http_chunk("data: {\"n\":1}\n\n"));
    if (first_seen_f.wait_for(kWait) != std::future_status::ready) return;
    send_all(fd, http_chunk("data: {\"n\":2}\n\ndata: {\"n\":3}\n\n") +
                     http_chunk("data: [DONE]\n\n") + "0\r\n\r\n");
  });
  auto client = client_for(server.port(), "/pre");
  std::vector<SseEvent> events;
  std::promise<HttpExchange> done;
  ClientRequest req;
  req.path = "/v1/completions";
  req.body = R"({"prompt":[1,2]})";
  req.api_key = "sk-test";
  client->start(
      req,
      [&](const SseEvent& e) {
        events.push_back(e);
        if (events.size() == 1) first_seen.set_value();
      },
      [&](HttpExchange ex) { done.set_value(std::move(ex)); });
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
  const HttpExchange ex = f.get();
  EXPECT_TRUE(ex.error.ok()) << ex.error.to_string();
  EXPECT_EQ(ex.status, 200);
  EXPECT_TRUE(ex.event_stream);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].data, "{\"n\":1}");
  EXPECT_EQ(events[1].data, "{\"n\":2}");
  EXPECT_EQ(events[2].data, "{\"n\":3}");
  EXPECT_EQ(events[3].data, "[DONE]");
  for (size_t i = 1; i < events.size(); ++i) EXPECT_GE(events[i].time_ns, events[i - 1].time_ns);
  EXPECT_LE(ex.start_ns, ex.head_ns);
  EXPECT_LE(ex.head_ns, events[0].time_ns);
  EXPECT_LE(events[3].time_ns, ex.end_ns);
  EXPECT_EQ(client->in_flight(), 0);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(got_req.method, "POST");
  EXPECT_EQ(got_req.target, "/pre/v1/completions");
  EXPECT_EQ(got_req.body, req.body);
  EXPECT_NE(got_req.head.find("Bearer sk-test"), std::string::npos);
}

TEST(HttpClient, ErrorStatusKeepsItsBody) {
  const std::string body = R"({"error":{"message":"bad","type":"invalid_request_error"}})";
  FakeServer server([&](const FakeRequest&, int fd) {
    send_all(fd, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body);
  });
  auto client = client_for(server.port());
  ClientRequest req;
  req.path = "/v1/completions";
  req.body = "{}";
  const HttpExchange ex = client->fetch(req);
  EXPECT_TRUE(ex.error.ok()) << ex.error.to_string();
  EXPECT_EQ(ex.status, 400);
  EXPECT_FALSE(ex.event_stream);
  EXPECT_EQ(ex.body, body);
}

TEST(HttpClient, GetWithBodyUntilClose) {
  FakeServer server([&](const FakeRequest& req, int fd) {
    // No Content-Length: the body runs to the end of the connection.
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"target\":\"" +
                     req.target + "\",\"method\":\"" + req.method + "\"}");
  });
  auto client = client_for(server.port());
  ClientRequest req;
  req.method = "GET";
  req.path = "/v1/models";
  const HttpExchange ex = client->fetch(req);
  EXPECT_TRUE(ex.error.ok()) << ex.error.to_string();
  EXPECT_EQ(ex.status, 200);
  EXPECT_EQ(ex.body, R"({"target":"/v1/models","method":"GET"})");
}

TEST(HttpClient, RefusedConnectionIsUnavailable) {
  uint16_t port = 0;
  {
    FakeServer closed([](const FakeRequest&, int) {});
    port = closed.port();
  }
  auto client = client_for(port);
  ClientRequest req;
  req.path = "/v1/completions";
  const HttpExchange ex = client->fetch(req);
  EXPECT_EQ(ex.error.code(), StatusCode::kUnavailable) << ex.error.to_string();
  EXPECT_NE(ex.error.message().find("connect"), std::string::npos);
  EXPECT_EQ(ex.status, 0);
}

TEST(HttpClient, StreamCutShortIsAnErrorAfterItsEvents) {
  FakeServer server([&](const FakeRequest&, int fd) {
    send_all(fd, sse_head() + http_chunk("data: {\"n\":1}\n\n"));  // no last chunk: cut
  });
  auto client = client_for(server.port());
  int events = 0;
  std::promise<HttpExchange> done;
  ClientRequest req;
  req.path = "/v1/completions";
  client->start(
      req, [&](const SseEvent&) { ++events; },
      [&](HttpExchange ex) { done.set_value(std::move(ex)); });
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
  const HttpExchange ex = f.get();
  EXPECT_FALSE(ex.error.ok());
  EXPECT_EQ(ex.status, 200);
  EXPECT_EQ(events, 1);
}

TEST(HttpClient, ManyStreamsAtOnceEachOnItsOwnConnection) {
  constexpr int kRequests = 48;
  // Every stream stays open until all have connected, so they are truly concurrent.
  std::atomic<int> arrived{0};
  std::promise<void> all_in;
  std::shared_future<void> all_in_f = all_in.get_future().share();
  FakeServer server([&](const FakeRequest& req, int fd) {
    send_all(fd, sse_head());
    if (++arrived == kRequests) all_in.set_value();
    if (all_in_f.wait_for(kWait) != std::future_status::ready) return;
    send_all(fd, http_chunk("data: " + req.body + "\n\n") + "0\r\n\r\n");
  });
  auto client = client_for(server.port());
  std::mutex mu;
  std::vector<std::string> seen(kRequests);
  std::promise<void> finished;
  int done = 0, ok = 0;
  for (int i = 0; i < kRequests; ++i) {
    ClientRequest req;
    req.path = "/x";
    req.body = std::to_string(i);
    client->start(
        req,
        [&, i](const SseEvent& e) {
          std::lock_guard<std::mutex> lock(mu);
          seen[static_cast<size_t>(i)] = e.data;
        },
        [&](HttpExchange ex) {
          std::lock_guard<std::mutex> lock(mu);
          ok += ex.error.ok() && ex.status == 200;
          if (++done == kRequests) finished.set_value();
        });
  }
  ASSERT_EQ(finished.get_future().wait_for(kWait), std::future_status::ready);
  EXPECT_EQ(ok, kRequests);
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], std::to_string(i));
  EXPECT_EQ(server.connections(), kRequests);
  EXPECT_GE(client->io_thread_cpu_s(), 0.0);
}

TEST(HttpClient, CancelAllEndsOpenStreams) {
  std::promise<void> release;
  std::shared_future<void> release_f = release.get_future().share();
  std::promise<void> started;
  FakeServer server([&](const FakeRequest&, int fd) {
    send_all(fd, sse_head() + http_chunk("data: {}\n\n"));
    started.set_value();
    (void)release_f.wait_for(kWait);
  });
  auto client = client_for(server.port());
  std::promise<HttpExchange> done;
  ClientRequest req;
  req.path = "/x";
  client->start(req, nullptr, [&](HttpExchange ex) { done.set_value(std::move(ex)); });
  ASSERT_EQ(started.get_future().wait_for(kWait), std::future_status::ready);
  client->cancel_all();
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
  EXPECT_EQ(f.get().error.code(), StatusCode::kCancelled);
  release.set_value();
}

}  // namespace
}  // namespace xds::loadgen
