#include "serve/http_request_parser.h"

#include <cctype>

#include <fmt/format.h>
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/string.hpp>

namespace xds::serve {

namespace http = boost::beast::http;

std::string http_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == http_lower(name)) return v;
  }
  return {};
}

void reset_request_parser(std::optional<BeastRequestParser>& parser,
                          const HttpRequestLimits& limits) {
  parser.emplace();
  parser->header_limit(static_cast<uint32_t>(limits.max_header_bytes));
  parser->body_limit(limits.max_body_bytes);
}

HttpParseError http_parse_error(const boost::system::error_code& ec, bool reading_header) {
  if (ec == http::error::body_limit) return {413, "request body too large"};
  if (reading_header && ec == http::error::header_limit) {
    return {431, "request headers too large"};
  }
  return {400, fmt::format("malformed HTTP request: {}", ec.message())};
}

ParsedHttpRequest to_parsed_request(BeastRequest&& message) {
  ParsedHttpRequest out;
  out.version = message.version();
  out.keep_alive = message.keep_alive();
  HttpRequest& req = out.request;
  req.method = std::string(message.method_string());
  req.target = std::string(message.target());
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& f : message) {
    req.headers.emplace_back(http_lower(std::string(f.name_string())), std::string(f.value()));
  }
  req.body = std::move(message.body());
  return out;
}

HttpParseOutcome parse_http_request(std::string_view bytes, const HttpRequestLimits& limits) {
  HttpParseOutcome out;
  std::optional<BeastRequestParser> parser;
  reset_request_parser(parser, limits);
  // Feeds what is left of `bytes`. Beast's parser asks for more (need_more) only when the
  // bytes it was given end inside the request: a socket reader then reads on; here the
  // request is incomplete.
  auto feed = [&](bool reading_header) -> bool {
    if (out.consumed == bytes.size()) return false;
    boost::system::error_code ec;
    const size_t n = parser->put(
        boost::asio::const_buffer(bytes.data() + out.consumed, bytes.size() - out.consumed), ec);
    out.consumed += n;
    if (ec == http::error::need_more) return false;
    if (ec) {
      out.state = HttpParseState::kFailed;
      out.error = http_parse_error(ec, reading_header);
      return false;
    }
    return n > 0 || parser->is_done();  // no progress without an error: treat as incomplete
  };
  // The header first (async_read_header: not eager), then the body (async_read: eager).
  while (!parser->is_header_done()) {
    if (!feed(/*reading_header=*/true)) return out;
  }
  out.expects_continue = boost::beast::iequals(parser->get()[http::field::expect], "100-continue");
  parser->eager(true);
  while (!parser->is_done()) {
    if (!feed(/*reading_header=*/false)) return out;
  }
  out.state = HttpParseState::kComplete;
  out.parsed = to_parsed_request(parser->release());
  return out;
}

}  // namespace xds::serve
