// The HTTP server: Beast/Asio stay in this file (and in http_request_parser.{h,cc}, the pure
// part of reading a request).
//
// Per connection, everything below runs on the connection's strand (the socket's executor):
//
//   kReading ──request──▶ kHandling ──send()──────────▶ kWriting ──written──▶ kReading
//                             │                                                  ▲
//                             └──start_stream()──▶ kStreaming ──last chunk────────┘
//   any phase ──socket error / EOF while answering / timeout / stop──▶ kClosed
//
// While a request is being answered, a "watch" read stays posted on the socket: EOF or an
// error there means the client went away; bytes that arrive (a pipelined next request) are
// kept in the read buffer for the next parse.
//
// Lifetimes: pending async operations hold the Connection (shared_ptr). An ExchangeState (one
// request/answer) refers to its Connection weakly, and posts to it only while the server's
// Life token is open, so a Responder kept past the server's stop is harmless.
#include "serve/http_server.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/accept_backoff.h"
#include "base/log.h"
#include "serve/http_request_parser.h"

namespace xds::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

namespace {

std::string default_error_body(int status, std::string_view message) {
  const char* type = status >= 500 ? "server_error" : "invalid_request_error";
  nlohmann::json j = {{"error",
                       {{"message", message}, {"type", type}, {"code", nullptr},
                        {"param", nullptr}}}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string chunk_frame(std::string_view data) {
  return fmt::format("{:x}\r\n{}\r\n", data.size(), data);
}

// A read error that means the client went away (closed, reset, or the read was cancelled):
// the connection closes without an answer. Any other error is the parser's (see
// http_parse_error).
bool peer_gone(const error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof ||
         ec == net::error::operation_aborted || ec == net::error::connection_reset;
}

}  // namespace

namespace detail {

class Connection;

// Open while the io_context may take posts; closed (under mu) once stop() joined the threads.
struct Life {
  std::mutex mu;
  bool open = true;
};

// One request and its answer. Fields marked (strand) are touched on the connection's strand
// only; (mu) under mu; atomics from anywhere.
struct ExchangeState {
  std::shared_ptr<Life> life;
  std::weak_ptr<Connection> conn;
  size_t max_backlog = 0;

  std::atomic<bool> answered{false};  // send / start_stream / the 500 of the guard happened
  std::atomic<bool> gone{false};      // the client went away before the answer finished
  std::atomic<bool> closed{false};    // StreamHandle::close() called

  bool finished = false;                          // (strand) answer fully written
  std::vector<std::function<void()>> on_gone;     // (strand)

  std::mutex mu;
  std::string outbox;          // (mu) SSE bytes not yet taken by a write
  bool pump_posted = false;    // (mu) a pump of the outbox is due on the strand
  bool close_requested = false;  // (mu)

  // Runs fn(connection) on the connection's strand, if the connection and server live.
  // Returns false when it could not be posted.
  bool post(std::function<void(Connection&)> fn);
};

struct ServerCore {
  HttpServerOptions options;
  std::map<std::string, std::map<std::string, HttpHandler>> routes;  // path -> method -> h
  std::shared_ptr<Life> life = std::make_shared<Life>();

  mutable std::mutex conn_mu;
  std::condition_variable conn_cv;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;  // (conn_mu)
  std::atomic<bool> stopping{false};

  // Declared after the registry: destroyed first, so connections dying with it can still
  // unregister.
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> accept_timer;  // (acceptor's strand) the backoff's wait
  int accept_delay_ms = 0;                        // (acceptor's strand) base/accept_backoff.h
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  uint16_t bound_port = 0;
  bool running = false;
  bool stopped = false;

  explicit ServerCore(HttpServerOptions o) : options(std::move(o)) {}
  ~ServerCore();

  void do_accept();
  void register_connection(const std::shared_ptr<Connection>& c);
  void unregister_connection(Connection* c);
  std::string error_body(int status, std::string_view message) const {
    return options.error_body ? options.error_body(status, message)
                              : default_error_body(status, message);
  }
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ServerCore* server)
      : socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        buffer_(server->options.max_header_bytes + server->options.max_body_bytes + 65536),
        server_(server) {}

  ~Connection() {
    if (exchange_ && !exchange_->finished) exchange_->gone = true;
  }

  net::any_io_executor executor() { return socket_.get_executor(); }

  void start() {
    net::post(executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // (strand) The server is stopping: idle connections close, busy ones close after answering.
  void begin_stop() {
    stopping_ = true;
    keep_alive_ = false;
    if (phase_ == Phase::kReading) close_connection();
  }
  // (strand) Drop whatever is left.
  void force_close() { close_connection(); }

  // (strand) Exchange operations, from Responder / StreamHandle posts.
  void send_whole(const std::shared_ptr<ExchangeState>& ex, HttpResponse r);
  void start_stream(const std::shared_ptr<ExchangeState>& ex, const HttpHeaders& headers);
  void pump_stream(const std::shared_ptr<ExchangeState>& ex);
  void add_disconnect_callback(const std::shared_ptr<ExchangeState>& ex,
                               std::function<void()> cb);
  void drop_slow_client(const std::shared_ptr<ExchangeState>& ex) {
    if (ex == exchange_) {
      XDS_LOG_WARN("http: dropping a client that does not read its stream ({} bytes waiting)",
                   server_->options.max_stream_backlog_bytes);
      close_connection();
    }
  }

 private:
  enum class Phase { kReading, kHandling, kWriting, kStreaming, kClosed };

  void read_request();
  void start_header_read();
  void on_header(error_code ec);
  void on_body(error_code ec);
  void dispatch_request();
  void start_watch();
  void on_watch(error_code ec, size_t n);
  void send_error(int status, std::string_view message, bool close_after = true);
  void write_whole(std::unique_ptr<http::response<http::string_body>> res);
  void finish_exchange();
  void close_connection();
  void arm_timer(std::chrono::milliseconds d);
  void cancel_timer() {
    ++timer_gen_;
    timer_.cancel();
  }

  tcp::socket socket_;
  net::steady_timer timer_;
  beast::flat_buffer buffer_;
  ServerCore* server_;  // outlives every running handler (stop() joins first)

  Phase phase_ = Phase::kReading;
  bool reading_ = false;  // a socket read (request or watch) is pending
  bool writing_ = false;
  bool keep_alive_ = true;
  bool stopping_ = false;
  bool chunked_ = true;        // the stream uses chunked framing (HTTP/1.1)
  bool stream_final_ = false;  // the write in flight ends the stream
  unsigned version_ = 11;
  uint64_t timer_gen_ = 0;
  std::optional<BeastRequestParser> parser_;
  std::shared_ptr<ExchangeState> exchange_;  // the request being answered
  std::unique_ptr<http::response<http::string_body>> response_;  // the whole answer in flight
  std::string stream_head_;  // status line + headers of a stream, not yet written
  std::string write_buf_;    // stream bytes in flight
};

void Connection::arm_timer(std::chrono::milliseconds d) {
  uint64_t gen = ++timer_gen_;
  timer_.expires_after(d);
  timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
    if (ec || gen != self->timer_gen_ || self->phase_ == Phase::kClosed) return;
    self->close_connection();  // idle too long, or a write that does not progress
  });
}

void Connection::read_request() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kReading;
  exchange_.reset();
  if (stopping_ || server_->stopping) {
    close_connection();
    return;
  }
  reset_request_parser(parser_, {.max_header_bytes = server_->options.max_header_bytes,
                                 .max_body_bytes = server_->options.max_body_bytes});
  arm_timer(server_->options.idle_timeout);
  if (reading_) {
    // The watch read is still pending: cancel it; on_watch then starts the header read
    // (bytes of a pipelined request may already be in buffer_).
    error_code ec;
    socket_.cancel(ec);
    return;
  }
  start_header_read();
}

void Connection::start_header_read() {
  reading_ = true;
  http::async_read_header(socket_, buffer_, *parser_,
                          [self = shared_from_this()](error_code ec, size_t) {
                            self->on_header(ec);
                          });
}

void Connection::on_header(error_code ec) {
  reading_ = false;
  if (phase_ == Phase::kClosed) return;
  if (peer_gone(ec)) return close_connection();
  if (ec) {
    const HttpParseError e = http_parse_error(ec, /*reading_header=*/true);
    return send_error(e.status, e.message);
  }
  if (parser_->is_done()) return dispatch_request();
  auto continue_read = [self = shared_from_this()] {
    self->reading_ = true;
    http::async_read(self->socket_, self->buffer_, *self->parser_,
                     [self](error_code e, size_t) { self->on_body(e); });
  };
  if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    writing_ = true;
    net::async_write(socket_, net::buffer(kContinue.data(), kContinue.size()),
                     [self = shared_from_this(), continue_read](error_code e, size_t) {
                       self->writing_ = false;
                       if (e || self->phase_ == Phase::kClosed) return self->close_connection();
                       continue_read();
                     });
    return;
  }
  continue_read();
}

