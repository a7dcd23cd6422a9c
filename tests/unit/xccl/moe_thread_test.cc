// Dispatch/combine over the thread-backed fabric (label tsan), checked against moe_reference.h.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <utility>

#include "moe_reference.h"
#include "xccl/thread_fabric.h"

namespace xds::xccl {
namespace {

using testing::MoeCase;
using testing::Routing;

MoeConfig moe_config(const MoeCase& c) {
  return MoeConfig{.hidden = c.hidden,
                   .topk = c.topk,
                   .max_tokens = c.max_tokens,
                   .slots_per_device = c.slots,
                   .int8 = c.int8,
                   .timeout_ms = 60'000};
}

ArenaConfig arena_for(const MoeCase& c) {
  ArenaConfig a;
  a.world_size = c.world;
  a.lanes = 1;
  a.ring_slots = 1;
  a.slot_bytes = 64;
  a.staging_bytes = moe_staging_bytes(moe_config(c), c.world);
  a.app_bytes = 0;
  return a;
}

// Runs the case in rounds on every device; checks each round's received rows and the final
// combine output against the reference.
Status run_case(Fabric& f, const MoeCase& c, int pool_threads) {
  auto t = make_transport("shm", f);
  Mailbox mb(f, **t);
  ThreadPool pool(pool_threads);
  ExchangeRoles roles;
  for (int r = 0; r < c.world; ++r) {
    roles.senders.push_back(r);
    roles.receivers.push_back(r);
  }
  roles.staging_base = f.layout().staging;
  XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, moe_config(c), roles, &pool));
  std::vector<testing::DeviceInput> in;
  for (int d = 0; d < c.world; ++d) in.push_back(testing::make_input(c, d));
  const int me = f.rank();
  const ExpertMap map = testing::make_map(c);
  std::vector<uint16_t> out(size_t(c.n_tokens[size_t(me)]) * size_t(c.hidden), 0xFFFF);
  int round = 0;
  Status expert_check;
  auto experts = [&](const Exchange& e, uint16_t* y) {
    std::vector<int> b(size_t(c.world)), en(size_t(c.world));
    for (int s = 0; s < c.world; ++s) {
      b[size_t(s)] = std::min(c.n_tokens[size_t(s)], round * c.max_tokens);
      en[size_t(s)] = std::min(c.n_tokens[size_t(s)], b[size_t(s)] + c.max_tokens);
    }
    Status st = testing::check_received(c, in, me, b, en, e);
    if (expert_check.ok() && !st.ok())
      expert_check = st.with_context(fmt::format("round {}", round));
    testing::run_experts(c, me, e, y);
    ++round;
  };
  XDS_RETURN_IF_ERROR(run_moe_rounds(*ex, in[size_t(me)].x.data(), in[size_t(me)].ids,
                                     in[size_t(me)].w, c.n_tokens[size_t(me)], map,
                                     collective_key(f.epoch(), 1, 3, 0), experts, out.data()));
  XDS_RETURN_IF_ERROR(expert_check);
  const int want_rounds = [&] {
    int r = 1;
    for (int n : c.n_tokens) r = std::max(r, rounds_needed(n, c.max_tokens));
    return r;
  }();
  if (round != want_rounds) return internal_error("{} rounds, expected {}", round, want_rounds);
  return testing::check_combined(c, in[size_t(me)], me, out);
}

void run_everywhere(const MoeCase& c, int pool_threads = 1) {
  auto tf = ThreadFabric::create(arena_for(c), 3);
  ASSERT_TRUE(tf.ok()) << tf.status().to_string();
  auto st = (*tf)->run([&](Fabric& f) { return run_case(f, c, pool_threads); });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
}

TEST(XcclMoeThread, RandomTopkTwoToFourDevices) {
  for (int W = 2; W <= 4; ++W) {
    MoeCase c;
    c.world = W;
    c.n_logical = 3 * W;
    c.slots = 4;
    c.topk = 4;
    c.seed = 11 + uint64_t(W);
    for (int d = 0; d < W; ++d) c.n_tokens.push_back(3 + 5 * d);
    run_everywhere(c, W == 2 ? 2 : 1);
  }
}

TEST(XcclMoeThread, DeviceThatReceivesNothingAndOneWithoutTokens) {
  MoeCase c;
  c.world = 3;
  c.n_logical = 9;
  c.slots = 4;
  c.routing = Routing::kStarveLast;
  c.n_tokens = {7, 12, 0};
  run_everywhere(c);
}

TEST(XcclMoeThread, TokensWhoseExpertsAreAllLocal) {
  MoeCase c;
  c.world = 3;
  c.n_logical = 12;
  c.slots = 4;
  c.routing = Routing::kAllLocal;
  c.n_tokens = {5, 9, 2};
  run_everywhere(c);
}

TEST(XcclMoeThread, MoreTokensThanTheRoundMaximumGoInFurtherRounds) {
  MoeCase c;
  c.world = 2;
  c.max_tokens = 8;
  c.n_tokens = {21, 3};  // 3 rounds; device 1 joins rounds 2 and 3 with zero tokens
  run_everywhere(c, 2);
}

TEST(XcclMoeThread, Int8DispatchWithinThePerTokenBound) {
  MoeCase c;
  c.world = 3;
  c.n_logical = 9;
  c.hidden = 96;
  c.int8 = true;
  c.n_tokens = {10, 4, 16};
  run_everywhere(c);
}

// The producer writes both forms, as an epilogue would (bf16 rows, and every token's INT8 row
// + scale): dispatch does no quantizing, receivers dequantize; own rows stay exact bf16. Three
// steps on one Exchange, checked against the reference (INT8 bound for other devices' rows).
TEST(XcclMoeThread, Int8RowsWrittenByTheProducerDispatchWithinTheBound) {
  MoeCase c;
  c.world = 3;
  c.n_logical = 9;
  c.hidden = 96;
  c.int8 = true;
  c.max_tokens = 16;
  c.n_tokens = {10, 0, 16};
  auto tf = ThreadFabric::create(arena_for(c), 5);
  ASSERT_TRUE(tf.ok());
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    Mailbox mb(f, **t);
    ThreadPool pool(2);
    ExchangeRoles roles{{0, 1, 2}, {0, 1, 2}, f.layout().staging};
    XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, moe_config(c), roles, &pool));
    std::vector<testing::DeviceInput> in;
    for (int d = 0; d < c.world; ++d) in.push_back(testing::make_input(c, d));
    const int me = f.rank(), n = c.n_tokens[size_t(me)];
    const ExpertMap map = testing::make_map(c);
    const std::vector<int> begin(size_t(c.world), 0);
    for (uint32_t step = 0; step < 3; ++step) {
      const uint64_t key = collective_key(f.epoch(), step, 2, 0);
      XDS_ASSIGN_OR_RETURN(uint16_t * x, ex->input_rows());
      XDS_ASSIGN_OR_RETURN(std::byte * q, ex->int8_rows());
      for (int i = 0; i < n; ++i) {
        const uint16_t* row = in[size_t(me)].x.data() + size_t(i) * size_t(c.hidden);
        std::memcpy(x + size_t(i) * size_t(c.hidden), row, size_t(c.hidden) * 2);
        quantize_row_int8(row, c.hidden, q + size_t(i) * int8_row_stride(c.hidden));
      }
      const uint64_t pulled0 = ex->stats().bytes_pulled_tokens;
      XDS_RETURN_IF_ERROR(ex->dispatch(n, in[size_t(me)].ids, in[size_t(me)].w, map, key, false,
                                       SenderRows::kBf16AndInt8));
      XDS_RETURN_IF_ERROR(testing::check_received(c, in, me, begin, c.n_tokens, *ex)
                              .with_context(fmt::format("step {}", step)));
      // INT8 on the wire: one INT8 row per (token, other device) of the reference routing.
      std::set<std::pair<int, int>> units;
      for (const auto& r : testing::expected_rows(c, in, me, begin, c.n_tokens))
        if (r.src != me) units.insert({r.src, r.token});
      const uint64_t pulled = ex->stats().bytes_pulled_tokens - pulled0;
      if (pulled != units.size() * int8_row_bytes(c.hidden))
        return internal_error("rank {} step {}: pulled {} bytes, {} INT8 rows are {}", me, step,
                              pulled, units.size(), units.size() * int8_row_bytes(c.hidden));
      testing::run_experts(c, me, *ex, ex->expert_out());
      std::vector<uint16_t> out(size_t(n) * size_t(c.hidden), 0xFFFF);
      XDS_RETURN_IF_ERROR(ex->combine(out.data(), key));
      XDS_RETURN_IF_ERROR(testing::check_combined(c, in[size_t(me)], me, out)
                              .with_context(fmt::format("step {}", step)));
    }
    return ex->finish();
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  // INT8 rows on an exchange without INT8 staging: an error naming the setting, on every rank
  // (before anything is posted).
  MoeCase b = c;
  b.int8 = false;
  auto tf2 = ThreadFabric::create(arena_for(b), 6);
  ASSERT_TRUE(tf2.ok());
  auto st2 = (*tf2)->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    Mailbox mb(f, **t);
    ExchangeRoles roles{{0, 1, 2}, {0, 1, 2}, f.layout().staging};
    XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, moe_config(b), roles, nullptr));
    const auto in = testing::make_input(b, f.rank());
    return ex->dispatch(b.n_tokens[size_t(f.rank())], in.ids, in.w, testing::make_map(b), 1,
                        false, SenderRows::kBf16AndInt8);
  });
  for (size_t r = 0; r < st2.size(); ++r) {
    EXPECT_EQ(st2[r].code(), StatusCode::kInvalidArgument) << st2[r].to_string();
    EXPECT_NE(st2[r].message().find("MoeConfig::int8"), std::string::npos) << st2[r].to_string();
  }
}

