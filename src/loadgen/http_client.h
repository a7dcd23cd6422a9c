// The benchmark client's HTTP/1.1 client: posts a body and reads the answer, which is either a
// whole response or a Server-Sent Events stream whose `data:` events are handed over one by
// one with the steady-clock time (base/clock.h now_ns) of the socket read that completed them.
//
// Every request opens its own connection (`Connection: close`), so a slow stream never holds
// back another request. All connections live on one io_context driven by one io thread
// (Boost.Beast on Asio, asynchronous): thousands of open streams cost memory, not threads, and
// the client's own CPU time is that thread's (io_thread_cpu_s), which the bench reports.
// Beast and Asio stay inside http_client.cc (this header is a pimpl).
//
// Thread-safety: HttpClient: start(), in_flight(), io_thread_cpu_s() and cancel_all() from any
// thread; fetch() from any thread except the io thread (it blocks on it). Callbacks run on the
// io thread and must not block. The destructor drops open requests without calling their
// on_done and joins the io thread; don't destroy the client from one of its callbacks.
// SseParser is a value, one per stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace xds::loadgen {

// "http://HOST[:PORT][/PREFIX]"; PREFIX (without a trailing '/') is put before every path.
struct Url {
  std::string host;
  uint16_t port = 80;
  std::string prefix;  // "" or "/something"
};
Result<Url> parse_url(std::string_view text);

// Incremental SSE parsing (the WHATWG rules the OpenAI streams use): lines end with "\n",
// "\r\n" or "\r"; "data:" lines (one optional space after the colon) of one event are joined
// with "\n"; a blank line ends the event; comments (":...") and other fields are skipped;
// an event without data lines is not reported.
class SseParser {
 public:
  // Feeds the next bytes of the stream; appends the data of each event they complete.
  void feed(std::string_view bytes, std::vector<std::string>& events);

 private:
  void end_line(std::vector<std::string>& events);
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;  // a "\r\n" split across two feeds is one line end
};

struct SseEvent {
  int64_t time_ns = 0;  // steady clock, the read that completed the event
  std::string data;     // "{...}" or "[DONE]"
};

struct ClientRequest {
  std::string method = "POST";
  std::string path;     // "/v1/completions" (the URL's prefix is added)
  std::string body;     // JSON; empty for a GET
  std::string api_key;  // sent as "Authorization: Bearer KEY" when not empty
};

// The outcome of one request.
struct HttpExchange {
  Status error;               // a transport failure (connect, timeout, reset, malformed HTTP)
  int status = 0;             // the HTTP status; 0 when no response head arrived
  bool event_stream = false;  // Content-Type text/event-stream (events went to on_event)
  std::string body;           // the body when it is not an event stream
  int64_t start_ns = 0;       // before connecting
  int64_t head_ns = 0;        // the response head arrived
  int64_t end_ns = 0;         // the response ended or failed
};

using SseCallback = std::function<void(const SseEvent&)>;
using DoneCallback = std::function<void(HttpExchange)>;

struct HttpClientOptions {
  std::chrono::milliseconds connect_timeout{10'000};
  // The longest silence while waiting for (more of) a response: a prefill queued behind
  // long prompts on a CPU can take minutes.
  std::chrono::milliseconds idle_timeout{600'000};
};

namespace detail {
struct ClientCore;
}

class HttpClient {
 public:
  // Resolves the host (once) and starts the io thread.
  static Result<std::unique_ptr<HttpClient>> create(const Url& url, HttpClientOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Starts one request on a new connection. `on_event` (may be empty) gets every SSE data
  // event of an event-stream answer in order; `on_done` runs once, after the last event, when
  // the response ended or failed.
  void start(ClientRequest request, SseCallback on_event, DoneCallback on_done);
  // Blocking: one whole exchange (SSE events are dropped).
  HttpExchange fetch(ClientRequest request);
  // Requests started whose on_done has not run yet.
  int64_t in_flight() const;
  // CPU seconds the io thread has used since create().
  double io_thread_cpu_s() const;
  // Fails every open request (on_done with a Cancelled error) and returns at once.
  void cancel_all();

 private:
  explicit HttpClient(std::unique_ptr<detail::ClientCore> core);
  std::unique_ptr<detail::ClientCore> core_;
};

}  // namespace xds::loadgen
