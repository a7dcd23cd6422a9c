// Who may speak on the internal ZeroMQ channels: gateway <-> shell, shell <-> DP groups,
// DP group -> output process -> gateway.
//
// Every channel runs CURVE (libzmq's CurveZMQ: X25519 key exchange, encrypted and
// authenticated frames) with keys derived from one cluster secret: a server keypair that every
// binding socket uses and a client keypair that every connecting socket uses. `serve` draws a
// secret per run and its children inherit it (fork); `instance` and `gateway`, started apart
// (on other hosts too), read it from --cluster-secret-file (mode 0600). A peer without the
// secret cannot finish the handshake, so it reads nothing and sends nothing.
//
// On top of that each binding socket is guarded by the ZAP handler of its context (RFC 27,
// ZapGuard): it admits a CURVE client only with the cluster's client key, and an ipc peer
// only when the kernel's SO_PEERCRED (which libzmq puts in the ZAP request's address,
// "...:uid:gid:pid") names our own uid. Without keys (library tests that build a shell or an
// output process directly) sockets run ZeroMQ's NULL mechanism and only the uid rule holds,
// for ipc endpoints.
//
// Thread-safety: set_channel_keys() once at start-up, before any socket exists; the rest reads
// it. ZapGuard runs one thread per context.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "base/status.h"

namespace xds::protocol {

// 32 bytes from which every key is derived.
struct ClusterSecret {
  std::array<uint8_t, 32> bytes{};
};

// A new random secret (serve's per-run secret).
ClusterSecret random_cluster_secret();
// The secret in `path`: any non-empty content, hashed to 32 bytes. InvalidArgument naming the
// path when it cannot be read, is empty, or can be read or written by group or others
// (--cluster-secret-file must be mode 0600 or stricter).
Result<ClusterSecret> read_cluster_secret(const std::string& path);

// Z85 text (40 characters) of each key, as libzmq's socket options take them.
struct CurveKeys {
  std::string server_public, server_secret;
  std::string client_public, client_secret;
  std::array<uint8_t, 32> client_public_raw{};  // what a ZAP request carries
};
CurveKeys derive_curve_keys(const ClusterSecret& secret);

// The process's keys (inherited by forked children). Unset (nullopt): NULL mechanism.
void set_channel_keys(std::optional<CurveKeys> keys);
const CurveKeys* channel_keys();

// Before bind(endpoint) / connect(endpoint): the mechanism (CURVE with the process's keys)
// and, for a binding socket, the ZAP domain of its transport.
void secure_binding(zmq::socket_t& socket, const std::string& endpoint);
void secure_connecting(zmq::socket_t& socket);

// One ZAP request (RFC 27) and the rule applied to it.
struct ZapRequest {
  std::string version, request_id, domain, address, identity, mechanism;
  std::vector<std::string> credentials;
};
struct ZapVerdict {
  bool allowed = false;
  std::string reason;  // why not (logged), empty when allowed
};
// `keys`: the process's (null: none). `self`: our effective uid.
ZapVerdict zap_decide(const ZapRequest& r, const CurveKeys* keys, uid_t self);
// The uid in an ipc peer's ZAP address ("<anything>:uid:gid:pid"), or nullopt.
std::optional<uid_t> ipc_peer_uid(const std::string& address);

// The ZAP handler of one context: a thread answering inproc://zeromq.zap.01 until destroyed.
// Create it before the context's guarded sockets bind; destroy it before the context.
class ZapGuard {
 public:
  static Result<std::unique_ptr<ZapGuard>> start(zmq::context_t& ctx);
  ~ZapGuard();
  ZapGuard(const ZapGuard&) = delete;
  ZapGuard& operator=(const ZapGuard&) = delete;
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  ZapGuard() = default;
  void run(zmq::context_t& ctx, std::atomic<int>& ready);

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> refused_{0};
  std::string bind_error_;
};

}  // namespace xds::protocol
