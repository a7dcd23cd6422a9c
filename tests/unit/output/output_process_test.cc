// The output process over real ZeroMQ sockets, in one process: the loop runs on a thread, the
// test plays the DP group (PUSH of kRequest / kTokens, PULL of kCancel) and two gateways (a
// PULL each, one over tcp, one over ipc). References: Tokenizer::decode of the ids and the
// text before the stop string.
#include "output/output_process.h"

#include <thread>
#include <variant>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "protocol/messages.h"
#include "protocol/zmq_io.h"
#include "output_test_util.h"

namespace xds::output {
namespace {

using protocol::EngineRequest;
using protocol::TokenDelta;
using protocol::OutputDelta;
using protocol::Message;
using protocol::MessageKind;
using protocol::kind_of;
using protocol::send_message;
using protocol::recv_message;
using protocol::abstract_ipc_address;

constexpr int kReceiveTimeoutMs = 20000;  // a hang fails the test instead of wedging it

zmq::socket_t pull_socket(zmq::context_t& ctx, const std::string& address) {
  zmq::socket_t s(ctx, zmq::socket_type::pull);
  s.set(zmq::sockopt::rcvtimeo, kReceiveTimeoutMs);
  s.set(zmq::sockopt::linger, 0);
  s.bind(address);
  return s;
}

Message receive(zmq::socket_t& s) {
  auto m = recv_message(s, /*dontwait=*/false);
  XDS_CHECK(m.ok(), "{}", m.status().to_string());
  XDS_CHECK(m->has_value(), "no message within {} ms", kReceiveTimeoutMs);
  return std::move(**m);
}

EngineRequest request(const std::string& id, const std::string& reply_to) {
  EngineRequest r;
  r.id = id;
  r.reply_to = reply_to;
  return r;
}

struct Choice {
  std::string text;
  std::string finish_reason;
  std::vector<int32_t> token_ids;
  std::string error;
};

// Reads kOutput messages from `gateway` until the request's choice 0 finished.
Choice collect(zmq::socket_t& gateway, const std::string& id) {
  Choice c;
  while (c.finish_reason.empty()) {
    const Message m = receive(gateway);
    EXPECT_EQ(kind_of(m), MessageKind::kOutput);
    const auto* out = std::get_if<protocol::OutputMsg>(&m);
    if (out == nullptr) continue;
    for (const OutputDelta& d : out->outputs) {
      EXPECT_EQ(d.request_id, id) << "a delta reached the wrong gateway";
      c.text += d.text;
      c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
      c.error += d.error;
      if (!d.finish_reason.empty()) c.finish_reason = d.finish_reason;
    }
  }
  return c;
}

TEST(OutputProcess, TwoRequestsTwoGatewaysAndAStopString) {
  const Tokenizer& tok = test::tokenizer("kjv");
  const std::string verse_a = "In the beginning God created the heaven and the earth.";
  const std::string verse_b = "And God said, Let there be light: and there was light.";
  const auto ids_a = tok.encode(verse_a, false);
  const auto ids_b = tok.encode(verse_b, false);
  ASSERT_TRUE(ids_a.ok() && ids_b.ok());

  zmq::context_t ctx(1);
  zmq::socket_t gateway_tcp = pull_socket(ctx, "tcp://127.0.0.1:*");
  const std::string tcp_address = gateway_tcp.get(zmq::sockopt::last_endpoint);
  const std::string ipc_address = abstract_ipc_address("output-test-gateway");
  zmq::socket_t gateway_ipc = pull_socket(ctx, ipc_address);
  const std::string cancel_address = abstract_ipc_address("output-test-cancel");
  zmq::socket_t device_cancel = pull_socket(ctx, cancel_address);

  OutputProcessOptions o;
  o.model_dir = test::source_root() + "/models/kjv-moe-tiny";
  o.listen_address = abstract_ipc_address("output-test-in");
  o.cancel_address = cancel_address;
  int rc = -1;
  std::thread loop([&] { rc = run_output_process(o); });

  zmq::socket_t device(ctx, zmq::socket_type::push);
  device.set(zmq::sockopt::linger, 0);
  device.connect(o.listen_address);

  // A malformed frame first: skipped, the loop goes on.
  const std::string garbage = "\xc1 not msgpack";
  device.send(zmq::buffer(garbage), zmq::send_flags::none);

  protocol::RequestMsg ra{request("cmpl-a", tcp_address)};
  ra.request.output.stop = {"created"};
  ASSERT_TRUE(send_message(device, ra).ok());
  protocol::RequestMsg rb{request("cmpl-b", ipc_address)};
  ASSERT_TRUE(send_message(device, rb).ok());
  // A request that cannot be set up: an error delta and a cancel.
  protocol::RequestMsg rc_bad{request("cmpl-c", ipc_address)};
  rc_bad.request.output.reasoning_parser = "unknown_parser";

  // Interleaved steps of two tokens; each request's last step says "length".
  const size_t steps = std::max(ids_a->size(), ids_b->size());
  for (size_t i = 0; i < steps; i += 2) {
    protocol::TokensMsg m;
    for (const auto* p : {&*ids_a, &*ids_b}) {
      if (i >= p->size()) continue;
      TokenDelta d;
      d.request_id = p == &*ids_a ? "cmpl-a" : "cmpl-b";
      d.tokens.assign(p->begin() + i, p->begin() + std::min(p->size(), i + 2));
      if (i + 2 >= p->size()) d.finish_reason = "length";
      m.tokens.push_back(std::move(d));
    }
    ASSERT_TRUE(send_message(device, m).ok());
  }

  const Choice a = collect(gateway_tcp, "cmpl-a");
  EXPECT_EQ(a.text, verse_a.substr(0, verse_a.find("created")));
  EXPECT_EQ(a.finish_reason, "stop");
  EXPECT_LT(a.token_ids.size(), ids_a->size());
  const Choice b = collect(gateway_ipc, "cmpl-b");
  EXPECT_EQ(b.text, tok.decode(*ids_b, true));
  EXPECT_EQ(b.token_ids, *ids_b);
  EXPECT_EQ(b.finish_reason, "length");

  // The stop string finished cmpl-a before the device did: the device is told.
  const Message cancel_msg = receive(device_cancel);
  EXPECT_EQ(kind_of(cancel_msg), MessageKind::kCancel);
  ASSERT_TRUE(std::holds_alternative<protocol::CancelMsg>(cancel_msg));
  const auto& cancel = std::get<protocol::CancelMsg>(cancel_msg);
  EXPECT_EQ(cancel.request_id, "cmpl-a");
  EXPECT_EQ(cancel.index, 0);  // that choice only: the others of an n > 1 request go on

  ASSERT_TRUE(send_message(device, rc_bad).ok());
  const Choice c = collect(gateway_ipc, "cmpl-c");
  EXPECT_EQ(c.finish_reason, "abort");
  EXPECT_NE(c.error.find("unknown_parser"), std::string::npos);
  const Message cancel_c_msg = receive(device_cancel);
  ASSERT_TRUE(std::holds_alternative<protocol::CancelMsg>(cancel_c_msg));
  const auto& cancel_c = std::get<protocol::CancelMsg>(cancel_c_msg);
  EXPECT_EQ(cancel_c.request_id, "cmpl-c");
  EXPECT_EQ(cancel_c.index, -1);  // every choice

  ASSERT_TRUE(send_message(device, protocol::ShutdownMsg{}).ok());
  loop.join();
  EXPECT_EQ(rc, 0);
}

TEST(OutputProcess, BadListenAddressFails) {
  OutputProcessOptions o;
  o.listen_address = "nonsense://x";
  EXPECT_EQ(run_output_process(o), 1);
}

}  // namespace
}  // namespace xds::output
