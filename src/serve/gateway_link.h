// The gateway's messaging thread: the only owner of its ZeroMQ sockets.
//
//   DEALER ──▶ each instance's shell (requests, cancellations, health probes; kRejected,
//              kLoad and kPong come back on it), one per instance
//   PULL   ◀── the DP groups' output processes (kOutput), bound on `output_bind`
//
// Other threads hand it messages with post(), which queues them under a mutex and wakes the
// thread through an eventfd polled beside the sockets; what arrives goes to `on_message`, on
// the messaging thread (keep it short: look up state, format, hand to the HTTP stream).
//
// Instances may come and go (membership in etcd): connect() adds a DEALER for the next index,
// disconnect() closes one (messages for it are dropped); both take effect on the messaging
// thread before the messages queued after them.
//
// Thread-safety: post(), connect(), disconnect() and stop() from any thread; the callback runs
// on the messaging thread.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.h"
#include "protocol/messages.h"

namespace xds::serve {

class GatewayLink {
 public:
  // `from`: the instance whose shell sent it, or kOutputs for the PULL socket.
  using Callback = std::function<void(int from, protocol::Message)>;
  static constexpr int kOutputs = -1;
  static constexpr int kAllInstances = -1;

  // Binds the PULL socket on output_bind (tcp://HOST:0 picks a port: reply_to() says which),
  // connects one DEALER to each of `instances` (none only when `may_start_empty`: the
  // instances come later through connect()), and starts the thread.
  static Result<std::unique_ptr<GatewayLink>> start(const std::vector<std::string>& instances,
                                                    const std::string& output_bind,
                                                    Callback on_message,
                                                    bool may_start_empty = false);
  ~GatewayLink();  // stop()

  // The address output processes send to (the bound endpoint).
  const std::string& reply_to() const { return reply_to_; }
  // Queues `m` for instance `to`'s shell (kAllInstances: every one).
  void post(int to, protocol::Message m);
  // A DEALER to `address` for instance `index`, which must be the number of instances
  // connected so far (indices are never reused).
  void connect(int index, std::string address);
  // Closes instance `index`'s DEALER.
  void disconnect(int index);
  void stop();

 private:
  GatewayLink() = default;
  void loop();

  std::string reply_to_;
  Callback on_message_;
  struct Sockets;
  std::unique_ptr<Sockets> sockets_;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::deque<std::pair<int, protocol::Message>> outbox_;  // guarded by mu_
  // connect (address) and disconnect ("") requests, in order; guarded by mu_.
  std::deque<std::pair<int, std::string>> membership_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace xds::serve
