// The request table without a model: steps whose "forward" is a hand-written logits row per
// chunk (greedy sampling picks its argmax), checked against the lengths, tokens, deltas and
// KV lengths worked out by hand; preemption and its recompute; cancel; n > 1 forks; and the
// rollback of a failed step, which must leave every sequence, its KV and the deltas as they
// were before the step.
#include "engine/request_table.h"

#include <gtest/gtest.h>

#include <cstring>

#include "engine/sampler.h"

namespace xds::engine {
namespace {

constexpr int64_t kBs = 4;
constexpr int64_t kVocab = 8;
constexpr int32_t kEos = 7;

KvStorage make_storage(int64_t blocks) {
  KvStorageShape shape;
  shape.layout = mla_kv_layout(1, 4, 4, DType::kF32);
  shape.num_blocks = blocks;
  shape.block_size = kBs;
  auto r = KvStorage::create(shape);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

KvManager make_kv(int32_t blocks, bool cache) {
  auto r = KvManager::create({.num_blocks = blocks, .block_size = kBs, .prefix_cache = cache});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

struct Fixture {
  explicit Fixture(int32_t blocks = 16, bool cache = false, int64_t max_num_seqs = 4)
      : kv(make_kv(blocks, cache)),
        storage(make_storage(blocks)),
        table(options(max_num_seqs), kv, &storage) {}

  static RequestTableOptions options(int64_t max_num_seqs) {
    RequestTableOptions o;
    o.max_num_seqs = max_num_seqs;
    o.max_num_batched_tokens = 64;
    o.block_size = kBs;
    o.max_model_len = 64;
    o.valid_vocab = kVocab;
    o.eos_ids = {kEos};
    return o;
  }

  // Plans and applies one step.
  void begin() {
    ASSERT_TRUE(table.plan(plan).ok());
    ASSERT_TRUE(table.apply(plan).ok());
  }
  // Commits the step with chunk i's row peaking at picks[i].
  Status commit(const std::vector<int32_t>& picks) {
    StepOutput out;
    size_t rows = 0;
    for (const TokenChunk& c : table.chunks()) rows += c.all_logits ? c.tokens.size() : 1;
    EXPECT_EQ(rows, picks.size());
    out.logits.assign(rows * kVocab, 0.0f);
    for (size_t r = 0; r < rows; ++r) out.logits[r * kVocab + static_cast<size_t>(picks[r])] = 5.0f;
    return table.commit(out, kVocab, /*hidden_size=*/0, sampler, /*run_empty_passes=*/false);
  }
  // A whole step; returns the deltas it left.
  std::vector<TokenDelta> step(const std::vector<int32_t>& picks) {
    begin();
    EXPECT_TRUE(commit(picks).ok());
    table.end_step();
    std::vector<TokenDelta> d = std::move(table.deltas());
    table.deltas().clear();
    return d;
  }

  KvManager kv;
  KvStorage storage;
  RequestTable table;
  Sampler sampler;
  StepPlan plan;
};

EngineRequest request(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens,
                      int32_t n = 1) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.n = n;
  return r;
}

std::vector<int32_t> output_of(const Sequence& s) {
  return {s.tokens.begin() + s.prompt_len(), s.tokens.end()};
}

TEST(RequestTable, PrefillThenDecodesUntilLength) {
  Fixture f;
  ASSERT_TRUE(f.table.add(request("a", {1, 2, 3, 4, 5}, 3)).ok());
  EXPECT_FALSE(f.table.add(request("a", {1}, 1)).ok());  // duplicate id
  f.begin();
  // The whole 5-token prompt in one chunk from position 0.
  ASSERT_EQ(f.table.chunks().size(), 1u);
  EXPECT_EQ(f.table.chunks()[0].start_pos, 0);
  EXPECT_EQ(std::vector<int32_t>(f.table.chunks()[0].tokens.begin(),
                                 f.table.chunks()[0].tokens.end()),
            (std::vector<int32_t>{1, 2, 3, 4, 5}));
  ASSERT_TRUE(f.commit({6}).ok());
  f.table.end_step();
  ASSERT_EQ(f.table.deltas().size(), 1u);
  EXPECT_EQ(f.table.deltas()[0].request_id, "a");
  EXPECT_EQ(f.table.deltas()[0].tokens, std::vector<int32_t>{6});
  EXPECT_EQ(f.table.deltas()[0].prompt_tokens, 5);
  EXPECT_EQ(f.table.deltas()[0].finish_reason, "");
  f.table.deltas().clear();
  Sequence& s = *f.table.running().at(0);
  EXPECT_EQ(s.computed, 5);
  EXPECT_EQ(f.kv.length(s.kv), 5);

  // Decode: the token at position 5 (the sampled 6) goes in.
  std::vector<TokenDelta> d = f.step({2});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].tokens, std::vector<int32_t>{2});
  EXPECT_EQ(s.computed, 6);
  EXPECT_EQ(f.kv.length(s.kv), 6);
  EXPECT_EQ(output_of(s), (std::vector<int32_t>{6, 2}));

