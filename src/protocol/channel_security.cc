#include "protocol/channel_security.h"

#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "base/log.h"

namespace xds::protocol {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr const char* kIpcDomain = "xds-ipc";
constexpr const char* kTcpDomain = "xds-tcp";

std::optional<CurveKeys> g_keys;

std::string z85(const uint8_t* key32) {
  char text[41];
  zmq_z85_encode(text, key32, 32);
  return std::string(text, 40);
}

// The keypair whose secret is BLAKE2b(secret, label).
void derive_pair(const ClusterSecret& s, const char* label, std::array<uint8_t, 32>& secret,
                 std::array<uint8_t, 32>& pub) {
  crypto_generichash(secret.data(), secret.size(), reinterpret_cast<const uint8_t*>(label),
                     std::strlen(label), s.bytes.data(), s.bytes.size());
  crypto_scalarmult_base(pub.data(), secret.data());
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

ClusterSecret random_cluster_secret() {
  if (sodium_init() < 0) XDS_LOG_ERROR("libsodium failed to initialise");
  ClusterSecret s;
  randombytes_buf(s.bytes.data(), s.bytes.size());
  return s;
}

Result<ClusterSecret> read_cluster_secret(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return invalid_argument("--cluster-secret-file {}: {}", path, std::strerror(errno));
  }
  if ((st.st_mode & 077) != 0) {
    return invalid_argument(
        "--cluster-secret-file {}: mode {:o} lets group or others read or write it; it must be "
        "0600 (chmod 600 {})",
        path, st.st_mode & 0777, path);
  }
  std::ifstream f(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f.good() && !f.eof()) return invalid_argument("--cluster-secret-file {}: unreadable", path);
  if (text.empty()) return invalid_argument("--cluster-secret-file {}: empty", path);
  if (sodium_init() < 0) return internal_error("libsodium failed to initialise");
  ClusterSecret s;
  crypto_generichash(s.bytes.data(), s.bytes.size(), reinterpret_cast<const uint8_t*>(text.data()),
                     text.size(), nullptr, 0);
  return s;
}

CurveKeys derive_curve_keys(const ClusterSecret& secret) {
  std::array<uint8_t, 32> sec{}, pub{};
  CurveKeys k;
  derive_pair(secret, "xdeepserve curve server", sec, pub);
  k.server_secret = z85(sec.data());
  k.server_public = z85(pub.data());
  derive_pair(secret, "xdeepserve curve client", sec, pub);
  k.client_secret = z85(sec.data());
  k.client_public = z85(pub.data());
  k.client_public_raw = pub;
  sodium_memzero(sec.data(), sec.size());
  return k;
}

void set_channel_keys(std::optional<CurveKeys> keys) {
  g_keys = std::move(keys);
}
const CurveKeys* channel_keys() {
  return g_keys ? &*g_keys : nullptr;
}

void secure_binding(zmq::socket_t& socket, const std::string& endpoint) {
  socket.set(zmq::sockopt::zap_domain, endpoint.rfind("ipc://", 0) == 0 ? kIpcDomain : kTcpDomain);
  if (const CurveKeys* k = channel_keys()) {
    socket.set(zmq::sockopt::curve_server, true);
    socket.set(zmq::sockopt::curve_secretkey, k->server_secret);
  }
}

void secure_connecting(zmq::socket_t& socket) {
  if (const CurveKeys* k = channel_keys()) {
    socket.set(zmq::sockopt::curve_serverkey, k->server_public);
    socket.set(zmq::sockopt::curve_publickey, k->client_public);
    socket.set(zmq::sockopt::curve_secretkey, k->client_secret);
  }
}

std::optional<uid_t> ipc_peer_uid(const std::string& address) {
  // "<path or localhost>:uid:gid:pid"
  const size_t pid_colon = address.rfind(':');
  if (pid_colon == std::string::npos || pid_colon == 0) return std::nullopt;
  const size_t gid_colon = address.rfind(':', pid_colon - 1);
  if (gid_colon == std::string::npos || gid_colon == 0) return std::nullopt;
  const size_t uid_colon = address.rfind(':', gid_colon - 1);
  if (uid_colon == std::string::npos) return std::nullopt;
  const std::string uid = address.substr(uid_colon + 1, gid_colon - uid_colon - 1);
  const std::string gid = address.substr(gid_colon + 1, pid_colon - gid_colon - 1);
  const std::string pid = address.substr(pid_colon + 1);
  if (!all_digits(uid) || !all_digits(gid) || !all_digits(pid) || uid.size() > 10) {
    return std::nullopt;
  }
  return static_cast<uid_t>(std::stoul(uid));
}

ZapVerdict zap_decide(const ZapRequest& r, const CurveKeys* keys, uid_t self) {
  if (r.version != "1.0") return {false, "ZAP version " + r.version};
  if (r.domain == kIpcDomain) {
    const std::optional<uid_t> uid = ipc_peer_uid(r.address);
    if (!uid) return {false, "ipc peer without credentials (address '" + r.address + "')"};
    if (*uid != self) {
      return {false, "ipc peer of uid " + std::to_string(*uid) + " (ours is " +
                         std::to_string(self) + ")"};
    }
  } else if (r.domain != kTcpDomain) {
    return {false, "unknown ZAP domain '" + r.domain + "'"};
  }
  if (keys == nullptr) {
    if (r.mechanism != "NULL") return {false, "mechanism " + r.mechanism + " without keys"};
    return {true, {}};
  }
  if (r.mechanism != "CURVE") return {false, "mechanism " + r.mechanism + " (CURVE required)"};
  if (r.credentials.size() != 1 || r.credentials[0].size() != 32 ||
      std::memcmp(r.credentials[0].data(), keys->client_public_raw.data(), 32) != 0) {
    return {false, "a CURVE client key that is not the cluster's (from " + r.address + ")"};
  }
  return {true, {}};
}

Result<std::unique_ptr<ZapGuard>> ZapGuard::start(zmq::context_t& ctx) {
  std::unique_ptr<ZapGuard> g(new ZapGuard());
  std::atomic<int> ready{0};  // 1: bound, -1: failed
  g->thread_ = std::thread([&ctx, &ready, raw = g.get()] { raw->run(ctx, ready); });
  while (ready.load() == 0) std::this_thread::yield();
  if (ready.load() < 0) {
    g->thread_.join();
    return internal_error("ZAP handler: cannot bind {}: {}", kZapEndpoint, g->bind_error_);
  }
  return g;
}

ZapGuard::~ZapGuard() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ZapGuard::run(zmq::context_t& ctx, std::atomic<int>& ready) {
  zmq::socket_t rep(ctx, zmq::socket_type::rep);
  rep.set(zmq::sockopt::linger, 0);
  try {
    rep.bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    bind_error_ = e.what();
    ready.store(-1);
    return;
  }
  ready.store(1);
  const uid_t self = ::geteuid();
  while (!stop_.load(std::memory_order_relaxed)) {
    zmq::pollitem_t item{rep.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
    std::vector<std::string> frames;
    for (;;) {
      zmq::message_t m;
      if (!rep.recv(m, zmq::recv_flags::none)) break;
      frames.push_back(m.to_string());
      if (!m.more()) break;
    }
    ZapRequest r;
    if (frames.size() >= 6) {
      r.version = frames[0];
      r.request_id = frames[1];
      r.domain = frames[2];
      r.address = frames[3];
      r.identity = frames[4];
      r.mechanism = frames[5];
      r.credentials.assign(frames.begin() + 6, frames.end());
    }
    const ZapVerdict v = zap_decide(r, channel_keys(), self);
    if (!v.allowed) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      XDS_LOG_WARN("internal channel: refused a peer: {}", v.reason);
    }
    rep.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
    rep.send(zmq::buffer(r.request_id), zmq::send_flags::sndmore);
    rep.send(zmq::buffer(std::string(v.allowed ? "200" : "400")), zmq::send_flags::sndmore);
    rep.send(zmq::buffer(v.allowed ? std::string("OK") : v.reason), zmq::send_flags::sndmore);
    rep.send(zmq::str_buffer(""), zmq::send_flags::sndmore);  // user id
    rep.send(zmq::str_buffer(""), zmq::send_flags::none);     // metadata
  }
}

}  // namespace xds::protocol