void Connection::on_body(error_code ec) {
  reading_ = false;
  if (phase_ == Phase::kClosed) return;
  if (peer_gone(ec)) return close_connection();
  if (ec) {
    const HttpParseError e = http_parse_error(ec, /*reading_header=*/false);
    return send_error(e.status, e.message);
  }
  dispatch_request();
}

void Connection::dispatch_request() {
  cancel_timer();
  ParsedHttpRequest parsed = to_parsed_request(parser_->release());
  parser_.reset();
  version_ = parsed.version;
  keep_alive_ = parsed.keep_alive && !stopping_;
  HttpRequest req = std::move(parsed.request);

  auto route = server_->routes.find(req.path);
  if (route == server_->routes.end()) {
    return send_error(404, fmt::format("Invalid URL ({} {})", req.method, req.path), false);
  }
  auto handler = route->second.find(req.method);
  if (handler == route->second.end()) {
    return send_error(405, fmt::format("method {} not allowed on {}", req.method, req.path),
                      false);
  }

  auto ex = std::make_shared<ExchangeState>();
  ex->life = server_->life;
  ex->conn = weak_from_this();
  ex->max_backlog = server_->options.max_stream_backlog_bytes;
  exchange_ = ex;
  phase_ = Phase::kHandling;
  start_watch();
  try {
    handler->second(std::move(req), Responder(ex));
  } catch (const std::exception& e) {
    // The handler's Responder copies are gone; the guard answers 500.
    XDS_LOG_ERROR("http: handler for {} threw: {}", route->first, e.what());
  }
}

