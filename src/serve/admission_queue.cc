#include "serve/admission_queue.h"

#include <algorithm>

namespace xds::serve {

bool AdmissionQueue::accepts_new() const {
  return order_.empty() || static_cast<int64_t>(order_.size()) < max_waiting_;
}

AdmissionQueue::Deferral AdmissionQueue::defer(const std::string& id) {
  if (!order_.empty() && order_.front() == id) offered_ = false;
  if (contains(id)) return Deferral::kWaiting;
  if (static_cast<int64_t>(order_.size()) >= max_waiting_) return Deferral::kFull;
  order_.push_back(id);
  members_.insert(id);
  return Deferral::kQueued;
}

bool AdmissionQueue::hold(const std::string& id) {
  if (contains(id)) return false;
  order_.push_back(id);
  members_.insert(id);
  return true;
}

void AdmissionQueue::refuse(const std::string& id) {
  if (order_.empty() || order_.front() != id) return;
  offered_ = false;
  members_.erase(id);
  order_.pop_front();
}

void AdmissionQueue::placed(const std::string& id) {
  if (!contains(id)) return;
  erase(id);
  offered_ = false;
}

void AdmissionQueue::cancel(const std::string& id) {
  // An offered head that goes away ends its offer: its answer, if any, finds nothing.
  if (!order_.empty() && order_.front() == id) offered_ = false;
  erase(id);
}

std::optional<std::string> AdmissionQueue::offer(
    const std::function<bool(const std::string&)>& alive) {
  if (order_.empty() || offered_) return std::nullopt;
  if (alive(order_.front())) {
    offered_ = true;
    return order_.front();
  }
  members_.erase(order_.front());
  order_.pop_front();
  return std::nullopt;
}

void AdmissionQueue::clear() {
  order_.clear();
  members_.clear();
  offered_ = false;
}

void AdmissionQueue::erase(const std::string& id) {
  if (members_.erase(id) == 0) return;
  order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
}

}  // namespace xds::serve
