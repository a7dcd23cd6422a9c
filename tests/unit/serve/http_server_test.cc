// The HTTP server against a plain socket client (http_test_client.h): whole answers,
// keep-alive and pipelining, the router's 404/405, the body limit, SSE streams pushed from
// other threads, disconnect callbacks, a dropped Responder, graceful stop.
#include "serve/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "http_test_client.h"

namespace xds::serve {
namespace {

using testing::get_request;
using testing::post_request;
using testing::TestClient;
using namespace std::chrono_literals;

// Waits (bounded) for a one-shot signal from another thread.
struct Signal {
  std::promise<void> p;
  std::future<void> f = p.get_future();
  std::atomic<bool> fired{false};
  void fire() {
    if (!fired.exchange(true)) p.set_value();
  }
  bool wait() { return f.wait_for(10s) == std::future_status::ready; }
};

HttpServerOptions test_options() {
  HttpServerOptions o;
  o.port = 0;
  o.threads = 2;
  o.max_body_bytes = 1024;
  return o;
}

TEST(HttpServer, WholeResponsesKeepAliveAndHeaders) {
  HttpServer server(test_options());
  server.route("GET", "/hello", [](HttpRequest req, Responder res) {
    HttpResponse r;
    r.content_type = "text/plain";
    r.body = "hi " + req.header("X-Name") + " " + req.target;
    r.headers.emplace_back("X-Extra", "1");
    res.send(std::move(r));
  });
  server.route("POST", "/echo", [](HttpRequest req, Responder res) {
    res.send(HttpResponse{201, "application/json", req.body, {}});
  });
  ASSERT_TRUE(server.start().ok());
  TestClient c(server.port());
  ASSERT_TRUE(c.connected());

  ASSERT_TRUE(c.send_all(get_request("/hello?a=1", "X-Name: bob\r\n")));
  auto r1 = c.read_response();
  ASSERT_TRUE(r1.ok);
  EXPECT_EQ(r1.status, 200);
  EXPECT_EQ(r1.body, "hi bob /hello?a=1");
  EXPECT_EQ(r1.headers["content-type"], "text/plain");
  EXPECT_EQ(r1.headers["x-extra"], "1");

  // Same connection: keep-alive.
  ASSERT_TRUE(c.send_all(post_request("/echo", "{\"x\":1}")));
  auto r2 = c.read_response();
  ASSERT_TRUE(r2.ok);
  EXPECT_EQ(r2.status, 201);
  EXPECT_EQ(r2.body, "{\"x\":1}");
  EXPECT_EQ(server.open_connections(), 1u);
  server.stop(1s);
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  HttpServer server(test_options());
  server.route("POST", "/echo", [](HttpRequest req, Responder res) {
    // Answer from another thread, a little later, so the second request arrives first.
    std::thread([req = std::move(req), res]() mutable {
      std::this_thread::sleep_for(20ms);
      res.send(HttpResponse{200, "text/plain", req.body, {}});
    }).detach();
  });
  ASSERT_TRUE(server.start().ok());
  TestClient c(server.port());
  ASSERT_TRUE(c.send_all(post_request("/echo", "one") + post_request("/echo", "two")));
  auto r1 = c.read_response();
  auto r2 = c.read_response();
  ASSERT_TRUE(r1.ok && r2.ok);
  EXPECT_EQ(r1.body, "one");
  EXPECT_EQ(r2.body, "two");
  server.stop(1s);
}

TEST(HttpServer, RouterErrorsAreJson) {
  HttpServer server(test_options());
  server.route("POST", "/v1/completions", [](HttpRequest, Responder res) { res.send({}); });
  ASSERT_TRUE(server.start().ok());
  TestClient c(server.port());
  ASSERT_TRUE(c.send_all(get_request("/nope")));
  auto r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 404);
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["message"], "Invalid URL (GET /nope)");

  // The connection survives a 404; a wrong method gets 405.
  ASSERT_TRUE(c.send_all(get_request("/v1/completions")));
  r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 405);
  EXPECT_TRUE(nlohmann::json::parse(r.body).contains("error"));
  server.stop(1s);
}

TEST(HttpServer, BodyOverTheLimitGets413) {
  HttpServer server(test_options());
  std::atomic<int> calls{0};
  server.route("POST", "/echo", [&](HttpRequest, Responder res) {
    ++calls;
    res.send({});
  });
  ASSERT_TRUE(server.start().ok());
  TestClient c(server.port());
  ASSERT_TRUE(c.send_all(post_request("/echo", std::string(2000, 'x'))));
  auto r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 413);
  EXPECT_TRUE(c.wait_closed());
  EXPECT_EQ(calls.load(), 0);
  server.stop(1s);
}

