#include "loadgen/workload.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace xds::loadgen {
namespace {

// Lengths above this are a typo (no model here has such a context).
constexpr int64_t kMaxLength = int64_t{1} << 24;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t pos = 0;
  while (true) {
    const size_t e = s.find(sep, pos);
    parts.push_back(s.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos));
    if (e == std::string_view::npos) break;
    pos = e + 1;
  }
  return parts;
}

bool parse_int(std::string_view s, int64_t& v) {
  s = trim(s);
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

bool parse_double(std::string_view s, double& v) {
  s = trim(s);
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty() && std::isfinite(v);
}

Status check_length(int64_t v, std::string_view what, std::string_view text) {
  if (v < 1 || v > kMaxLength) {
    return invalid_argument("{}: length {} in '{}' is outside [1, {}]", what, v, text, kMaxLength);
  }
  return {};
}

// Words that common BPE vocabularies hold as one token each (with the leading space), so a
// text prompt of n words is close to n tokens; the server's usage.prompt_tokens is what counts.
constexpr std::string_view kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "that",  "for",   "it",    "as",
    "was",   "with",  "be",    "by",    "on",    "not",   "he",    "this",  "are",   "or",
    "his",   "from",  "at",    "which", "but",   "have",  "an",    "had",   "they",  "you",
    "were",  "their", "one",   "all",   "we",    "can",   "her",   "has",   "there", "been",
    "if",    "more",  "when",  "will",  "would", "who",   "so",    "no",    "time",  "people",
    "water", "world", "house", "city",  "music", "story", "light", "river", "small", "great"};
constexpr int64_t kNumWords = static_cast<int64_t>(sizeof(kWords) / sizeof(kWords[0]));

}  // namespace

Rng Rng::keyed(uint64_t seed, uint64_t a, uint64_t b) {
  return Rng(mix64(mix64(mix64(seed) ^ (a + 0x9e3779b97f4a7c15ULL)) ^ (b + 0x632be59bd9b4e019ULL)));
}

uint64_t Rng::next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return mix64(state_);
}

double Rng::uniform01() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

int64_t Rng::uniform_int(int64_t lo, int64_t hi) {
  XDS_CHECK(hi > lo, "uniform_int: empty range [{}, {})", lo, hi);
  const uint64_t span = static_cast<uint64_t>(hi - lo);
  // Reject the top partial copy of [0, span) so every value is equally likely.
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % span;
  uint64_t x = next();
  while (x >= limit) x = next();
  return lo + static_cast<int64_t>(x % span);
}

double Rng::exponential(double mean) {
  return -mean * std::log1p(-uniform01());
}

Result<LengthDist> parse_length_dist(std::string_view text, std::string_view what) {
  const std::string_view t = trim(text);
  LengthDist d;
  if (t.empty()) return invalid_argument("{}: empty length", what);
  if (t.find(':') != std::string_view::npos) {
    d.kind = LengthDist::Kind::kWeighted;
    for (std::string_view item : split(t, '/')) {
      const auto kv = split(item, ':');
      int64_t len = 0;
      double w = 0;
      if (kv.size() != 2 || !parse_int(kv[0], len) || !parse_double(kv[1], w)) {
        return invalid_argument("{}: '{}' in '{}' is not LENGTH:WEIGHT", what, item, text);
      }
      XDS_RETURN_IF_ERROR(check_length(len, what, text));
      if (!(w > 0)) return invalid_argument("{}: weight {} in '{}' must be > 0", what, w, text);
      d.weighted.emplace_back(len, w);
    }
    return d;
  }
  const size_t dash = t.find('-', 1);  // not a leading minus sign
  if (dash != std::string_view::npos) {
    d.kind = LengthDist::Kind::kUniform;
    if (!parse_int(t.substr(0, dash), d.lo) || !parse_int(t.substr(dash + 1), d.hi)) {
      return invalid_argument("{}: '{}' is not LO-HI", what, text);
    }
    XDS_RETURN_IF_ERROR(check_length(d.lo, what, text));
    XDS_RETURN_IF_ERROR(check_length(d.hi, what, text));
    if (d.hi < d.lo) return invalid_argument("{}: '{}' has HI < LO", what, text);
    return d;
  }
  if (!parse_int(t, d.lo)) {
    return invalid_argument("{}: '{}' is not a length (N, LO-HI or N:W/N:W...)", what, text);
  }
  XDS_RETURN_IF_ERROR(check_length(d.lo, what, text));
  d.hi = d.lo;
  return d;
}

