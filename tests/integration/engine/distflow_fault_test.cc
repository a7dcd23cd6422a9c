// DistFlow's link probing (P116) between a prefill and a decode DP group of one process: two
// engine cores over the tiny random checkpoint, each with its handoff stage, stepped by one
// thread the way dp_group.cc's loop steps them (the decode group's KvPuller pulls on its own
// thread over a real shared-memory link). A request is prefilled on the prefill group, its
// handoff (first token, KV blocks) goes to the decode group, which pulls and decodes. Checked
// against the same request run whole on a plain engine core (greedy: the same tokens):
//   - undisturbed, the handoff gives the colocated tokens;
//   - with the prefill side's links delayed (LinkFault::kDelay), every probe is answered: the
//     pull is saturated, not failed, and completes;
//   - with its links dropped (LinkFault::kDrop), the probe goes unanswered: the link is
//     failed, the request is recomputed on the decode group from its tokens and still gives
//     the colocated tokens (no error); the next request links anew and is pulled; a
//     handoff queued behind the failed pull for the same link fails with it;
//   - checksums (P120): a pull whose block lands corrupted in the decode group's memory
//     (KvReceiver::corrupt_next_pull) is caught, that block retired and the request
//     recomputed with the colocated tokens; a block changed on the prefill side after it was
//     parked is caught too, and nothing of the decode group is retired for it.
// The faults last until the test ends them (or far longer than a test), so nothing here
// depends on how fast the machine is beyond generous timeouts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "engine/engine_core.h"
#include "engine/handoff_stage.h"
#include "test_models.h"

namespace xds::engine {
namespace {

constexpr int32_t kMaxTokens = 6;
constexpr int64_t kTestTimeoutNs = 60'000'000'000;

const std::string& checkpoint() {
  static const std::string dir = fixtures::random_checkpoint("distflow_fault", 93, /*mtp=*/1);
  return dir;
}

EngineCoreOptions core_options() {
  EngineCoreOptions o;
  o.model_dir = checkpoint();
  o.model.threads = 2;
  o.kv_memory_bytes = int64_t{16} << 20;
  o.max_num_batched_tokens = 256;
  return o;
}

EngineRequest greedy(const std::string& id, std::vector<int32_t> prompt) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = kMaxTokens;
  r.sampling.ignore_eos = true;
  return r;
}

// The request run whole on a plain engine core.
std::vector<int32_t> colocated(const EngineRequest& r) {
  auto core = EngineCore::create(core_options());
  EXPECT_TRUE(core.ok()) << core.status().to_string();
  if (!core.ok()) return {};
  EXPECT_TRUE((*core)->add_request(r).ok());
  std::vector<int32_t> out;
  std::vector<TokenDelta> d;
  for (int i = 0; i < 100 && (*core)->has_work(); ++i) {
    d.clear();
    EXPECT_TRUE((*core)->step(&d).ok());
    for (const TokenDelta& x : d) out.insert(out.end(), x.tokens.begin(), x.tokens.end());
  }
  return out;
}

// An engine core with its handoff stage, as a DP group holds them.
struct Group {
  std::unique_ptr<HandoffStage> stage;
  std::unique_ptr<EngineCore> core;
  std::vector<TokenDelta> deltas;  // every delta so far
};

std::unique_ptr<Group> make_group(const HandoffOptions& ho) {
  auto g = std::make_unique<Group>();
  g->stage = std::make_unique<HandoffStage>(ho);
  EngineCoreOptions eo = core_options();
  eo.park_prefill_only = ho.export_kv;
  eo.kv_storage = g->stage->storage_factory();
  auto core = EngineCore::create(eo);
  EXPECT_TRUE(core.ok()) << core.status().to_string();
  if (!core.ok()) return nullptr;
  g->core = std::move(*core);
  const Status st = g->stage->attach(*g->core);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return st.ok() ? std::move(g) : nullptr;
}

// One pass of a DP group's loop without sockets (dp_group.cc, DpGroup::run): DistFlow's
// service, the plan, the pulls it admits, the step when it has rows, parking.
void loop_once(Group& g) {
  bool ended = false;
  Status st = g.stage->service(&ended);
  ASSERT_TRUE(st.ok()) << st.to_string();
  g.core->table().release_finished();
  if (!g.core->has_work()) return;
  ASSERT_TRUE(g.core->plan().ok());
  ASSERT_TRUE(g.stage->start_pulls(g.core->planned()).ok());
  if (g.core->planned().chunks.empty()) return;
  st = g.core->execute(/*lockstep=*/false);
  ASSERT_TRUE(st.ok()) << st.to_string();
  g.stage->park();
  for (TokenDelta& d : g.core->deltas()) g.deltas.push_back(std::move(d));
  g.core->deltas().clear();
}

// The tokens and the final reason of request `id` in g's deltas.
struct Output {
  std::vector<int32_t> tokens;
  std::string finish_reason;
  const KvHandoff* handoff = nullptr;
};
Output output_of(const Group& g, const std::string& id) {
  Output o;
  for (const TokenDelta& d : g.deltas) {
    if (d.request_id != id) continue;
    o.tokens.insert(o.tokens.end(), d.tokens.begin(), d.tokens.end());
    if (!d.finish_reason.empty()) o.finish_reason = d.finish_reason;
    if (!d.handoff.link.empty()) o.handoff = &d.handoff;
  }
  return o;
}

class DistFlowFault : public ::testing::Test {
 protected:
  // A prefill group exporting its KV and a decode group probing with `probe_timeout_ms`.
  void start(int64_t probe_timeout_ms) {
    HandoffOptions p;
    p.rank = 0;
    p.export_kv = true;
    p.link_name = "test-fault-" + std::to_string(getpid());
    prefill_ = make_group(p);
    HandoffOptions d;
    d.rank = 1;
    d.kv_transfer_backend = "shm";
    d.kv_probe.slack_ns = 20'000'000;  // slow after 20 ms: a held pull probes at once
    d.kv_probe.probe_timeout_ns = probe_timeout_ms * 1'000'000;
    decode_ = make_group(d);
    ASSERT_TRUE(prefill_ && decode_);
  }

