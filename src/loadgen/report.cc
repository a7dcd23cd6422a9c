#include "loadgen/report.h"

#include <fmt/format.h>

namespace xds::loadgen {

nlohmann::json distribution_json(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"min", d.min}, {"max", d.max},
          {"p50", d.p50},     {"p90", d.p90},   {"p99", d.p99}};
}

nlohmann::json summary_json(const RunSummary& s) {
  return {{"requests", s.requests},
          {"completed", s.completed},
          {"failed", s.failed},
          {"duration_s", s.duration_s},
          {"input_tokens", s.input_tokens},
          {"output_tokens", s.output_tokens},
          {"request_throughput", s.request_throughput},
          {"output_token_throughput", s.output_token_throughput},
          {"total_token_throughput", s.total_token_throughput},
          {"ttft_ms", distribution_json(s.ttft_ms)},
          {"tpot_ms", distribution_json(s.tpot_ms)},
          {"itl_ms", distribution_json(s.itl_ms)},
          {"e2e_ms", distribution_json(s.e2e_ms)},
          {"errors", s.first_errors}};
}

std::string summary_table(const RunSummary& s, std::string_view title) {
  std::string out = fmt::format("== {} ==\n", title);
  out += fmt::format("requests     {} completed, {} failed, {:.2f} s\n", s.completed, s.failed,
                     s.duration_s);
  out += fmt::format(
      "throughput   {:.3f} req/s, {:.1f} output tok/s, {:.1f} total tok/s "
      "({} in, {} out tokens)\n",
      s.request_throughput, s.output_token_throughput, s.total_token_throughput, s.input_tokens,
      s.output_tokens);
  out += fmt::format("{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "metric (ms)", "mean",
                     "P50", "P90", "P99", "max", "n");
  const auto row = [&](const char* name, const Distribution& d) {
    out += fmt::format("{:<12} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>8}\n", name,
                       d.mean, d.p50, d.p90, d.p99, d.max, d.count);
  };
  row("TTFT", s.ttft_ms);
  row("TPOT", s.tpot_ms);
  row("ITL", s.itl_ms);
  row("E2E", s.e2e_ms);
  for (const std::string& e : s.first_errors) out += fmt::format("error        {}\n", e);
  return out;
}

std::vector<RunSummary> summarize_classes(std::span<const RequestRecord> records, int n_classes,
                                          double duration_s) {
  std::vector<RunSummary> out;
  for (int c = 0; c < n_classes; ++c) {
    std::vector<RequestRecord> mine;
    for (const RequestRecord& r : records) {
      if (r.class_id == c) mine.push_back(r);
    }
    out.push_back(summarize_run(mine, duration_s));
  }
  return out;
}

}  // namespace xds::loadgen
