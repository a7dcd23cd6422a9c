// An instance's entry in etcd (docs/design/membership.md): its InstanceRecord under
// `prefix` + its address, attached to a lease of `ttl_s` seconds that is kept alive only while
// the instance reports itself healthy.
//
//   healthy, no lease   ──▶ grant(ttl), put(key, record, lease)          (registered)
//   healthy, lease      ──▶ keep-alive every ttl/3; the record put again when it changed
//                           (at most once per period); a keep-alive that finds the lease gone
//                           registers again
//   unhealthy           ──▶ nothing: no keep-alive, so the lease expires within ttl and etcd
//                           deletes the key (the gateways drop the instance)
//   stop(revoke = true) ──▶ the lease revoked: the key goes at once (clean shutdown)
//
// "Healthy" is what the shell reports (ShellOptions::on_health): every serving DP group
// answers its heartbeat. Errors talking to etcd are logged and retried the next period; they
// never stop the instance.
//
// Thread-safety: report() from any thread (the shell's loop); start() and stop() from the one
// that owns the object. One thread of its own talks to etcd.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"
#include "serve/etcd_client.h"
#include "serve/etcd_json.h"

namespace xds::serve {

inline constexpr const char* kDefaultEtcdPrefix = "/xdeepserve/instances/";

struct EtcdRegistrationOptions {
  std::string endpoint;  // http://HOST:PORT
  std::string prefix = kDefaultEtcdPrefix;
  int64_t ttl_s = 10;
};

// Checks the flags: InvalidArgument naming --etcd, --etcd-prefix or --etcd-ttl.
Status check_etcd_flags(const std::string& endpoint, const std::string& prefix, int64_t ttl_s);

class EtcdRegistration {
 public:
  // Starts the thread; the first registration waits for a healthy report.
  static Result<std::unique_ptr<EtcdRegistration>> start(EtcdRegistrationOptions options,
                                                         etcd::InstanceRecord record);
  ~EtcdRegistration();  // stop(false)

  // The instance's health and its record now (groups, load).
  void report(bool healthy, const etcd::InstanceRecord& record);
  // Stops the thread; revokes the lease when `revoke` (and one is held).
  void stop(bool revoke);

  const std::string& key() const { return key_; }

 private:
  EtcdRegistration(EtcdRegistrationOptions options, etcd::Client client,
                   etcd::InstanceRecord record);
  void loop();
  // One period's work: register, keep alive or wait (see the top of this file).
  void tick(bool healthy, const etcd::InstanceRecord& record);

  EtcdRegistrationOptions o_;
  etcd::Client client_;
  std::string key_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool healthy_ = false;         // guarded by mu_
  etcd::InstanceRecord record_;  // guarded by mu_
  bool stopping_ = false;        // guarded by mu_
  bool health_changed_ = false;  // guarded by mu_: wake the thread early
  // The thread's own state.
  int64_t lease_ = 0;                // 0: none held
  etcd::InstanceRecord put_record_;  // what the key holds
  bool said_unhealthy_ = false;
  std::thread thread_;
};

}  // namespace xds::serve