  // Both groups' loops, until `done` holds (false after the test's timeout).
  template <typename Fn>
  bool step_until(Fn done) {
    const int64_t deadline = now_ns() + kTestTimeoutNs;
    while (!done()) {
      if (now_ns() > deadline) return false;
      loop_once(*prefill_);
      loop_once(*decode_);
      if (::testing::Test::HasFatalFailure()) return false;
      usleep(100);
    }
    return true;
  }

  // Prefills r on the prefill group and hands it to the decode group: its first token.
  std::vector<int32_t> hand_off(const EngineRequest& r) {
    EngineRequest p = r;
    p.phase = RequestPhase::kPrefillOnly;
    EXPECT_TRUE(prefill_->core->add_request(p).ok());
    EXPECT_TRUE(step_until([&] { return output_of(*prefill_, r.id).handoff != nullptr; }));
    const Output first = output_of(*prefill_, r.id);
    if (first.handoff == nullptr) return {};
    EngineRequest d = r;
    d.phase = RequestPhase::kDecode;
    d.handoff = *first.handoff;
    EXPECT_EQ(d.handoff.output, first.tokens);
    EXPECT_TRUE(decode_->core->add_request(d).ok());
    return first.tokens;
  }

  // The decode group's tokens of request `id` once it finished.
  Output finish(const std::string& id) {
    EXPECT_TRUE(step_until([&] { return !output_of(*decode_, id).finish_reason.empty(); }));
    return output_of(*decode_, id);
  }