// The engine pre-sums itself (as an expert GEMM epilogue would) into presum_vector(unit):
// the test's plain double loop over the grouped rows, then combine_presummed. Three steps on
// the same Exchange (the presum area is reused once the senders released it).
TEST(XcclMoeThread, EngineWrittenPreSumsCombineToTheReference) {
  MoeCase c;
  c.world = 3;
  c.n_logical = 9;
  c.slots = 4;
  c.max_tokens = 16;
  c.n_tokens = {9, 0, 16};
  auto tf = ThreadFabric::create(arena_for(c), 5);
  ASSERT_TRUE(tf.ok());
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    Mailbox mb(f, **t);
    ThreadPool pool(2);
    ExchangeRoles roles{{0, 1, 2}, {0, 1, 2}, f.layout().staging};
    XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, moe_config(c), roles, &pool));
    const int me = f.rank(), n = c.n_tokens[size_t(me)];
    const auto in = testing::make_input(c, me);
    const ExpertMap map = testing::make_map(c);
    for (uint32_t step = 0; step < 3; ++step) {
      const uint64_t key = collective_key(f.epoch(), step, 1, 0);
      XDS_ASSIGN_OR_RETURN(uint16_t * x, ex->input_rows());
      if (n > 0) std::memcpy(x, in.x.data(), in.x.size() * 2);
      XDS_RETURN_IF_ERROR(ex->dispatch(n, in.ids, in.w, map, key));
      std::vector<uint16_t> y(size_t(ex->received().n_rows()) * size_t(c.hidden));
      testing::run_experts(c, me, *ex, y.data());
      std::vector<double> acc(size_t(ex->n_units()) * size_t(c.hidden), 0.0);
      for (int r = 0; r < ex->received().n_rows(); ++r)
        for (int h = 0; h < c.hidden; ++h)
          acc[size_t(ex->unit_of(r)) * size_t(c.hidden) + size_t(h)] +=
              double(ex->received().rows[size_t(r)].weight) *
              bf16_to_float(y[size_t(r) * size_t(c.hidden) + size_t(h)]);
      XDS_RETURN_IF_ERROR(ex->wait_vectors_free());
      for (int u = 0; u < ex->n_units(); ++u)
        for (int h = 0; h < c.hidden; ++h)
          ex->presum_vector(uint32_t(u))[h] =
              float_to_bf16(float(acc[size_t(u) * size_t(c.hidden) + size_t(h)]));
      std::vector<uint16_t> out(size_t(n) * size_t(c.hidden), 0xFFFF);
      XDS_RETURN_IF_ERROR(ex->combine_presummed(out.data(), key));
      XDS_RETURN_IF_ERROR(testing::check_combined(c, in, me, out)
                              .with_context(fmt::format("rank {} step {}", me, step)));
    }
    return ex->finish();
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
}