  d = f.step({3});  // the third token reaches max_tokens
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].tokens, std::vector<int32_t>{3});
  EXPECT_EQ(d[0].finish_reason, "length");
  EXPECT_TRUE(f.table.running().empty());
  EXPECT_EQ(f.kv.available(), 16);  // every block back
  f.table.release_finished();
  EXPECT_TRUE(f.table.requests().empty());
  EXPECT_FALSE(f.table.has_work());
}

TEST(RequestTable, EosStopsAndCancelAborts) {
  Fixture f;
  ASSERT_TRUE(f.table.add(request("a", {1, 2}, 10)).ok());
  ASSERT_TRUE(f.table.add(request("b", {3, 4}, 10)).ok());
  std::vector<TokenDelta> d = f.step({kEos, 5});  // a: eos; b: 5
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].request_id, "a");
  EXPECT_EQ(d[0].finish_reason, "stop");
  EXPECT_EQ(d[1].request_id, "b");
  EXPECT_EQ(d[1].finish_reason, "");
  f.table.cancel("b", -1);
  ASSERT_EQ(f.table.deltas().size(), 1u);
  EXPECT_EQ(f.table.deltas()[0].request_id, "b");
  EXPECT_EQ(f.table.deltas()[0].finish_reason, "abort");
  EXPECT_EQ(f.kv.available(), 16);  // both gave their blocks back
}

TEST(RequestTable, PreemptedSequenceIsRecomputedWithoutSampling) {
  Fixture f;
  ASSERT_TRUE(f.table.add(request("a", {1, 2, 3, 4, 5}, 10)).ok());
  (void)f.step({6});
  (void)f.step({2});  // tokens 1 2 3 4 5 6 2, computed 6
  Sequence& s = *f.table.running().at(0);
  f.table.preempt(s);
  EXPECT_EQ(s.state, SeqState::kPreempted);
  EXPECT_EQ(s.computed, 0);
  EXPECT_EQ(s.target, 6);  // every token but the last sampled one
  EXPECT_EQ(f.kv.available(), 16);
  EXPECT_EQ(f.table.stats().preemptions, 1);
  // The recompute: one chunk [0, 6), no token sampled.
  std::vector<TokenDelta> d = f.step({0});
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(s.state, SeqState::kRunning);
  EXPECT_EQ(s.computed, 6);
  EXPECT_EQ(f.kv.length(s.kv), 6);
  // Then the decode of the last sampled token at position 6.
  d = f.step({4});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].tokens, std::vector<int32_t>{4});
  EXPECT_EQ(output_of(s), (std::vector<int32_t>{6, 2, 4}));
}

TEST(RequestTable, AResumedRequestIsRecomputedThenDecodesWithoutResending) {
  Fixture f;
  EngineRequest r = request("a", {1, 2, 3, 4, 5}, 4);
  r.resume = {{6, 2}};
  ASSERT_TRUE(f.table.add(r).ok());
  ASSERT_EQ(f.table.preempted().size(), 1u);
  const Sequence& s = *f.table.preempted()[0];
  EXPECT_EQ(s.target, 6);  // the prompt and the first resumed token
  EXPECT_EQ(f.table.stats().preemptions, 0);
  // The recompute sends nothing; the decode of token 2 at position 6 samples position 7.
  EXPECT_TRUE(f.step({0}).empty());
  std::vector<TokenDelta> d = f.step({4});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].tokens, std::vector<int32_t>{4});
  EXPECT_EQ(d[0].finish_reason, "");
  // max_tokens counts the resumed tokens: 6 2 4 3 is the fourth.
  d = f.step({3});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].tokens, std::vector<int32_t>{3});
  EXPECT_EQ(d[0].finish_reason, "length");
}

