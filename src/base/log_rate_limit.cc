#include "base/log_rate_limit.h"

namespace xds {

void LogRateLimiter::flush(int64_t now_ns, std::vector<Summary>& summaries) {
  if (sites_suppressing_ == 0) return;
  for (auto& [key, s] : sites_) {
    if (s.suppressed == 0 || now_ns - s.window_start < window_ns_) continue;
    summaries.push_back({s.format, s.suppressed, s.tag});
    s.suppressed = 0;
    --sites_suppressing_;
  }
}

bool LogRateLimiter::admit(std::string_view format, int tag, int64_t now_ns,
                           std::vector<Summary>& summaries) {
  flush(now_ns, summaries);
  auto [it, inserted] = sites_.try_emplace(format);
  Site& s = it->second;
  s.tag = tag;
  if (inserted || now_ns - s.window_start >= window_ns_) {
    s.format = format;
    s.window_start = now_ns;
    s.printed = 0;
  }
  if (s.printed < per_window_) {
    ++s.printed;
    return true;
  }
  if (s.suppressed++ == 0) ++sites_suppressing_;
  return false;
}

}  // namespace xds
