#include "loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace xds::loadgen {

double percentile_sorted(std::span<const double> sorted, double p) {
  if (sorted.empty()) return 0;
  const double clamped = std::clamp(p, 0.0, 100.0);
  const double rank = clamped / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + frac * (sorted[hi] - sorted[lo]);
}

Distribution summarize(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = static_cast<int64_t>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(d.count);
  d.min = values.front();
  d.max = values.back();
  d.p50 = percentile_sorted(values, 50);
  d.p90 = percentile_sorted(values, 90);
  d.p99 = percentile_sorted(values, 99);
  return d;
}

RequestMetrics request_metrics(const RequestRecord& r) {
  RequestMetrics m;
  if (!r.ok || r.event_s.empty()) return m;
  m.valid = true;
  m.ttft_s = r.event_s.front() - r.send_s;
  m.e2e_s = r.end_s - r.send_s;
  m.output_tokens = r.completion_tokens;
  if (m.output_tokens >= 2) {
    m.tpot_s = (r.event_s.back() - r.event_s.front()) / static_cast<double>(m.output_tokens - 1);
  }
  for (size_t i = 1; i < r.event_s.size(); ++i) {
    const int32_t k = i < r.event_tokens.size() ? std::max(r.event_tokens[i], 1) : 1;
    const double gap = (r.event_s[i] - r.event_s[i - 1]) / k;
    for (int32_t j = 0; j < k; ++j) m.itl_s.push_back(gap);
  }
  return m;
}

void append_token_event(RequestRecord& r, double time_s, int32_t tokens) {
  if (!r.event_s.empty() && r.event_s.back() == time_s && !r.event_tokens.empty()) {
    r.event_tokens.back() += tokens;
    return;
  }
  r.event_s.push_back(time_s);
  r.event_tokens.push_back(tokens);
}

RunSummary summarize_run(std::span<const RequestRecord> records, double duration_s) {
  RunSummary s;
  s.requests = static_cast<int64_t>(records.size());
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++s.failed;
      if (s.first_errors.size() < 5 && std::find(s.first_errors.begin(), s.first_errors.end(),
                                                 r.error) == s.first_errors.end()) {
        s.first_errors.push_back(r.error);
      }
      continue;
    }
    const RequestMetrics m = request_metrics(r);
    if (!m.valid) continue;  // ok but no token (max_tokens 0, or an immediate stop)
    ++s.completed;
    s.input_tokens += r.prompt_tokens;
    s.output_tokens += m.output_tokens;
    ttft.push_back(m.ttft_s * 1e3);
    e2e.push_back(m.e2e_s * 1e3);
    if (m.tpot_s) tpot.push_back(*m.tpot_s * 1e3);
    for (double x : m.itl_s) itl.push_back(x * 1e3);
  }
  if (duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / duration_s;
    s.output_token_throughput = static_cast<double>(s.output_tokens) / duration_s;
    s.total_token_throughput = static_cast<double>(s.input_tokens + s.output_tokens) / duration_s;
  }
  s.ttft_ms = summarize(std::move(ttft));
  s.tpot_ms = summarize(std::move(tpot));
  s.itl_ms = summarize(std::move(itl));
  s.e2e_ms = summarize(std::move(e2e));
  return s;
}

double slo_attainment(std::span<const RequestRecord> records, const SloLimits& limits) {
  if (records.empty()) return 0;
  int64_t met = 0;
  for (const RequestRecord& r : records) {
    const RequestMetrics m = request_metrics(r);
    if (!m.valid) continue;
    if (m.ttft_s > limits.ttft_s) continue;
    if (m.tpot_s && *m.tpot_s > limits.tpot_s) continue;
    ++met;
  }
  return static_cast<double>(met) / static_cast<double>(records.size());
}

std::optional<double> goodput_rate(std::span<const SweepPoint> points, double min_fraction) {
  std::optional<double> best;
  for (const SweepPoint& p : points) {
    if (p.attainment >= min_fraction && (!best || p.rate > *best)) best = p.rate;
  }
  return best;
}

std::optional<double> goodput_rate_p99(std::span<const SweepPoint> points,
                                       const SloLimits& limits) {
  std::optional<double> best;
  for (const SweepPoint& p : points) {
    if (p.ttft_p99_s <= limits.ttft_s && p.tpot_p99_s <= limits.tpot_s &&
        (!best || p.rate > *best)) {
      best = p.rate;
    }
  }
  return best;
}

DecodeWindow decode_window(std::span<const RequestRecord> records) {
  DecodeWindow w;
  if (records.empty()) return w;
  double start = -std::numeric_limits<double>::infinity();
  double end = std::numeric_limits<double>::infinity();
  for (const RequestRecord& r : records) {
    if (!r.ok || r.event_s.empty()) return w;
    start = std::max(start, r.event_s.front());
    end = std::min(end, r.event_s.back());
  }
  w.streams = static_cast<int64_t>(records.size());
  w.start_s = start;
  w.end_s = end;
  if (!(end > start)) return w;
  for (const RequestRecord& r : records) {
    for (size_t i = 0; i < r.event_s.size(); ++i) {
      if (r.event_s[i] > start && r.event_s[i] <= end) {
        w.tokens += i < r.event_tokens.size() ? r.event_tokens[i] : 1;
      }
    }
  }
  if (w.tokens == 0) return w;
  w.valid = true;
  w.tokens_per_s = static_cast<double>(w.tokens) / (end - start);
  w.step_time_s = static_cast<double>(w.streams) / w.tokens_per_s;
  return w;
}

}  // namespace xds::loadgen