TEST(RequestTable, ResumedChoicesRunApartAndEndedOnesStayEnded) {
  Fixture f;
  EngineRequest r = request("a", {1, 2, 3, 4, 5}, 6, /*n=*/3);
  r.resume = {{6, 2}, {}, {5}};
  r.resume_finished = {0, 0, 1};
  ASSERT_TRUE(f.table.add(r).ok());
  EXPECT_EQ(f.table.preempted().size(), 1u);  // choice 0
  EXPECT_EQ(f.table.waiting().size(), 1u);    // choice 1: nothing streamed yet
  // One step: choice 0 recomputes [0, 6), choice 1 prefills [0, 5) and samples its own first
  // token (no fork, and choice 0 samples nothing yet).
  std::vector<TokenDelta> d = f.step({0, 3});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].index, 1);
  EXPECT_EQ(d[0].tokens, std::vector<int32_t>{3});
  EXPECT_EQ(f.table.requests().at("a")->choices.size(), 3u);
  d = f.step({kEos, kEos});
  ASSERT_EQ(d.size(), 2u);
  for (const TokenDelta& x : d) EXPECT_EQ(x.finish_reason, "stop");
  std::vector<std::string> released;
  f.table.release_finished(&released);
  EXPECT_EQ(released, std::vector<std::string>{"a"});
}

TEST(RequestTable, AResumeThatDoesNotMatchIsRefused) {
  Fixture f;
  EngineRequest r = request("a", {1, 2, 3}, 4, /*n=*/2);
  r.resume = {{6}};
  EXPECT_EQ(f.table.add(r).code(), StatusCode::kInvalidArgument);
  r.resume = {{6}, {5}};
  r.resume_finished = {0};
  EXPECT_EQ(f.table.add(r).code(), StatusCode::kInvalidArgument);
  r.resume_finished.clear();
  r.resume[1].assign(70, 1);  // past max_model_len 64
  EXPECT_EQ(f.table.add(r).code(), StatusCode::kInvalidArgument);
}

TEST(RequestTable, RetiredBlocksAreRecomputedIntoGoodOnesAndNeverReused) {
  Fixture f;
  ASSERT_TRUE(f.table.add(request("a", {1, 2, 3, 4, 5}, 10)).ok());
  ASSERT_TRUE(f.table.add(request("b", {1, 2, 3, 4, 6}, 10)).ok());
  (void)f.step({6, 3});
  (void)f.step({2, 2});  // a: 1 2 3 4 5 6 2, b: 1 2 3 4 6 3 2; 6 positions of KV each
  Sequence& a = *f.table.running().at(0);
  Sequence& b = *f.table.running().at(1);
  const int32_t bad = f.kv.table(a.kv)[0];  // a's first block, [1 2 3 4]
  EXPECT_EQ(f.table.retire_kv_blocks(1), 1);
  EXPECT_EQ(f.table.stats().kv_blocks_retired, 1);
  // a held it and is recomputed; b holds its own blocks (no prefix cache here) and runs on.
  EXPECT_EQ(a.state, SeqState::kPreempted);
  EXPECT_EQ(b.state, SeqState::kRunning);
  EXPECT_EQ(f.table.stats().retired_recomputes, 1);
  EXPECT_TRUE(f.kv.allocator().retired(bad));
  // b decodes while a recomputes [0, 6) (no delta for a), then both decode: the same tokens
  // as if nothing had happened, and the bad block is in nobody's table.
  std::vector<TokenDelta> d = f.step({4, 0});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request_id, "b");
  d = f.step({5, 1});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(output_of(a), (std::vector<int32_t>{6, 2, 5}));
  EXPECT_EQ(output_of(b), (std::vector<int32_t>{3, 2, 4, 1}));
  for (const Sequence* s : {&a, &b}) {
    for (const int32_t blk : f.kv.table(s->kv)) EXPECT_NE(blk, bad);
  }
  f.kv.check_invariants();
}

