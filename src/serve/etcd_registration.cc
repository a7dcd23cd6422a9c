#include "serve/etcd_registration.h"

#include <chrono>

#include "base/log.h"

namespace xds::serve {

Status check_etcd_flags(const std::string& endpoint, const std::string& prefix, int64_t ttl_s) {
  XDS_RETURN_IF_ERROR(etcd::parse_endpoint(endpoint, "--etcd").status());
  if (prefix.empty() || prefix.back() != '/') {
    return invalid_argument("--etcd-prefix must end with '/', got '{}'", prefix);
  }
  if (ttl_s < 2 || ttl_s > 3600) {
    return invalid_argument("--etcd-ttl must be in [2, 3600] seconds, got {}", ttl_s);
  }
  return {};
}

Result<std::unique_ptr<EtcdRegistration>> EtcdRegistration::start(EtcdRegistrationOptions options,
                                                                  etcd::InstanceRecord record) {
  XDS_RETURN_IF_ERROR(check_etcd_flags(options.endpoint, options.prefix, options.ttl_s));
  XDS_ASSIGN_OR_RETURN(etcd::Endpoint ep, etcd::parse_endpoint(options.endpoint, "--etcd"));
  std::unique_ptr<EtcdRegistration> r(
      new EtcdRegistration(std::move(options), etcd::Client(std::move(ep)), std::move(record)));
  r->thread_ = std::thread([p = r.get()] { p->loop(); });
  return r;
}

EtcdRegistration::EtcdRegistration(EtcdRegistrationOptions options, etcd::Client client,
                                   etcd::InstanceRecord record)
    : o_(std::move(options)),
      client_(std::move(client)),
      key_(etcd::instance_key(o_.prefix, record.address)),
      record_(std::move(record)) {}

EtcdRegistration::~EtcdRegistration() {
  stop(false);
}

void EtcdRegistration::report(bool healthy, const etcd::InstanceRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  if (healthy != healthy_) {
    health_changed_ = true;
    cv_.notify_all();
  }
  healthy_ = healthy;
  record_ = record;
}

void EtcdRegistration::stop(bool revoke) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  if (revoke && lease_ != 0) {
    if (Status st = client_.revoke(lease_); !st.ok()) {
      XDS_LOG_WARN("instance: revoking its etcd lease: {}", st.message());
    } else {
      XDS_LOG_INFO("instance: left etcd ({} removed)", key_);
    }
    lease_ = 0;
  }
}

void EtcdRegistration::loop() {
  // A third of the TTL between keep-alives: two may be lost before the lease expires.
  const auto period = std::chrono::milliseconds(o_.ttl_s * 1000 / 3);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const bool healthy = healthy_;
    const etcd::InstanceRecord record = record_;
    health_changed_ = false;
    lock.unlock();
    tick(healthy, record);
    lock.lock();
    cv_.wait_for(lock, period, [&] { return stopping_ || health_changed_; });
  }
}

void EtcdRegistration::tick(bool healthy, const etcd::InstanceRecord& record) {
  if (!healthy) {
    if (lease_ != 0 && !said_unhealthy_) {
      XDS_LOG_WARN("instance: not healthy: etcd keep-alives stopped ({} expires within {} s)", key_,
                   o_.ttl_s);
    }
    said_unhealthy_ = true;
    return;
  }
  said_unhealthy_ = false;
  if (lease_ != 0) {
    auto ttl = client_.keep_alive(lease_);
    if (!ttl.ok()) {
      XDS_LOG_WARN("instance: etcd keep-alive: {}", ttl.status().message());
      return;
    }
    if (*ttl <= 0) {
      XDS_LOG_WARN("instance: its etcd lease expired; registering again");
      lease_ = 0;
    } else if (record != put_record_) {
      if (Status st = client_.put(key_, etcd::instance_record_json(record), lease_); !st.ok()) {
        XDS_LOG_WARN("instance: etcd put: {}", st.message());
        return;
      }
      put_record_ = record;
      return;
    } else {
      return;
    }
  }
  auto lease = client_.grant(o_.ttl_s);
  if (!lease.ok()) {
    XDS_LOG_WARN("instance: etcd lease grant: {}", lease.status().message());
    return;
  }
  if (Status st = client_.put(key_, etcd::instance_record_json(record), lease->id); !st.ok()) {
    XDS_LOG_WARN("instance: etcd put: {}", st.message());
    (void)client_.revoke(lease->id);
    return;
  }
  lease_ = lease->id;
  put_record_ = record;
  XDS_LOG_INFO("instance: registered in etcd as {} (lease {:x}, TTL {} s)", key_,
               static_cast<uint64_t>(lease_), o_.ttl_s);
}

}  // namespace xds::serve
