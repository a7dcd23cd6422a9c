// An asynchronous HTTP/1.1 server (Boost.Beast on Asio) with a router and Server-Sent Events.
//
// One io_context runs on a small fixed number of threads; every connection lives on its own
// strand, so thousands of open streams cost memory, not threads. Keep-alive, a request body
// limit (413), `Expect: 100-continue`, an idle timeout between requests and a write timeout.
//
// A handler gets the request and a Responder. It answers exactly once, now or later, from any
// thread: either a whole response (`send`) or a stream of SSE events (`start_stream`, then
// `StreamHandle::send_event(...)` ... `close()`). While a request is unanswered or its stream
// open, the connection watches the socket: a client that goes away fires the
// `on_disconnect` callbacks at once (so the engine can cancel the request).
//
// Beast and Asio stay inside http_server.cc and http_request_parser.{h,cc} (this header is a
// pimpl): including it is cheap.
//
// Thread-safety: HttpServer: route() only before start(); start(), stop(), port() and
// open_connections() from any one thread. Responder and StreamHandle: every method is
// thread-safe and may be called from any thread, also after the client went away or the
// server stopped (then it does nothing). Handlers and on_disconnect callbacks run on an io
// thread and must not block (hand long work to another thread and answer from there).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace xds::serve {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ... as sent
  std::string target;  // "/v1/models?x=1"
  std::string path;    // target without the query: "/v1/models"
  HttpHeaders headers; // names lower-cased, in arrival order
  std::string body;

  // The first header with this name (case-insensitive), or "" when absent.
  std::string header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;  // extra headers, e.g. {"Retry-After", "1"}
};

namespace detail {
struct ExchangeState;
struct ServerCore;
}  // namespace detail

// An open SSE stream (`text/event-stream`, chunked). Created by Responder::start_stream.
// Dropping the last reference without close() closes the stream.
class StreamHandle {
 public:
  explicit StreamHandle(std::shared_ptr<detail::ExchangeState> state);
  ~StreamHandle();
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;

  // Queues one event "data: <data>\n\n" (a `data` with newlines becomes several data: lines).
  // Events queued before a write completes go out together in one chunk. Returns false when
  // the stream is closed or the client has gone (the event is dropped).
  bool send_event(std::string_view data);
  // Ends the response (the last chunk); the connection then serves its next request.
  void close();
  // Whether the client is still there and close() was not called.
  bool is_open() const;
  // Runs `cb` once, on an io thread, if the client disconnects (or the server drops the
  // stream) before close(); at once if that already happened. Not run after close().
  void on_disconnect(std::function<void()> cb);

 private:
  std::shared_ptr<detail::ExchangeState> state_;
};

// How a handler answers one request. Copyable; all copies refer to the same exchange. If every
// copy is dropped without an answer, the client gets a 500.
class Responder {
 public:
  explicit Responder(std::shared_ptr<detail::ExchangeState> state);

  // A whole response. Only the first answer (send or start_stream) counts.
  void send(HttpResponse response);
  // Starts a 200 `text/event-stream` response; `headers` are extra headers. Returns nullptr
  // when the exchange was already answered.
  std::shared_ptr<StreamHandle> start_stream(HttpHeaders headers = {});
  // As StreamHandle::on_disconnect, for the time before the answer (and the stream's life).
  void on_disconnect(std::function<void()> cb);
  // True once the client has gone (or the server dropped the connection).
  bool disconnected() const;

 private:
  struct Guard;  // answers 500 when the last copy goes without an answer
  std::shared_ptr<Guard> guard_;
};

using HttpHandler = std::function<void(HttpRequest request, Responder responder)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (port() says which)
  int threads = 2;       // io threads
  size_t max_body_bytes = 8u << 20;    // larger bodies get 413
  size_t max_header_bytes = 64u << 10; // larger headers get 431
  std::chrono::milliseconds idle_timeout{60'000};   // waiting for (the rest of) a request
  std::chrono::milliseconds write_timeout{30'000};  // one write to a client that doesn't read
  size_t max_stream_backlog_bytes = 16u << 20;      // unsent SSE bytes; beyond: drop the client
  // The body of the server's own errors (404, 405, 413, 400 malformed HTTP, 500); the default
  // is an OpenAI-style {"error": {"message", "type", "code", "param"}} object.
  std::function<std::string(int status, std::string_view message)> error_body;
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // stop(0) if running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Registers a handler for an exact method ("GET", "POST") and path ("/v1/models"). A path
  // with no route gets 404; a path routed for other methods gets 405. Before start() only.
  void route(std::string method, std::string path, HttpHandler handler);

  // Binds, listens and starts the io threads. Fails with the address when it cannot bind.
  Status start();
  // The bound port (after start()).
  uint16_t port() const;

  // Graceful stop: stops accepting, closes idle keep-alive connections, lets answers in
  // flight and open streams finish for up to `drain`, then drops what is left (their
  // on_disconnect callbacks run) and joins the io threads. Idempotent. Not from a handler.
  void stop(std::chrono::milliseconds drain = std::chrono::milliseconds(5000));

  // Open client connections now.
  size_t open_connections() const;

 private:
  std::unique_ptr<detail::ServerCore> impl_;
};

// The SSE bytes of one event: each line of `data` as "data: <line>\n", then "\n".
std::string sse_event_bytes(std::string_view data);

}  // namespace xds::serve