void Connection::start_watch() {
  if (reading_ || phase_ == Phase::kClosed || phase_ == Phase::kReading) return;
  if (buffer_.size() + 4096 > buffer_.max_size()) return;  // enough buffered; stop reading
  reading_ = true;
  socket_.async_read_some(buffer_.prepare(4096),
                          [self = shared_from_this()](error_code ec, size_t n) {
                            self->on_watch(ec, n);
                          });
}

void Connection::on_watch(error_code ec, size_t n) {
  reading_ = false;
  if (phase_ == Phase::kClosed) return;
  if (ec == net::error::operation_aborted && phase_ == Phase::kReading) {
    return start_header_read();
  }
  if (ec) {
    // EOF or error: during an answer this is a disconnect; between requests the end.
    return close_connection();
  }
  buffer_.commit(n);
  if (phase_ == Phase::kReading) return start_header_read();
  start_watch();
}

void Connection::send_error(int status, std::string_view message, bool close_after) {
  if (close_after) keep_alive_ = false;
  auto res = std::make_unique<http::response<http::string_body>>();
  res->version(version_);
  res->result(static_cast<unsigned>(status));
  res->set(http::field::content_type, "application/json");
  res->body() = server_->error_body(status, message);
  phase_ = Phase::kWriting;
  write_whole(std::move(res));
}

void Connection::send_whole(const std::shared_ptr<ExchangeState>& ex, HttpResponse r) {
  if (ex != exchange_ || phase_ != Phase::kHandling) return;
  auto res = std::make_unique<http::response<http::string_body>>();
  res->version(version_);
  res->result(static_cast<unsigned>(r.status));
  res->set(http::field::content_type, r.content_type);
  for (auto& [name, value] : r.headers) res->set(name, value);
  res->body() = std::move(r.body);
  phase_ = Phase::kWriting;
  write_whole(std::move(res));
}

void Connection::write_whole(std::unique_ptr<http::response<http::string_body>> res) {
  res->keep_alive(keep_alive_ && !stopping_);
  res->prepare_payload();
  response_ = std::move(res);
  writing_ = true;
  arm_timer(server_->options.write_timeout);
  http::async_write(socket_, *response_, [self = shared_from_this()](error_code ec, size_t) {
    self->writing_ = false;
    self->cancel_timer();
    self->response_.reset();
    if (self->phase_ == Phase::kClosed) return;
    if (ec) return self->close_connection();
    self->finish_exchange();
  });
}

