// The benchmark client's runner: sends a workload (workload.h) to an OpenAI-compatible server
// and records what every request saw (stats.h RequestRecord).
//
// Every request is streamed (`"stream": true`, `stream_options.include_usage`). Tokens per
// SSE event (chunks of one socket read are one token event: stats.h): the length of
// `choices[0].token_ids` when the server sends ids (a tokenizer-less model), else 1 for an event
// with non-empty text (`choices[0].text`, or the chat delta's content / reasoning_content /
// tool_calls). The request's completion_tokens is the final usage chunk's when it comes, else the
// sum over events. A request is ok when the answer was HTTP 200, the stream ended with `data:
// [DONE]` and no event carried an error.
//
// Closed loop: `concurrency` requests in flight, the next sent when one ends. Open loop: each
// request is sent at its planned arrival time (at most max_in_flight at once; an arrival that
// finds the cap full waits and is counted). Either stops sending at num_requests or after
// duration_s, then waits for what is in flight. A progress line goes to stderr while it runs.
//
// Thread-safety: run_workload blocks the calling thread; it uses its own HttpClient (one io
// thread). The pure helpers are reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "loadgen/http_client.h"
#include "loadgen/stats.h"
#include "loadgen/workload.h"

namespace xds::loadgen {

enum class Endpoint { kCompletions, kChat };

struct RunnerOptions {
  Url url;
  std::string model;  // the "model" field
  Endpoint endpoint = Endpoint::kCompletions;
  bool ignore_eos = false;
  std::optional<double> temperature;  // not sent when absent
  std::string api_key;
  bool progress = true;          // the progress line on stderr
  std::string label;             // put before the progress line ("rate 2/s")
  int64_t max_in_flight = 4096;  // open loop
  HttpClientOptions http;
};

// The JSON body of one request.
std::string request_body(const RequestSpec& request, const RunnerOptions& options);

// What one SSE data event says.
struct ChunkInfo {
  bool done = false;                         // "[DONE]"
  int32_t tokens = 0;                        // output tokens it carries
  std::optional<int64_t> prompt_tokens;      // usage
  std::optional<int64_t> completion_tokens;  // usage
  std::string error;                         // an "error" object's message; empty when none
};
// Malformed JSON is an error naming the start of the text.
Result<ChunkInfo> parse_chunk(std::string_view data, Endpoint endpoint);

struct RunResult {
  std::vector<RequestRecord> records;  // [requests], in index order
  double duration_s = 0;               // first send to last end
  int64_t events = 0;                  // SSE events received
  double client_cpu_s = 0;             // CPU time of the client's io thread during the run
  double process_cpu_s = 0;            // CPU time of this whole process during the run
  int64_t delayed_arrivals = 0;        // open loop: sent after the cap let them
  double max_send_lag_s = 0;           // open loop: latest send against its planned time
};
Result<RunResult> run_workload(const WorkloadSpec& workload, const RunnerOptions& options);

// GET `path` (one connection, 30 s of silence allowed): the body of a 200 answer; Unavailable
// naming the path and the status (and the server's error message) otherwise.
Result<std::string> get_body(const Url& url, const std::string& path, const std::string& api_key);

// GET /v1/models: the first model's id (for a bench without --model).
Result<std::string> first_model(const Url& url, const std::string& api_key);

}  // namespace xds::loadgen
