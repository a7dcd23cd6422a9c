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
  std::vector<zmq::socket_t> dealers;       // [instances]; a closed one: disconnected
  zmq::socket_t pull{ctx, zmq::socket_type::pull};
};

namespace {

// A DEALER to an instance's shell, over the cluster secret's channel (the shell answers only a
// peer that holds the secret).
Result<zmq::socket_t> open_dealer(zmq::context_t& ctx, const std::string& address) {
  try {
    zmq::socket_t d(ctx, zmq::socket_type::dealer);
    d.set(zmq::sockopt::linger, 1000);
    protocol::secure_connecting(d);
    d.connect(address);
    return d;
  } catch (const zmq::error_t& e) {
    return unavailable("gateway: cannot reach the instance at {}: {}", address, e.what());
  }
}

}  // namespace

Result<std::unique_ptr<GatewayLink>> GatewayLink::start(const std::vector<std::string>& instances,
                                                        const std::string& output_bind,
                                                        Callback on_message, bool may_start_empty) {
  std::unique_ptr<GatewayLink> link(new GatewayLink());
  link->on_message_ = std::move(on_message);
  link->sockets_ = std::make_unique<Sockets>();
  Sockets& s = *link->sockets_;
  if (instances.empty() && !may_start_empty) {
    return invalid_argument("gateway: no instance address");
  }
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
    XDS_ASSIGN_OR_RETURN(zmq::socket_t d, open_dealer(s.ctx, instance));
    s.dealers.push_back(std::move(d));
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

void GatewayLink::connect(int index, std::string address) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    membership_.emplace_back(index, std::move(address));
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void GatewayLink::disconnect(int index) {
  connect(index, std::string());
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
  std::deque<std::pair<int, std::string>> changes;
  auto apply_membership = [&] {
    for (auto& [index, address] : changes) {
      if (address.empty()) {  // disconnect
        if (index >= 0 && static_cast<size_t>(index) < s.dealers.size()) {
          s.dealers[static_cast<size_t>(index)].close();
        }
        continue;
      }
      if (static_cast<size_t>(index) != s.dealers.size()) {
        XDS_LOG_ERROR("gateway: instance {} connected out of order ({} known)", index,
                      s.dealers.size());
        continue;
      }
      auto d = open_dealer(s.ctx, address);
      if (!d.ok()) XDS_LOG_WARN("{}", d.status().message());
      s.dealers.push_back(d.ok() ? std::move(*d) : zmq::socket_t());
    }
    changes.clear();
  };
  auto flush_outbox = [&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      changes.swap(membership_);
      batch.swap(outbox_);
    }
    apply_membership();
    const int n = static_cast<int>(s.dealers.size());
    for (const auto& [to, m] : batch) {
      for (int i = 0; i < n; ++i) {
        if (to != kAllInstances && to != i) continue;
        if (!s.dealers[static_cast<size_t>(i)]) continue;  // disconnected
        Status st = protocol::send_message(s.dealers[static_cast<size_t>(i)], m);
        if (!st.ok()) XDS_LOG_WARN("gateway: {}", st.message());
      }
    }
    batch.clear();
  };
  std::vector<zmq::pollitem_t> items;
  while (!stop_.load(std::memory_order_relaxed)) {
    items.clear();
    for (zmq::socket_t& d : s.dealers) {
      if (d) items.push_back({d.handle(), 0, ZMQ_POLLIN, 0});
    }
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
    const int n = static_cast<int>(s.dealers.size());
    for (int i = -1; i < n; ++i) {
      zmq::socket_t& sock = i < 0 ? s.pull : s.dealers[static_cast<size_t>(i)];
      if (!sock) continue;  // disconnected
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
