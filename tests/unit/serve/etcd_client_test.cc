// The etcd client, the gateway's watch and the instance's registration against a real etcd
// (tests/unit/serve/etcd_test_server.h); skipped, with the reason, where etcd is missing.
// What is expected follows etcd's documented v3 semantics: a range over a prefix returns
// exactly the keys under it, a key put with a lease goes when the lease is revoked or expires,
// a watch reports puts and deletes in revision order, and a watch from a compacted revision is
// cancelled with the compaction's revision.
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "etcd_test_server.h"
#include "serve/etcd_registration.h"
#include "serve/etcd_watch.h"

namespace xds::serve {
namespace {

using namespace std::chrono_literals;

class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new fixtures::EtcdTestServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (!server_->installed()) GTEST_SKIP() << server_->why();
    ASSERT_TRUE(server_->failure().empty()) << server_->failure();
  }
  static fixtures::EtcdTestServer* server_;
};

fixtures::EtcdTestServer* EtcdClientTest::server_ = nullptr;

// Polls `cond` every 50 ms for at most `limit`.
template <typename Cond>
bool eventually(Cond cond, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return cond();
}

TEST_F(EtcdClientTest, PutAndRangeOverAPrefix) {
  etcd::Client c = server_->client();
  ASSERT_TRUE(c.put("/t1/a", "one", 0).ok());
  ASSERT_TRUE(c.put("/t1/b", std::string("two\0bytes", 9), 0).ok());
  ASSERT_TRUE(c.put("/t10", "outside", 0).ok());  // shares the bytes "/t1" but not "/t1/"
  auto r = c.range_prefix("/t1/");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[0].key, "/t1/a");
  EXPECT_EQ(r->kvs[0].value, "one");
  EXPECT_EQ(r->kvs[1].value, std::string("two\0bytes", 9));
  EXPECT_GE(r->revision, r->kvs[1].mod_revision);
}

TEST_F(EtcdClientTest, LeaseKeepAliveAndRevoke) {
  etcd::Client c = server_->client();
  auto lease = c.grant(30);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  EXPECT_EQ(lease->ttl_s, 30);
  ASSERT_TRUE(c.put("/t2/x", "v", lease->id).ok());
  auto ttl = c.keep_alive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().to_string();
  EXPECT_EQ(*ttl, 30);
  auto r = c.range_prefix("/t2/");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].lease, lease->id);
  ASSERT_TRUE(c.revoke(lease->id).ok());
  EXPECT_TRUE(c.range_prefix("/t2/")->kvs.empty());  // the key went with its lease
  auto gone = c.keep_alive(lease->id);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(*gone, 0);
  EXPECT_EQ(c.revoke(lease->id).code(), StatusCode::kUnavailable);  // not found
}

TEST_F(EtcdClientTest, AnExpiredLeaseDeletesItsKey) {
  etcd::Client c = server_->client();
  auto lease = c.grant(2);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(c.put("/t3/x", "v", lease->id).ok());
  EXPECT_TRUE(eventually([&] { return c.range_prefix("/t3/")->kvs.empty(); }, 8s));
}

TEST_F(EtcdClientTest, WatchReportsPutsAndDeletesThenStops) {
  etcd::Client c = server_->client();
  auto start = c.range_prefix("/t4/");
  ASSERT_TRUE(start.ok());
  std::mutex mu;
  std::vector<etcd::WatchEvent> seen;
  std::atomic<bool> stop{false};
  Status result;
  std::thread watcher([&] {
    result = c.watch("/t4/", start->revision + 1, stop, [&](const etcd::WatchMessage& m) {
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(seen.end(), m.events.begin(), m.events.end());
      return true;
    });
  });
  auto lease = c.grant(30);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(c.put("/t4/a", "1", lease->id).ok());
  ASSERT_TRUE(c.put("/t5/a", "other prefix", 0).ok());
  ASSERT_TRUE(c.revoke(lease->id).ok());
  EXPECT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> l(mu);
        return seen.size() >= 2;
      },
      5s));
  stop.store(true);
  watcher.join();
  EXPECT_EQ(result.code(), StatusCode::kCancelled);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].type, etcd::WatchEventType::kPut);
  EXPECT_EQ(seen[0].kv.key, "/t4/a");
  EXPECT_EQ(seen[0].kv.value, "1");
  EXPECT_EQ(seen[1].type, etcd::WatchEventType::kDelete);
  EXPECT_GT(seen[1].kv.mod_revision, seen[0].kv.mod_revision);
}

