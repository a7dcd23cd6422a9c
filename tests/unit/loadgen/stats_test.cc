// The benchmark statistics against values derived by hand from the definitions in stats.h.
#include "loadgen/stats.h"

#include <gtest/gtest.h>

namespace xds::loadgen {
namespace {

constexpr double kEps = 1e-12;

RequestRecord record(double send, std::vector<double> events, std::vector<int32_t> tokens,
                     double end) {
  RequestRecord r;
  r.send_s = send;
  r.event_s = std::move(events);
  r.event_tokens = std::move(tokens);
  r.end_s = end;
  r.ok = true;
  for (int32_t k : r.event_tokens) r.completion_tokens += k;
  return r;
}

TEST(Percentile, LinearInterpolationBetweenOrderStatistics) {
  const std::vector<double> x = {1, 2, 3, 4};
  // rank = p/100 * 3
  EXPECT_NEAR(percentile_sorted(x, 0), 1.0, kEps);
  EXPECT_NEAR(percentile_sorted(x, 50), 2.5, kEps);   // rank 1.5
  EXPECT_NEAR(percentile_sorted(x, 90), 3.7, kEps);   // rank 2.7
  EXPECT_NEAR(percentile_sorted(x, 99), 3.97, kEps);  // rank 2.97
  EXPECT_NEAR(percentile_sorted(x, 100), 4.0, kEps);
  EXPECT_NEAR(percentile_sorted(std::vector<double>{7}, 99), 7.0, kEps);
  EXPECT_EQ(percentile_sorted({}, 50), 0.0);
}

TEST(Percentile, SummarizeSortsFirst) {
  // 11 values 0..100 step 10, shuffled: rank(p) = p/10, so P50 = 50, P90 = 90, P99 = 99.
  const Distribution d = summarize({30, 100, 0, 50, 10, 90, 20, 70, 40, 80, 60});
  EXPECT_EQ(d.count, 11);
  EXPECT_NEAR(d.mean, 50.0, kEps);
  EXPECT_NEAR(d.min, 0.0, kEps);
  EXPECT_NEAR(d.max, 100.0, kEps);
  EXPECT_NEAR(d.p50, 50.0, kEps);
  EXPECT_NEAR(d.p90, 90.0, kEps);
  EXPECT_NEAR(d.p99, 99.0, kEps);
}

TEST(RequestMetrics, TtftTpotItlE2e) {
  // Sent at 1.0; events at 1.5 (1 token), 1.6 (1), 1.8 (2); ended at 1.9.
  const RequestRecord r = record(1.0, {1.5, 1.6, 1.8}, {1, 1, 2}, 1.9);
  const RequestMetrics m = request_metrics(r);
  ASSERT_TRUE(m.valid);
  EXPECT_NEAR(m.ttft_s, 0.5, kEps);
  EXPECT_NEAR(m.e2e_s, 0.9, kEps);
  EXPECT_EQ(m.output_tokens, 4);
  ASSERT_TRUE(m.tpot_s.has_value());
  EXPECT_NEAR(*m.tpot_s, 0.1, kEps);  // (1.8 - 1.5) / (4 - 1)
  // Gaps 0.1 (1 token) and 0.2 (2 tokens -> two ITLs of 0.1).
  ASSERT_EQ(m.itl_s.size(), 3u);
  for (double x : m.itl_s) EXPECT_NEAR(x, 0.1, kEps);
}

TEST(RequestMetrics, OneTokenHasNoTpotAndFailureIsInvalid) {
  const RequestMetrics one = request_metrics(record(0, {0.25}, {1}, 0.5));
  ASSERT_TRUE(one.valid);
  EXPECT_FALSE(one.tpot_s.has_value());
  EXPECT_TRUE(one.itl_s.empty());
  RequestRecord failed = record(0, {0.25}, {1}, 0.5);
  failed.ok = false;
  EXPECT_FALSE(request_metrics(failed).valid);
}

TEST(RequestMetrics, ChunksOfOneReadAreOneEvent) {
  RequestRecord r;
  r.send_s = 0;
  append_token_event(r, 1.0, 1);
  append_token_event(r, 1.5, 1);
  append_token_event(r, 1.5, 2);  // same read as the one before
  append_token_event(r, 2.0, 1);
  EXPECT_EQ(r.event_s, (std::vector<double>{1.0, 1.5, 2.0}));
  EXPECT_EQ(r.event_tokens, (std::vector<int32_t>{1, 3, 1}));
  r.completion_tokens = 5;
  r.end_s = 2.0;
  r.ok = true;
  const RequestMetrics m = request_metrics(r);
  // Gap 0.5 over 3 tokens, then 0.5 over 1: never a zero ITL for the chunks read together.
  ASSERT_EQ(m.itl_s.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(m.itl_s[i], 0.5 / 3, kEps);
  EXPECT_NEAR(m.itl_s[3], 0.5, kEps);
  EXPECT_NEAR(*m.tpot_s, 0.25, kEps);  // (2.0 - 1.0) / (5 - 1)
}

TEST(RunSummary, ThroughputsAndDistributions) {
  std::vector<RequestRecord> rs;
  rs.push_back(record(0.0, {0.2, 0.3, 0.4}, {1, 1, 1}, 0.5));  // TTFT 0.2, TPOT 0.1, E2E 0.5
  rs.back().prompt_tokens = 10;
  rs.push_back(record(1.0, {1.4, 1.6}, {1, 1}, 2.0));  // TTFT 0.4, TPOT 0.2, E2E 1.0
  rs.back().prompt_tokens = 20;
  RequestRecord bad;
  bad.ok = false;
  bad.error = "HTTP 503: busy";
  rs.push_back(bad);
  rs.push_back(bad);
  const RunSummary s = summarize_run(rs, 2.0);
  EXPECT_EQ(s.requests, 4);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.input_tokens, 30);
  EXPECT_EQ(s.output_tokens, 5);
  EXPECT_NEAR(s.request_throughput, 1.0, kEps);
  EXPECT_NEAR(s.output_token_throughput, 2.5, kEps);
  EXPECT_NEAR(s.total_token_throughput, 17.5, kEps);
  EXPECT_NEAR(s.ttft_ms.p50, 300.0, 1e-9);  // between 200 and 400
  EXPECT_NEAR(s.tpot_ms.p90, 190.0, 1e-9);  // 100 + 0.9 * (200 - 100)
  EXPECT_NEAR(s.e2e_ms.max, 1000.0, 1e-9);
  // ITLs: 100, 100 (first request), 200 (second).
  EXPECT_EQ(s.itl_ms.count, 3);
  EXPECT_NEAR(s.itl_ms.p50, 100.0, 1e-9);
  ASSERT_EQ(s.first_errors.size(), 1u);  // distinct messages only
  EXPECT_EQ(s.first_errors[0], "HTTP 503: busy");
}

TEST(Goodput, AttainmentCountsBothLimitsAndFailures) {
  std::vector<RequestRecord> rs;
  rs.push_back(record(0, {1.0, 1.1}, {1, 1}, 1.1));  // TTFT 1.0, TPOT 0.1: meets
  rs.push_back(record(0, {3.0, 3.1}, {1, 1}, 3.1));  // TTFT 3.0: misses TTFT
  rs.push_back(record(0, {0.5, 1.5}, {1, 1}, 1.5));  // TPOT 1.0: misses TPOT
  rs.push_back(record(0, {0.5}, {1}, 0.5));          // no TPOT: meets
  RequestRecord bad;
  bad.ok = false;
  rs.push_back(bad);  // failed: misses
  EXPECT_NEAR(slo_attainment(rs, {2.0, 0.15}), 2.0 / 5.0, kEps);
  EXPECT_NEAR(slo_attainment(rs, {10.0, 10.0}), 4.0 / 5.0, kEps);
}

TEST(Goodput, HighestSweptRateAtOrAboveTheFraction) {
  const std::vector<SweepPoint> pts = {
      {1.0, 0.99, 0.5, 0.05}, {2.0, 0.95, 1.0, 0.08}, {4.0, 0.85, 3.0, 0.2}, {3.0, 0.90, 2.5, 0.1}};
  ASSERT_TRUE(goodput_rate(pts).has_value());
  EXPECT_EQ(*goodput_rate(pts), 3.0);  // 0.90 >= 0.9 counts
  EXPECT_EQ(*goodput_rate(pts, 0.96), 1.0);
  EXPECT_FALSE(goodput_rate(pts, 0.999).has_value());
  EXPECT_FALSE(goodput_rate({}).has_value());
  // P99 rule: rate 3 has TTFT P99 2.5 > 2: the highest within both is rate 2.
  ASSERT_TRUE(goodput_rate_p99(pts, {2.0, 0.15}).has_value());
  EXPECT_EQ(*goodput_rate_p99(pts, {2.0, 0.15}), 2.0);
}

TEST(DecodeWindow, FromLastFirstTokenToFirstLastToken) {
  std::vector<RequestRecord> rs;
  rs.push_back(record(0, {1, 2, 3, 4, 5}, {1, 1, 1, 1, 1}, 5));
  rs.push_back(record(0, {2.5, 3.5, 4.5, 5.5, 6.5}, {1, 1, 1, 1, 1}, 6.5));
  const DecodeWindow w = decode_window(rs);
  ASSERT_TRUE(w.valid);
  EXPECT_NEAR(w.start_s, 2.5, kEps);
  EXPECT_NEAR(w.end_s, 5.0, kEps);
  // In (2.5, 5]: 3, 4, 5 of the first stream and 3.5, 4.5 of the second.
  EXPECT_EQ(w.tokens, 5);
  EXPECT_NEAR(w.tokens_per_s, 2.0, kEps);
  EXPECT_NEAR(w.step_time_s, 1.0, kEps);  // 2 streams / 2 tokens/s
}

TEST(DecodeWindow, InvalidWhenStreamsNeverOverlapOrOneFailed) {
  std::vector<RequestRecord> rs;
  rs.push_back(record(0, {1, 2}, {1, 1}, 2));
  rs.push_back(record(0, {3, 4}, {1, 1}, 4));
  EXPECT_FALSE(decode_window(rs).valid);
  rs[1] = record(0, {1.5, 2.5}, {1, 1}, 2.5);
  EXPECT_TRUE(decode_window(rs).valid);
  rs[1].ok = false;
  EXPECT_FALSE(decode_window(rs).valid);
}

}  // namespace
}  // namespace xds::loadgen