TEST(HttpServer, MalformedRequestGets400) {
  HttpServer server(test_options());
  ASSERT_TRUE(server.start().ok());
  TestClient c(server.port());
  ASSERT_TRUE(c.send_all("NOT HTTP AT ALL\r\n\r\n"));
  auto r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 400);
  server.stop(1s);
}

TEST(HttpServer, ExpectContinue) {
  HttpServer server(test_options());
  server.route("POST", "/echo", [](HttpRequest req, Responder res) {
    res.send(HttpResponse{200, "text/plain", req.body, {}});
  });
  ASSERT_TRUE(server.start().ok());
  TestClient c(server.port());
  ASSERT_TRUE(c.send_all(
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  ASSERT_TRUE(c.read_until("HTTP/1.1 100 Continue\r\n\r\n"));
  ASSERT_TRUE(c.send_all("hello"));
  auto r = c.read_response();  // skips the 100
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello");
  server.stop(1s);
}

TEST(HttpServer, SseStreamFromAnotherThreadThenKeepAlive) {
  HttpServer server(test_options());
  server.route("POST", "/stream", [](HttpRequest, Responder res) {
    auto stream = res.start_stream({{"X-Request-Id", "r1"}});
    ASSERT_NE(stream, nullptr);
    EXPECT_EQ(res.start_stream(), nullptr);  // answered once only
    std::thread([stream] {
      for (int i = 0; i < 50; ++i) EXPECT_TRUE(stream->send_event("{\"i\":" + std::to_string(i) + "}"));
      EXPECT_TRUE(stream->send_event("two\nlines"));
      EXPECT_TRUE(stream->send_event("[DONE]"));
      stream->close();
      EXPECT_FALSE(stream->send_event("late"));
    }).detach();
  });
  server.route("GET", "/after", [](HttpRequest, Responder res) {
    res.send(HttpResponse{200, "text/plain", "ok", {}});
  });
  ASSERT_TRUE(server.start().ok());
  TestClient c(server.port());
  ASSERT_TRUE(c.send_all(post_request("/stream", "{}")));
  auto r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/event-stream");
  EXPECT_EQ(r.headers["transfer-encoding"], "chunked");
  EXPECT_EQ(r.headers["x-request-id"], "r1");
  std::string expected;
  for (int i = 0; i < 50; ++i) expected += "data: {\"i\":" + std::to_string(i) + "}\n\n";
  expected += "data: two\ndata: lines\n\n";
  expected += "data: [DONE]\n\n";
  EXPECT_EQ(r.body, expected);

  ASSERT_TRUE(c.send_all(get_request("/after")));
  auto r2 = c.read_response();
  ASSERT_TRUE(r2.ok);
  EXPECT_EQ(r2.body, "ok");
  server.stop(1s);
}

TEST(HttpServer, SseEventBytes) {
  EXPECT_EQ(sse_event_bytes("x"), "data: x\n\n");
  EXPECT_EQ(sse_event_bytes(""), "data: \n\n");
  EXPECT_EQ(sse_event_bytes("a\r\nb"), "data: a\ndata: b\n\n");
}

TEST(HttpServer, ClientDisconnectDuringStreamFiresCallback) {
  HttpServer server(test_options());
  auto gone = std::make_shared<Signal>();
  std::promise<std::shared_ptr<StreamHandle>> handle_p;
  auto handle_f = handle_p.get_future();
  server.route("POST", "/stream", [&, gone](HttpRequest, Responder res) {
    auto stream = res.start_stream();
    stream->on_disconnect([gone] { gone->fire(); });
    stream->send_event("first");
    handle_p.set_value(stream);
  });
  ASSERT_TRUE(server.start().ok());
  {
    TestClient c(server.port());
    ASSERT_TRUE(c.send_all(post_request("/stream", "{}")));
    ASSERT_TRUE(c.read_until("data: first\n\n"));
  }  // the client closes its socket
  ASSERT_TRUE(gone->wait());
  auto stream = handle_f.get();
  // Sends after the disconnect report false; a callback registered now runs at once.
  EXPECT_FALSE(stream->send_event("more"));
  EXPECT_FALSE(stream->is_open());
  auto late = std::make_shared<Signal>();
  stream->on_disconnect([late] { late->fire(); });
  EXPECT_TRUE(late->wait());
  server.stop(1s);
}

TEST(HttpServer, ClientDisconnectBeforeWholeAnswerFiresCallback) {
  HttpServer server(test_options());
  auto gone = std::make_shared<Signal>();
  std::promise<Responder> res_p;
  auto res_f = res_p.get_future();
  server.route("POST", "/slow", [&, gone](HttpRequest, Responder res) {
    res.on_disconnect([gone] { gone->fire(); });
    res_p.set_value(res);  // answered later (never, here)
  });
  ASSERT_TRUE(server.start().ok());
  std::optional<Responder> res;  // kept unanswered (dropping it would answer 500)
  {
    TestClient c(server.port());
    ASSERT_TRUE(c.send_all(post_request("/slow", "{}")));
    res = res_f.get();  // the handler ran
    EXPECT_FALSE(res->disconnected());
  }
  ASSERT_TRUE(gone->wait());
  EXPECT_TRUE(res->disconnected());
  res->send({});  // harmless: nobody to answer
  server.stop(1s);
}

TEST(HttpServer, DroppedResponderAnswers500AndThrowingHandlerToo) {
  HttpServer server(test_options());
  server.route("GET", "/drop", [](HttpRequest, Responder) {});
  server.route("GET", "/throw", [](HttpRequest, Responder) { throw std::runtime_error("boom"); });
  ASSERT_TRUE(server.start().ok());
  TestClient c(server.port());
  ASSERT_TRUE(c.send_all(get_request("/drop")));
  auto r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 500);
  EXPECT_TRUE(nlohmann::json::parse(r.body).contains("error"));
  ASSERT_TRUE(c.send_all(get_request("/throw")));
  r = c.read_response();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 500);
  server.stop(1s);
}