  std::unique_ptr<Group> prefill_, decode_;
};

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(DistFlowFault, AnUndisturbedHandoffGivesTheColocatedTokens) {
  ASSERT_NO_FATAL_FAILURE(start(/*probe_timeout_ms=*/10'000));
  const int64_t vocab = prefill_->core->info().vocab_size;
  const EngineRequest r = greedy("a", fixtures::random_ids(21, vocab, 11));
  const std::vector<int32_t> expected = colocated(r);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kMaxTokens));
  const std::vector<int32_t> first = hand_off(r);
  const Output rest = finish("a");
  EXPECT_EQ(rest.finish_reason, "length");
  EXPECT_EQ(concat(first, rest.tokens), expected);
  EXPECT_TRUE(step_until([&] { return prefill_->stage->stats().transfers_done == 1; }));
  const HandoffStats hs = decode_->stage->stats();
  EXPECT_EQ(hs.links_failed, 0);
  EXPECT_EQ(hs.handoffs_recomputed, 0);
  EXPECT_EQ(hs.checksum_mismatches, 0);
  EXPECT_GT(hs.pulled_bytes, 0);
}

// A block that goes bad in the decode group's memory as it lands: its checksum differs, it is
// read again from the prefill side (which matches), so it is this group's memory that is bad:
// retired for good, and the request recomputed from its tokens. The transfer still completes.
TEST_F(DistFlowFault, ABlockCorruptedOnArrivalIsRetiredAndTheRequestRecomputed) {
  ASSERT_NO_FATAL_FAILURE(start(/*probe_timeout_ms=*/10'000));
  const int64_t vocab = prefill_->core->info().vocab_size;
  const EngineRequest a = greedy("a", fixtures::random_ids(21, vocab, 15));
  const EngineRequest b = greedy("b", fixtures::random_ids(17, vocab, 16));
  const std::vector<int32_t> expected_a = colocated(a), expected_b = colocated(b);
  decode_->stage->corrupt_next_pull(1);
  const std::vector<int32_t> first = hand_off(a);
  const Output rest = finish("a");
  EXPECT_EQ(rest.finish_reason, "length");
  EXPECT_EQ(concat(first, rest.tokens), expected_a);
  EXPECT_TRUE(step_until([&] { return prefill_->stage->stats().transfers_done == 1; }));
  HandoffStats hs = decode_->stage->stats();
  EXPECT_EQ(hs.checksum_mismatches, 1);
  EXPECT_EQ(hs.handoffs_recomputed, 1);
  EXPECT_EQ(hs.links_failed, 0);
  EXPECT_EQ(decode_->core->table().stats().kv_blocks_retired, 1);
  EXPECT_EQ(decode_->core->kv().usage().retired, 1);
  // The next handoff is pulled and checked clean; the retired block stays out.
  const std::vector<int32_t> first_b = hand_off(b);
  const Output rest_b = finish("b");
  EXPECT_EQ(concat(first_b, rest_b.tokens), expected_b);
  hs = decode_->stage->stats();
  EXPECT_EQ(hs.checksum_mismatches, 1);
  EXPECT_EQ(hs.handoffs_recomputed, 1);
  EXPECT_EQ(decode_->core->kv().usage().retired, 1);
}

// A parked block that changes on the prefill side before the pull: the decode side's copy
// differs from the checksum and so does a second read, so the prefill side's memory is to
// blame: nothing is retired here, and the request is recomputed from its tokens.
TEST_F(DistFlowFault, ABlockChangedOnThePrefillSideIsCaughtAndNothingRetiredHere) {
  ASSERT_NO_FATAL_FAILURE(start(/*probe_timeout_ms=*/10'000));
  const int64_t vocab = prefill_->core->info().vocab_size;
  const EngineRequest a = greedy("a", fixtures::random_ids(21, vocab, 17));
  const std::vector<int32_t> expected = colocated(a);
  const std::vector<int32_t> first = hand_off(a);  // parked; not pulled before the next loop
  const Output parked = output_of(*prefill_, "a");
  ASSERT_NE(parked.handoff, nullptr);
  ASSERT_EQ(parked.handoff->block_sums.size(), parked.handoff->blocks.size());
  KvStorage& storage = prefill_->core->storage();
  storage.block_ptr(parked.handoff->blocks.back())[storage.block_bytes() - 1] ^= std::byte{1};
  const Output rest = finish("a");
  EXPECT_EQ(rest.finish_reason, "length");
  EXPECT_EQ(concat(first, rest.tokens), expected);
  const HandoffStats hs = decode_->stage->stats();
  EXPECT_EQ(hs.checksum_mismatches, 1);
  EXPECT_EQ(hs.handoffs_recomputed, 1);
  EXPECT_EQ(decode_->core->kv().usage().retired, 0);
}

// Delayed links answer every probe: the pull waits, saturated, then completes.
TEST_F(DistFlowFault, ADelayedLinkIsSaturatedAndThePullCompletes) {
  ASSERT_NO_FATAL_FAILURE(start(/*probe_timeout_ms=*/10'000));
  const int64_t vocab = prefill_->core->info().vocab_size;
  const EngineRequest r = greedy("a", fixtures::random_ids(21, vocab, 12));
  const std::vector<int32_t> expected = colocated(r);
  ASSERT_TRUE(prefill_->stage->inject_link_fault({LinkFault::kDelay, 600'000}).ok());
  const std::vector<int32_t> first = hand_off(r);
  // Held until the decode side has had two probes answered ...
  ASSERT_TRUE(step_until([&] { return decode_->stage->stats().probes_saturated >= 2; }));
  EXPECT_EQ(decode_->core->table().pulling().size(), 1u);  // ... still pulling, not failed
  // ... then a fault of 1 ms replaces it and ends by itself.
  ASSERT_TRUE(prefill_->stage->inject_link_fault({LinkFault::kDelay, 1}).ok());
  const Output rest = finish("a");
  EXPECT_EQ(rest.finish_reason, "length");
  EXPECT_EQ(concat(first, rest.tokens), expected);
  EXPECT_TRUE(step_until([&] { return prefill_->stage->stats().transfers_done == 1; }));
  const HandoffStats hs = decode_->stage->stats();
  EXPECT_GE(hs.probes_saturated, 2);
  EXPECT_EQ(hs.links_failed, 0);
  EXPECT_EQ(hs.handoffs_recomputed, 0);
  EXPECT_GT(hs.pulled_bytes, 0);
}

// Dropped links answer no probe: the link is failed, the request recomputed on the decode
// group with the same tokens; the next request links anew and is pulled.
TEST_F(DistFlowFault, ADroppedLinkIsFailedTheRequestRecomputedAndTheLinkMadeAgain) {
  ASSERT_NO_FATAL_FAILURE(start(/*probe_timeout_ms=*/300));
  const int64_t vocab = prefill_->core->info().vocab_size;
  const EngineRequest a = greedy("a", fixtures::random_ids(21, vocab, 13));
  const EngineRequest b = greedy("b", fixtures::random_ids(30, vocab, 14));
  const std::vector<int32_t> expected_a = colocated(a), expected_b = colocated(b);
  ASSERT_TRUE(prefill_->stage->inject_link_fault({LinkFault::kDrop, 600'000}).ok());
  const std::vector<int32_t> first = hand_off(a);
  ASSERT_TRUE(step_until([&] { return decode_->stage->stats().links_failed == 1; }));
  ASSERT_TRUE(prefill_->stage->inject_link_fault({LinkFault::kDrop, 0}).ok());  // ends it
  const Output rest = finish("a");
  EXPECT_EQ(rest.finish_reason, "length");
  EXPECT_EQ(concat(first, rest.tokens), expected_a);
  HandoffStats hs = decode_->stage->stats();
  EXPECT_EQ(hs.probes_saturated, 0);
  EXPECT_EQ(hs.handoffs_recomputed, 1);
  const int64_t pulled = hs.pulled_bytes;
  EXPECT_EQ(pulled, 0);
  // The next handoff links anew and is pulled (the abandoned transfer stays parked until
  // its deadline).
  const std::vector<int32_t> first_b = hand_off(b);
  const Output rest_b = finish("b");
  EXPECT_EQ(rest_b.finish_reason, "length");
  EXPECT_EQ(concat(first_b, rest_b.tokens), expected_b);
  EXPECT_TRUE(step_until([&] { return prefill_->stage->stats().transfers_done == 1; }));
  hs = decode_->stage->stats();
  EXPECT_EQ(hs.links_failed, 1);
  EXPECT_EQ(hs.handoffs_recomputed, 1);
  EXPECT_GT(hs.pulled_bytes, pulled);
  EXPECT_EQ(prefill_->stage->stats().parked, 1);
}

// Two handoffs queued on a link that stops answering: the first pull's probe goes unanswered,
// and the second, queued behind it for the same link, fails with it (one link failure, not a
// probe timeout each); both requests are recomputed with their colocated tokens.
TEST_F(DistFlowFault, HandoffsQueuedBehindAFailedLinkFailWithIt) {
  // The probe timeout outlasts b's prefill, so b is queued while a's pull waits.
  ASSERT_NO_FATAL_FAILURE(start(/*probe_timeout_ms=*/2'000));
  const int64_t vocab = prefill_->core->info().vocab_size;
  const EngineRequest a = greedy("a", fixtures::random_ids(21, vocab, 18));
  const EngineRequest b = greedy("b", fixtures::random_ids(26, vocab, 19));
  const std::vector<int32_t> expected_a = colocated(a), expected_b = colocated(b);
  ASSERT_TRUE(prefill_->stage->inject_link_fault({LinkFault::kDrop, 600'000}).ok());
  const std::vector<int32_t> first_a = hand_off(a);
  const std::vector<int32_t> first_b = hand_off(b);
  ASSERT_EQ(decode_->stage->stats().links_failed, 0) << "b was not queued behind a's pull";
  const Output rest_a = finish("a");
  const Output rest_b = finish("b");
  EXPECT_EQ(concat(first_a, rest_a.tokens), expected_a);
  EXPECT_EQ(concat(first_b, rest_b.tokens), expected_b);
  const HandoffStats hs = decode_->stage->stats();
  EXPECT_EQ(hs.links_failed, 1);
  EXPECT_EQ(hs.handoffs_recomputed, 2);
  ASSERT_TRUE(prefill_->stage->inject_link_fault({LinkFault::kDrop, 0}).ok());
}

TEST_F(DistFlowFault, OnlyAPrefillGroupTakesALinkFault) {
  ASSERT_NO_FATAL_FAILURE(start(/*probe_timeout_ms=*/300));
  const Status st = decode_->stage->inject_link_fault({LinkFault::kDrop, 1000});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
}

}  // namespace
}  // namespace xds::engine
