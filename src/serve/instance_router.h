// What the gateway knows of the instances behind it, and where each request goes
// (the paper's JE, P096; prefill/decode disaggregation, docs/design/disaggregation.md).
//
// Per instance: the role its shell reports (colocated, prefill or decode; "failed" once the
// gateway takes it out), when it was last heard from, its DP groups' last loads, the prompt
// blocks it holds (BlocksMsg events), and the prefills sent to it whose first token has not
// come back (long and short, for length-aware routing).
//
// Placement of a request (route()), with several instances:
//   - a decode phase (the prefill side handed its KV off): the least loaded decode instance;
//     none left -> the request fails.
//   - prefill and decode instances both present: the prefill instance that
//     instance_routing.h's rule picks; while decode phases wait in the handoff queue, a new
//     prefill waits in the admission queue instead (backpressure from the decode side, P101).
//   - otherwise (colocated, or what is left of a disaggregated deployment): the whole request
//     on an instance picked by the same rule, colocated ones first, then decode, then prefill.
//   - no instance of the role reported yet: instance 0.
// With one instance every request goes to it whole.
//
// The handoff queue holds decode phases no decode instance could take yet (RejectedMsg); the
// KV stays parked on the prefill side meanwhile. Its head is offered again on each load
// report, one offer at a time; heads no longer alive are dropped.
//
// Failover (docs/design/reliability.md): an instance whose shell reports a FailedMsg, or that
// answers no heartbeat for the timeout, is out (mark_failed(): recovering when it restarts, or
// failed); nothing is routed to it. Its requests are sent again by the gateway (a decode phase
// that streamed nothing since its handoff to another decode instance, the rest recomputed from
// what they streamed). It is back (rejoin()) when its shell answers again, ready; a new
// incarnation number (restarted()) tells the gateway the instance lost what it held.
//
// Membership in etcd (docs/design/membership.md): instances are added as they register
// (add_instance(), a new index each time) and leave when their entry goes (mark_left()).
// Indices are never reused; a left instance is never routed to nor rejoins.
//
// Thread-safety: none; the gateway guards it with its mutex. No sockets, no clock: times are
// arguments.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "protocol/messages.h"
#include "protocol/payloads.h"
#include "serve/instance_routing.h"

namespace xds::serve {

// An instance as the gateway sees it: the role its shell reports, or not known yet, or taken
// out.
enum class InstanceState {
  kUnknown,  // no role reported yet
  kColocated,
  kPrefill,
  kDecode,
  kRecovering,  // restarting its processes (or silent): out until it answers, ready
  kFailed,      // failed for good (it may still come back as a new incarnation)
  kLeft,        // its entry in etcd is gone (lease expired or revoked): out for good; an
                // instance that registers again is a new instance
};

// The state of an instance that reports `role`.
InstanceState instance_state(protocol::InstanceRole role);
// The role's name, "failed", or "" for kUnknown.
const char* instance_state_name(InstanceState state);

// The decode phases waiting for a decode instance with room, in the order they were refused.
class HandoffQueue {
 public:
  // The decode side refused `id` for now. True when it starts waiting (counted as deferred);
  // the offered head's refusal ends its offer and keeps its place.
  bool defer(const std::string& id);
  // A decode group took `id` (its first output as a decode phase): the head leaves.
  void taken(const std::string& id);
  // `id` went away (cancelled, or its instance failed): it leaves; an offered head's offer is
  // over.
  void cancel(const std::string& id);
  // The head to offer again: none while an offer is in flight; heads not alive are dropped.
  std::optional<std::string> offer(const std::function<bool(const std::string&)>& alive);

  size_t size() const { return order_.size(); }
  bool empty() const { return order_.empty(); }
  bool offer_in_flight() const { return offered_; }

 private:
  std::deque<std::string> order_;
  bool offered_ = false;
};

// A request's share of its instance's in-flight prefills (kept in the request's state).
struct PrefillTicket {
  int32_t instance = -1;  // counted there until the first token, a failure or a cancel
  bool long_prompt = false;
};

struct InstanceRoute {
  int32_t to = 0;
  engine::RequestPhase phase = engine::RequestPhase::kWhole;
  bool hold = false;       // a new prefill while handoffs wait: it waits in the admission queue
  bool no_decode = false;  // a decode phase with no decode instance left: it fails
};

class InstanceRouter {
 public:
  InstanceRouter(size_t instances, InstanceRoutingPolicy policy);

