// The gateway's answers to instance failures (docs/design/reliability.md): an instance out
// (FailedMsg, heartbeat silence) or restarted (a new incarnation) turns its requests into
// orphans, sent again with what they streamed wherever an instance serves; /health says 503
// while one is out; waiting past --recovery-timeout fails with 503; /admin/faults.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/log.h"
#include "serve/gateway_impl.h"

namespace xds::serve {

std::optional<HttpResponse> Gateway::Impl::unavailable_health() const {
  nlohmann::json out = nlohmann::json::array();
  bool all = true;
  for (size_t i = 0; i < router.size(); ++i) {
    const auto k = static_cast<int32_t>(i);
    if (router.state(k) == InstanceState::kLeft) continue;  // gone from etcd: not ours any more
    all = all && router.serving(k);
    out.push_back({{"instance", addresses[i]},
                   {"state", router.serving(k) ? "serving" : instance_state_name(router.state(k))},
                   {"why", router.why(k)}});
  }
  if (all && !(out.empty() && !o.etcd.empty())) return std::nullopt;
  HttpResponse r;
  r.status = 503;
  nlohmann::json body{{"status", "unavailable"}, {"instances", out}};
  if (out.empty())
    body["why"] = fmt::format("no instance is registered in etcd under {}", o.etcd_prefix);
  r.body = body.dump();
  return r;
}

void Gateway::Impl::orphan_requests_of(int from, int64_t now, std::optional<uint64_t> keep) {
  for (auto& [id, p] : live) {
    if (p->done || p->orphaned || admission.contains(id)) continue;
    const bool held_there = p->instance == from && (!keep || p->incarnation != *keep);
    // A decode phase waiting for a decode instance loses its KV with its prefill instance.
    const bool kv_there = p->decode_phase && p->prefill_instance == from && !keep;
    if (!held_there && !kv_there) continue;
    orphan(id, *p, now);
  }
}

void Gateway::Impl::orphan(const std::string& id, Pending& p, int64_t now) {
  p.orphaned = true;
  if (p.lost_ns == 0) p.lost_ns = now;
  p.req.attempt += 1;  // what the lost attempt still sends is dropped
  router.end_prefill(p.prefill);
  router.handoffs().cancel(id);
  orphans.push_back(id);
}

void Gateway::Impl::on_membership(int from, const protocol::MembershipMsg& m) {
  if (m.joined) {
    std::lock_guard<std::mutex> lock(mu);
    XDS_LOG_WARN("gateway: instance {}: DP group {} joined again; {} group(s) serve",
                 addresses[static_cast<size_t>(from)], m.group, m.members.size());
    metrics.set_instance_groups(from, static_cast<int64_t>(m.members.size()));
    faults.observe(from, fmt::format("DP group {} joined again, {} group(s) serve", m.group,
                                     m.members.size()),
                   now_ns());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    const int64_t now = now_ns();
    int64_t lost = 0;
    for (const std::string& id : m.request_ids) {
      auto it = live.find(id);
      if (it == live.end()) continue;
      Pending& p = *it->second;
      if (p.done || p.orphaned || p.instance != from || admission.contains(id)) continue;
      orphan(id, p, now);
      ++lost;
    }
    XDS_LOG_WARN(
        "gateway: instance {} lost DP group {} ({}) and goes on with {} group(s); {} "
        "request(s) it held are recomputed",
        addresses[static_cast<size_t>(from)], m.group, m.reason, m.members.size(), lost);
    metrics.count_scale_down(from, static_cast<int64_t>(m.members.size()));
    faults.observe(from,
                   fmt::format("scaled down: DP group {} lost ({}), {} group(s) go on, {} "
                               "request(s) recomputed",
                               m.group, m.reason, m.members.size(), lost),
                   now);
  }
  resend_orphans();
}

void Gateway::Impl::resend_orphans() {
  std::vector<std::shared_ptr<Pending>> again;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!router.any_serving()) return;
    for (const std::string& id : orphans) {
      auto it = live.find(id);
      if (it != live.end() && !it->second->done) again.push_back(it->second);
    }
    orphans.clear();
  }
  for (const std::shared_ptr<Pending>& p : again) submit(p);
}

void Gateway::Impl::expire_waiting(int64_t now) {
  const int64_t limit = o.recovery_timeout_s * 1'000'000'000;
  std::vector<std::shared_ptr<Pending>> expired;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (router.any_serving()) {
      unavailable_since_ns = 0;
    } else if (unavailable_since_ns == 0) {
      unavailable_since_ns = now;
    }
    const bool none_for_long = unavailable_since_ns > 0 && now - unavailable_since_ns > limit;
    for (auto it = orphans.begin(); it != orphans.end();) {
      auto p = live.find(*it);
      if (p == live.end() || p->second->done) {
        it = orphans.erase(it);
      } else if (none_for_long || now - p->second->lost_ns > limit) {
        expired.push_back(p->second);
        it = orphans.erase(it);
      } else {
        ++it;
      }
    }
    for (const std::shared_ptr<Pending>& p : expired) {
      p->done = true;
      router.end_prefill(p->prefill);
      live.erase(p->req.id);
    }
    if (none_for_long) {
      std::vector<std::shared_ptr<Pending>> rest = take_waiting();
      expired.insert(expired.end(), rest.begin(), rest.end());
    }
  }
  const ApiError err = api_error(
      503, fmt::format("no instance could serve this request within {} s of a failure",
                       o.recovery_timeout_s),
      "server_error", "instance_failed");
  for (const std::shared_ptr<Pending>& p : expired) fail_request(p, err);
  if (!expired.empty()) idle_cv.notify_all();
}

