#include "loadgen/http_client.h"

#include <pthread.h>
#include <time.h>

#include <array>
#include <charconv>
#include <future>
#include <optional>
#include <thread>
#include <unordered_set>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/clock.h"

namespace xds::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Result<Url> parse_url(std::string_view text) {
  constexpr std::string_view kScheme = "http://";
  if (text.substr(0, 8) == "https://") {
    return unimplemented("--url '{}': https is not supported (use http://)", text);
  }
  if (text.substr(0, kScheme.size()) != kScheme) {
    return invalid_argument("--url '{}' must start with http://", text);
  }
  std::string_view rest = text.substr(kScheme.size());
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  Url url;
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {  // [::1]:8000
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return invalid_argument("--url '{}': unclosed '['", text);
    url.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return invalid_argument("--url '{}': junk after ']'", text);
      port_text = after.substr(1);
    }
  } else {
    const size_t colon = authority.find(':');
    url.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (url.host.empty()) return invalid_argument("--url '{}' has no host", text);
  if (!port_text.empty() || authority.find(':') != std::string_view::npos) {
    unsigned port = 0;
    const auto [p, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || p != port_text.data() + port_text.size() || port < 1 || port > 65535) {
      return invalid_argument("--url '{}': port '{}' is not in [1, 65535]", text, port_text);
    }
    url.port = static_cast<uint16_t>(port);
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  url.prefix = std::string(path);
  return url;
}

void SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  for (const char c : bytes) {
    if (last_was_cr_ && c == '\n') {
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = false;
    if (c == '\r') {
      end_line(events);
      last_was_cr_ = true;
    } else if (c == '\n') {
      end_line(events);
    } else {
      line_ += c;
    }
  }
}

void SseParser::end_line(std::vector<std::string>& events) {
  if (line_.empty()) {
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_.front() != ':') {
    const size_t colon = line_.find(':');
    const std::string_view field = std::string_view(line_).substr(0, colon);
    std::string_view value;
    if (colon != std::string::npos) {
      value = std::string_view(line_).substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    }
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_.append(value);
      has_data_ = true;
    }
  }
  line_.clear();
}

namespace detail {

class Session;

struct ClientCore {
  explicit ClientCore(Url u, HttpClientOptions o)
      : url(std::move(u)), options(o), guard(asio::make_work_guard(io)) {}

  Url url;
  HttpClientOptions options;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> guard;
  tcp::resolver::results_type endpoints;
  std::thread thread;
  clockid_t cpu_clock{};
  bool has_cpu_clock = false;
  std::atomic<int64_t> in_flight{0};
  // Io thread only.
  std::unordered_set<std::shared_ptr<Session>> open;
  bool shutting_down = false;
};

// One request on its own connection. Lives on the io thread only.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ClientCore& core, ClientRequest request, SseCallback on_event, DoneCallback on_done)
      : core_(core),
        stream_(core.io),
        on_event_(std::move(on_event)),
        on_done_(std::move(on_done)) {
    req_.method_string(request.method);
    req_.target(core.url.prefix + request.path);
    req_.version(11);
    req_.set(http::field::host, fmt::format("{}:{}", core.url.host, core.url.port));
    req_.set(http::field::user_agent, "xdeepserve-bench");
    req_.set(http::field::connection, "close");
    req_.set(http::field::accept, "application/json, text/event-stream");
    if (!request.api_key.empty()) {
      req_.set(http::field::authorization, "Bearer " + request.api_key);
    }
    if (!request.body.empty() || request.method == "POST") {
      req_.set(http::field::content_type, "application/json");
      req_.body() = std::move(request.body);
      req_.prepare_payload();
    }
  }

  void run() {
    ex_.start_ns = now_ns();
    stream_.expires_after(core_.options.connect_timeout);
    stream_.async_connect(core_.endpoints,
                          [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                            self->on_connect(ec);
                          });
  }

  // Ends the request now with `why` (Cancelled), closing the connection.
  void abort(Status why) { finish(std::move(why)); }

 private:
  void on_connect(beast::error_code ec) {
    if (finished_) return;
    if (ec) {
      return finish(
          unavailable("connect to {}:{}: {}", core_.url.host, core_.url.port, ec.message()));
    }
    beast::error_code ignored;
    stream_.socket().set_option(tcp::no_delay(true), ignored);
    stream_.expires_after(core_.options.idle_timeout);
    http::async_write(stream_, req_, [self = shared_from_this()](beast::error_code e, size_t) {
      self->on_write(e);
    });
  }

