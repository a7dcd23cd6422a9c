// The pure part of reading an HTTP/1.1 request: Beast's request parser as the server sets it
// up (the header and body limits), how its errors are answered, and how a parsed message
// becomes the HttpRequest a handler sees. No sockets, no threads.
//
//   http_server.cc         drives the parser from the socket (async_read_header, async_read);
//   parse_http_request()   drives the same parser from a buffer of bytes (tests, fuzzing).
//
// This header includes Beast: it is for http_server.cc and tests only, so that
// http_server.h stays cheap to include.
//
// Thread-safety: pure functions; a parser is used by one thread at a time.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http.hpp>

#include "serve/http_server.h"

namespace xds::serve {

using BeastRequest = boost::beast::http::request<boost::beast::http::string_body>;
using BeastRequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

struct HttpRequestLimits {
  size_t max_header_bytes = 64u << 10;  // larger headers: 431
  size_t max_body_bytes = 8u << 20;     // larger bodies: 413
};

// A fresh parser for the next request of a connection, with `limits` set.
void reset_request_parser(std::optional<BeastRequestParser>& parser,
                          const HttpRequestLimits& limits);

// How the server answers an error of the parser (not of the socket): 413 for a body over the
// limit, 431 for headers over it (while reading the header), 400 "malformed HTTP request: ..."
// for anything else.
struct HttpParseError {
  int status = 400;
  std::string message;
};
HttpParseError http_parse_error(const boost::system::error_code& ec, bool reading_header);

// A whole parsed request as the handler sees it, with what the connection keeps of it.
struct ParsedHttpRequest {
  HttpRequest request;     // path = target up to '?'; header names lower-cased
  unsigned version = 11;   // 10 = HTTP/1.0, 11 = HTTP/1.1
  bool keep_alive = true;  // as the request asks (Connection header and version)
};
ParsedHttpRequest to_parsed_request(BeastRequest&& message);

// One request read from the front of `bytes`, as a connection reads it from its socket.
enum class HttpParseState {
  kIncomplete,  // the bytes end before the request does
  kComplete,    // `parsed` holds it; `consumed` bytes belong to it (the rest is pipelined)
  kFailed,      // `error` is what the server answers
};
struct HttpParseOutcome {
  HttpParseState state = HttpParseState::kIncomplete;
  ParsedHttpRequest parsed;       // kComplete
  HttpParseError error;           // kFailed
  size_t consumed = 0;            // bytes the parser took
  bool expects_continue = false;  // the header asked for "Expect: 100-continue"
};
HttpParseOutcome parse_http_request(std::string_view bytes, const HttpRequestLimits& limits);

// ASCII lower case (header names).
std::string http_lower(std::string_view s);

}  // namespace xds::serve
