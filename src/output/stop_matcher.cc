#include "output/stop_matcher.h"

#include <algorithm>

namespace xds::output {

size_t partial_suffix(std::string_view text, std::string_view tag) {
  if (tag.empty()) return 0;
  for (size_t k = std::min(tag.size() - 1, text.size()); k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopPush StopMatcher::push(std::string_view text) {
  StopPush out;
  if (stopped_) return out;
  if (stops_.empty()) {
    out.text.assign(text);
    return out;
  }
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(text);

  // The earliest full match; on a tie the longest stop string (either way the cut is there).
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    const size_t pos = buf.find(s);
    if (pos == std::string::npos) continue;
    if (pos < best || (pos == best && s.size() > best_stop->size())) {
      best = pos;
      best_stop = &s;
    }
  }
  if (best_stop != nullptr) {
    out.text = buf.substr(0, best);
    out.stopped = true;
    out.matched = *best_stop;
    stopped_ = true;
    return out;
  }

  // No full match: hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) hold = std::max(hold, partial_suffix(buf, s));
  out.text = buf.substr(0, buf.size() - hold);
  held_ = buf.substr(buf.size() - hold);
  return out;
}

std::string StopMatcher::finish() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace xds::output