TEST(RequestTable, ForkedChoicesShareThePrefillRow) {
  Fixture f;
  ASSERT_TRUE(f.table.add(request("a", {1, 2, 3, 4, 5, 6}, 4, /*n=*/2)).ok());
  std::vector<TokenDelta> d = f.step({3});
  // Both choices sample their first token from the one row (greedy: both 3).
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].index, 0);
  EXPECT_EQ(d[1].index, 1);
  EXPECT_EQ(d[0].tokens, std::vector<int32_t>{3});
  EXPECT_EQ(d[1].tokens, std::vector<int32_t>{3});
  ASSERT_EQ(f.table.running().size(), 2u);
  // The child shares block 0 (positions 0-3) and copied the partial block 1.
  const Sequence& p = *f.table.running()[0];
  const Sequence& c = *f.table.running()[1];
  EXPECT_EQ(f.kv.table(p.kv)[0], f.kv.table(c.kv)[0]);
  EXPECT_NE(f.kv.table(p.kv)[1], f.kv.table(c.kv)[1]);
  EXPECT_EQ(c.computed, 6);
}

TEST(RequestTable, RollbackRestoresLengthsOutputsAndKv) {
  Fixture f(16, /*cache=*/true);
  ASSERT_TRUE(f.table.add(request("a", {1, 2, 3, 4, 5, 6, 7 - 1}, 10)).ok());  // 7 tokens
  ASSERT_TRUE(f.table.add(request("b", {2, 2, 2}, 10)).ok());
  (void)f.step({1, 2});  // a: 7 + [1], b: 3 + [2]
  Sequence& a = *f.table.running()[0];
  Sequence& b = *f.table.running()[1];
  const std::vector<int32_t> a_tokens = a.tokens, b_tokens = b.tokens;
  const std::vector<int32_t> a_blocks(f.kv.table(a.kv).begin(), f.kv.table(a.kv).end());
  ASSERT_EQ(a.computed, 7);
  ASSERT_EQ(f.kv.length(a.kv), 7);

  // The decode step of a fills block 1 (positions 4-7), which enters the prefix cache; b
  // samples eos and finishes (its KV goes back). Then the step is rolled back.
  f.begin();
  ASSERT_TRUE(f.commit({3, kEos}).ok());
  ASSERT_EQ(f.kv.length(a.kv), 8);
  ASSERT_EQ(b.state, SeqState::kFinished);
  const int32_t cached_block = f.kv.table(a.kv)[1];
  std::memset(f.storage.block_ptr(cached_block), 0x5A, static_cast<size_t>(f.storage.block_bytes()));
  ASSERT_TRUE(f.table.rollback().ok());

  EXPECT_TRUE(f.table.deltas().empty());  // no token of the step
  EXPECT_EQ(a.tokens, a_tokens);
  EXPECT_EQ(a.computed, 7);
  EXPECT_EQ(f.kv.length(a.kv), 7);
  EXPECT_EQ(f.kv.capacity(a.kv), 8);  // two blocks cover position 7
  // The cached block 1 is not written again: a holds a copy of it.
  EXPECT_EQ(f.kv.table(a.kv)[0], a_blocks[0]);
  EXPECT_NE(f.kv.table(a.kv)[1], cached_block);
  EXPECT_EQ(static_cast<unsigned char>(*f.storage.block_ptr(f.kv.table(a.kv)[1])), 0x5Au);
  // b had given its KV back: it is restored as preempted, its tokens as before.
  EXPECT_EQ(b.state, SeqState::kPreempted);
  EXPECT_EQ(b.tokens, b_tokens);
  EXPECT_EQ(b.target, 3);
  EXPECT_EQ(b.request->finished, 0);
  EXPECT_EQ(f.table.stats().preemptions, 0);
  f.kv.check_invariants();

  // The step again gives what it would have given: a decodes 3, b is recomputed (no token),
  // then decodes.
  std::vector<TokenDelta> d = f.step({3, 0});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request_id, "a");
  EXPECT_EQ(d[0].tokens, std::vector<int32_t>{3});
  EXPECT_EQ(f.kv.length(a.kv), 8);
  EXPECT_EQ(b.computed, 3);
  d = f.step({4, 5});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[1].request_id, "b");
  EXPECT_EQ(d[1].tokens, std::vector<int32_t>{5});
  f.kv.check_invariants();
}

