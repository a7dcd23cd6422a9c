// The gateway's side of membership in etcd (docs/design/membership.md): an instance that
// registers gets a new index, a DEALER to its address and a place in the router; one whose
// entry goes (its lease expired or was revoked) leaves for good.
#include <fmt/format.h>

#include "base/clock.h"
#include "base/log.h"
#include "serve/gateway_impl.h"

namespace xds::serve {

ApiError Gateway::Impl::no_instance_error() const {
  return api_error(503, fmt::format("no instance is registered in etcd under {}", o.etcd_prefix),
                   "server_error", "no_instance");
}

void Gateway::Impl::on_etcd_change(const etcd::MemberChange& change) {
  switch (change.kind) {
    case etcd::MemberChangeKind::kUpdated:
      return;  // role and loads come from the shell itself
    case etcd::MemberChangeKind::kJoined: {
      int32_t i = 0;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = etcd_instances.find(change.key); it != etcd_instances.end()) {
          return;  // known already (an address change arrives as left, then joined)
        }
        i = router.add_instance();
        addresses.push_back(change.record.address);
        etcd_instances[change.key] = i;
        unavailable_since_ns = 0;  // an instance to serve again
        // It connects and authenticates over the cluster secret's channel like any instance;
        // until its shell answers, it is routable like an instance that has not reported yet.
        link->connect(i, change.record.address);
        metrics.set_instance_up(i, true);
        faults.observe(i, fmt::format("registered in etcd ({})", change.record.address), now_ns());
      }
      XDS_LOG_INFO("gateway: instance {} ({}, {}) joined through etcd as instance {}",
                   change.record.address, change.record.role, change.key, i);
      resend_orphans();
      offer_waiting();
      return;
    }
    case etcd::MemberChangeKind::kLeft: {
      int32_t i = -1;
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = etcd_instances.find(change.key);
        if (it == etcd_instances.end()) return;
        i = it->second;
        etcd_instances.erase(it);
      }
      on_instance_left(
          i, fmt::format("its etcd entry {} is gone (lease expired or revoked)", change.key));
      return;
    }
  }
}

void Gateway::Impl::on_instance_left(int from, const std::string& why) {
  bool reoffer = false;
  std::vector<std::shared_ptr<Pending>> given_up;
  std::string address;
  {
    std::lock_guard<std::mutex> lock(mu);
    const int64_t now = now_ns();
    address = addresses[static_cast<size_t>(from)];
    XDS_LOG_WARN("gateway: instance {} left: {}", address, why);
    metrics.set_instance_up(from, false);
    faults.observe(from, fmt::format("left: {}", why), now);
    router.mark_left(from, why);
    link->disconnect(from);
    if (const std::string* head = admission.head(); head && admission.offer_in_flight()) {
      auto it = live.find(*head);
      if (it != live.end() && it->second->instance == from) {
        admission.offer_lost();
        reoffer = true;
      }
    }
    orphan_requests_of(from, now);
    // No instance left to wait for: what waits gets its 503 now rather than at the recovery
    // timeout.
    if (!router.any_present()) given_up = take_waiting();
  }
  const ApiError err =
      api_error(503,
                fmt::format("the instance serving this request ({}) left and no instance is "
                            "registered in etcd under {}",
                            address, o.etcd_prefix),
                "server_error", "no_instance");
  for (const std::shared_ptr<Pending>& p : given_up) fail_request(p, err);
  resend_orphans();
  if (reoffer) offer_waiting();
  idle_cv.notify_all();
}

}  // namespace xds::serve