void Connection::start_stream(const std::shared_ptr<ExchangeState>& ex,
                              const HttpHeaders& headers) {
  if (ex != exchange_ || phase_ != Phase::kHandling) return;
  phase_ = Phase::kStreaming;
  chunked_ = version_ >= 11;
  if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends when the connection does
  stream_head_ = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
  if (chunked_) stream_head_ += "Transfer-Encoding: chunked\r\n";
  if (!keep_alive_ || stopping_) stream_head_ += "Connection: close\r\n";
  for (const auto& [name, value] : headers) stream_head_ += fmt::format("{}: {}\r\n", name, value);
  stream_head_ += "\r\n";
  pump_stream(ex);
}

void Connection::pump_stream(const std::shared_ptr<ExchangeState>& ex) {
  if (ex != exchange_ || phase_ != Phase::kStreaming || writing_) return;
  std::string data;
  bool close_req = false;
  {
    std::lock_guard<std::mutex> lock(ex->mu);
    data.swap(ex->outbox);
    ex->pump_posted = false;
    close_req = ex->close_requested;
  }
  std::string out = std::move(stream_head_);
  stream_head_.clear();
  if (!data.empty()) out += chunked_ ? chunk_frame(data) : data;
  if (close_req) {
    if (chunked_) out += "0\r\n\r\n";
    stream_final_ = true;
  }
  if (out.empty()) return;
  write_buf_ = std::move(out);
  writing_ = true;
  arm_timer(server_->options.write_timeout);
  net::async_write(socket_, net::buffer(write_buf_),
                   [self = shared_from_this(), ex](error_code ec, size_t) {
                     self->writing_ = false;
                     self->cancel_timer();
                     if (self->phase_ == Phase::kClosed) return;
                     if (ec) return self->close_connection();
                     if (self->stream_final_) {
                       self->stream_final_ = false;
                       return self->finish_exchange();
                     }
                     self->pump_stream(ex);
                   });
}

void Connection::add_disconnect_callback(const std::shared_ptr<ExchangeState>& ex,
                                         std::function<void()> cb) {
  if (ex->gone) return cb();
  if (ex->finished) return;
  ex->on_gone.push_back(std::move(cb));
}

void Connection::finish_exchange() {
  if (exchange_) {
    exchange_->finished = true;
    exchange_->on_gone.clear();
    exchange_.reset();
  }
  if (!keep_alive_ || stopping_) {
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    return close_connection();
  }
  read_request();
}

void Connection::close_connection() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  cancel_timer();
  error_code ec;
  socket_.close(ec);
  std::vector<std::function<void()>> callbacks;
  if (exchange_ && !exchange_->finished) {
    exchange_->gone = true;
    callbacks.swap(exchange_->on_gone);
  }
  exchange_.reset();
  server_->unregister_connection(this);
  for (auto& cb : callbacks) {
    try {
      cb();
    } catch (const std::exception& e) {
      XDS_LOG_ERROR("http: on_disconnect callback threw: {}", e.what());
    }
  }
}

}  // namespace detail

using detail::Connection;
using detail::ExchangeState;
using detail::ServerCore;

// ---- ExchangeState, Responder, StreamHandle --------------------------------------------

bool detail::ExchangeState::post(std::function<void(Connection&)> fn) {
  std::lock_guard<std::mutex> lock(life->mu);
  if (!life->open) return false;
  std::shared_ptr<Connection> c = conn.lock();
  if (!c) return false;
  net::post(c->executor(), [c, fn = std::move(fn)] { fn(*c); });
  return true;
}

struct Responder::Guard {
  explicit Guard(std::shared_ptr<ExchangeState> s) : state(std::move(s)) {}
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  std::shared_ptr<ExchangeState> state;
  ~Guard() {
    if (state->answered.exchange(true)) return;
    HttpResponse r;
    r.status = 500;
    r.body = default_error_body(500, "the server did not answer this request");
    auto st = state;
    state->post([st, r = std::move(r)](Connection& c) mutable { c.send_whole(st, std::move(r)); });
  }
};

