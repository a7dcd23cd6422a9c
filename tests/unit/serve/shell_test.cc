// The shell's routing of cancels (serve/shell.h) over real ZeroMQ sockets: the test plays the
// gateway (a DEALER on the shell's ROUTER), two DP groups (PULLs on the shell's PUSHes) and an
// output process (a PUSH on the shell's input). A cancel reaches the group the request was
// placed on and no other; after that group says the request ended, a cancel reaches nobody;
// a cooperative prefill instance sends every cancel to every group.
//
// "Reaches no other" is checked with a marker: once the shell has handled the cancel (the
// holder has it, or a later message on the same socket arrived), the gateway sends a Ping,
// which the shell relays to every group. A group's PUSH is FIFO, so the next message of a
// group the cancel did not reach is that Ping.
#include "serve/shell.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "protocol/messages.h"
#include "protocol/zmq_io.h"

namespace xds::serve {
namespace {

using protocol::CancelMsg;
using protocol::EndedMsg;
using protocol::Message;
using protocol::PingMsg;
using protocol::RequestMsg;
using protocol::ShutdownMsg;

constexpr int kGroups = 2;

// The next message on `s` within `timeout_ms` that is not a Wake (the shell wakes every group
// after each placement), or nullopt.
std::optional<Message> next(zmq::socket_t& s, int timeout_ms = 5000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, left) == 0) return std::nullopt;
    auto m = protocol::recv_message(s, /*dontwait=*/true);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (!m.ok() || !m->has_value()) return std::nullopt;
    if (std::holds_alternative<protocol::WakeMsg>(**m)) continue;
    return std::move(**m);
  }
}

class ShellRouting : public ::testing::Test {
 protected:
  void start(bool cooperative) {
    const std::string tag =
        std::string(::testing::UnitTest::GetInstance()->current_test_info()->name());
    ShellOptions o;
    o.group_heartbeat_interval_ms = 600'000;  // no heartbeat ping among the tests' markers
    o.listen = protocol::abstract_ipc_address("shell-test-" + tag + "-listen");
    o.shell_input = protocol::abstract_ipc_address("shell-test-" + tag + "-input");
    for (int g = 0; g < kGroups; ++g) {
      o.group_inputs.push_back(
          protocol::abstract_ipc_address("shell-test-" + tag + "-group" + std::to_string(g)));
    }
    o.cooperative = cooperative;
    o.role = cooperative ? "prefill" : "colocated";
    o.kv_blocks_per_group = 1000;
    shell_.emplace(o);
    thread_ = std::thread([this] { status_ = shell_->run(); });

    gateway_.set(zmq::sockopt::routing_id, "gateway-0");
    gateway_.connect(o.listen);
    input_.connect(o.shell_input);
    for (int g = 0; g < kGroups; ++g) {
      groups_.emplace_back(ctx_, zmq::socket_type::pull);
      groups_.back().connect(o.group_inputs[static_cast<size_t>(g)]);
    }
  }

  void TearDown() override {
    if (thread_.joinable()) {
      ASSERT_TRUE(protocol::send_message(gateway_, ShutdownMsg{}).ok());
      thread_.join();
      EXPECT_TRUE(status_.ok()) << status_.to_string();
    }
  }

  void place(const std::string& id) {
    RequestMsg r;
    r.request.id = id;
    r.request.prompt = {1, 2, 3};
    r.request.sampling.max_tokens = 4;
    ASSERT_TRUE(protocol::send_message(gateway_, r).ok());
  }

  // The group `id` was placed on (the only one that received it).
  int holder_of(const std::string& id) {
    for (int g = 0; g < kGroups; ++g) {
      auto m = next(groups_[static_cast<size_t>(g)], 300);
      if (!m) continue;
      const auto* r = std::get_if<RequestMsg>(&*m);
      EXPECT_NE(r, nullptr) << "group " << g << " got another kind first";
      if (r != nullptr && r->request.id == id) return g;
    }
    return -1;
  }

  static CancelMsg cancel_of(const std::string& id) {
    CancelMsg c;
    c.request_id = id;
    return c;
  }

