#include "serve/instance_router.h"

#include <algorithm>

namespace xds::serve {

InstanceState instance_state(protocol::InstanceRole role) {
  switch (role) {
    case protocol::InstanceRole::kColocated:
      return InstanceState::kColocated;
    case protocol::InstanceRole::kPrefill:
      return InstanceState::kPrefill;
    case protocol::InstanceRole::kDecode:
      return InstanceState::kDecode;
  }
  return InstanceState::kUnknown;
}

const char* instance_state_name(InstanceState state) {
  switch (state) {
    case InstanceState::kColocated:
      return "colocated";
    case InstanceState::kPrefill:
      return "prefill";
    case InstanceState::kDecode:
      return "decode";
    case InstanceState::kRecovering:
      return "recovering";
    case InstanceState::kFailed:
      return "failed";
    case InstanceState::kLeft:
      return "left";
    case InstanceState::kUnknown:
      break;
  }
  return "";
}

bool HandoffQueue::defer(const std::string& id) {
  if (!order_.empty() && order_.front() == id) {
    offered_ = false;
    return false;
  }
  if (std::find(order_.begin(), order_.end(), id) != order_.end()) return false;
  order_.push_back(id);
  return true;
}

void HandoffQueue::taken(const std::string& id) {
  if (order_.empty() || order_.front() != id) return;
  order_.pop_front();
  offered_ = false;
}

void HandoffQueue::cancel(const std::string& id) {
  if (!order_.empty() && order_.front() == id) offered_ = false;
  order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
}

std::optional<std::string> HandoffQueue::offer(
    const std::function<bool(const std::string&)>& alive) {
  while (!order_.empty() && !offered_) {
    if (alive(order_.front())) {
      offered_ = true;
      return order_.front();
    }
    order_.pop_front();
  }
  return std::nullopt;
}

InstanceRouter::InstanceRouter(size_t instances, InstanceRoutingPolicy policy)
    : policy_(policy), views_(instances) {}

void InstanceRouter::heard(int32_t i, int64_t now_ns) {
  views_[static_cast<size_t>(i)].last_heard_ns = now_ns;
}

void InstanceRouter::heard_all(int64_t now_ns) {
  for (View& v : views_) v.last_heard_ns = now_ns;
}

void InstanceRouter::report_role(int32_t i, protocol::InstanceRole role) {
  if (serving(i)) views_[static_cast<size_t>(i)].state = instance_state(role);
}

bool InstanceRouter::restarted(int32_t i, uint64_t incarnation) {
  View& v = views_[static_cast<size_t>(i)];
  const bool changed = v.incarnation != 0 && incarnation != v.incarnation;
  v.incarnation = incarnation;
  return changed;
}

int32_t InstanceRouter::add_instance() {
  views_.emplace_back();
  return static_cast<int32_t>(views_.size() - 1);
}

bool InstanceRouter::rejoin(int32_t i, protocol::InstanceRole role) {
  if (serving(i)) return false;
  View& v = views_[static_cast<size_t>(i)];
  if (v.state == InstanceState::kLeft) return false;
  v.state = instance_state(role);
  v.why.clear();
  return true;
}

bool InstanceRouter::serving(int32_t i) const {
  const InstanceState s = views_[static_cast<size_t>(i)].state;
  return s != InstanceState::kRecovering && s != InstanceState::kFailed &&
         s != InstanceState::kLeft;
}

bool InstanceRouter::any_present() const {
  for (const View& v : views_) {
    if (v.state != InstanceState::kFailed && v.state != InstanceState::kLeft) return true;
  }
  return false;
}

bool InstanceRouter::any_serving() const {
  for (size_t i = 0; i < views_.size(); ++i) {
    if (serving(static_cast<int32_t>(i))) return true;
  }
  return false;
}

void InstanceRouter::update_loads(int32_t i, std::vector<engine::GroupLoad> loads) {
  std::vector<engine::GroupLoad>& kept = views_[static_cast<size_t>(i)].loads;
  if (kept.size() != loads.size()) kept.resize(loads.size());
  for (size_t g = 0; g < loads.size(); ++g) engine::merge_load(kept[g], std::move(loads[g]));
}

void InstanceRouter::update_blocks(int32_t i, std::span<const uint64_t> added,
                                   std::span<const uint64_t> removed) {
  auto& cached = views_[static_cast<size_t>(i)].cached;
  for (uint64_t h : added) cached[h] += 1;
  for (uint64_t h : removed) {
    auto it = cached.find(h);
    if (it != cached.end() && --it->second <= 0) cached.erase(it);
  }
}

double InstanceRouter::load(const View& v) {
  double load = 0;
  for (const engine::GroupLoad& g : v.loads) load += g.running + g.waiting + g.kv_parked;
  return load / static_cast<double>(std::max<size_t>(1, v.loads.size()));
}

bool InstanceRouter::disaggregated() const {
  bool prefill = false, decode = false;
  for (const View& v : views_) {
    prefill = prefill || v.state == InstanceState::kPrefill;
    decode = decode || v.state == InstanceState::kDecode;
  }
  return prefill && decode;
}

int32_t InstanceRouter::pick(InstanceState role) const {
  int32_t best = -1;
  double best_load = 0;
  for (size_t i = 0; i < views_.size(); ++i) {
    const View& v = views_[i];
    if (v.state != role) continue;
    const double l = load(v);
    if (best < 0 || l < best_load) {
      best = static_cast<int32_t>(i);
      best_load = l;
    }
  }
  return best;
}

int32_t InstanceRouter::route_among(InstanceState role, std::span<const int32_t> prompt) const {
  std::vector<InstanceCandidate> c;
  std::vector<uint64_t> chain;
  for (size_t i = 0; i < views_.size(); ++i) {
    const View& v = views_[i];
    if (v.state != role) continue;
    if (chain.empty() && !v.loads.empty())
      chain = prompt_block_hashes(prompt, v.loads.front().block_size);
    // Prefills sent and not started count as load before the instance reports them.
    const double sent = static_cast<double>(v.long_inflight + v.short_inflight) /
                        static_cast<double>(std::max<size_t>(1, v.loads.size()));
    c.push_back({static_cast<int32_t>(i), load(v) + sent, leading_hits(chain, v.cached),
                 v.long_inflight, v.short_inflight});
  }
  const int32_t k = route_to_instance(c, static_cast<int64_t>(prompt.size()), policy_);
  return k < 0 ? -1 : c[static_cast<size_t>(k)].index;
}

InstanceRoute InstanceRouter::route(std::span<const int32_t> prompt, bool decode_phase) const {
  InstanceRoute r;
  if (views_.size() <= 1) {
    r.to = !views_.empty() && serving(0) ? 0 : -1;
    return r;
  }
  int32_t to = -1;
  if (decode_phase) {
    r.phase = engine::RequestPhase::kDecode;
    to = pick(InstanceState::kDecode);
    if (to < 0) {
      r.no_decode = true;
      return r;
    }
  } else if (disaggregated()) {
    r.phase = engine::RequestPhase::kPrefillOnly;
    r.hold = !handoffs_.empty();
    to = route_among(InstanceState::kPrefill, prompt);
  } else {
    r.phase = engine::RequestPhase::kWhole;
    for (InstanceState role :
         {InstanceState::kColocated, InstanceState::kDecode, InstanceState::kPrefill}) {
      to = route_among(role, prompt);
      if (to >= 0) break;
    }
  }
  if (to < 0) {  // roles not reported yet: the first instance that may serve
    for (size_t i = 0; i < views_.size() && to < 0; ++i) {
      if (serving(static_cast<int32_t>(i))) to = static_cast<int32_t>(i);
    }
  }
  r.to = to;
  return r;
}

void InstanceRouter::count_prefill(PrefillTicket& t, int32_t to, int64_t prompt_tokens) {
  if (views_.size() <= 1 || t.instance >= 0) return;
  t.long_prompt = prompt_tokens >= policy_.long_prompt_tokens;
  t.instance = to;
  View& v = views_[static_cast<size_t>(to)];
  (t.long_prompt ? v.long_inflight : v.short_inflight) += 1;
}

void InstanceRouter::end_prefill(PrefillTicket& t) {
  if (t.instance < 0) return;
  View& v = views_[static_cast<size_t>(t.instance)];
  (t.long_prompt ? v.long_inflight : v.short_inflight) -= 1;
  t.instance = -1;
}

bool InstanceRouter::mark_failed(int32_t i, bool recovering, std::string why) {
  View& failed = views_[static_cast<size_t>(i)];
  failed.state = recovering ? InstanceState::kRecovering : InstanceState::kFailed;
  failed.why = std::move(why);
  failed.loads.clear();
  failed.cached.clear();
  failed.long_inflight = failed.short_inflight = 0;
  return any_serving();
}

void InstanceRouter::mark_left(int32_t i, std::string why) {
  (void)mark_failed(i, false, std::move(why));
  views_[static_cast<size_t>(i)].state = InstanceState::kLeft;
}

bool InstanceRouter::continues_elsewhere(bool decode_phase, bool streamed_since_handoff) const {
  return decode_phase && !streamed_since_handoff && pick(InstanceState::kDecode) >= 0;
}

std::vector<int32_t> InstanceRouter::silent(int64_t now_ns, int64_t timeout_ns) const {
  std::vector<int32_t> out;
  for (size_t i = 0; i < views_.size(); ++i) {
    if (serving(static_cast<int32_t>(i)) && views_[i].last_heard_ns > 0 &&
        now_ns - views_[i].last_heard_ns > timeout_ns)
      out.push_back(static_cast<int32_t>(i));
  }
  return out;
}

std::vector<engine::GroupLoad> InstanceRouter::group_loads() const {
  std::vector<engine::GroupLoad> out;
  for (const View& v : views_) {
    for (const engine::GroupLoad& g : v.loads) {
      out.push_back(g);
      out.back().group = static_cast<int32_t>(out.size() - 1);
    }
  }
  return out;
}

std::vector<size_t> InstanceRouter::cached_blocks() const {
  std::vector<size_t> out;
  for (const View& v : views_) out.push_back(v.cached.size());
  return out;
}

}  // namespace xds::serve