TEST_F(EtcdClientTest, AWatchFromACompactedRevisionIsCancelledWithIt) {
  etcd::Client c = server_->client();
  ASSERT_TRUE(c.put("/t6/a", "1", 0).ok());
  ASSERT_TRUE(c.put("/t6/a", "2", 0).ok());
  auto now = c.range_prefix("/t6/");
  ASSERT_TRUE(now.ok());
  ASSERT_TRUE(c.compact(now->revision).ok());
  etcd::MembershipTable table("/t6/");
  std::atomic<bool> stop{false};
  Status applied;
  Status st = c.watch("/t6/", 1, stop, [&](const etcd::WatchMessage& m) {
    auto r = table.apply(m);
    if (!r.ok()) applied = r.status();
    return r.ok();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(applied.code(), StatusCode::kAborted) << applied.to_string();
}

TEST_F(EtcdClientTest, MembershipWatchSeesInstancesComeAndGo) {
  etcd::Client c = server_->client();
  etcd::InstanceRecord a{"tcp://10.0.0.1:8100", "prefill", "m", {0}, 0, 0, 0};
  etcd::InstanceRecord b{"tcp://10.0.0.2:8100", "decode", "m", {0, 1}, 0, 0, 0};
  const std::string prefix = "/t7/instances/";
  ASSERT_TRUE(c.put(etcd::instance_key(prefix, a.address), etcd::instance_record_json(a), 0).ok());
  std::mutex mu;
  std::vector<etcd::MemberChange> changes;
  auto w = EtcdMembershipWatch::start({server_->url(), prefix}, [&](const etcd::MemberChange& ch) {
    std::lock_guard<std::mutex> lock(mu);
    changes.push_back(ch);
  });
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(changes.size(), 1u);  // the first read, before start() returned
    EXPECT_EQ(changes[0].kind, etcd::MemberChangeKind::kJoined);
    EXPECT_EQ(changes[0].record, a);
  }
  auto lease = c.grant(30);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(
      c.put(etcd::instance_key(prefix, b.address), etcd::instance_record_json(b), lease->id).ok());
  ASSERT_TRUE(c.revoke(lease->id).ok());
  EXPECT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> l(mu);
        return changes.size() >= 3;
      },
      5s));
  (*w)->stop();
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[1].kind, etcd::MemberChangeKind::kJoined);
  EXPECT_EQ(changes[1].record, b);
  EXPECT_EQ(changes[2].kind, etcd::MemberChangeKind::kLeft);
  EXPECT_EQ(changes[2].record.address, b.address);
}

TEST_F(EtcdClientTest, MembershipWatchRefusesToStartWithoutEtcd) {
  const int port = fixtures::free_tcp_port();  // nothing listens there
  auto w = EtcdMembershipWatch::start({"http://127.0.0.1:" + std::to_string(port), "/p/"},
                                      [](const etcd::MemberChange&) {});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(w.status().message().find(std::to_string(port)), std::string::npos);
}

TEST_F(EtcdClientTest, RegistrationFollowsHealth) {
  etcd::Client c = server_->client();
  const std::string prefix = "/t8/instances/";
  etcd::InstanceRecord me{"tcp://127.0.0.1:8100", "colocated", "m", {0}, 0, 0, 0};
  auto reg = EtcdRegistration::start({server_->url(), prefix, 2}, me);
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  auto registered = [&] {
    auto r = c.range_prefix(prefix);
    return r.ok() && r->kvs.size() == 1 && r->kvs[0].key == prefix + "127.0.0.1:8100" &&
           r->kvs[0].lease != 0;
  };
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(registered()) << "registered before it reported itself healthy";
  (*reg)->report(true, me);
  EXPECT_TRUE(eventually(registered, 3s));
  // Healthy for longer than the TTL: the keep-alives hold the key.
  std::this_thread::sleep_for(3s);
  EXPECT_TRUE(registered());
  // Unhealthy: no keep-alive, the lease expires within the TTL (+ etcd's expiry check).
  (*reg)->report(false, me);
  EXPECT_TRUE(eventually([&] { return c.range_prefix(prefix)->kvs.empty(); }, 6s));
  // Healthy again: registered again, with its load.
  me.running = 2;
  (*reg)->report(true, me);
  EXPECT_TRUE(eventually(registered, 3s));
  auto value = etcd::parse_instance_record(c.range_prefix(prefix)->kvs[0].value, "k");
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(value->running, 2);
  // A clean stop revokes the lease: the key goes at once.
  (*reg)->stop(/*revoke=*/true);
  EXPECT_TRUE(c.range_prefix(prefix)->kvs.empty());
}

}  // namespace
}  // namespace xds::serve