  void on_write(beast::error_code ec) {
    if (finished_) return;
    if (ec) return finish(transport_error("sending the request", ec));
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stream_.expires_after(core_.options.idle_timeout);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code e, size_t) { self->on_header(e); });
  }

  void on_header(beast::error_code ec) {
    if (finished_) return;
    if (ec) return finish(transport_error("reading the response head", ec));
    ex_.head_ns = now_ns();
    ex_.status = static_cast<int>(parser_->get().result_int());
    const auto type = parser_->get()[http::field::content_type];
    ex_.event_stream = type.substr(0, 17) == "text/event-stream";
    read_more();
  }

  void read_more() {
    if (parser_->is_done()) return finish({});
    parser_->get().body().data = chunk_.data();
    parser_->get().body().size = chunk_.size();
    stream_.expires_after(core_.options.idle_timeout);
    http::async_read_some(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code e, size_t) { self->on_read(e); });
  }

  void on_read(beast::error_code ec) {
    if (finished_) return;
    if (ec == http::error::need_buffer) ec = {};
    const size_t got = chunk_.size() - parser_->get().body().size;
    if (got > 0) consume(std::string_view(chunk_.data(), got), now_ns());
    if (ec) return finish(transport_error("reading the response body", ec));
    read_more();
  }

  void consume(std::string_view bytes, int64_t t) {
    if (!ex_.event_stream) {
      ex_.body.append(bytes);
      return;
    }
    sse_.feed(bytes, pending_);
    for (std::string& data : pending_) {
      if (on_event_) on_event_(SseEvent{t, std::move(data)});
    }
    pending_.clear();
  }

  Status transport_error(std::string_view stage, beast::error_code ec) {
    if (ec == beast::error::timeout) {
      return deadline_exceeded("{}: no data for {} ms", stage, core_.options.idle_timeout.count());
    }
    return unavailable("{}: {}", stage, ec.message());
  }

  void finish(Status error) {
    if (finished_) return;
    finished_ = true;
    auto self = shared_from_this();
    ex_.error = std::move(error);
    ex_.end_ns = now_ns();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    core_.open.erase(self);
    core_.in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (!core_.shutting_down && on_done_) on_done_(std::move(ex_));
  }

  ClientCore& core_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> req_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  std::array<char, 16384> chunk_{};
  SseParser sse_;
  std::vector<std::string> pending_;
  SseCallback on_event_;
  DoneCallback on_done_;
  HttpExchange ex_;
  bool finished_ = false;
};

}  // namespace detail

HttpClient::HttpClient(std::unique_ptr<detail::ClientCore> core) : core_(std::move(core)) {}

Result<std::unique_ptr<HttpClient>> HttpClient::create(const Url& url, HttpClientOptions options) {
  auto core = std::make_unique<detail::ClientCore>(url, options);
  tcp::resolver resolver(core->io);
  beast::error_code ec;
  core->endpoints = resolver.resolve(url.host, std::to_string(url.port), ec);
  if (ec || core->endpoints.empty()) {
    return unavailable("cannot resolve {}:{}: {}", url.host, url.port, ec.message());
  }
  detail::ClientCore* c = core.get();
  c->thread = std::thread([c] { c->io.run(); });
  c->has_cpu_clock = pthread_getcpuclockid(c->thread.native_handle(), &c->cpu_clock) == 0;
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(core)));
}

HttpClient::~HttpClient() {
  detail::ClientCore* c = core_.get();
  asio::post(c->io, [c] {
    c->shutting_down = true;
    auto open = c->open;  // abort() erases from c->open
    for (const auto& s : open) s->abort(cancelled("client destroyed"));
  });
  c->guard.reset();
  c->thread.join();
}

void HttpClient::start(ClientRequest request, SseCallback on_event, DoneCallback on_done) {
  detail::ClientCore* c = core_.get();
  c->in_flight.fetch_add(1, std::memory_order_relaxed);
  asio::post(c->io, [c, request = std::move(request), on_event = std::move(on_event),
                     on_done = std::move(on_done)]() mutable {
    auto s = std::make_shared<detail::Session>(*c, std::move(request), std::move(on_event),
                                               std::move(on_done));
    c->open.insert(s);
    s->run();
  });
}

HttpExchange HttpClient::fetch(ClientRequest request) {
  if (std::this_thread::get_id() == core_->thread.get_id()) {
    HttpExchange ex;
    ex.error = failed_precondition("HttpClient::fetch called on the io thread");
    return ex;
  }
  auto done = std::make_shared<std::promise<HttpExchange>>();
  std::future<HttpExchange> result = done->get_future();
  start(std::move(request), nullptr, [done](HttpExchange ex) { done->set_value(std::move(ex)); });
  return result.get();
}

int64_t HttpClient::in_flight() const {
  return core_->in_flight.load(std::memory_order_relaxed);
}

double HttpClient::io_thread_cpu_s() const {
  if (!core_->has_cpu_clock) return 0;
  timespec ts{};
  if (clock_gettime(core_->cpu_clock, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void HttpClient::cancel_all() {
  detail::ClientCore* c = core_.get();
  asio::post(c->io, [c] {
    auto open = c->open;
    for (const auto& s : open) s->abort(cancelled("cancelled by the client"));
  });
}

}  // namespace xds::loadgen
