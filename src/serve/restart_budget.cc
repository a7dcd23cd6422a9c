#include "serve/restart_budget.h"

namespace xds::serve {

void RestartBudget::forget_before(int64_t now_ns) const {
  while (!recent_.empty() && now_ns - recent_.front() >= window_ns_) recent_.pop_front();
}

bool RestartBudget::allows(int64_t now_ns) const {
  forget_before(now_ns);
  return static_cast<int64_t>(recent_.size()) < max_restarts_;
}

void RestartBudget::restarted(int64_t now_ns) {
  forget_before(now_ns);
  recent_.push_back(now_ns);
  ++total_;
}

}  // namespace xds::serve
