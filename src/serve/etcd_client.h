// A small client of etcd's v3 API over its JSON gateway (HTTP/1.1, Boost.Beast): the calls
// membership needs -- range over a prefix, put, lease grant / keep-alive / revoke, and a
// watch stream. The JSON of each call is serve/etcd_json.h's; this file only moves it.
//
// Every call opens its own connection (Connection: close) on its own io_context, so calls
// from different threads do not share state. Unary calls give up after `timeout`; a watch
// runs until its callback says stop, `stop` becomes true (checked every 200 ms), or the
// stream fails. No TLS and no etcd authentication: etcd is reached on a private network, and
// an entry in it is not trusted anyway (the gateway authenticates every instance over the
// cluster secret's channels, protocol/channel_security.h).
//
// Thread-safety: an EtcdClient is immutable after construction; calls may run concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "serve/etcd_json.h"

namespace xds::serve::etcd {

struct Endpoint {
  std::string host;
  std::string port;  // as text, for the resolver
};

// "http://HOST:PORT" (a trailing '/' allowed). InvalidArgument naming `flag` otherwise
// (https:// is refused: no TLS here).
Result<Endpoint> parse_endpoint(std::string_view url, std::string_view flag);

class Client {
 public:
  explicit Client(Endpoint endpoint,
                  std::chrono::milliseconds timeout = std::chrono::milliseconds(3000))
      : endpoint_(std::move(endpoint)), timeout_(timeout) {}

  Result<RangeAnswer> range_prefix(std::string_view prefix) const;
  Status put(std::string_view key, std::string_view value, int64_t lease) const;
  Result<LeaseGrant> grant(int64_t ttl_s) const;
  // The lease's remaining TTL; 0: etcd no longer knows it (expired or revoked).
  Result<int64_t> keep_alive(int64_t lease) const;
  Status revoke(int64_t lease) const;
  // Compacts the history up to `revision` (operators do this periodically; the tests force it).
  Status compact(int64_t revision) const;
  // Watches `prefix` from `start_revision`, handing each message to `on_message` until it
  // returns false (then ok), `stop` is set (Cancelled), or the stream fails or ends
  // (Unavailable).
  Status watch(std::string_view prefix, int64_t start_revision, const std::atomic<bool>& stop,
               const std::function<bool(const WatchMessage&)>& on_message) const;

  const Endpoint& endpoint() const { return endpoint_; }

 private:
  // POSTs `body` to `path`; the answer's body (any HTTP status: etcd's errors are JSON).
  Result<std::string> post(std::string_view path, std::string body) const;

  Endpoint endpoint_;
  std::chrono::milliseconds timeout_;
};

}  // namespace xds::serve::etcd
