// The Prometheus registry against hand-written exposition text (format 0.0.4), and its
// counts under concurrent updates against the arithmetic of what the threads did.
#include "serve/metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace xds::serve {
namespace {

TEST(Metrics, RendersCountersGaugesAndHistograms) {
  MetricsRegistry reg;
  Counter& ok = reg.counter("xds_requests_total", "Requests by outcome.", {{"outcome", "ok"}});
  Counter& bad = reg.counter("xds_requests_total", "ignored", {{"outcome", "error"}});
  ok.inc();
  ok.inc(2);
  bad.inc();
  EXPECT_EQ(&reg.counter("xds_requests_total", "", {{"outcome", "ok"}}), &ok);

  Gauge& kv = reg.gauge("xds_kv_usage_ratio", "KV blocks in use.", {{"group", "0"}});
  kv.set(0.25);
  Gauge& running = reg.gauge("xds_running_requests", "Running requests.");
  running.add(3);
  running.add(-1);

  Histogram& ttft = reg.histogram("xds_ttft_seconds", "Time to first token.", {0.125, 0.5, 1});
  // Binary fractions, so the sum is exact.
  ttft.observe(0.0625);
  ttft.observe(0.125);  // on a bound: counted in that bucket
  ttft.observe(0.25);
  ttft.observe(7);
  Histogram& itl = reg.histogram("xds_itl_seconds", "Inter-token latency.", {0.01},
                                 {{"group", "1"}});
  itl.observe(0.002);

  const std::string expected =
      "# HELP xds_requests_total Requests by outcome.\n"
      "# TYPE xds_requests_total counter\n"
      "xds_requests_total{outcome=\"ok\"} 3\n"
      "xds_requests_total{outcome=\"error\"} 1\n"
      "# HELP xds_kv_usage_ratio KV blocks in use.\n"
      "# TYPE xds_kv_usage_ratio gauge\n"
      "xds_kv_usage_ratio{group=\"0\"} 0.25\n"
      "# HELP xds_running_requests Running requests.\n"
      "# TYPE xds_running_requests gauge\n"
      "xds_running_requests 2\n"
      "# HELP xds_ttft_seconds Time to first token.\n"
      "# TYPE xds_ttft_seconds histogram\n"
      "xds_ttft_seconds_bucket{le=\"0.125\"} 2\n"
      "xds_ttft_seconds_bucket{le=\"0.5\"} 3\n"
      "xds_ttft_seconds_bucket{le=\"1\"} 3\n"
      "xds_ttft_seconds_bucket{le=\"+Inf\"} 4\n"
      "xds_ttft_seconds_sum 7.4375\n"
      "xds_ttft_seconds_count 4\n"
      "# HELP xds_itl_seconds Inter-token latency.\n"
      "# TYPE xds_itl_seconds histogram\n"
      "xds_itl_seconds_bucket{group=\"1\",le=\"0.01\"} 1\n"
      "xds_itl_seconds_bucket{group=\"1\",le=\"+Inf\"} 1\n"
      "xds_itl_seconds_sum{group=\"1\"} 0.002\n"
      "xds_itl_seconds_count{group=\"1\"} 1\n";
  EXPECT_EQ(reg.render(), expected);
}

TEST(Metrics, EscapingAndNumbers) {
  MetricsRegistry reg;
  reg.gauge("g", "line one\nback\\slash", {{"path", "a\"b\\c\nd"}}).set(-2.5);
  EXPECT_EQ(reg.render(),
            "# HELP g line one\\nback\\\\slash\n"
            "# TYPE g gauge\n"
            "g{path=\"a\\\"b\\\\c\\nd\"} -2.5\n");
  EXPECT_EQ(format_metric_value(0), "0");
  EXPECT_EQ(format_metric_value(1e6), "1000000");
  EXPECT_EQ(format_metric_value(0.1), "0.1");
  EXPECT_EQ(format_metric_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(format_metric_value(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(format_metric_value(0.0 / 0.0), "NaN");
  EXPECT_EQ(escape_label_value("plain"), "plain");
}

TEST(Metrics, ExponentialBuckets) {
  EXPECT_EQ(exponential_buckets(0.001, 2, 4), (std::vector<double>{0.001, 0.002, 0.004, 0.008}));
}

TEST(Metrics, ConcurrentUpdatesAreAllCounted) {
  MetricsRegistry reg;
  constexpr int kThreads = 4, kPerThread = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&reg, t] {
      // Each thread also registers its own series while others update theirs.
      Counter& mine = reg.counter("c_total", "c", {{"t", std::to_string(t)}});
      Counter& shared = reg.counter("c_total", "c", {{"t", "all"}});
      Histogram& h = reg.histogram("h", "h", {1, 2});
      for (int i = 0; i < kPerThread; ++i) {
        mine.inc();
        shared.inc();
        h.observe(i % 3);  // 0, 1, 2: buckets le=1 gets 0 and 1, le=2 gets 2
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(reg.counter("c_total", "c", {{"t", "all"}}).value(), kThreads * kPerThread);
  EXPECT_EQ(reg.counter("c_total", "c", {{"t", "2"}}).value(), kPerThread);
  Histogram::Snapshot s = reg.histogram("h", "h", {1, 2}).snapshot();
  // Per thread, i % 3 over 0..9999: 3334 zeros, 3333 ones, 3333 twos.
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{kThreads * 6667u, kThreads * 10000u,
                                                 kThreads * 10000u}));
  EXPECT_EQ(s.count, kThreads * 10000u);
  EXPECT_DOUBLE_EQ(s.sum, kThreads * (3333.0 * 1 + 3333.0 * 2));
}

TEST(MetricsDeathTest, MisuseIsABug) {
  MetricsRegistry reg;
  reg.counter("x_total", "x");
  EXPECT_DEATH(reg.gauge("x_total", "x"), "registered as a counter");
  EXPECT_DEATH(reg.counter("bad name", "x"), "invalid metric name");
  EXPECT_DEATH(reg.counter("y", "y", {{"le", "1"}}), "invalid label name");
  EXPECT_DEATH(reg.counter("x_total", "x").inc(-1), "only go up");
  EXPECT_DEATH(Histogram({2, 1}), "increase strictly");
}

}  // namespace
}  // namespace xds::serve
