// The control messages' codec: every kind round-trips field by field (hand-built values, none
// of them a default), and decode() refuses another protocol version, malformed bytes and
// unknown kinds with an error that says so.
#include "protocol/messages.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace xds::protocol {
namespace {

// encode() then decode(); the decoded message must hold alternative M.
template <typename M>
M round_trip(const M& in) {
  const std::string bytes = encode(Message(in));
  Result<Message> out = decode(bytes.data(), bytes.size());
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  if (!out.ok()) return M{};
  EXPECT_TRUE(std::holds_alternative<M>(*out));
  if (!std::holds_alternative<M>(*out)) return M{};
  return std::get<M>(*out);
}

KvHandoff handoff() {
  KvHandoff h;
  h.link = "xds-link-3";
  h.ucx_address = "10.0.0.7:4711";
  h.transfer = 99;
  h.blocks = {4, 5, 9};
  h.rows = 37;
  h.output = {1234};
  h.kv_format = "m/61/16/2";
  h.prefill_group = 2;
  h.drafts = {7, 8};
  return h;
}

void expect_handoff(const KvHandoff& h) {
  EXPECT_EQ(h.link, "xds-link-3");
  EXPECT_EQ(h.ucx_address, "10.0.0.7:4711");
  EXPECT_EQ(h.transfer, 99u);
  EXPECT_EQ(h.blocks, (std::vector<int32_t>{4, 5, 9}));
  EXPECT_EQ(h.rows, 37);
  EXPECT_EQ(h.output, (std::vector<int32_t>{1234}));
  EXPECT_EQ(h.kv_format, "m/61/16/2");
  EXPECT_EQ(h.prefill_group, 2);
  EXPECT_EQ(h.drafts, (std::vector<int32_t>{7, 8}));
}

TokenLogprob logprob() {
  TokenLogprob l;
  l.token = 17;
  l.logprob = -0.5f;
  l.top = {{17, -0.5f}, {3, -1.25f}};
  return l;
}

void expect_logprob(const TokenLogprob& l) {
  EXPECT_EQ(l.token, 17);
  EXPECT_EQ(l.logprob, -0.5f);
  EXPECT_EQ(l.top, (std::vector<std::pair<int32_t, float>>{{17, -0.5f}, {3, -1.25f}}));
}

TEST(Messages, Request) {
  RequestMsg m;
  EngineRequest& r = m.request;
  r.id = "cmpl-1";
  r.prompt = {1, 2, 3};
  r.sampling.temperature = 0.5f;
  r.sampling.top_p = 0.75f;
  r.sampling.top_k = 40;
  r.sampling.seed = 12345678901234ULL;
  r.sampling.presence_penalty = 0.25f;
  r.sampling.frequency_penalty = -0.5f;
  r.sampling.repetition_penalty = 1.5f;
  r.sampling.max_tokens = 77;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = 3;
  r.sampling.n = 2;
  r.sampling.stop_token_ids = {5, 6};
  r.output.detokenize = false;
  r.output.skip_special_tokens = false;
  r.output.stop = {"\n\n", "END"};
  r.output.reasoning_parser = "deepseek_r1";
  r.output.prompt_in_reasoning = true;
  r.output.tool_call_parser = "qwen3";
  r.output.tools_requested = true;
  r.output.stream = true;
  r.output.echo_prompt_ids = true;
  r.reply_to = "tcp://127.0.0.1:9000";
  r.arrival_us = 555;
  r.phase = RequestPhase::kDecode;
  r.handoff = handoff();
  r.pool_number = 8;
  r.resume = {{4, 5}, {}};
  r.resume_finished = {0, 1};
  r.attempt = 3;
  m.incarnation = 0x8000000000000001ULL;

  EXPECT_EQ(round_trip(m).incarnation, 0x8000000000000001ULL);
  const EngineRequest o = round_trip(m).request;
  EXPECT_EQ(o.resume, (std::vector<std::vector<int32_t>>{{4, 5}, {}}));
  EXPECT_EQ(o.resume_finished, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(o.attempt, 3);
  EXPECT_EQ(o.id, "cmpl-1");
  EXPECT_EQ(o.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(o.sampling.temperature, 0.5f);
  EXPECT_EQ(o.sampling.top_p, 0.75f);
  EXPECT_EQ(o.sampling.top_k, 40);
  EXPECT_EQ(o.sampling.seed, 12345678901234ULL);
  EXPECT_EQ(o.sampling.presence_penalty, 0.25f);
  EXPECT_EQ(o.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(o.sampling.repetition_penalty, 1.5f);
  EXPECT_EQ(o.sampling.max_tokens, 77);
  EXPECT_TRUE(o.sampling.ignore_eos);
  EXPECT_EQ(o.sampling.logprobs, 3);
  EXPECT_EQ(o.sampling.n, 2);
  EXPECT_EQ(o.sampling.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_FALSE(o.output.detokenize);
  EXPECT_FALSE(o.output.skip_special_tokens);
  EXPECT_EQ(o.output.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(o.output.reasoning_parser, "deepseek_r1");
  EXPECT_TRUE(o.output.prompt_in_reasoning);
  EXPECT_EQ(o.output.tool_call_parser, "qwen3");
  EXPECT_TRUE(o.output.tools_requested);
  EXPECT_TRUE(o.output.stream);
  EXPECT_TRUE(o.output.echo_prompt_ids);
  EXPECT_EQ(o.reply_to, "tcp://127.0.0.1:9000");
  EXPECT_EQ(o.arrival_us, 555);
  EXPECT_EQ(o.phase, RequestPhase::kDecode);
  expect_handoff(o.handoff);
  EXPECT_EQ(o.pool_number, 8u);
}

TEST(Messages, Cancel) {
  const CancelMsg o = round_trip(CancelMsg{"cmpl-2", 3});
  EXPECT_EQ(o.request_id, "cmpl-2");
  EXPECT_EQ(o.index, 3);
}

TEST(Messages, Tokens) {
  TokensMsg m;
  TokenDelta d;
  d.request_id = "cmpl-3";
  d.index = 1;
  d.tokens = {10, 11};
  d.logprobs = {logprob()};
  d.finish_reason = "length";
  d.prompt_tokens = 12;
  d.cached_tokens = 8;
  d.handoff = handoff();
  m.tokens = {d, TokenDelta{}};
  const TokensMsg o = round_trip(m);
  ASSERT_EQ(o.tokens.size(), 2u);
  const TokenDelta& t = o.tokens[0];
  EXPECT_EQ(t.request_id, "cmpl-3");
  EXPECT_EQ(t.index, 1);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{10, 11}));
  ASSERT_EQ(t.logprobs.size(), 1u);
  expect_logprob(t.logprobs[0]);
  EXPECT_EQ(t.finish_reason, "length");
  EXPECT_EQ(t.prompt_tokens, 12);
  EXPECT_EQ(t.cached_tokens, 8);
  expect_handoff(t.handoff);
  EXPECT_EQ(o.tokens[1].request_id, "");
}

TEST(Messages, Output) {
  OutputMsg m;
  OutputDelta d;
  d.request_id = "cmpl-4";
  d.index = 2;
  d.text = "héllo";
  d.reasoning = "think";
  d.token_ids = {20, 21};
  d.logprobs = {logprob()};
  d.token_texts = {"hé", "llo"};
  d.tool_calls = {ToolCall{"call_1", "get_weather", "{\"city\":\"Oslo\"}"}};
  d.finish_reason = "tool_calls";
  d.prompt_tokens = 30;
  d.completion_tokens = 2;
  d.cached_tokens = 16;
  d.error = "boom";
  d.handoff = handoff();
  m.outputs = {d};
  const OutputMsg o = round_trip(m);
  ASSERT_EQ(o.outputs.size(), 1u);
  const OutputDelta& t = o.outputs[0];
  EXPECT_EQ(t.request_id, "cmpl-4");
  EXPECT_EQ(t.index, 2);
  EXPECT_EQ(t.text, "héllo");
  EXPECT_EQ(t.reasoning, "think");
  EXPECT_EQ(t.token_ids, (std::vector<int32_t>{20, 21}));
  ASSERT_EQ(t.logprobs.size(), 1u);
  expect_logprob(t.logprobs[0]);
  EXPECT_EQ(t.token_texts, (std::vector<std::string>{"hé", "llo"}));
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_EQ(t.tool_calls[0].id, "call_1");
  EXPECT_EQ(t.tool_calls[0].name, "get_weather");
  EXPECT_EQ(t.tool_calls[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_EQ(t.finish_reason, "tool_calls");
  EXPECT_EQ(t.prompt_tokens, 30);
  EXPECT_EQ(t.completion_tokens, 2);
  EXPECT_EQ(t.cached_tokens, 16);
  EXPECT_EQ(t.error, "boom");
  expect_handoff(t.handoff);
}

TEST(Messages, Load) {
  GroupLoad l;
  l.group = 3;
  l.running = 4;
  l.waiting = 5;
  l.max_num_seqs = 64;
  l.kv_blocks_total = 1000;
  l.kv_blocks_used = 200;
  l.kv_blocks_reserved = 50;
  l.block_size = 32;
  l.prefix_hits = 7;
  l.prefix_queries = 9;
  l.steps = 11;
  l.last_batch_size = 2.5;
  l.preemptions = 1;
  l.spec_steps = 13;
  l.spec_tokens = 21;
  l.spec_drafted = {13, 10};
  l.spec_accepted = {8, 4};
  l.kv_parked = 2;
  l.kv_transfers_done = 3;
  l.kv_transfers_expired = 1;
  l.kv_pulled_bytes = 4096;
  l.kv_probes_saturated = 5;
  l.kv_links_failed = 2;
  l.kv_handoffs_recomputed = 1;
  l.moe_ns = 123456;
  l.rollbacks = 2;
  l.expert_tokens = {1, 2, 3, 4};
  l.moe_layers = {3, 4};
  l.n_experts = 2;
  l.window_seq = 6;
  l.window_expert_tokens = {5, 6, 7, 8};
  l.window_slot_tokens = {9, 10, 11, 12, 13, 14};
  l.slots_per_device = 3;
  l.window_map_version = 17;
  l.window_uniform = true;
  LoadMsg m;
  m.loads = {l};
  m.role = InstanceRole::kPrefill;
  const LoadMsg o = round_trip(m);
  EXPECT_EQ(o.role, InstanceRole::kPrefill);
  ASSERT_EQ(o.loads.size(), 1u);
  const GroupLoad& t = o.loads[0];
  EXPECT_EQ(t.group, 3);
  EXPECT_EQ(t.running, 4);
  EXPECT_EQ(t.waiting, 5);
  EXPECT_EQ(t.max_num_seqs, 64);
  EXPECT_EQ(t.kv_blocks_total, 1000);
  EXPECT_EQ(t.kv_blocks_used, 200);
  EXPECT_EQ(t.kv_blocks_reserved, 50);
  EXPECT_EQ(t.block_size, 32);
  EXPECT_EQ(t.prefix_hits, 7);
  EXPECT_EQ(t.prefix_queries, 9);
  EXPECT_EQ(t.steps, 11);
  EXPECT_EQ(t.last_batch_size, 2.5);
  EXPECT_EQ(t.preemptions, 1);
  EXPECT_EQ(t.spec_steps, 13);
  EXPECT_EQ(t.spec_tokens, 21);
  EXPECT_EQ(t.spec_drafted, (std::vector<int64_t>{13, 10}));
  EXPECT_EQ(t.spec_accepted, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(t.kv_parked, 2);
  EXPECT_EQ(t.kv_transfers_done, 3);
  EXPECT_EQ(t.kv_transfers_expired, 1);
  EXPECT_EQ(t.kv_pulled_bytes, 4096);
  EXPECT_EQ(t.kv_probes_saturated, 5);
  EXPECT_EQ(t.kv_links_failed, 2);
  EXPECT_EQ(t.kv_handoffs_recomputed, 1);
  EXPECT_EQ(t.moe_ns, 123456);
  EXPECT_EQ(t.rollbacks, 2);
  EXPECT_EQ(t.expert_tokens, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(t.moe_layers, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(t.n_experts, 2);
  EXPECT_EQ(t.window_seq, 6);
  EXPECT_EQ(t.window_expert_tokens, (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(t.window_slot_tokens, (std::vector<int64_t>{9, 10, 11, 12, 13, 14}));
  EXPECT_EQ(t.slots_per_device, 3);
  EXPECT_EQ(t.window_map_version, 17u);
  EXPECT_TRUE(t.window_uniform);
}

TEST(Messages, WakeShutdownPingPong) {
  const WakeMsg w = round_trip(WakeMsg{41, 2});
  EXPECT_EQ(w.seq, 41u);
  EXPECT_EQ(w.group, 2);
  round_trip(ShutdownMsg{});
  const PingMsg p = round_trip(PingMsg{"health-7", 9});
  EXPECT_EQ(p.probe_id, "health-7");
  EXPECT_EQ(p.seq, 9u);
  const PongMsg q = round_trip(PongMsg{"health-8", 10, 3, InstanceRole::kDecode});
  EXPECT_EQ(q.probe_id, "health-8");
  EXPECT_EQ(q.seq, 10u);
  EXPECT_EQ(q.group, 3);
  EXPECT_EQ(q.role, InstanceRole::kDecode);
  EXPECT_EQ(q.incarnation, 0u);  // defaults of the fields it did not set
  EXPECT_TRUE(q.ready);
  EXPECT_EQ(q.waiting_on, -1);
  PongMsg h;
  h.probe_id = "heartbeat";
  h.incarnation = 0xfedcba9876543211ULL;
  h.ready = false;
  h.state = "starting";
  h.waiting_on = 1;
  const PongMsg oh = round_trip(h);
  EXPECT_EQ(oh.incarnation, 0xfedcba9876543211ULL);
  EXPECT_FALSE(oh.ready);
  EXPECT_EQ(oh.state, "starting");
  EXPECT_EQ(oh.waiting_on, 1);
}

TEST(Messages, Rejected) {
  const RejectedMsg o = round_trip(RejectedMsg{"cmpl-5", "too long", true, 2});
  EXPECT_EQ(o.request_id, "cmpl-5");
  EXPECT_EQ(o.reason, "too long");
  EXPECT_TRUE(o.never);
  EXPECT_EQ(o.attempt, 2);
}

TEST(Messages, EplbCommandAndReport) {
  EplbCommandMsg c;
  c.command.op = EplbOp::kAbort;
  c.command.version = 12;
  c.command.moe_layers = {3, 5};
  c.command.replicas = {{{0, 4}, {1}}, {{2}, {3, 5}}};
  const EplbCommandMsg oc = round_trip(c);
  EXPECT_EQ(oc.command.op, EplbOp::kAbort);
  EXPECT_EQ(oc.command.version, 12u);
  EXPECT_EQ(oc.command.moe_layers, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(oc.command.replicas,
            (std::vector<std::vector<std::vector<int32_t>>>{{{0, 4}, {1}}, {{2}, {3, 5}}}));

  EplbReportMsg r;
  r.report.group = 1;
  r.report.version = 12;
  r.report.state = EplbState::kSwitched;
  r.report.error = "none";
  r.report.disable_step = 100;
  r.report.switch_step = 104;
  r.report.loaded_bytes = 1 << 20;
  const EplbReportMsg orr = round_trip(r);
  EXPECT_EQ(orr.report.group, 1);
  EXPECT_EQ(orr.report.version, 12u);
  EXPECT_EQ(orr.report.state, EplbState::kSwitched);
  EXPECT_EQ(orr.report.error, "none");
  EXPECT_EQ(orr.report.disable_step, 100u);
  EXPECT_EQ(orr.report.switch_step, 104u);
  EXPECT_EQ(orr.report.loaded_bytes, 1 << 20);
}

TEST(Messages, Admin) {
  const AdminRequestMsg a = round_trip(AdminRequestMsg{"admin-3", AdminCall::kEplbRebalance, "{}"});
  EXPECT_EQ(a.call_id, "admin-3");
  EXPECT_EQ(a.call, AdminCall::kEplbRebalance);
  const AdminReplyMsg r = round_trip(AdminReplyMsg{"admin-3", 409, "{\"error\":\"busy\"}"});
  EXPECT_EQ(r.call_id, "admin-3");
  EXPECT_EQ(r.http_status, 409);
  EXPECT_EQ(r.body, "{\"error\":\"busy\"}");
  const EplbStatePushMsg p = round_trip(EplbStatePushMsg{"xds_eplb_version 4\n"});
  EXPECT_EQ(p.metrics_text, "xds_eplb_version 4\n");
}

TEST(Messages, FailedBlocksEnded) {
  const FailedMsg f = round_trip(FailedMsg{"DP group 1 died", true, "dead_process"});
  EXPECT_EQ(f.reason, "DP group 1 died");
  EXPECT_TRUE(f.recovering);
  EXPECT_EQ(f.kind, "dead_process");
  FaultMsg fm;
  fm.fault.id = 7;
  fm.fault.kind = FaultKind::kLinkDrop;
  fm.fault.instance = 1;
  fm.fault.group = 3;
  fm.fault.after_steps = 5;
  fm.fault.duration_ms = 250;
  const FaultMsg of = round_trip(fm);
  EXPECT_EQ(of.fault.id, 7u);
  EXPECT_EQ(of.fault.kind, FaultKind::kLinkDrop);
  EXPECT_EQ(of.fault.instance, 1);
  EXPECT_EQ(of.fault.group, 3);
  EXPECT_EQ(of.fault.after_steps, 5);
  EXPECT_EQ(of.fault.duration_ms, 250);
  const BlocksMsg b = round_trip(BlocksMsg{2, {0xffffffffffffffffULL, 1}, {7}});
  EXPECT_EQ(b.group, 2);
  EXPECT_EQ(b.added, (std::vector<uint64_t>{0xffffffffffffffffULL, 1}));
  EXPECT_EQ(b.removed, (std::vector<uint64_t>{7}));
  const EndedMsg e = round_trip(EndedMsg{1, {"cmpl-6", "cmpl-7"}});
  EXPECT_EQ(e.group, 1);
  EXPECT_EQ(e.request_ids, (std::vector<std::string>{"cmpl-6", "cmpl-7"}));
}

TEST(Messages, ScaleDown) {
  ReformMsg m;
  m.phase = ReformPhase::kJoin;
  m.generation = 2;
  m.members = {0, 2, 3};
  m.pids = {100, 102, 4242};
  m.map_version = 9;
  const ReformMsg rm = round_trip(m);
  EXPECT_EQ(rm.phase, ReformPhase::kJoin);
  EXPECT_EQ(rm.generation, 2u);
  EXPECT_EQ(rm.members, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(rm.pids, (std::vector<int32_t>{100, 102, 4242}));
  EXPECT_EQ(rm.map_version, 9u);
  const ReformedMsg d = round_trip(ReformedMsg{3, ReformPhase::kReset, 2, "no copy of expert 5"});
  EXPECT_EQ(d.group, 3);
  EXPECT_EQ(d.phase, ReformPhase::kReset);
  EXPECT_EQ(d.generation, 2u);
  EXPECT_EQ(d.error, "no copy of expert 5");
  const MembershipMsg s = round_trip(
      MembershipMsg{1, false, "DP group 1 was killed by signal 9", {0, 2}, {"cmpl-4"}});
  EXPECT_EQ(s.group, 1);
  EXPECT_FALSE(s.joined);
  EXPECT_TRUE(round_trip(MembershipMsg{1, true, "", {0, 1, 2}, {}}).joined);
  EXPECT_EQ(s.reason, "DP group 1 was killed by signal 9");
  EXPECT_EQ(s.members, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(s.request_ids, (std::vector<std::string>{"cmpl-4"}));
  EXPECT_EQ(kind_of(Message(MembershipMsg{})), MessageKind::kMembership);
  EXPECT_EQ(static_cast<int>(MessageKind::kReform), 20);  // wire tags are never reused
  EXPECT_STREQ(kind_name(MessageKind::kReformed), "reformed");
}

TEST(Messages, KindsAreTheWireTags) {
  EXPECT_EQ(kind_of(Message(RequestMsg{})), MessageKind::kRequest);
  EXPECT_EQ(kind_of(Message(CancelMsg{})), MessageKind::kCancel);
  EXPECT_EQ(kind_of(Message(BlocksMsg{})), MessageKind::kBlocks);
  EXPECT_EQ(kind_of(Message(EndedMsg{})), MessageKind::kEnded);
  EXPECT_STREQ(kind_name(MessageKind::kAdminReply), "admin reply");
  EXPECT_STREQ(kind_name(static_cast<MessageKind>(99)), "unknown");
}

TEST(Messages, Roles) {
  for (InstanceRole r : {InstanceRole::kColocated, InstanceRole::kPrefill, InstanceRole::kDecode}) {
    auto parsed = parse_instance_role(to_string(r));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, r);
  }
  EXPECT_STREQ(to_string(InstanceRole::kPrefill), "prefill");
  EXPECT_FALSE(parse_instance_role("attention").ok());
}

std::string msgpack(const nlohmann::json& j) {
  const std::vector<uint8_t> b = nlohmann::json::to_msgpack(j);
  return std::string(b.begin(), b.end());
}

Status decode_error(const std::string& bytes) {
  Result<Message> m = decode(bytes.data(), bytes.size());
  EXPECT_FALSE(m.ok());
  return m.ok() ? Status() : m.status();
}

TEST(Messages, AnotherVersionIsRefusedNamingBoth) {
  const std::string bytes = msgpack(
      {{"v", kProtocolVersion + 1}, {"kind", 2}, {"body", {{"request_id", "x"}}}});
  const Status st = decode_error(bytes);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(fmt::format("protocol version {} from the peer",
                                          kProtocolVersion + 1)),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(fmt::format("speaks version {}", kProtocolVersion)),
            std::string::npos)
      << st.message();
  // No version at all (a peer from before versions existed).
  const Status none = decode_error(msgpack({{"kind", 2}, {"request_id", "x"}}));
  EXPECT_NE(none.message().find("no protocol version"), std::string::npos) << none.message();
}

TEST(Messages, MalformedBytesAreRefused) {
  EXPECT_NE(decode_error("\xc1 not msgpack").message().find("not a MessagePack object"),
            std::string::npos);
  EXPECT_NE(decode_error(msgpack(nlohmann::json::array({1, 2}))).message().find(
                "not a MessagePack object"),
            std::string::npos);
  // The right envelope, a body of the wrong shape: an error, not a throw.
  const Status bad_field = decode_error(
      msgpack({{"v", kProtocolVersion}, {"kind", 2}, {"body", {{"request_id", 5}}}}));
  EXPECT_NE(bad_field.message().find("control message"), std::string::npos);
  const Status no_body = decode_error(msgpack({{"v", kProtocolVersion}, {"kind", 2}}));
  EXPECT_NE(no_body.message().find("a cancel message without a body"), std::string::npos)
      << no_body.message();
  // Truncated bytes of a valid message.
  const std::string whole = encode(Message(CancelMsg{"cmpl-8", -1}));
  EXPECT_FALSE(decode_error(whole.substr(0, whole.size() - 3)).message().empty());
}

TEST(Messages, UnknownKindIsRefused) {
  for (int kind : {0, 23, 1000}) {
    const Status st = decode_error(
        msgpack({{"v", kProtocolVersion}, {"kind", kind}, {"body", nlohmann::json::object()}}));
    EXPECT_NE(st.message().find(fmt::format("unknown kind {}", kind)), std::string::npos)
        << st.message();
  }
}

TEST(Messages, MergeLoadKeepsExpertCounts) {
  GroupLoad kept;
  kept.expert_tokens = {1, 2};
  kept.moe_layers = {3};
  kept.n_experts = 2;
  GroupLoad incoming;
  incoming.running = 5;
  incoming.window_seq = 4;
  incoming.window_expert_tokens = {9};
  merge_load(kept, incoming);
  EXPECT_EQ(kept.running, 5);
  EXPECT_EQ(kept.expert_tokens, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(kept.moe_layers, (std::vector<int64_t>{3}));
  EXPECT_EQ(kept.n_experts, 2);
  EXPECT_EQ(kept.window_seq, 0);
  EXPECT_TRUE(kept.window_expert_tokens.empty());
}

}  // namespace
}  // namespace xds::protocol
