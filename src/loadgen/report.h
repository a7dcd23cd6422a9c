// The benchmark client's report: the run summary as a table (stdout) and as JSON. Pure
// formatting, no I/O.
//
// Thread-safety: every function is pure and reentrant.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/stats.h"

namespace xds::loadgen {

nlohmann::json distribution_json(const Distribution& d);
// {"requests", "completed", "failed", "duration_s", throughputs, "ttft_ms": {...}, ...}.
nlohmann::json summary_json(const RunSummary& s);

// A few lines: counts, throughputs, then TTFT / TPOT / ITL / E2E mean, P50, P90, P99, max.
std::string summary_table(const RunSummary& s, std::string_view title);

// The summary of each request class (class_id 0 .. n_classes - 1) over the same duration.
std::vector<RunSummary> summarize_classes(std::span<const RequestRecord> records, int n_classes,
                                          double duration_s);

}  // namespace xds::loadgen