TEST(XcclMoeThread, MismatchedExpertMapVersionPoisonsTheEpoch) {
  MoeCase c;
  c.world = 2;
  c.n_tokens = {4, 4};
  auto tf = ThreadFabric::create(arena_for(c), 3);
  ASSERT_TRUE(tf.ok());
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    Mailbox mb(f, **t);
    ExchangeRoles roles{{0, 1}, {0, 1}, f.layout().staging};
    XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, moe_config(c), roles, nullptr));
    auto in = testing::make_input(c, f.rank());
    ExpertMap map = testing::make_map(c);
    map.version += uint64_t(f.rank());  // rank 1 switched maps mid-step
    XDS_ASSIGN_OR_RETURN(uint16_t * x, ex->input_rows());
    std::memcpy(x, in.x.data(), in.x.size() * 2);
    return ex->dispatch(4, in.ids, in.w, map, 1);
  });
  ASSERT_FALSE(st[0].ok());
  EXPECT_EQ(st[0].to_string(), st[1].to_string());
  EXPECT_NE(st[0].message().find("during dispatch"), std::string::npos) << st[0].to_string();
}

TEST(XcclMoeThread, SilentDeviceFailsTheCollectiveOnEverySurvivor) {
  MoeCase c;
  c.world = 3;
  c.n_logical = 6;
  c.n_tokens = {4, 4, 4};
  auto tf = ThreadFabric::create(arena_for(c), 9);
  ASSERT_TRUE(tf.ok());
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    if (f.rank() == 2) return Status::ok_status();  // never joins the step
    auto t = make_transport("shm", f);
    Mailbox mb(f, **t);
    ExchangeRoles roles{{0, 1, 2}, {0, 1, 2}, f.layout().staging};
    MoeConfig mc = moe_config(c);
    mc.timeout_ms = f.rank() == 0 ? 200 : 30'000;
    XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, mc, roles, nullptr));
    auto in = testing::make_input(c, f.rank());
    XDS_ASSIGN_OR_RETURN(uint16_t * x, ex->input_rows());
    std::memcpy(x, in.x.data(), in.x.size() * 2);
    return ex->dispatch(4, in.ids, in.w, testing::make_map(c), 1);
  });
  ASSERT_FALSE(st[0].ok());
  EXPECT_EQ(st[0].to_string(), st[1].to_string());
  EXPECT_NE(st[0].message().find("peer 2 was silent"), std::string::npos) << st[0].to_string();
}

}  // namespace
}  // namespace xds::xccl