  // Group g's next message is a cancel of `id`.
  void expect_cancel(int g, const std::string& id) {
    auto m = next(groups_[static_cast<size_t>(g)]);
    ASSERT_TRUE(m.has_value()) << "group " << g << " got nothing";
    const auto* c = std::get_if<CancelMsg>(&*m);
    ASSERT_NE(c, nullptr) << "group " << g << " got another kind";
    EXPECT_EQ(c->request_id, id);
  }

  // The marker: a Ping through the gateway; group g's next message must be it.
  void send_marker() {
    PingMsg p;
    p.probe_id = "marker";
    ASSERT_TRUE(protocol::send_message(gateway_, p).ok());
  }
  void expect_marker(int g) {
    auto m = next(groups_[static_cast<size_t>(g)]);
    ASSERT_TRUE(m.has_value()) << "group " << g << " got nothing";
    EXPECT_TRUE(std::holds_alternative<PingMsg>(*m))
        << "group " << g << " got another kind (a cancel meant for another group?)";
  }

  zmq::context_t ctx_{1};
  zmq::socket_t gateway_{ctx_, zmq::socket_type::dealer};
  zmq::socket_t input_{ctx_, zmq::socket_type::push};
  std::vector<zmq::socket_t> groups_;
  std::optional<Shell> shell_;
  std::thread thread_;
  Status status_;
};

TEST_F(ShellRouting, CancelsReachOnlyTheGroupHoldingTheRequest) {
  start(/*cooperative=*/false);
  place("a");
  const int holder = holder_of("a");
  ASSERT_GE(holder, 0);
  const int other = 1 - holder;

  // From the gateway (a client went away), then from an output process (a stop string).
  ASSERT_TRUE(protocol::send_message(gateway_, cancel_of("a")).ok());
  expect_cancel(holder, "a");
  ASSERT_TRUE(protocol::send_message(input_, cancel_of("a")).ok());
  expect_cancel(holder, "a");
  send_marker();
  expect_marker(holder);
  expect_marker(other);

  // The holder releases it: the shell forgets where it was, and a late cancel goes nowhere.
  // Ended and the cancels travel on the one input socket, in order: once z's holder has z's
  // cancel, the shell has handled everything sent before it.
  place("z");
  const int z_holder = holder_of("z");
  ASSERT_GE(z_holder, 0);
  EndedMsg ended;
  ended.group = holder;
  ended.request_ids = {"a"};
  ASSERT_TRUE(protocol::send_message(input_, ended).ok());
  ASSERT_TRUE(protocol::send_message(input_, cancel_of("a")).ok());
  ASSERT_TRUE(protocol::send_message(input_, cancel_of("z")).ok());
  expect_cancel(z_holder, "z");
  send_marker();
  expect_marker(0);
  expect_marker(1);
}

TEST_F(ShellRouting, AnEndedFromAnotherGroupDoesNotForgetTheHolder) {
  start(/*cooperative=*/false);
  place("b");
  const int holder = holder_of("b");
  ASSERT_GE(holder, 0);
  EndedMsg ended;  // not the holder's: it must not end the routing of "b"
  ended.group = 1 - holder;
  ended.request_ids = {"b"};
  ASSERT_TRUE(protocol::send_message(input_, ended).ok());
  ASSERT_TRUE(protocol::send_message(input_, cancel_of("b")).ok());  // after it, in order
  expect_cancel(holder, "b");
}

TEST_F(ShellRouting, ACooperativeInstanceCancelsOnEveryGroup) {
  start(/*cooperative=*/true);
  place("c");
  for (int g = 0; g < kGroups; ++g) {  // every group holds it until they agree who prefills
    auto m = next(groups_[static_cast<size_t>(g)]);
    ASSERT_TRUE(m.has_value());
    const auto* r = std::get_if<RequestMsg>(&*m);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->request.id, "c");
  }
  ASSERT_TRUE(protocol::send_message(gateway_, cancel_of("c")).ok());
  expect_cancel(0, "c");
  expect_cancel(1, "c");
}

}  // namespace
}  // namespace xds::serve
