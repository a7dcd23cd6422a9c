// The gateway's messaging thread: the only owner of its ZeroMQ sockets.
//
//   DEALER ──▶ the instance's shell (requests, cancellations, health probes; kRejected,
//              kLoad and kPong come back on it)
//   PULL   ◀── the DP groups' output processes (kOutput), bound on `output_bind`
//
// Other threads hand it messages with post(), which queues them under a mutex and wakes the
// thread through an eventfd polled beside the sockets; what arrives goes to `on_message`, on
// the messaging thread (keep it short: look up state, format, hand to the HTTP stream).
//
// Thread-safety: post() and stop() from any thread; the callback runs on the messaging thread.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"
#include "engine/request.h"

namespace xds::serve {

class GatewayLink {
 public:
  using Callback = std::function<void(engine::Message)>;

  // Binds the PULL socket on output_bind (tcp://HOST:0 picks a port: reply_to() says which),
  // connects the DEALER to `instance`, and starts the thread.
  static Result<std::unique_ptr<GatewayLink>> start(const std::string& instance,
                                                    const std::string& output_bind,
                                                    Callback on_message);
  ~GatewayLink();  // stop()

  // The address output processes send to (the bound endpoint).
  const std::string& reply_to() const { return reply_to_; }
  // Queues `m` for the shell.
  void post(engine::Message m);
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
  std::deque<engine::Message> outbox_;  // guarded by mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace xds::serve