TEST(HttpServer, GracefulStopLetsAStreamFinishAndClosesIdleConnections) {
  HttpServer server(test_options());
  std::promise<std::shared_ptr<StreamHandle>> handle_p;
  auto handle_f = handle_p.get_future();
  server.route("POST", "/stream", [&](HttpRequest, Responder res) {
    handle_p.set_value(res.start_stream());
  });
  server.route("GET", "/ping", [](HttpRequest, Responder res) { res.send({}); });
  ASSERT_TRUE(server.start().ok());
  TestClient idle(server.port());
  ASSERT_TRUE(idle.send_all(get_request("/ping")));
  ASSERT_TRUE(idle.read_response().ok);  // accepted, now idle between requests
  TestClient c(server.port());
  ASSERT_TRUE(c.send_all(post_request("/stream", "{}")));
  auto stream = handle_f.get();
  ASSERT_TRUE(stream->send_event("a"));
  ASSERT_TRUE(c.read_until("data: a\n\n"));

  std::thread stopper([&] { server.stop(10s); });
  EXPECT_TRUE(idle.wait_closed());  // idle keep-alive connection closed by stop
  ASSERT_TRUE(stream->send_event("b"));
  stream->close();
  stopper.join();
  // The last event's chunk ends with CRLF, then the last (empty) chunk.
  ASSERT_TRUE(c.read_until("data: b\n\n\r\n0\r\n\r\n"));
  EXPECT_TRUE(c.wait_closed());
  TestClient refused(server.port());
  EXPECT_FALSE(refused.connected());
}

TEST(HttpServer, StopDropsAStreamThatNeverEnds) {
  HttpServer server(test_options());
  auto gone = std::make_shared<Signal>();
  std::promise<std::shared_ptr<StreamHandle>> handle_p;
  auto handle_f = handle_p.get_future();
  server.route("POST", "/stream", [&, gone](HttpRequest, Responder res) {
    auto s = res.start_stream();
    s->on_disconnect([gone] { gone->fire(); });
    handle_p.set_value(s);
  });
  ASSERT_TRUE(server.start().ok());
  TestClient c(server.port());
  ASSERT_TRUE(c.send_all(post_request("/stream", "{}")));
  auto stream = handle_f.get();
  server.stop(50ms);
  EXPECT_TRUE(gone->wait());
  EXPECT_FALSE(stream->send_event("after stop"));
  stream->close();  // harmless after stop
  EXPECT_TRUE(c.wait_closed());
}

TEST(HttpServer, BindFailureIsAStatus) {
  HttpServer a(test_options());
  ASSERT_TRUE(a.start().ok());
  HttpServerOptions o = test_options();
  o.port = a.port();
  HttpServer b(o);
  Status s = b.start();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(std::to_string(a.port())), std::string::npos) << s.message();
  a.stop(1s);
}

}  // namespace
}  // namespace xds::serve