Responder::Responder(std::shared_ptr<detail::ExchangeState> state)
    : guard_(std::make_shared<Guard>(std::move(state))) {}

void Responder::send(HttpResponse response) {
  auto st = guard_->state;
  if (st->answered.exchange(true)) return;
  st->post([st, r = std::move(response)](Connection& c) mutable { c.send_whole(st, std::move(r)); });
}

std::shared_ptr<StreamHandle> Responder::start_stream(HttpHeaders headers) {
  auto st = guard_->state;
  if (st->answered.exchange(true)) return nullptr;
  st->post([st, h = std::move(headers)](Connection& c) { c.start_stream(st, h); });
  return std::make_shared<StreamHandle>(st);
}

void Responder::on_disconnect(std::function<void()> cb) {
  auto st = guard_->state;
  auto shared_cb = std::make_shared<std::function<void()>>(std::move(cb));
  bool posted = st->post([st, shared_cb](Connection& c) {
    c.add_disconnect_callback(st, std::move(*shared_cb));
  });
  if (!posted && st->gone) (*shared_cb)();
}

bool Responder::disconnected() const { return guard_->state->gone; }

StreamHandle::StreamHandle(std::shared_ptr<detail::ExchangeState> state)
    : state_(std::move(state)) {}

StreamHandle::~StreamHandle() { close(); }

bool StreamHandle::send_event(std::string_view data) {
  auto& st = *state_;
  if (st.gone || st.closed) return false;
  bool post_pump = false;
  bool overflow = false;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.close_requested) return false;
    if (st.outbox.size() + data.size() > st.max_backlog) {
      overflow = true;
    } else {
      st.outbox += sse_event_bytes(data);
      post_pump = !st.pump_posted;
      st.pump_posted = true;
    }
  }
  auto s = state_;
  if (overflow) {
    s->post([s](Connection& c) { c.drop_slow_client(s); });
    return false;
  }
  if (post_pump) s->post([s](Connection& c) { c.pump_stream(s); });
  return true;
}

void StreamHandle::close() {
  auto& st = *state_;
  if (st.closed.exchange(true)) return;
  bool post_pump = false;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.close_requested = true;
    post_pump = !st.pump_posted;
    st.pump_posted = true;
  }
  auto s = state_;
  if (post_pump) s->post([s](Connection& c) { c.pump_stream(s); });
}

bool StreamHandle::is_open() const { return !state_->gone && !state_->closed; }

void StreamHandle::on_disconnect(std::function<void()> cb) {
  auto s = state_;
  auto shared_cb = std::make_shared<std::function<void()>>(std::move(cb));
  bool posted = s->post([s, shared_cb](Connection& c) {
    c.add_disconnect_callback(s, std::move(*shared_cb));
  });
  if (!posted && s->gone) (*shared_cb)();
}

std::string sse_event_bytes(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  size_t pos = 0;
  while (true) {
    size_t nl = data.find('\n', pos);
    std::string_view line = data.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out += "data: ";
    out += line;
    out += '\n';
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  out += '\n';
  return out;
}

// ---- HttpServer ---------------------------------------------------------------------------

void ServerCore::register_connection(const std::shared_ptr<Connection>& c) {
  std::lock_guard<std::mutex> lock(conn_mu);
  connections.emplace(c.get(), c);
}

void ServerCore::unregister_connection(Connection* c) {
  std::lock_guard<std::mutex> lock(conn_mu);
  connections.erase(c);
  if (connections.empty()) conn_cv.notify_all();
}

void ServerCore::do_accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
    if (!ec && !stopping) {
      socket.set_option(tcp::no_delay(true), ec);
      auto c = std::make_shared<Connection>(std::move(socket), this);
      register_connection(c);
      c->start();
    }
    accept_delay_ms = next_accept_delay_ms(accept_delay_ms, ec ? ec.value() : 0);
    if (ec) {
      XDS_LOG_WARN("http: accept failed: {} (next try in {} ms)", ec.message(), accept_delay_ms);
    }
    if (accept_delay_ms == 0) return do_accept();
    // Out of descriptors or memory: the next accept() would fail at once too (the connection
    // stays in the backlog); wait instead of spinning.
    accept_timer->expires_after(std::chrono::milliseconds(accept_delay_ms));
    accept_timer->async_wait([this](error_code wait_ec) {
      if (wait_ec || !acceptor->is_open()) return;
      do_accept();
    });
  });
}

