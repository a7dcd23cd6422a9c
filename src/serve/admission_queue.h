// The gateway's admission queue: the requests an instance refused for now (RejectedMsg: no DP
// group has room) wait here in arrival order, and the head is offered again whenever the
// instances report new load -- one offer at a time, until the instance answers it.
//
//   arrival      accepts_new(): refused (503 + Retry-After) when max_waiting or more wait;
//                an empty queue always accepts (max_waiting 0 still lets requests through
//                while nothing waits).
//   refused      defer(id): appended once (a request already waiting keeps its place), or
//                kFull when max_waiting wait; the head's answer ends its offer.
//   backpressure hold(id): appended without the limit (new prefills wait while decode
//                handoffs do, instance_router.h).
//   never fits   refuse(id): the head leaves (a waiting request further back stays counted
//                until it reaches the head); ends the head's offer.
//   placed       placed(id): a waiting request's first output came: it leaves the queue, and
//                the offer in flight is over.
//   cancelled    cancel(id): it leaves the queue; an offered head's offer is over.
//   new load     offer(alive): the head to send again, once per offer; a head that is no
//                longer alive is dropped (one per call) and nothing is offered.
//   lost offer   offer_lost(): the instance the head was offered to failed, so no answer
//                comes; the head keeps its place and the next offer() sends it again.
//
// Thread-safety: none; the gateway guards it with its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <unordered_set>

namespace xds::serve {

class AdmissionQueue {
 public:
  explicit AdmissionQueue(int64_t max_waiting = 1024) : max_waiting_(max_waiting) {}

  enum class Deferral {
    kQueued,   // appended at the back
    kWaiting,  // it already waits (an offered head the instance still had no room for)
    kFull,     // max_waiting wait: refuse it
  };

  bool accepts_new() const;
  Deferral defer(const std::string& id);
  // Appends `id` unless it waits already; true when appended.
  bool hold(const std::string& id);
  void refuse(const std::string& id);
  void placed(const std::string& id);
  void cancel(const std::string& id);
  std::optional<std::string> offer(const std::function<bool(const std::string&)>& alive);
  void offer_lost() { offered_ = false; }
  void clear();

  bool contains(const std::string& id) const { return members_.count(id) > 0; }
  size_t size() const { return order_.size(); }
  bool empty() const { return order_.empty(); }
  bool offer_in_flight() const { return offered_; }
  const std::string* head() const { return order_.empty() ? nullptr : &order_.front(); }

 private:
  void erase(const std::string& id);

  int64_t max_waiting_;
  std::deque<std::string> order_;
  std::unordered_set<std::string> members_;
  bool offered_ = false;  // the head was offered again and not answered
};

}  // namespace xds::serve
