// The internal channels' guard (protocol/channel_security.h): the ZAP rule on hand-written
// requests, the key derivation against libzmq's own zmq_curve_public, the secret file's
// checks, and real sockets: a peer without the cluster's keys gets nothing through (over TCP
// with CURVE), nor does a peer of another uid (over ipc, checked by a child that becomes
// `nobody`; root only).
#include "protocol/channel_security.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include <zmq.hpp>

namespace xds::protocol {
namespace {

ClusterSecret secret_of(uint8_t fill) {
  ClusterSecret s;
  s.bytes.fill(fill);
  return s;
}

ZapRequest request(const std::string& domain, const std::string& address,
                   const std::string& mechanism) {
  ZapRequest r;
  r.version = "1.0";
  r.request_id = "1";
  r.domain = domain;
  r.address = address;
  r.mechanism = mechanism;
  return r;
}

TEST(ChannelSecurity, IpcPeerUidIsTheThirdFieldFromTheEnd) {
  EXPECT_EQ(ipc_peer_uid("localhost:0:0:6460"), uid_t{0});
  EXPECT_EQ(ipc_peer_uid("@xdeepserve-12-shell:1000:100:77"), uid_t{1000});
  EXPECT_EQ(ipc_peer_uid("127.0.0.1"), std::nullopt);
  EXPECT_EQ(ipc_peer_uid("::1"), std::nullopt);
  EXPECT_EQ(ipc_peer_uid("localhost:x:0:1"), std::nullopt);
  EXPECT_EQ(ipc_peer_uid(""), std::nullopt);
}

TEST(ChannelSecurity, ZapRuleWithoutKeys) {
  // ipc: our uid only; tcp: NULL allowed (library tests without keys).
  EXPECT_TRUE(
      zap_decide(request("xds-ipc", "localhost:1000:1000:5", "NULL"), nullptr, 1000).allowed);
  const ZapVerdict other =
      zap_decide(request("xds-ipc", "localhost:65534:65534:5", "NULL"), nullptr, 1000);
  EXPECT_FALSE(other.allowed);
  EXPECT_NE(other.reason.find("uid 65534"), std::string::npos) << other.reason;
  EXPECT_FALSE(zap_decide(request("xds-ipc", "localhost", "NULL"), nullptr, 1000).allowed);
  EXPECT_TRUE(zap_decide(request("xds-tcp", "127.0.0.1", "NULL"), nullptr, 1000).allowed);
  EXPECT_FALSE(zap_decide(request("other", "127.0.0.1", "NULL"), nullptr, 1000).allowed);
  ZapRequest old = request("xds-tcp", "127.0.0.1", "NULL");
  old.version = "0.9";
  EXPECT_FALSE(zap_decide(old, nullptr, 1000).allowed);
}

TEST(ChannelSecurity, ZapRuleWithKeysWantsTheClusterClientKey) {
  const CurveKeys k = derive_curve_keys(secret_of(7));
  const CurveKeys stranger = derive_curve_keys(secret_of(8));
  EXPECT_FALSE(zap_decide(request("xds-tcp", "10.0.0.2", "NULL"), &k, 0).allowed);
  ZapRequest curve = request("xds-tcp", "10.0.0.2", "CURVE");
  curve.credentials = {std::string(k.client_public_raw.begin(), k.client_public_raw.end())};
  EXPECT_TRUE(zap_decide(curve, &k, 0).allowed);
  curve.credentials = {
      std::string(stranger.client_public_raw.begin(), stranger.client_public_raw.end())};
  EXPECT_FALSE(zap_decide(curve, &k, 0).allowed);
  curve.credentials = {};
  EXPECT_FALSE(zap_decide(curve, &k, 0).allowed);
  // ipc with the right key but another uid: still refused.
  ZapRequest ipc = request("xds-ipc", "localhost:5:5:9", "CURVE");
  ipc.credentials = {std::string(k.client_public_raw.begin(), k.client_public_raw.end())};
  EXPECT_FALSE(zap_decide(ipc, &k, 0).allowed);
  EXPECT_TRUE(zap_decide(ipc, &k, 5).allowed);
}

TEST(ChannelSecurity, KeysAreDerivedDeterministicallyAndPairUp) {
  const CurveKeys a = derive_curve_keys(secret_of(1));
  const CurveKeys b = derive_curve_keys(secret_of(1));
  const CurveKeys c = derive_curve_keys(secret_of(2));
  EXPECT_EQ(a.server_secret, b.server_secret);
  EXPECT_EQ(a.client_public, b.client_public);
  EXPECT_NE(a.server_secret, c.server_secret);
  EXPECT_NE(a.server_secret, a.client_secret);
  // Each public key is the one libzmq computes from the secret key.
  for (const auto& [pub, sec] :
       {std::pair{a.server_public, a.server_secret}, std::pair{a.client_public, a.client_secret}}) {
    char computed[41];
    ASSERT_EQ(zmq_curve_public(computed, sec.c_str()), 0);
    EXPECT_EQ(std::string(computed, 40), pub);
  }
  uint8_t raw[32];
  ASSERT_NE(zmq_z85_decode(raw, a.client_public.c_str()), nullptr);
  EXPECT_EQ(std::string(raw, raw + 32),
            std::string(a.client_public_raw.begin(), a.client_public_raw.end()));
}

TEST(ChannelSecurity, TheSecretFileMustBeTheOwnersAlone) {
  const std::string path = ::testing::TempDir() + "/xds_cluster_secret";
  {
    std::ofstream f(path, std::ios::trunc);
    f << "correct horse battery staple";
  }
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  Result<ClusterSecret> loose = read_cluster_secret(path);
  ASSERT_FALSE(loose.ok());
  EXPECT_NE(loose.status().message().find("chmod 600"), std::string::npos)
      << loose.status().message();
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  Result<ClusterSecret> a = read_cluster_secret(path);
  Result<ClusterSecret> b = read_cluster_secret(path);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->bytes, b->bytes);
  { std::ofstream f(path, std::ios::trunc); }
  EXPECT_FALSE(read_cluster_secret(path).ok());  // empty
  EXPECT_FALSE(read_cluster_secret(path + ".missing").ok());
  std::remove(path.c_str());
}

// A guarded PULL (its own context and ZAP handler) and what arrives on it.
class Guarded {
 public:
  explicit Guarded(const std::string& endpoint) {
    auto g = ZapGuard::start(ctx_);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (g.ok()) zap_ = std::move(*g);
    pull_.set(zmq::sockopt::linger, 0);
    secure_binding(pull_, endpoint);
    pull_.bind(endpoint);
    endpoint_ = pull_.get(zmq::sockopt::last_endpoint);
  }
  const std::string& endpoint() const { return endpoint_; }
  // The next message within `ms`, or "" when none.
  std::string receive(int ms) {
    zmq::pollitem_t item{pull_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(ms)) == 0) return "";
    zmq::message_t m;
    if (!pull_.recv(m, zmq::recv_flags::none)) return "";
    return m.to_string();
  }
  int64_t refused() const { return zap_ ? zap_->refused() : -1; }

