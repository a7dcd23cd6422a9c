#include "serve/gateway_link.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>

#include <zmq.hpp>

#include "base/log.h"
#include "engine/zmq_io.h"

namespace xds::serve {

struct GatewayLink::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t dealer{ctx, zmq::socket_type::dealer};
  zmq::socket_t pull{ctx, zmq::socket_type::pull};
};

Result<std::unique_ptr<GatewayLink>> GatewayLink::start(const std::string& instance,
                                                        const std::string& output_bind,
                                                        Callback on_message) {
  std::unique_ptr<GatewayLink> link(new GatewayLink());
  link->on_message_ = std::move(on_message);
  link->sockets_ = std::make_unique<Sockets>();
  Sockets& s = *link->sockets_;
  try {
    s.pull.set(zmq::sockopt::linger, 0);
    s.pull.bind(output_bind);
    link->reply_to_ = s.pull.get(zmq::sockopt::last_endpoint);
    s.dealer.set(zmq::sockopt::linger, 1000);
    s.dealer.connect(instance);
  } catch (const zmq::error_t& e) {
    return unavailable("gateway: cannot bind {} or reach the instance at {}: {}", output_bind,
                       instance, e.what());
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

void GatewayLink::post(engine::Message m) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.push_back(std::move(m));
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
  std::deque<engine::Message> batch;
  auto flush_outbox = [&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch.swap(outbox_);
    }
    for (const engine::Message& m : batch) {
      Status st = engine::send_message(s.dealer, m);
      if (!st.ok()) XDS_LOG_WARN("gateway: {}", st.message());
    }
    batch.clear();
  };
  while (!stop_.load(std::memory_order_relaxed)) {
    zmq::pollitem_t items[] = {{s.dealer.handle(), 0, ZMQ_POLLIN, 0},
                               {s.pull.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 3, std::chrono::milliseconds(1000));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      XDS_LOG_ERROR("gateway: poll failed: {}", e.what());
      return;
    }
    if (items[2].revents & ZMQ_POLLIN) {
      uint64_t n = 0;
      (void)!::read(wake_fd_, &n, sizeof(n));
    }
    flush_outbox();
    for (zmq::socket_t* sock : {&s.dealer, &s.pull}) {
      while (true) {
        auto m = engine::recv_message(*sock, /*dontwait=*/true);
        if (!m.ok()) {
          XDS_LOG_WARN("gateway: {}", m.status().message());
          continue;
        }
        if (!m->has_value()) break;
        on_message_(std::move(**m));
      }
    }
  }
  flush_outbox();  // a last kShutdown / kCancel
}

}  // namespace xds::serve