TEST(RequestTable, RollbackOfAForkingPrefillDropsTheChildren) {
  Fixture f;
  ASSERT_TRUE(f.table.add(request("a", {1, 2, 3, 4, 5}, 4, /*n=*/3)).ok());
  const int64_t free_before = f.kv.available();
  f.begin();
  ASSERT_TRUE(f.commit({2}).ok());
  ASSERT_EQ(f.table.running().size(), 3u);
  ASSERT_TRUE(f.table.rollback().ok());
  ASSERT_EQ(f.table.running().size(), 1u);
  Sequence& s = *f.table.running()[0];
  EXPECT_EQ(s.request->choices.size(), 1u);
  EXPECT_FALSE(s.forked);
  EXPECT_EQ(s.computed, 0);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(f.kv.length(s.kv), 0);
  EXPECT_TRUE(f.table.deltas().empty());
  // Admitted in the step, it keeps its (empty) KV sequence; the children's blocks are back.
  EXPECT_EQ(f.kv.available(), free_before);
  f.kv.check_invariants();
  // Run again: the same three first tokens.
  std::vector<TokenDelta> d = f.step({2});
  ASSERT_EQ(d.size(), 3u);
  for (const TokenDelta& x : d) EXPECT_EQ(x.tokens, std::vector<int32_t>{2});
}

TEST(RequestTable, DecodeHandoffsWaitForTheirPull) {
  Fixture f(4);  // 4 blocks of 4
  EngineRequest r = request("d", {1, 2, 3, 4, 5}, 4);
  r.phase = RequestPhase::kDecode;
  r.handoff.rows = 5;
  r.handoff.output = {6};
  ASSERT_TRUE(f.table.add(std::move(r)).ok());
  ASSERT_EQ(f.table.awaiting().size(), 1u);
  ASSERT_TRUE(f.table.plan(f.plan).ok());
  // blocks_for(5 + 1) = 2 fit: the plan pulls it, and the step runs nothing.
  EXPECT_EQ(f.plan.handoffs, std::vector<int64_t>{f.table.awaiting()[0]->id});
  EXPECT_TRUE(f.plan.chunks.empty());
}

// A handoff whose link failed during its pull: its reserved blocks go back, and it is
// recomputed from prompt + the prefill side's first token like a preempted sequence (one
// chunk [0, 5) that samples nothing, then the decode of that token at position 5).
TEST(RequestTable, AHandoffWhoseLinkFailedIsRecomputedFromItsTokens) {
  Fixture f(4);  // 4 blocks of 4
  EngineRequest r = request("d", {1, 2, 3, 4, 5}, 4);
  r.phase = RequestPhase::kDecode;
  r.handoff.rows = 5;
  r.handoff.output = {6};
  ASSERT_TRUE(f.table.add(std::move(r)).ok());
  Sequence& s = *f.table.awaiting().at(0);
  // What HandoffStage::start_pulls does: blocks for the 5 rows reserved, the pull posted.
  s.kv = f.kv.add_sequence();
  ASSERT_TRUE(f.kv.reserve(s.kv, 5).ok());
  f.table.start_pull(s);
  EXPECT_EQ(f.kv.available(), 2);
  f.table.end_pull(s);  // the pull ended: its link failed
  f.table.recompute_handoff(s);
  EXPECT_EQ(s.state, SeqState::kPreempted);
  EXPECT_EQ(s.kv, -1);
  EXPECT_EQ(f.kv.available(), 4);
  EXPECT_EQ(s.computed, 0);
  EXPECT_EQ(s.target, 5);  // the prompt; the first token is the next decode's input
  EXPECT_TRUE(f.table.awaiting().empty());
  ASSERT_EQ(f.table.preempted().size(), 1u);
  EXPECT_EQ(f.table.stats().preemptions, 0);
  std::vector<TokenDelta> d = f.step({0});
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(s.state, SeqState::kRunning);
  EXPECT_EQ(s.computed, 5);
  EXPECT_EQ(f.kv.length(s.kv), 5);
  d = f.step({3});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request_id, "d");
  EXPECT_EQ(d[0].tokens, std::vector<int32_t>{3});
  EXPECT_EQ(output_of(s), (std::vector<int32_t>{6, 3}));
  EXPECT_EQ(s.computed, 6);
  f.kv.check_invariants();
}

}  // namespace
}  // namespace xds::engine
