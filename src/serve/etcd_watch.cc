#include "serve/etcd_watch.h"

#include <chrono>

#include "base/log.h"

namespace xds::serve {

Result<std::unique_ptr<EtcdMembershipWatch>> EtcdMembershipWatch::start(EtcdWatchOptions options,
                                                                        OnChange on_change) {
  XDS_ASSIGN_OR_RETURN(etcd::Endpoint ep, etcd::parse_endpoint(options.endpoint, "--etcd"));
  if (options.prefix.empty() || options.prefix.back() != '/') {
    return invalid_argument("--etcd-prefix must end with '/', got '{}'", options.prefix);
  }
  std::unique_ptr<EtcdMembershipWatch> w(new EtcdMembershipWatch(
      std::move(options), etcd::Client(std::move(ep)), std::move(on_change)));
  XDS_RETURN_IF_ERROR(w->read_all().with_context("gateway: reading the instances from etcd"));
  w->thread_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

EtcdMembershipWatch::EtcdMembershipWatch(EtcdWatchOptions options, etcd::Client client,
                                         OnChange on_change)
    : o_(std::move(options)),
      client_(std::move(client)),
      on_change_(std::move(on_change)),
      table_(o_.prefix) {}

EtcdMembershipWatch::~EtcdMembershipWatch() {
  stop();
}

void EtcdMembershipWatch::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void EtcdMembershipWatch::deliver(const etcd::MemberChanges& changes) {
  for (const std::string& why : changes.rejected) {
    XDS_LOG_WARN("gateway: an etcd entry is not an instance: {}", why);
  }
  for (const etcd::MemberChange& c : changes.changes) on_change_(c);
}

Status EtcdMembershipWatch::read_all() {
  XDS_ASSIGN_OR_RETURN(etcd::RangeAnswer all, client_.range_prefix(o_.prefix));
  deliver(table_.reset(all));
  XDS_LOG_INFO("gateway: {} instance(s) under {} in etcd at revision {}", table_.members().size(),
               o_.prefix, table_.revision());
  return {};
}

void EtcdMembershipWatch::loop() {
  bool read_again = false;
  while (!stop_.load()) {
    if (read_again) {
      if (Status st = read_all(); !st.ok()) {
        XDS_LOG_WARN("gateway: {}", st.message());
        std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;
      }
      read_again = false;
    }
    Status failure;
    Status st = client_.watch(o_.prefix, table_.next_watch_revision(), stop_,
                              [&](const etcd::WatchMessage& m) {
                                auto changes = table_.apply(m);
                                if (!changes.ok()) {
                                  failure = changes.status();
                                  return false;
                                }
                                deliver(*changes);
                                return true;
                              });
    if (stop_.load()) break;
    if (!failure.ok()) st = failure;
    XDS_LOG_WARN("gateway: {}", st.message());
    // A compaction lost events: read everything again. Any other failure: watch again from
    // the next revision, after a pause (a compaction meanwhile is answered as above).
    if (st.code() == StatusCode::kAborted) {
      read_again = true;
      continue;
    }
    for (int i = 0; i < 5 && !stop_.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

}  // namespace xds::serve