std::string length_dist_string(const LengthDist& d) {
  switch (d.kind) {
    case LengthDist::Kind::kFixed:
      return fmt::format("{}", d.lo);
    case LengthDist::Kind::kUniform:
      return fmt::format("{}-{}", d.lo, d.hi);
    case LengthDist::Kind::kWeighted: {
      std::string s;
      for (const auto& [len, w] : d.weighted) {
        if (!s.empty()) s += '/';
        s += fmt::format("{}:{}", len, w);
      }
      return s;
    }
  }
  return {};
}

int64_t sample_length(const LengthDist& d, Rng& rng) {
  switch (d.kind) {
    case LengthDist::Kind::kFixed:
      return d.lo;
    case LengthDist::Kind::kUniform:
      return rng.uniform_int(d.lo, d.hi + 1);
    case LengthDist::Kind::kWeighted: {
      double total = 0;
      for (const auto& p : d.weighted) total += p.second;
      double u = rng.uniform01() * total;
      for (const auto& [len, w] : d.weighted) {
        if (u < w) return len;
        u -= w;
      }
      return d.weighted.back().first;  // rounding at the top end
    }
  }
  return d.lo;
}

int64_t max_length(const LengthDist& d) {
  if (d.kind != LengthDist::Kind::kWeighted) return d.hi;
  int64_t m = 0;
  for (const auto& p : d.weighted) m = std::max(m, p.first);
  return m;
}

Result<std::vector<RequestClass>> parse_mix(std::string_view text) {
  std::vector<RequestClass> classes;
  for (std::string_view cls_text : split(text, ';')) {
    if (trim(cls_text).empty()) continue;
    RequestClass c;
    bool has_in = false, has_out = false, has_rate = false, has_period = false;
    for (std::string_view field : split(cls_text, ',')) {
      const size_t eq = field.find('=');
      if (eq == std::string_view::npos) {
        return invalid_argument("--mix: '{}' in class '{}' is not key=value", field, cls_text);
      }
      const std::string_view key = trim(field.substr(0, eq));
      const std::string_view value = field.substr(eq + 1);
      if (key == "in" || key == "out") {
        const std::string what = fmt::format("--mix {}=", key);
        XDS_ASSIGN_OR_RETURN(LengthDist d, parse_length_dist(value, what));
        (key == "in" ? c.input : c.output) = d;
        (key == "in" ? has_in : has_out) = true;
      } else if (key == "rate" || key == "period" || key == "start") {
        double v = 0;
        if (!parse_double(value, v) || v < 0 || (key != "start" && v == 0)) {
          return invalid_argument("--mix: {}={} must be a number {} 0", key, value,
                                  key == "start" ? ">=" : ">");
        }
        if (key == "rate") {
          c.rate = v;
          has_rate = true;
        } else if (key == "period") {
          c.period_s = v;
          has_period = true;
        } else {
          c.start_s = v;
        }
      } else {
        return invalid_argument("--mix: unknown key '{}' (rate, period, start, in, out)", key);
      }
    }
    if (has_rate == has_period) {
      return invalid_argument("--mix: class '{}' needs exactly one of rate= and period=", cls_text);
    }
    if (!has_in || !has_out) {
      return invalid_argument("--mix: class '{}' needs in= and out=", cls_text);
    }
    c.arrival = has_rate ? ArrivalKind::kPoisson : ArrivalKind::kPeriodic;
    classes.push_back(std::move(c));
  }
  if (classes.empty()) return invalid_argument("--mix: no request class in '{}'", text);
  return classes;
}

