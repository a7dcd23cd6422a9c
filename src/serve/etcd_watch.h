// The gateway's side of membership in etcd (docs/design/membership.md): reads every entry
// under the prefix, then watches from the next revision and hands each change (an instance
// joined, was updated, left) to a callback, on its own thread.
//
//   start(): range(prefix) ──▶ on_change(joined) for each entry      (before start returns)
//   thread:  watch(from revision + 1) ──▶ on_change per event
//            compacted ──▶ range again (the diff against the table: joined / left) ──▶ watch
//            stream failed or ended ──▶ 1 s later, watch again from the next revision
//                                       (range again when that fails too)
//
// An entry is not trusted: the gateway connects to the address over the cluster secret's
// channels, and an instance that cannot authenticate never answers.
//
// Thread-safety: on_change runs on start()'s caller for the first read, then on the watcher's
// thread; never two at once. stop() from any thread but the callback's.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "base/status.h"
#include "serve/etcd_client.h"
#include "serve/etcd_members.h"

namespace xds::serve {

struct EtcdWatchOptions {
  std::string endpoint;  // http://HOST:PORT
  std::string prefix;    // e.g. /xdeepserve/instances/
};

class EtcdMembershipWatch {
 public:
  using OnChange = std::function<void(const etcd::MemberChange&)>;
  // Unavailable when etcd cannot be read at start (the gateway refuses to start).
  static Result<std::unique_ptr<EtcdMembershipWatch>> start(EtcdWatchOptions options,
                                                            OnChange on_change);
  ~EtcdMembershipWatch();  // stop()
  void stop();

 private:
  EtcdMembershipWatch(EtcdWatchOptions options, etcd::Client client, OnChange on_change);
  // A full read; the changes against the table handed over.
  Status read_all();
  void loop();
  void deliver(const etcd::MemberChanges& changes);

  EtcdWatchOptions o_;
  etcd::Client client_;
  OnChange on_change_;
  etcd::MembershipTable table_;  // the watcher thread's (start()'s caller before it runs)
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace xds::serve
