// A small Prometheus registry: counters, gauges and histograms with fixed buckets, each a
// family of series told apart by labels, rendered in the text exposition format (0.0.4):
//
//   # HELP xds_requests_total Requests by outcome.
//   # TYPE xds_requests_total counter
//   xds_requests_total{outcome="ok"} 3
//   # HELP xds_ttft_seconds Time to first token.
//   # TYPE xds_ttft_seconds histogram
//   xds_ttft_seconds_bucket{le="0.1"} 1
//   xds_ttft_seconds_bucket{le="+Inf"} 2
//   xds_ttft_seconds_sum 0.35
//   xds_ttft_seconds_count 2
//
// Families render in registration order, series in the order they were first asked for.
// Numbers: integral values as integers, others in the shortest form that reads back exactly;
// +Inf, -Inf, NaN.
//
// Thread-safety: everything is thread-safe. counter()/gauge()/histogram() take a lock (look a
// series up once and keep the reference: it stays valid as long as the registry); updates to
// a series are lock-free atomics; render() takes the lock and reads the atomics (a histogram
// read during observe() may lag by that one observation in _sum).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xds::serve {

// {name, value} pairs; names match [a-zA-Z_][a-zA-Z0-9_]* and are not "le".
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(double v = 1.0);  // v >= 0
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

class Gauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void add(double v) { v_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

class Histogram {
 public:
  // `upper_bounds`: finite, strictly increasing; +Inf is implied.
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);  // counted in the first bucket with v <= bound

  struct Snapshot {
    std::vector<double> upper_bounds;  // [buckets], without +Inf
    std::vector<uint64_t> cumulative;  // [buckets + 1], the last is +Inf (= count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // [bounds + 1], per bucket (not cumulative)
  std::atomic<double> sum_{0.0};
};

// `count` bounds: start, start*factor, ... (start > 0, factor > 1).
std::vector<double> exponential_buckets(double start, double factor, int count);

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The series of family `name` with these labels, created on first use. Asking for a name
  // already registered as another type, or a histogram family with other buckets, is a bug
  // (XDS_CHECK). `help` of the first registration is kept.
  Counter& counter(std::string_view name, std::string_view help, const MetricLabels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const MetricLabels& labels = {});
  Histogram& histogram(std::string_view name, std::string_view help,
                       const std::vector<double>& upper_bounds,
                       const MetricLabels& labels = {});

  // The text exposition format (Content-Type: text/plain; version=0.0.4).
  std::string render() const;

 private:
  struct Family;
  Family& family(std::string_view name, std::string_view help, int type);
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Family>> families_;  // (mu_) registration order
};

// Exposed for tests: a sample value as rendered, and an escaped label value.
std::string format_metric_value(double v);
std::string escape_label_value(std::string_view v);

}  // namespace xds::serve
