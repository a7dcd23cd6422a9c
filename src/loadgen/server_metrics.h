// What the benchmark client reads from the server's /metrics (Prometheus text) around a run:
// the MTP speculative-decoding counters (xdeepserve_spec_decode_*_total), whose difference over
// the run gives the acceptance per draft position and the tokens per verify step.
//
// Thread-safety: the parse and difference functions are pure; fetch_spec_counters does I/O.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "loadgen/http_client.h"

namespace xds::loadgen {

// Cumulative counters, all DP groups.
struct SpecCounters {
  double verify_steps = 0;       // decode steps that verified drafts
  double step_tokens = 0;        // tokens they gave (accepted + 1 each)
  std::vector<double> drafted;   // [k] drafts verified at position i + 1
  std::vector<double> accepted;  // [k] of those, accepted
  bool present() const { return !drafted.empty(); }
};

// The counters in a /metrics text; none (present() false) when the server does not
// speculate. DataLoss naming the line when a spec_decode sample is malformed.
Result<SpecCounters> parse_spec_counters(std::string_view metrics_text);

// after - before, position by position (before may have fewer positions, or none).
SpecCounters spec_difference(const SpecCounters& after, const SpecCounters& before);

// {"verify_steps", "tokens_per_step", "acceptance": [per position], "drafted", "accepted"}.
nlohmann::json spec_json(const SpecCounters& d);
// One line: "speculative  N verify steps, T tokens/step, acceptance by position a1 a2 ...".
std::string spec_line(const SpecCounters& d);

// GET /metrics from the server at `url`.
Result<SpecCounters> fetch_spec_counters(const Url& url, const std::string& api_key);

}  // namespace xds::loadgen
