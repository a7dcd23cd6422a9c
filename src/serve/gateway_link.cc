#include "serve/gateway_link.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>

#include <zmq.hpp>

#include "base/log.h"
#include "protocol/channel_security.h"
#include "protocol/zmq_io.h"

namespace xds::serve {

struct GatewayLink::Sockets {
  zmq::context_t ctx{1};
  std::unique_ptr<protocol::ZapGuard> zap;  // before the sockets: destroyed after them
  std::vector<zmq::socket_t> dealers;
  zmq::socket_t pull{ctx, zmq::socket_type::pull};
};

Result<std::unique_ptr<GatewayLink>> GatewayLink::start(const std::vector<std::string>& instances,
                                                        const std::string& output_bind,
                                                        Callback on_message) {
  std::unique_ptr<GatewayLink> link(new GatewayLink());
  link->on_message_ = std::move(on_message);
  link->sockets_ = std::make_unique<Sockets>();
  Sockets& s = *link->sockets_;
  if (instances.empty()) return invalid_argument("gateway: no instance address");
  XDS_ASSIGN_OR_RETURN(s.zap, protocol::ZapGuard::start(s.ctx));
  try {
    s.pull.set(zmq::sockopt::linger, 0);
    protocol::secure_binding(s.pull, output_bind);
    s.pull.bind(output_bind);
    link->reply_to_ = s.pull.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return unavailable("gateway: cannot bind {}: {}", output_bind, e.what());
  }
  for (const std::string& instance : instances) {
    try {
      zmq::socket_t d(s.ctx, zmq::socket_type::dealer);
      d.set(zmq::sockopt::linger, 1000);
      protocol::secure_connecting(d);
      d.connect(instance);
      s.dealers.push_back(std::move(d));
    } catch (const zmq::error_t& e) {
      return unavailable("gateway: cannot reach the instance at {}: {}", instance, e.what());
    }
  }
  link->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (link->wake_fd_ < 0) return internal_error("gateway: eventfd failed: {}", errno);
  link->thread_ = std::thread([l = link.get()] { l->loop(); });
  return link;
}

GatewayLink::~GatewayLink() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void GatewayLink::post(int to, protocol::Message m) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.emplace_back(to, std::move(m));
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void GatewayLink::stop() {
  if (stop_.exchange(true)) return;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void GatewayLink::loop() {
  Sockets& s = *sockets_;
  std::deque<std::pair<int, protocol::Message>> batch;
  const int n = static_cast<int>(s.dealers.size());
  auto flush_outbox = [&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch.swap(outbox_);
    }
    for (const auto& [to, m] : batch) {
      for (int i = 0; i < n; ++i) {
        if (to != kAllInstances && to != i) continue;
        Status st = protocol::send_message(s.dealers[static_cast<size_t>(i)], m);
        if (!st.ok()) XDS_LOG_WARN("gateway: {}", st.message());
      }
    }
    batch.clear();
  };
  std::vector<zmq::pollitem_t> items;
  while (!stop_.load(std::memory_order_relaxed)) {
    items.clear();
    for (zmq::socket_t& d : s.dealers) items.push_back({d.handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({s.pull.handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(1000));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      XDS_LOG_ERROR("gateway: poll failed: {}", e.what());
      return;
    }
    if (items.back().revents & ZMQ_POLLIN) {
      uint64_t v = 0;
      (void)!::read(wake_fd_, &v, sizeof(v));
    }
    flush_outbox();
    for (int i = -1; i < n; ++i) {
      zmq::socket_t& sock = i < 0 ? s.pull : s.dealers[static_cast<size_t>(i)];
      while (true) {
        auto m = protocol::recv_message(sock, /*dontwait=*/true);
        if (!m.ok()) {
          XDS_LOG_WARN("gateway: {}", m.status().message());
          continue;
        }
        if (!m->has_value()) break;
        on_message_(i < 0 ? kOutputs : i, std::move(**m));
      }
    }
  }
  flush_outbox();  // a last kShutdown / kCancel
}

}  // namespace xds::serve