HttpServer::HttpServer(HttpServerOptions options)
    : impl_(std::make_unique<ServerCore>(std::move(options))) {}

HttpServer::~HttpServer() { stop(std::chrono::milliseconds(0)); }

detail::ServerCore::~ServerCore() = default;

void HttpServer::route(std::string method, std::string path, HttpHandler handler) {
  XDS_CHECK(!impl_->running, "HttpServer::route({} {}) after start()", method, path);
  impl_->routes[std::move(path)][std::move(method)] = std::move(handler);
}

Status HttpServer::start() {
  ServerCore& s = *impl_;
  XDS_CHECK(!s.running && !s.stopped, "HttpServer::start() called twice");
  if (s.options.threads < 1) {
    return invalid_argument("http server: threads must be >= 1, got {}", s.options.threads);
  }
  error_code ec;
  tcp::resolver resolver(s.ioc);
  auto endpoints = resolver.resolve(s.options.host, std::to_string(s.options.port), ec);
  if (ec || endpoints.empty()) {
    return unavailable("http server: cannot resolve {}:{}: {}", s.options.host, s.options.port,
                       ec.message());
  }
  tcp::endpoint ep = endpoints.begin()->endpoint();
  s.acceptor.emplace(net::make_strand(s.ioc));
  s.acceptor->open(ep.protocol(), ec);
  if (!ec) s.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor->bind(ep, ec);
  if (!ec) s.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    error_code ignored;
    s.acceptor->close(ignored);
    return unavailable("http server: cannot listen on {}:{}: {}", s.options.host,
                       s.options.port, ec.message());
  }
  s.bound_port = s.acceptor->local_endpoint().port();
  s.accept_timer.emplace(s.acceptor->get_executor());
  s.work.emplace(net::make_work_guard(s.ioc));
  s.do_accept();
  for (int i = 0; i < s.options.threads; ++i) {
    s.threads.emplace_back([&s] { s.ioc.run(); });
  }
  s.running = true;
  return {};
}

uint16_t HttpServer::port() const { return impl_->bound_port; }

size_t HttpServer::open_connections() const {
  std::lock_guard<std::mutex> lock(impl_->conn_mu);
  return impl_->connections.size();
}

void HttpServer::stop(std::chrono::milliseconds drain) {
  ServerCore& s = *impl_;
  if (!s.running || s.stopped) return;
  s.stopped = true;
  s.stopping = true;

  // 1. Stop accepting (on the acceptor's strand), wait until that ran.
  {
    std::promise<void> done;
    net::post(s.acceptor->get_executor(), [&s, &done] {
      error_code ec;
      s.acceptor->close(ec);
      if (s.accept_timer) s.accept_timer->cancel();
      done.set_value();
    });
    done.get_future().wait();
  }
  // 2. Ask every connection to stop: idle ones close, busy ones close after their answer.
  auto for_each_connection = [&s](auto fn) {
    std::vector<std::shared_ptr<Connection>> live;
    {
      std::lock_guard<std::mutex> lock(s.conn_mu);
      for (auto& [ptr, weak] : s.connections) {
        if (auto c = weak.lock()) live.push_back(std::move(c));
      }
    }
    for (auto& c : live) net::post(c->executor(), [c, fn] { fn(*c); });
  };
  for_each_connection([](Connection& c) { c.begin_stop(); });
  {
    std::unique_lock<std::mutex> lock(s.conn_mu);
    s.conn_cv.wait_for(lock, drain, [&s] { return s.connections.empty(); });
  }
  // 3. Drop the rest (their on_disconnect callbacks run), then let the threads finish.
  for_each_connection([](Connection& c) { c.force_close(); });
  {
    std::unique_lock<std::mutex> lock(s.conn_mu);
    s.conn_cv.wait_for(lock, std::chrono::seconds(2), [&s] { return s.connections.empty(); });
  }
  s.work.reset();
  {
    std::lock_guard<std::mutex> lock(s.life->mu);
    s.life->open = false;  // no more posts from Responders / StreamHandles
  }
  s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  s.running = false;
}

}  // namespace xds::serve
