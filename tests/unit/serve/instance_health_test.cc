// The instance's readiness endpoint (serve/instance_health.h): the host taken from --listen,
// GET /health's 503 -> 200 as the flag turns (read with the independent test client), and the
// shell's flag itself over real ZeroMQ sockets: false until every DP group has spoken (the
// test plays the groups), false again once the shell stops.
#include "serve/instance_health.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "http_test_client.h"
#include "protocol/messages.h"
#include "protocol/zmq_io.h"
#include "serve/shell.h"

namespace xds::serve {
namespace {

TEST(InstanceHealth, TheHostComesFromTheListenAddress) {
  EXPECT_EQ(listen_host("tcp://0.0.0.0:8100").value(), "0.0.0.0");
  EXPECT_EQ(listen_host("tcp://127.0.0.1:9").value(), "127.0.0.1");
  EXPECT_EQ(listen_host("tcp://*:8100").value(), "0.0.0.0");
  EXPECT_EQ(listen_host("tcp://[::1]:8100").value(), "::1");
  for (const char* bad : {"ipc://@shell", "tcp://:8100", "0.0.0.0:8100", "tcp://host"}) {
    const auto r = listen_host(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().to_string();
  }
}

testing::ParsedResponse get_health(uint16_t port) {
  testing::TestClient c(port);
  EXPECT_TRUE(c.connected());
  EXPECT_TRUE(c.send_all(testing::get_request("/health")));
  return c.read_response();
}

TEST(InstanceHealth, AnswersServiceUnavailableUntilReady) {
  std::atomic<bool> ready{false};
  auto server = start_instance_health("127.0.0.1", 0, "decode", ready);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  const uint16_t port = (*server)->port();
  testing::ParsedResponse r = get_health(port);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("\"starting\""), std::string::npos) << r.body;
  ready.store(true);
  r = get_health(port);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"ready\""), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\"decode\""), std::string::npos) << r.body;
  ready.store(false);
  EXPECT_EQ(get_health(port).status, 503);
  EXPECT_FALSE(start_instance_health("127.0.0.1", 70000, "decode", ready).ok());
}

// Polls `flag` for up to 5 s; true once it reads `want`.
bool becomes(const std::atomic<bool>& flag, bool want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (flag.load() == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(InstanceHealth, TheShellIsReadyOnceEveryGroupHasSpoken) {
  constexpr int kGroups = 2;
  std::atomic<bool> ready{false};
  ShellOptions o;
  o.group_heartbeat_interval_ms = 600'000;  // no heartbeat verdicts during the test
  o.listen = protocol::abstract_ipc_address("health-test-listen");
  o.shell_input = protocol::abstract_ipc_address("health-test-input");
  for (int g = 0; g < kGroups; ++g) {
    o.group_inputs.push_back(
        protocol::abstract_ipc_address("health-test-group" + std::to_string(g)));
  }
  o.kv_blocks_per_group = 1000;
  o.ready = &ready;
  Shell shell(o);
  Status status;
  std::thread loop([&] { status = shell.run(); });

  zmq::context_t ctx{1};
  zmq::socket_t gateway{ctx, zmq::socket_type::dealer};
  zmq::socket_t input{ctx, zmq::socket_type::push};
  gateway.set(zmq::sockopt::routing_id, "gateway-0");
  gateway.connect(o.listen);
  input.connect(o.shell_input);
  auto load_of = [](int32_t g) {
    protocol::LoadMsg m;
    protocol::GroupLoad l;
    l.group = g;
    l.kv_blocks_total = 1000;
    m.loads.push_back(l);
    return m;
  };

  // Group 0 speaks, group 1 not yet: not ready however long the shell runs.
  ASSERT_TRUE(protocol::send_message(input, load_of(0)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // several loop turns
  EXPECT_FALSE(ready.load()) << "ready with DP group 1 silent";
  ASSERT_TRUE(protocol::send_message(input, load_of(1)).ok());
  EXPECT_TRUE(becomes(ready, true)) << "not ready after every group spoke";
  ASSERT_TRUE(protocol::send_message(gateway, protocol::ShutdownMsg{}).ok());
  loop.join();
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_FALSE(ready.load()) << "still ready after the shell stopped";
}

}  // namespace
}  // namespace xds::serve
