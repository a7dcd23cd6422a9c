#include "serve/metrics.h"

#include <cmath>
#include <variant>

#include <fmt/format.h>

#include "base/check.h"

namespace xds::serve {

namespace {

enum Type { kCounter = 0, kGauge = 1, kHistogram = 2 };
constexpr const char* kTypeNames[] = {"counter", "gauge", "histogram"};

bool valid_name(std::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string escape_help(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} with an optional extra label last (le); "" when there are none.
std::string label_text(const MetricLabels& labels, std::string_view extra_name = {},
                       std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return {};
  std::string out = "{";
  bool first = true;
  auto add = [&](std::string_view k, std::string_view v) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    out += escape_label_value(v);
    out += '"';
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (!extra_name.empty()) add(extra_name, extra_value);
  out += '}';
  return out;
}

}  // namespace

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    return fmt::format("{}", static_cast<int64_t>(v));
  }
  return fmt::format("{}", v);  // shortest round-trip form
}

std::string escape_label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Counter::inc(double v) {
  XDS_CHECK(v >= 0, "Counter::inc({}): counters only go up", v);
  v_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    XDS_CHECK(std::isfinite(bounds_[i]), "histogram bound {} is not finite", bounds_[i]);
    XDS_CHECK(i == 0 || bounds_[i] > bounds_[i - 1],
              "histogram bounds must increase strictly: {} after {}", bounds_[i],
              bounds_[i - 1]);
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && !(v <= bounds_[i])) ++i;  // NaN lands in +Inf
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  XDS_CHECK(start > 0 && factor > 1 && count >= 1,
            "exponential_buckets({}, {}, {}): need start > 0, factor > 1, count >= 1", start,
            factor, count);
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

struct MetricsRegistry::Family {
  std::string name;
  std::string help;
  int type = kCounter;
  std::vector<double> bounds;  // histograms
  struct Series {
    MetricLabels labels;
    std::variant<std::unique_ptr<Counter>, std::unique_ptr<Gauge>, std::unique_ptr<Histogram>>
        metric;
  };
  std::vector<Series> series;

  Series* find(const MetricLabels& labels) {
    for (auto& s : series) {
      if (s.labels == labels) return &s;
    }
    return nullptr;
  }
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family& MetricsRegistry::family(std::string_view name, std::string_view help,
                                                 int type) {
  XDS_CHECK(valid_name(name, true), "invalid metric name '{}'", name);
  for (auto& f : families_) {
    if (f->name == name) {
      XDS_CHECK(f->type == type, "metric '{}' registered as a {}, asked for as a {}", name,
                kTypeNames[f->type], kTypeNames[type]);
      return *f;
    }
  }
  auto f = std::make_unique<Family>();
  f->name = std::string(name);
  f->help = std::string(help);
  f->type = type;
  families_.push_back(std::move(f));
  return *families_.back();
}

namespace {
void check_labels(std::string_view metric, const MetricLabels& labels) {
  for (const auto& [k, v] : labels) {
    XDS_CHECK(valid_name(k, false) && k != "le", "metric '{}': invalid label name '{}'", metric,
              k);
  }
}
}  // namespace

Counter& MetricsRegistry::counter(std::string_view name, std::string_view help,
                                  const MetricLabels& labels) {
  check_labels(name, labels);
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = family(name, help, kCounter);
  if (auto* s = f.find(labels)) return *std::get<0>(s->metric);
  f.series.push_back({labels, std::make_unique<Counter>()});
  return *std::get<0>(f.series.back().metric);
}

Gauge& MetricsRegistry::gauge(std::string_view name, std::string_view help,
                              const MetricLabels& labels) {
  check_labels(name, labels);
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = family(name, help, kGauge);
  if (auto* s = f.find(labels)) return *std::get<1>(s->metric);
  f.series.push_back({labels, std::make_unique<Gauge>()});
  return *std::get<1>(f.series.back().metric);
}

Histogram& MetricsRegistry::histogram(std::string_view name, std::string_view help,
                                      const std::vector<double>& upper_bounds,
                                      const MetricLabels& labels) {
  check_labels(name, labels);
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = family(name, help, kHistogram);
  if (f.series.empty()) {
    f.bounds = upper_bounds;
  } else {
    XDS_CHECK(f.bounds == upper_bounds, "histogram '{}' asked for with other buckets", name);
  }
  if (auto* s = f.find(labels)) return *std::get<2>(s->metric);
  f.series.push_back({labels, std::make_unique<Histogram>(upper_bounds)});
  return *std::get<2>(f.series.back().metric);
}

std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& f : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", f->name, escape_help(f->help), f->name,
                       kTypeNames[f->type]);
    for (const auto& s : f->series) {
      if (f->type == kCounter) {
        out += fmt::format("{}{} {}\n", f->name, label_text(s.labels),
                           format_metric_value(std::get<0>(s.metric)->value()));
      } else if (f->type == kGauge) {
        out += fmt::format("{}{} {}\n", f->name, label_text(s.labels),
                           format_metric_value(std::get<1>(s.metric)->value()));
      } else {
        Histogram::Snapshot h = std::get<2>(s.metric)->snapshot();
        for (size_t i = 0; i < h.cumulative.size(); ++i) {
          std::string le = i < h.upper_bounds.size() ? format_metric_value(h.upper_bounds[i])
                                                     : std::string("+Inf");
          out += fmt::format("{}_bucket{} {}\n", f->name, label_text(s.labels, "le", le),
                             h.cumulative[i]);
        }
        out += fmt::format("{}_sum{} {}\n", f->name, label_text(s.labels),
                           format_metric_value(h.sum));
        out += fmt::format("{}_count{} {}\n", f->name, label_text(s.labels), h.count);
      }
    }
  }
  return out;
}

}  // namespace xds::serve
