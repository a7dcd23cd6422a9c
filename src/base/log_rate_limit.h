// The logger's rate limit, as a pure policy: which messages of a call site get printed.
//
// A call site is keyed by its format string (the literal's address and text: the same call
// site, or identical formats, share a key). In each window (1 s by default) the first
// `per_window` messages of a key are printed; the rest are counted and suppressed. When a
// window that suppressed messages has ended, the limiter reports a summary for that key
// ("(suppressed K similar messages: <format>)") -- on the next admit() of any key, or on
// flush(). The clock is passed in: no I/O, no time source of its own.
//
// Thread-safety: none; the logger calls it under its mutex.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace xds {

class LogRateLimiter {
 public:
  struct Summary {
    std::string_view format;  // the key (points at the call site's format literal)
    uint64_t suppressed = 0;  // messages not printed in the window that ended
    int tag = 0;              // the caller's tag of the key's last message (its level)
  };

  explicit LogRateLimiter(int per_window = 20, int64_t window_ns = 1'000'000'000)
      : per_window_(per_window), window_ns_(window_ns) {}

  // Whether a message with `format` at `now_ns` is printed. Appends to `summaries` (first)
  // every key whose window ended with suppressed messages.
  // `tag` is kept for the summary (the logger passes the level).
  bool admit(std::string_view format, int tag, int64_t now_ns, std::vector<Summary>& summaries);
  // Appends the summaries of windows that ended by `now_ns` (e.g. from a periodic timer).
  void flush(int64_t now_ns, std::vector<Summary>& summaries);

 private:
  struct Site {
    std::string_view format;
    int tag = 0;
    int64_t window_start = 0;
    int printed = 0;
    uint64_t suppressed = 0;
  };
  struct KeyHash {
    size_t operator()(const std::string_view& s) const {
      return std::hash<const void*>()(s.data()) ^ s.size();
    }
  };
  struct KeyEq {
    bool operator()(const std::string_view& a, const std::string_view& b) const {
      return a.data() == b.data() && a.size() == b.size();
    }
  };

  int per_window_;
  int64_t window_ns_;
  std::unordered_map<std::string_view, Site, KeyHash, KeyEq> sites_;
  size_t sites_suppressing_ = 0;  // sites with suppressed > 0
};

}  // namespace xds
