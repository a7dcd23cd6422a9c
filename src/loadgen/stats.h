// The benchmark client's statistics: pure functions over per-request records, no I/O.
//
// Definitions (the same as the common serving benchmarks, stated here once):
//   - Times are seconds on one steady clock, relative to the start of the run.
//   - A "token event" is what one socket read brought of output tokens: one streamed chunk
//     or several (a server that batches its writes), with one or more tokens each
//     (speculative decoding). Chunks that arrived in the same read carry the same time and
//     cannot be told apart in time, so they are one event (append_token_event).
//   - TTFT  = time of the first token event - send time.
//   - E2E   = end time (the stream's last byte) - send time.
//   - TPOT  = (time of the last token event - time of the first) / (output tokens - 1); only
//             for requests with >= 2 output tokens.
//   - ITL   = the gaps between consecutive token events; a gap before an event that carries k
//             tokens counts as k inter-token latencies of gap / k each.
//   - Percentile p of n values: sort them, rank r = p / 100 * (n - 1), value =
//     x[floor r] + (r - floor r) * (x[floor r + 1] - x[floor r]) (linear interpolation between
//     order statistics; numpy's default).
//   - SLO attainment: the fraction of all requests (failed ones count as missing) whose TTFT
//     <= the TTFT limit and whose TPOT <= the TPOT limit (a request without a TPOT, fewer
//     than 2 output tokens, meets the TPOT limit).
//   - Goodput of a rate sweep: the highest swept Poisson rate at which the attainment is
//     >= 90% (the fraction is a parameter).
//
// Thread-safety: every function is pure and reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace xds::loadgen {

// Percentile p in [0, 100] of values that are already sorted ascending; 0 for no values.
double percentile_sorted(std::span<const double> sorted, double p);

// Summary of one metric over many samples.
struct Distribution {
  int64_t count = 0;
  double mean = 0, min = 0, max = 0;
  double p50 = 0, p90 = 0, p99 = 0;
};
Distribution summarize(std::vector<double> values);

// What the client saw of one request.
struct RequestRecord {
  int64_t index = 0;  // position in the workload
  int class_id = 0;   // request class of a mixed workload (0 when there is one)
  double send_s = 0;  // when the client started the request
  double end_s = 0;   // when the response ended (or failed)
  // One entry per token event: [events].
  std::vector<double> event_s;        // arrival time of the event
  std::vector<int32_t> event_tokens;  // output tokens the event carried (>= 1)
  int64_t prompt_tokens = 0;          // usage.prompt_tokens, else the tokens the client sent
  int64_t completion_tokens = 0;      // usage.completion_tokens, else the sum of event_tokens
  bool ok = false;
  std::string error;  // why it failed (HTTP status and message, transport error)
};

// The metrics of one request. Valid only for an ok record with >= 1 token event.
struct RequestMetrics {
  bool valid = false;
  double ttft_s = 0;
  double e2e_s = 0;
  std::optional<double> tpot_s;  // absent with < 2 output tokens
  std::vector<double> itl_s;     // [completion tokens - tokens of the first event]
  int64_t output_tokens = 0;
};
RequestMetrics request_metrics(const RequestRecord& r);

// Records `tokens` (>= 1) output tokens that arrived at `time_s`: a new event, or more tokens
// of the last one when it has the same time (the same socket read).
void append_token_event(RequestRecord& r, double time_s, int32_t tokens);

// The run's aggregate. Throughputs are over `duration_s` (first send to last end).
struct RunSummary {
  int64_t requests = 0;   // all records
  int64_t completed = 0;  // ok with at least one token
  int64_t failed = 0;     // not ok
  double duration_s = 0;
  int64_t input_tokens = 0;            // of completed requests
  int64_t output_tokens = 0;           // of completed requests
  double request_throughput = 0;       // completed / s
  double output_token_throughput = 0;  // output tokens / s
  double total_token_throughput = 0;   // (input + output tokens) / s
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms;
  std::vector<std::string> first_errors;  // up to 5 distinct error messages
};
RunSummary summarize_run(std::span<const RequestRecord> records, double duration_s);

struct SloLimits {
  double ttft_s = 0;
  double tpot_s = 0;
};
// The fraction of `records` meeting both limits (definition above); 0 for no records.
double slo_attainment(std::span<const RequestRecord> records, const SloLimits& limits);

// One swept rate's outcome.
struct SweepPoint {
  double rate = 0;        // requests / s
  double attainment = 0;  // slo_attainment at this rate
  double ttft_p99_s = 0;
  double tpot_p99_s = 0;
};
// The highest rate whose attainment >= min_fraction; nullopt when none reaches it.
std::optional<double> goodput_rate(std::span<const SweepPoint> points, double min_fraction = 0.9);
// The highest rate whose TTFT P99 and TPOT P99 are both within the limits.
std::optional<double> goodput_rate_p99(std::span<const SweepPoint> points, const SloLimits& limits);

// --peak-decode: the window in which every stream is decoding, from the last stream's first
// token event to the first stream's last token event, and the tokens decoded in it (events
// strictly after the window start up to and including its end, so no stream's prefill token
// counts).
struct DecodeWindow {
  bool valid = false;  // false when the streams never decoded all at once (or one failed)
  double start_s = 0, end_s = 0;
  int64_t streams = 0;
  int64_t tokens = 0;       // over all streams, inside the window
  double tokens_per_s = 0;  // tokens / (end - start)
  double step_time_s = 0;   // streams / tokens_per_s: the mean time per token of one stream
};
DecodeWindow decode_window(std::span<const RequestRecord> records);

}  // namespace xds::loadgen
