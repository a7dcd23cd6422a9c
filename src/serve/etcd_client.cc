#include "serve/etcd_client.h"

#include <charconv>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace xds::serve::etcd {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// A watch checks its stop flag this often.
constexpr std::chrono::milliseconds kStopPoll{200};

// One connection to etcd carrying one request.
struct Connection {
  net::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
};

std::string where(const Endpoint& ep, std::string_view path) {
  return fmt::format("etcd at http://{}:{}{}", ep.host, ep.port, path);
}

// Connects and sends `body` to `path`, within `timeout`.
Status send_request(Connection& c, const Endpoint& ep, std::string_view path, std::string body,
                    std::chrono::milliseconds timeout) {
  beast::error_code ec;
  tcp::resolver resolver(c.ioc);
  const auto results = resolver.resolve(ep.host, ep.port, ec);
  if (ec) return unavailable("{}: cannot resolve the host: {}", where(ep, path), ec.message());
  http::request<http::string_body> req{http::verb::post, std::string(path), 11};
  req.set(http::field::host, ep.host);
  req.set(http::field::content_type, "application/json");
  req.keep_alive(false);
  req.body() = std::move(body);
  req.prepare_payload();
  c.stream.expires_after(timeout);
  c.stream.async_connect(results, [&](beast::error_code e, const tcp::endpoint&) {
    if (e) {
      ec = e;
      return;
    }
    http::async_write(c.stream, req, [&](beast::error_code e2, size_t) { ec = e2; });
  });
  c.ioc.run();
  c.ioc.restart();
  if (ec) return unavailable("{}: {}", where(ep, path), ec.message());
  return {};
}

}  // namespace

Result<Endpoint> parse_endpoint(std::string_view url, std::string_view flag) {
  constexpr std::string_view kScheme = "http://";
  if (!url.starts_with(kScheme)) {
    return invalid_argument("{} must be http://HOST:PORT (no TLS), got '{}'", flag, url);
  }
  std::string_view rest = url.substr(kScheme.size());
  if (rest.ends_with('/')) rest.remove_suffix(1);
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || rest.find('/') != std::string_view::npos) {
    return invalid_argument("{} must be http://HOST:PORT, got '{}'", flag, url);
  }
  const std::string_view port = rest.substr(colon + 1);
  int value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value < 1 || value > 65535) {
    return invalid_argument("{}: port '{}' is not in [1, 65535] (in '{}')", flag, port, url);
  }
  return Endpoint{std::string(rest.substr(0, colon)), std::string(port)};
}

Result<std::string> Client::post(std::string_view path, std::string body) const {
  Connection c;
  XDS_RETURN_IF_ERROR(send_request(c, endpoint_, path, std::move(body), timeout_));
  http::response<http::string_body> res;
  beast::error_code ec;
  http::async_read(c.stream, c.buffer, res, [&](beast::error_code e, size_t) { ec = e; });
  c.ioc.run();
  if (ec) return unavailable("{}: {}", where(endpoint_, path), ec.message());
  return std::move(res.body());
}

Result<RangeAnswer> Client::range_prefix(std::string_view prefix) const {
  XDS_ASSIGN_OR_RETURN(std::string body, post("/v3/kv/range", range_prefix_request(prefix)));
  return parse_range_answer(body);
}

Status Client::put(std::string_view key, std::string_view value, int64_t lease) const {
  XDS_ASSIGN_OR_RETURN(std::string body, post("/v3/kv/put", put_request(key, value, lease)));
  return parse_unary_answer(body, "put");
}

Result<LeaseGrant> Client::grant(int64_t ttl_s) const {
  XDS_ASSIGN_OR_RETURN(std::string body, post("/v3/lease/grant", lease_grant_request(ttl_s)));
  return parse_lease_grant_answer(body);
}

Result<int64_t> Client::keep_alive(int64_t lease) const {
  XDS_ASSIGN_OR_RETURN(std::string body, post("/v3/lease/keepalive", lease_id_request(lease)));
  return parse_keepalive_answer(body);
}

Status Client::revoke(int64_t lease) const {
  XDS_ASSIGN_OR_RETURN(std::string body, post("/v3/lease/revoke", lease_id_request(lease)));
  return parse_unary_answer(body, "lease revoke");
}

Status Client::compact(int64_t revision) const {
  XDS_ASSIGN_OR_RETURN(std::string body, post("/v3/kv/compaction", compaction_request(revision)));
  return parse_unary_answer(body, "compaction");
}

Status Client::watch(std::string_view prefix, int64_t start_revision, const std::atomic<bool>& stop,
                     const std::function<bool(const WatchMessage&)>& on_message) const {
  constexpr std::string_view kPath = "/v3/watch";
  Connection c;
  XDS_RETURN_IF_ERROR(
      send_request(c, endpoint_, kPath, watch_create_request(prefix, start_revision), timeout_));
  c.stream.expires_never();  // a quiet prefix sends nothing for as long as it stays quiet
  http::response_parser<http::string_body> parser;
  parser.body_limit(boost::none);
  while (true) {
    bool done = false;
    beast::error_code ec;
    http::async_read_some(c.stream, c.buffer, parser, [&](beast::error_code e, size_t) {
      ec = e;
      done = true;
    });
    while (!done) {
      c.ioc.run_for(kStopPoll);
      if (!done && stop.load(std::memory_order_relaxed)) {
        c.stream.cancel();
        c.ioc.run();
        return cancelled("etcd watch of {} stopped", prefix);
      }
    }
    c.ioc.restart();
    if (ec) return unavailable("{}: {}", where(endpoint_, kPath), ec.message());
    if (parser.is_header_done() && parser.get().result() != http::status::ok) {
      return unavailable("{}: HTTP {} for the watch of {}", where(endpoint_, kPath),
                         parser.get().result_int(), prefix);
    }
    // Each message is one line of the (chunked) body: hand over the complete ones.
    std::string& body = parser.get().body();
    size_t start = 0;
    for (size_t nl; (nl = body.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string_view line = std::string_view(body).substr(start, nl - start);
      if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
      XDS_ASSIGN_OR_RETURN(WatchMessage m, parse_watch_message(line));
      if (!on_message(m)) return {};
    }
    body.erase(0, start);
    if (parser.is_done()) {
      return unavailable("{}: the watch stream of {} ended", where(endpoint_, kPath), prefix);
    }
  }
}

}  // namespace xds::serve::etcd