  size_t size() const { return views_.size(); }
  // A new instance (state kUnknown: routable at once); its index.
  int32_t add_instance();
  InstanceState state(int32_t i) const { return views_[static_cast<size_t>(i)].state; }

  // A message came from instance i's shell at `now_ns`.
  void heard(int32_t i, int64_t now_ns);
  void heard_all(int64_t now_ns);
  // i reported its role (ignored while it is out: rejoin() brings it back).
  void report_role(int32_t i, protocol::InstanceRole role);
  // i's shell answered with `incarnation`: true when it differs from the one known before
  // (the instance restarted; a first answer is no restart). Recorded either way.
  bool restarted(int32_t i, uint64_t incarnation);
  uint64_t incarnation(int32_t i) const { return views_[static_cast<size_t>(i)].incarnation; }
  // i answered ready with `role`: true when it was out and now serves again.
  bool rejoin(int32_t i, protocol::InstanceRole role);
  // Routable: neither recovering nor failed (an instance that has not reported yet is).
  bool serving(int32_t i) const;
  bool any_serving() const;
  // Serving or recovering (not failed for good, not left): worth waiting for.
  bool any_present() const;
  // Why i is out ("" while it serves).
  const std::string& why(int32_t i) const { return views_[static_cast<size_t>(i)].why; }
  // i's load report (engine::merge_load per group).
  void update_loads(int32_t i, std::vector<engine::GroupLoad> loads);
  // i's prefix-cache events: chain hashes added and removed (one count per group).
  void update_blocks(int32_t i, std::span<const uint64_t> added, std::span<const uint64_t> removed);

  // Where a request goes now (see the top of this file). `prompt`: its prompt ids. to = -1:
  // no instance serves now (the request waits).
  InstanceRoute route(std::span<const int32_t> prompt, bool decode_phase) const;
  // A prefill (or whole request) sent to `to`: counted there, unless `t` counts one already.
  // With one instance nothing is counted (there is nothing to choose).
  void count_prefill(PrefillTicket& t, int32_t to, int64_t prompt_tokens);
  // Its prefill is over (first token, failure or cancel): uncounted where it was sent.
  void end_prefill(PrefillTicket& t);

  // Takes i out (kRecovering when it restarts, else kFailed; `why` kept for /health), loads
  // and cached blocks forgotten. True when another instance still serves.
  bool mark_failed(int32_t i, bool recovering = false, std::string why = {});
  // Takes i out for good: its etcd entry is gone (see mark_failed()).
  void mark_left(int32_t i, std::string why);
  // A request of a failed instance: true when it continues on another decode instance (a
  // decode phase that streamed nothing since its handoff, and a decode instance is left).
  bool continues_elsewhere(bool decode_phase, bool streamed_since_handoff) const;
  // Serving instances not heard from for more than `timeout_ns` before `now_ns`. An instance
  // never heard from is not silent: its timer starts with its first answer (a first load can
  // take minutes).
  std::vector<int32_t> silent(int64_t now_ns, int64_t timeout_ns) const;

  // Every instance's groups' last loads, numbered across instances, for /metrics.
  std::vector<engine::GroupLoad> group_loads() const;
  // The prompt blocks the gateway knows each instance holds.
  std::vector<size_t> cached_blocks() const;

  HandoffQueue& handoffs() { return handoffs_; }
  const HandoffQueue& handoffs() const { return handoffs_; }

 private:
  struct View {
    InstanceState state = InstanceState::kUnknown;
    int64_t last_heard_ns = 0;
    uint64_t incarnation = 0;  // 0: not known yet
    std::string why;           // out: why
    std::vector<engine::GroupLoad> loads;
    std::unordered_map<uint64_t, int32_t> cached;   // chain hash -> groups holding it
    int32_t long_inflight = 0, short_inflight = 0;  // prefills sent, first token not back
  };
  // Requests per DP group: running + waiting + parked, over its groups.
  static double load(const View& v);
  bool disaggregated() const;
  // The instance of `role` with the fewest requests per group (-1: none).
  int32_t pick(InstanceState role) const;
  // instance_routing.h's choice among the instances of `role` for `prompt` (-1: none).
  int32_t route_among(InstanceState role, std::span<const int32_t> prompt) const;

  InstanceRoutingPolicy policy_;
  std::vector<View> views_;
  HandoffQueue handoffs_;
};

}  // namespace xds::serve