Status validate_workload(const WorkloadSpec& spec) {
  if (spec.classes.empty()) return invalid_argument("workload: no request class");
  const bool closed = spec.classes.front().arrival == ArrivalKind::kClosedLoop;
  if (closed && spec.classes.size() != 1) {
    return invalid_argument("workload: a closed loop has one request class, got {}",
                            spec.classes.size());
  }
  if (closed && (spec.concurrency < 1 || spec.concurrency > 100000)) {
    return invalid_argument("workload: concurrency must be in [1, 100000], got {}",
                            spec.concurrency);
  }
  if (spec.num_requests < 0) {
    return invalid_argument("workload: num_requests must be >= 0, got {}", spec.num_requests);
  }
  if (!(spec.duration_s >= 0) || !std::isfinite(spec.duration_s)) {
    return invalid_argument("workload: duration must be >= 0 s, got {}", spec.duration_s);
  }
  if (spec.num_requests == 0 && spec.duration_s == 0) {
    return invalid_argument("workload: give a number of requests or a duration (or both)");
  }
  for (size_t i = 0; i < spec.classes.size(); ++i) {
    const RequestClass& c = spec.classes[i];
    if (c.arrival == ArrivalKind::kClosedLoop && !closed) {
      return invalid_argument("workload: class {} is closed-loop in an open-loop mix", i);
    }
    if (c.arrival == ArrivalKind::kPoisson && !(c.rate > 0 && std::isfinite(c.rate))) {
      return invalid_argument("workload: class {}: rate must be > 0, got {}", i, c.rate);
    }
    if (c.arrival == ArrivalKind::kPeriodic &&
        !(c.period_s > 0 && std::isfinite(c.period_s) && c.start_s >= 0)) {
      return invalid_argument("workload: class {}: period must be > 0 and start >= 0, got {}, {}",
                              i, c.period_s, c.start_s);
    }
    for (const LengthDist* d : {&c.input, &c.output}) {
      const bool bad_fixed = d->kind != LengthDist::Kind::kWeighted &&
                             (d->lo < 1 || d->hi < d->lo || d->hi > kMaxLength);
      const bool bad_weighted = d->kind == LengthDist::Kind::kWeighted && d->weighted.empty();
      if (bad_fixed || bad_weighted) {
        return invalid_argument("workload: class {}: bad length distribution '{}'", i,
                                length_dist_string(*d));
      }
    }
  }
  if (spec.prompt.token_ids && (spec.prompt.id_lo < 0 || spec.prompt.id_hi <= spec.prompt.id_lo)) {
    return invalid_argument("workload: token ids [{}, {}) is an empty or negative range",
                            spec.prompt.id_lo, spec.prompt.id_hi);
  }
  return {};
}

Result<std::vector<Arrival>> open_loop_arrivals(const WorkloadSpec& spec) {
  XDS_RETURN_IF_ERROR(validate_workload(spec));
  if (spec.classes.front().arrival == ArrivalKind::kClosedLoop) {
    return invalid_argument("open_loop_arrivals: the workload is closed-loop");
  }
  const double horizon =
      spec.duration_s > 0 ? spec.duration_s : std::numeric_limits<double>::infinity();
  // Per class, at most num_requests arrivals (any arrival among the first num_requests merged
  // ones is among the first num_requests of its class).
  const int64_t per_class_cap =
      spec.num_requests > 0 ? spec.num_requests : std::numeric_limits<int64_t>::max();
  std::vector<Arrival> all;
  for (size_t ci = 0; ci < spec.classes.size(); ++ci) {
    const RequestClass& c = spec.classes[ci];
    Rng rng = Rng::keyed(spec.seed, ci, 0xa771'7a15ULL);
    double t = c.arrival == ArrivalKind::kPeriodic ? c.start_s : 0.0;
    for (int64_t n = 0; n < per_class_cap; ++n) {
      if (c.arrival == ArrivalKind::kPoisson) {
        t += rng.exponential(1.0 / c.rate);
      } else if (n > 0) {
        t += c.period_s;
      }
      if (!(t < horizon)) break;
      all.push_back({t, static_cast<int>(ci)});
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Arrival& a, const Arrival& b) {
    return a.time_s < b.time_s || (a.time_s == b.time_s && a.class_id < b.class_id);
  });
  if (spec.num_requests > 0 && static_cast<int64_t>(all.size()) > spec.num_requests) {
    all.resize(static_cast<size_t>(spec.num_requests));
  }
  return all;
}

RequestSpec make_request(const WorkloadSpec& spec, int class_id, int64_t index, double arrival_s) {
  XDS_CHECK(class_id >= 0 && static_cast<size_t>(class_id) < spec.classes.size(),
            "make_request: class {} of {}", class_id, spec.classes.size());
  const RequestClass& c = spec.classes[static_cast<size_t>(class_id)];
  Rng rng =
      Rng::keyed(spec.seed, static_cast<uint64_t>(class_id) + 1, static_cast<uint64_t>(index));
  RequestSpec r;
  r.index = index;
  r.class_id = class_id;
  r.arrival_s = arrival_s;
  r.input_len = sample_length(c.input, rng);
  r.output_len = sample_length(c.output, rng);
  if (spec.prompt.token_ids) {
    r.prompt_ids.resize(static_cast<size_t>(r.input_len));
    for (int32_t& id : r.prompt_ids) {
      id = static_cast<int32_t>(rng.uniform_int(spec.prompt.id_lo, spec.prompt.id_hi));
    }
  } else if (!spec.prompt.texts.empty()) {
    r.prompt_text = spec.prompt.texts[static_cast<size_t>(index) % spec.prompt.texts.size()];
  } else {
    r.prompt_text.reserve(static_cast<size_t>(r.input_len) * 6);
    for (int64_t i = 0; i < r.input_len; ++i) {
      if (i > 0) r.prompt_text += ' ';
      r.prompt_text += kWords[rng.uniform_int(0, kNumWords)];
    }
  }
  return r;
}

}  // namespace xds::loadgen
