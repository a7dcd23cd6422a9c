// How often an instance may restart its processes (restart the world, P118): at most
// `max_restarts` within any `window_ns`; one more failure in that window declares the
// instance failed for good. Pure: times are arguments.
//
// Thread-safety: not thread-safe; the instance's supervisor owns it.
#pragma once

#include <cstdint>
#include <deque>

namespace xds::serve {

class RestartBudget {
 public:
  RestartBudget(int64_t max_restarts, int64_t window_ns)
      : max_restarts_(max_restarts), window_ns_(window_ns) {}

  // Whether a failure at `now_ns` may restart the instance (the restarts of the last window
  // number fewer than max_restarts). Does not count it.
  bool allows(int64_t now_ns) const;
  // A restart at `now_ns` (call only when allows()).
  void restarted(int64_t now_ns);
  int64_t total() const { return total_; }

 private:
  void forget_before(int64_t now_ns) const;

  int64_t max_restarts_;
  int64_t window_ns_;
  mutable std::deque<int64_t> recent_;  // restart times within the window, oldest first
  int64_t total_ = 0;
};

}  // namespace xds::serve