 private:
  zmq::context_t ctx_{1};
  std::unique_ptr<ZapGuard> zap_;
  zmq::socket_t pull_{ctx_, zmq::socket_type::pull};
  std::string endpoint_;
};

// Sends `text` from a PUSH with `keys` (null: NULL mechanism) on a context of its own.
void send_from(const std::string& endpoint, const CurveKeys* keys, const std::string& text) {
  zmq::context_t ctx{1};
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 0);
  if (keys != nullptr) {
    push.set(zmq::sockopt::curve_serverkey, keys->server_public);
    push.set(zmq::sockopt::curve_publickey, keys->client_public);
    push.set(zmq::sockopt::curve_secretkey, keys->client_secret);
  }
  push.connect(endpoint);
  push.send(zmq::buffer(text), zmq::send_flags::dontwait);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the handshake run
}

TEST(ChannelSecurity, OverTcpOnlyTheClustersKeysGetThrough) {
  const CurveKeys k = derive_curve_keys(secret_of(3));
  set_channel_keys(k);
  {
    Guarded g("tcp://127.0.0.1:*");
    // A peer that knows the server's public key but holds another client key: ZAP refuses.
    CurveKeys half = derive_curve_keys(secret_of(4));
    half.server_public = k.server_public;
    send_from(g.endpoint(), &half, "half");
    EXPECT_EQ(g.receive(200), "");
    EXPECT_GE(g.refused(), 1);
    // A peer of another cluster (another server key): the handshake itself fails.
    const CurveKeys other = derive_curve_keys(secret_of(5));
    send_from(g.endpoint(), &other, "other");
    EXPECT_EQ(g.receive(200), "");
    // No CURVE at all.
    send_from(g.endpoint(), nullptr, "plain");
    EXPECT_EQ(g.receive(200), "");
    // The cluster's own client.
    send_from(g.endpoint(), &k, "member");
    EXPECT_EQ(g.receive(2000), "member");
  }
  set_channel_keys(std::nullopt);
}

TEST(ChannelSecurity, OverIpcAnotherUidGetsNothingThrough) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another uid";
  set_channel_keys(std::nullopt);
  Guarded g("ipc://@xds-channel-security-test-" + std::to_string(::getpid()));
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(2);
    send_from(g.endpoint(), nullptr, "from nobody");
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(g.receive(300), "");
  EXPECT_GE(g.refused(), 1);
  send_from(g.endpoint(), nullptr, "from us");
  EXPECT_EQ(g.receive(2000), "from us");
}

}  // namespace
}  // namespace xds::protocol