namespace xds::xccl {
namespace {

TEST(XcclMailboxThread, StepHeaderAllgatherAndAbortFlagPoisonsAlike) {
  ArenaConfig a;
  a.world_size = 4;
  auto tf = ThreadFabric::create(a, 2);
  ASSERT_TRUE(tf.ok());
  auto st = (*tf)->run([&](Fabric& f) -> Status {
    auto t = make_transport("shm", f);
    Mailbox mb(f, **t);
    std::vector<int> peers;
    for (int r = 0; r < 4; ++r)
      if (r != f.rank()) peers.push_back(r);
    WaitCtx ctx{OpKind::kBarrier, deadline_after_ms(30'000)};
    for (uint32_t step = 0; step < 3; ++step) {
      std::vector<MailWords> got(peers.size());
      const MailWords mine{step, uint64_t(f.rank()) * 10 + step, 0, 0, 0, 0};  // tokens per device
      XDS_RETURN_IF_ERROR(
          allgather_words(mb, peers, collective_key(2, step, 0, 0), mine, ctx, got));
      for (size_t i = 0; i < peers.size(); ++i)
        if (got[i][0] != step || got[i][1] != uint64_t(peers[i]) * 10 + step)
          return internal_error("step {}: header from {} is ({}, {})", step, peers[i], got[i][0],
                                got[i][1]);
    }
    // Rank 3 raises the abort flag: every device's next wait fails with the same status.
    if (f.rank() == 3) return f.poison({f.epoch(), 3, PoisonReason::kAborted, OpKind::kBarrier, 3});
    return barrier(mb, peers, collective_key(2, 3, 0, 0), ctx);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(st[size_t(r)].code(), StatusCode::kAborted) << st[size_t(r)].to_string();
    EXPECT_EQ(st[size_t(r)].to_string(), st[3].to_string());
  }
  EXPECT_NE(st[0].message().find("peer 3 aborted during barrier"), std::string::npos)
      << st[0].to_string();
}

}  // namespace
}  // namespace xds::xccl
