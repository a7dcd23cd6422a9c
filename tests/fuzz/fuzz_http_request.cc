// Fuzz target: the HTTP/1.1 request parser of the server (serve/http_request_parser.h).
// Input: the bytes a client sends on one connection (requests may be pipelined).
//
// Checked beyond "no crash, no hang, no exception":
//   - a complete request: path is the target up to '?', header names are lower case and
//     header() finds the first of a name in any case, the body is within the limit, the parser
//     took no more bytes than it was given;
//   - the same bytes under larger limits: what parses under the small limits parses the same
//     (limits only ever refuse, they never change a request);
//   - pipelined requests: each next one is parsed from the bytes left over, as a keep-alive
//     connection does.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/check.h"
#include "serve/http_request_parser.h"

namespace {

using xds::serve::HttpParseOutcome;
using xds::serve::HttpParseState;
using xds::serve::HttpRequestLimits;

constexpr HttpRequestLimits kSmallLimits{.max_header_bytes = 512, .max_body_bytes = 1024};
constexpr HttpRequestLimits kServerLimits{};  // the server's defaults: 64 KiB, 8 MiB
constexpr int kMaxPipelined = 8;

void check_complete(const HttpParseOutcome& out, std::string_view bytes,
                    const HttpRequestLimits& limits) {
  const auto& req = out.parsed.request;
  XDS_CHECK(out.consumed <= bytes.size(), "consumed {} of {} bytes", out.consumed, bytes.size());
  XDS_CHECK(req.path == req.target.substr(0, req.target.find('?')), "path '{}' of target '{}'",
            req.path, req.target);
  XDS_CHECK(req.body.size() <= limits.max_body_bytes, "body of {} bytes over the limit {}",
            req.body.size(), limits.max_body_bytes);
  for (const auto& [name, value] : req.headers) {
    XDS_CHECK(name == xds::serve::http_lower(name), "header name '{}' not lower case", name);
    // header() finds the first of that name, whatever the case asked for.
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const auto first =
        std::find_if(req.headers.begin(), req.headers.end(),
                     [&req_name = name](const auto& h) { return h.first == req_name; });
    XDS_CHECK(req.header(upper) == first->second, "header('{}')", upper);
  }
  XDS_CHECK(out.parsed.version == 10 || out.parsed.version == 11, "version {}", out.parsed.version);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);

  const HttpParseOutcome small = xds::serve::parse_http_request(bytes, kSmallLimits);
  const HttpParseOutcome large = xds::serve::parse_http_request(bytes, kServerLimits);
  if (small.state == HttpParseState::kFailed) {
    XDS_CHECK(small.error.status == 400 || small.error.status == 413 || small.error.status == 431,
              "status {}", small.error.status);
  }
  if (small.state == HttpParseState::kComplete) {
    check_complete(small, bytes, kSmallLimits);
    XDS_CHECK(large.state == HttpParseState::kComplete, "complete under the small limits only");
    XDS_CHECK(large.consumed == small.consumed &&
                  large.parsed.request.body == small.parsed.request.body &&
                  large.parsed.request.target == small.parsed.request.target &&
                  large.parsed.request.headers == small.parsed.request.headers,
              "the limits changed the request");
  }

  // Keep-alive: the next requests come from what the last one left.
  std::string_view rest = bytes;
  for (int i = 0; i < kMaxPipelined && !rest.empty(); ++i) {
    const HttpParseOutcome out = xds::serve::parse_http_request(rest, kServerLimits);
    if (out.state != HttpParseState::kComplete) break;
    check_complete(out, rest, kServerLimits);
    if (out.consumed == 0) break;
    rest.remove_prefix(out.consumed);
  }
  return 0;
}