void Gateway::Impl::on_instance_answer(int from, uint64_t incarnation, bool ready,
                                       protocol::InstanceRole role) {
  bool again = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    const int64_t now = now_ns();
    if (incarnation != 0 && router.restarted(from, incarnation)) {
      XDS_LOG_WARN(
          "gateway: instance {} restarted (a new incarnation): the requests it held "
          "are recomputed",
          addresses[static_cast<size_t>(from)]);
      metrics.count_instance_restart(from);
      faults.observe(from, "restarted", now);
      orphan_requests_of(from, now, incarnation);
      again = true;
    }
    if (ready && router.rejoin(from, role)) {
      XDS_LOG_WARN("gateway: instance {} serves again", addresses[static_cast<size_t>(from)]);
      metrics.set_instance_up(from, true);
      faults.observe(from, "serving again", now);
      again = true;
    }
    if (ready) router.report_role(from, role);
  }
  if (again) resend_orphans();
}

void Gateway::Impl::on_instance_failed(int from, const std::string& why, bool recovering,
                                      const std::string& kind) {
  bool reoffer = false;
  std::vector<std::pair<Responder, HttpResponse>> answered;
  std::vector<std::shared_ptr<Pending>> given_up;
  std::string address;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!router.serving(from)) return;  // out already
    address = addresses[static_cast<size_t>(from)];
    const int64_t now = now_ns();
    XDS_LOG_ERROR("gateway: instance {} ({}) failed{}: {}", addresses[static_cast<size_t>(from)],
                  instance_state_name(router.state(from)), recovering ? ", it restarts" : "", why);
    metrics.count_instance_failure(from, kind);
    metrics.set_instance_up(from, false);
    faults.observe(from, fmt::format("failed ({}): {}", kind, why), now);
    router.mark_failed(from, recovering, why);
    // The waiting head offered to this instance gets no answer: it is offered again.
    if (const std::string* head = admission.head(); head && admission.offer_in_flight()) {
      auto it = live.find(*head);
      if (it != live.end() && it->second->instance == from) {
        admission.offer_lost();
        reoffer = true;
      }
    }
    orphan_requests_of(from, now);
    // /health probes waiting on the instance's groups learn at once.
    if (std::optional<HttpResponse> health = unavailable_health()) {
      for (auto it = probes.begin(); it != probes.end();) {
        if (it->second.health) {
          answered.emplace_back(it->second.responder, *health);
          it = probes.erase(it);
        } else {
          ++it;
        }
      }
    }
    // It will not restart and nothing else serves: what waits would wait in vain.
    if (!recovering && !router.any_serving()) given_up = take_waiting();
  }
  for (auto& [responder, response] : answered) responder.send(std::move(response));
  const ApiError err =
      api_error(503, fmt::format("the instance serving this request ({}) failed: {}", address, why),
                "server_error", "instance_failed");
  for (const std::shared_ptr<Pending>& p : given_up) fail_request(p, err);
  resend_orphans();
  if (reoffer) offer_waiting();
  idle_cv.notify_all();
}

std::vector<std::shared_ptr<Pending>> Gateway::Impl::take_waiting() {
  std::vector<std::shared_ptr<Pending>> out;
  for (const std::string& id : orphans) {
    auto it = live.find(id);
    if (it != live.end()) out.push_back(it->second);
  }
  orphans.clear();
  while (const std::string* head = admission.head()) {
    auto it = live.find(*head);
    if (it != live.end()) out.push_back(it->second);
    admission.cancel(*head);
  }
  for (const std::shared_ptr<Pending>& p : out) {
    p->done = true;
    router.end_prefill(p->prefill);
    live.erase(p->req.id);
  }
  return out;
}

void Gateway::Impl::inject_fault(protocol::FaultSpec fault, Responder responder) {
  const std::string id = next_id("fault");
  {
    std::lock_guard<std::mutex> lock(mu);
    fault.id = next_number.fetch_add(1);
    probes.emplace(id, Probe{responder, now_ns() + int64_t{5'000'000'000}, 1, false});
    faults.accepted(fault, now_ns());
  }
  protocol::AdminRequestMsg m{id, protocol::AdminCall::kInjectFault, nlohmann::json(fault).dump()};
  link->post(fault.instance, std::move(m));
}

void Gateway::Impl::list_faults(Responder responder) {
  HttpResponse r;
  {
    std::lock_guard<std::mutex> lock(mu);
    r.body = faults.to_json().dump();
  }
  responder.send(std::move(r));
}

}  // namespace xds::serve
