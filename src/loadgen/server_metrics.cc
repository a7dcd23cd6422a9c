#include "loadgen/server_metrics.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "loadgen/runner.h"

namespace xds::loadgen {
namespace {

constexpr std::string_view kPrefix = "xdeepserve_spec_decode_";

// The value of `position="N"` in a label set, or -1.
int64_t position_label(std::string_view labels) {
  constexpr std::string_view key = "position=\"";
  const size_t at = labels.find(key);
  if (at == std::string_view::npos) return -1;
  int64_t v = -1;
  const char* first = labels.data() + at + key.size();
  const auto [ptr, ec] = std::from_chars(first, labels.data() + labels.size(), v);
  if (ec != std::errc() || ptr == labels.data() + labels.size() || *ptr != '"') return -1;
  return v;
}

void set_at(std::vector<double>& v, int64_t position, double value) {
  if (static_cast<int64_t>(v.size()) < position) v.resize(static_cast<size_t>(position), 0.0);
  v[static_cast<size_t>(position - 1)] = value;
}

}  // namespace

Result<SpecCounters> parse_spec_counters(std::string_view text) {
  SpecCounters c;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.starts_with(kPrefix)) continue;
    const size_t space = line.rfind(' ');
    if (space == std::string_view::npos) return data_loss("/metrics: no value in '{}'", line);
    const std::string value_text(line.substr(space + 1));
    double value = 0;
    try {
      size_t used = 0;
      value = std::stod(value_text, &used);
      if (used != value_text.size()) throw std::invalid_argument(value_text);
    } catch (const std::exception&) {
      return data_loss("/metrics: '{}' is not a number in '{}'", value_text, line);
    }
    const std::string_view series = line.substr(kPrefix.size(), space - kPrefix.size());
    const size_t brace = series.find('{');
    const std::string_view name = series.substr(0, brace);
    const std::string_view labels =
        brace == std::string_view::npos ? std::string_view{} : series.substr(brace);
    if (name == "verify_steps_total") {
      c.verify_steps = value;
    } else if (name == "step_tokens_total") {
      c.step_tokens = value;
    } else if (name == "draft_tokens_total" || name == "accepted_tokens_total") {
      const int64_t p = position_label(labels);
      if (p < 1 || p > 64) return data_loss("/metrics: bad draft position in '{}'", line);
      set_at(name == "draft_tokens_total" ? c.drafted : c.accepted, p, value);
    }
  }
  c.accepted.resize(c.drafted.size(), 0.0);
  return c;
}

SpecCounters spec_difference(const SpecCounters& after, const SpecCounters& before) {
  SpecCounters d = after;
  d.verify_steps -= before.verify_steps;
  d.step_tokens -= before.step_tokens;
  for (size_t i = 0; i < std::min(d.drafted.size(), before.drafted.size()); ++i) {
    d.drafted[i] -= before.drafted[i];
    d.accepted[i] -= i < before.accepted.size() ? before.accepted[i] : 0.0;
  }
  return d;
}

nlohmann::json spec_json(const SpecCounters& d) {
  nlohmann::json acceptance = nlohmann::json::array();
  for (size_t i = 0; i < d.drafted.size(); ++i) {
    acceptance.push_back(d.drafted[i] > 0 ? d.accepted[i] / d.drafted[i] : 0.0);
  }
  return {{"verify_steps", d.verify_steps},
          {"tokens_per_step", d.verify_steps > 0 ? d.step_tokens / d.verify_steps : 0.0},
          {"acceptance", acceptance},
          {"drafted", d.drafted},
          {"accepted", d.accepted}};
}

std::string spec_line(const SpecCounters& d) {
  std::string s = fmt::format("speculative  {:.0f} verify steps, {:.3f} tokens/step, acceptance by "
                              "position",
                              d.verify_steps,
                              d.verify_steps > 0 ? d.step_tokens / d.verify_steps : 0.0);
  for (size_t i = 0; i < d.drafted.size(); ++i) {
    s += fmt::format(" {:.3f}", d.drafted[i] > 0 ? d.accepted[i] / d.drafted[i] : 0.0);
  }
  return s + "\n";
}

Result<SpecCounters> fetch_spec_counters(const Url& url, const std::string& api_key) {
  XDS_ASSIGN_OR_RETURN(const std::string body, get_body(url, "/metrics", api_key));
  return parse_spec_counters(body);
}

}  // namespace xds::loadgen
