// The batching policy on hand-built states (expected plans worked out from the rules in
// scheduler.h), plus a randomised simulation that applies every plan to a plain model of the
// block pool and checks the invariants and that every request finishes.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace xds::engine {
namespace {

SchedSeq decoding(int64_t id, int64_t computed, int64_t bs = 16) {
  return {.id = id,
          .arrival = id,
          .target = computed,
          .computed = computed,
          .blocks_held = blocks_for(computed, bs)};
}
SchedSeq waiting(int64_t id, int64_t target) {
  return {.id = id, .arrival = id, .target = target};
}

StepPlan run(const SchedulerInput& in, const SchedulerLimits& lim) {
  StepPlan plan;
  const Status st = schedule(in, lim, &plan);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return plan;
}

SchedulerLimits limits(int64_t budget, int64_t free_blocks) {
  return {.max_num_seqs = 16, .max_num_batched_tokens = budget, .free_blocks = free_blocks};
}

TEST(Scheduler, DecodesFirstThenPrefillWithinBudget) {
  SchedulerInput in;
  in.running = {decoding(1, 20), decoding(2, 40), decoding(3, 5)};
  in.waiting = {waiting(4, 100), waiting(5, 100)};
  const StepPlan p = run(in, limits(64, 100));
  ASSERT_EQ(p.chunks.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(p.chunks[i].decode);
    EXPECT_EQ(p.chunks[i].count, 1);
    EXPECT_EQ(p.chunks[i].start, in.running[i].computed);
    EXPECT_TRUE(p.chunks[i].wants_logits);
  }
  // 64 - 3 decodes = 61 prompt tokens of the oldest waiting request; the next gets nothing.
  EXPECT_EQ(p.chunks[3].seq, 4);
  EXPECT_EQ(p.chunks[3].start, 0);
  EXPECT_EQ(p.chunks[3].count, 61);
  EXPECT_FALSE(p.chunks[3].wants_logits);
  ASSERT_EQ(p.admitted.size(), 1u);
  EXPECT_EQ(p.admitted[0].seq, 4);
  EXPECT_EQ(p.tokens, 64);
  // Blocks: seq 1 at 20 -> 21 fits its 2 blocks; seq 2 at 40 -> 41 fits 3; seq 3 fits 1;
  // seq 4 needs ceil(61 / 16) = 4.
  EXPECT_EQ(p.new_blocks, 4);
}

TEST(Scheduler, DecodesAreNotStarvedByAnOlderPrefill) {
  SchedulerInput in;
  // Seq 1 arrived first and is part-way through a long prompt; seqs 2-4 decode.
  in.running = {{.id = 1, .arrival = 1, .target = 1000, .computed = 256, .blocks_held = 16},
                decoding(2, 30),
                decoding(3, 31),
                decoding(4, 32)};
  const StepPlan p = run(in, limits(8, 100));
  ASSERT_EQ(p.chunks.size(), 4u);
  EXPECT_EQ(p.chunks[0].seq, 2);
  EXPECT_EQ(p.chunks[1].seq, 3);
  EXPECT_EQ(p.chunks[2].seq, 4);
  EXPECT_EQ(p.chunks[3].seq, 1);
  EXPECT_EQ(p.chunks[3].start, 256);
  EXPECT_EQ(p.chunks[3].count, 5);  // 8 - 3
  EXPECT_EQ(p.tokens, 8);
}

TEST(Scheduler, LookaheadCountsInBudgetAndBlocks) {
  SchedulerInput in;
  in.running = {decoding(1, 14), decoding(2, 100)};
  in.waiting = {waiting(3, 50)};
  SchedulerLimits lim = limits(10, 100);
  lim.lookahead = 2;
  const StepPlan p = run(in, lim);
  ASSERT_EQ(p.chunks.size(), 3u);
  EXPECT_EQ(p.chunks[0].count, 3);
  EXPECT_EQ(p.chunks[1].count, 3);
  EXPECT_EQ(p.chunks[2].count, 4);  // 10 - 2 * 3
  // Seq 1: positions up to 17 need 2 blocks (holds 1); seq 2: 103 -> 7 (holds 7); seq 3: 1.
  EXPECT_EQ(p.new_blocks, 2);
}

TEST(Scheduler, FirstComeFirstServedEvenWhenALaterOneWouldFit) {
  SchedulerInput in;
  in.waiting = {waiting(1, 100), waiting(2, 10)};
  // Chunking off: seq 1 needs 7 blocks, only 5 free -> nobody (seq 2's 1 block must wait).
  SchedulerLimits lim = limits(200, 5);
  lim.chunked_prefill = false;
  StepPlan p = run(in, lim);
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_TRUE(p.admitted.empty());
  // Chunking on: seq 1 takes the 5 blocks (80 tokens), seq 2 still waits.
  lim.chunked_prefill = true;
  p = run(in, lim);
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].seq, 1);
  EXPECT_EQ(p.chunks[0].count, 80);
}

// Applies prefill chunks of one request until it is done; returns (start, count, logits).
std::vector<std::tuple<int64_t, int64_t, bool>> prefill_chunks(SchedulerLimits lim,
                                                               int64_t target) {
  std::vector<std::tuple<int64_t, int64_t, bool>> out;
  SchedSeq s = waiting(1, target);
  bool running = false;
  for (int step = 0; step < 100 && s.computed < target; ++step) {
    SchedulerInput in;
    (running ? in.running : in.waiting).push_back(s);
    const StepPlan p = run(in, lim);
    EXPECT_EQ(p.chunks.size(), 1u);
    if (p.chunks.empty()) break;
    const StepChunk& c = p.chunks[0];
    EXPECT_EQ(c.start, s.computed);
    out.emplace_back(c.start, c.count, c.wants_logits);
    s.computed += c.count;
    s.blocks_held = blocks_for(s.computed, lim.block_size);
    running = true;
  }
  return out;
}

TEST(Scheduler, ChunkBoundaries) {
  using C = std::tuple<int64_t, int64_t, bool>;
  EXPECT_EQ(prefill_chunks(limits(32, 100), 100),
            (std::vector<C>{{0, 32, false}, {32, 32, false}, {64, 32, false}, {96, 4, true}}));
  SchedulerLimits lim = limits(64, 100);
  lim.long_prefill_chunk = 40;
  EXPECT_EQ(prefill_chunks(lim, 100),
            (std::vector<C>{{0, 40, false}, {40, 40, false}, {80, 20, true}}));
  lim.chunked_prefill = false;  // whole, even beyond the budget
  EXPECT_EQ(prefill_chunks(lim, 100), (std::vector<C>{{0, 100, true}}));
}

TEST(Scheduler, LongPrefillChunkLeavesBudgetForTheNextPrompt) {
  SchedulerInput in;
  in.waiting = {waiting(1, 1000), waiting(2, 30)};
  SchedulerLimits lim = limits(64, 100);
  lim.long_prefill_chunk = 32;
  const StepPlan p = run(in, lim);
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].count, 32);
  EXPECT_EQ(p.chunks[1].seq, 2);
  EXPECT_EQ(p.chunks[1].count, 30);
  EXPECT_TRUE(p.chunks[1].wants_logits);
}

TEST(Scheduler, ChunkingOffPrefillsWholeAndStallsTheStep) {
  SchedulerInput in;
  in.running = {decoding(1, 10)};
  in.waiting = {waiting(2, 300), waiting(3, 5)};
  SchedulerLimits lim = limits(32, 100);
  lim.chunked_prefill = false;
  const StepPlan p = run(in, lim);
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_TRUE(p.chunks[0].decode);
  EXPECT_EQ(p.chunks[1].seq, 2);
  EXPECT_EQ(p.chunks[1].count, 300);  // the whole prompt, past the budget
  EXPECT_EQ(p.tokens, 301);
  // Two prompts that each fit but not together: only the first.
  in.waiting = {waiting(2, 20), waiting(3, 20)};
  const StepPlan q = run(in, lim);
  ASSERT_EQ(q.chunks.size(), 2u);
  EXPECT_EQ(q.chunks[1].seq, 2);
}

TEST(Scheduler, PreemptionPicksTheNewest) {
  SchedulerInput in;
  // Each sits at a block boundary (16 = one full block) and needs one more block; one free.
  in.running = {decoding(1, 16), decoding(2, 16), decoding(3, 16)};
  StepPlan p = run(in, limits(64, 1));
  // Seq 1 takes the free block; seq 2 preempts seq 3 and takes its block.
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].seq, 1);
  EXPECT_EQ(p.chunks[1].seq, 2);
  EXPECT_EQ(p.preempted, (std::vector<int64_t>{3}));
  // Nothing free: seq 1 preempts 3, seq 2 preempts itself (it is then the newest).
  p = run(in, limits(64, 0));
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].seq, 1);
  EXPECT_EQ(p.preempted, (std::vector<int64_t>{3, 2}));
  // A lone decode without a block preempts itself.
  in.running = {decoding(1, 32)};
  p = run(in, limits(64, 0));
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_EQ(p.preempted, (std::vector<int64_t>{1}));
  // The newest may be part-way through its prefill; awaiting-KV sequences are never chosen.
  in.running = {
      decoding(1, 16),
      {.id = 2, .arrival = 2, .target = 100, .computed = 32, .blocks_held = 2},
      {.id = 3, .arrival = 3, .target = 64, .computed = 0, .blocks_held = 4, .awaiting_kv = true}};
  p = run(in, limits(64, 0));
  EXPECT_EQ(p.preempted, (std::vector<int64_t>{2}));
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].seq, 1);
}

TEST(Scheduler, BlockedRunningPrefillPreemptsNewerIdleOnes) {
  SchedulerInput in;
  in.running = {{.id = 1, .arrival = 1, .target = 100, .computed = 32, .blocks_held = 2},
                {.id = 2, .arrival = 2, .target = 100, .computed = 48, .blocks_held = 3}};
  const StepPlan p = run(in, limits(64, 0));
  EXPECT_EQ(p.preempted, (std::vector<int64_t>{2}));
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].seq, 1);
  EXPECT_EQ(p.chunks[0].count, 48);  // 2 + 3 blocks cover 80 positions
}

TEST(Scheduler, HandoffsArePulledOnlyWhenTheirBlocksFit) {
  // Block 16, lookahead 1. Handoff 10: 40 rows need blocks_for(42) = 3 and reserve
  // blocks_for(40) = 3; 11: 15 rows need blocks_for(17) = 2, reserve 1; 12: 100 rows need 7.
  SchedulerInput in;
  in.awaiting = {{.id = 10, .rows = 40}, {.id = 11, .rows = 15}, {.id = 12, .rows = 100}};
  in.waiting = {waiting(1, 32)};
  SchedulerLimits lim = limits(256, 6);
  lim.lookahead = 1;
  StepPlan p = run(in, lim);
  // 6 free: 10 (6 >= 3, 3 left), 11 (3 >= 2, 2 left), 12 stops; the prompt gets 2 blocks.
  EXPECT_EQ(p.handoffs, (std::vector<int64_t>{10, 11}));
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].count, 32);
  EXPECT_EQ(p.new_blocks, 2);
  // 5 free: the same two handoffs leave 1 block, so the prompt's first chunk is 16 tokens.
  lim.free_blocks = 5;
  p = run(in, lim);
  EXPECT_EQ(p.handoffs, (std::vector<int64_t>{10, 11}));
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].count, 16);
  // First come, first served: 12 first does not fit 9 blocks, and 11 behind it waits too.
  in.awaiting = {{.id = 12, .rows = 100}, {.id = 11, .rows = 15}};
  lim.free_blocks = 6;
  p = run(in, lim);
  EXPECT_TRUE(p.handoffs.empty());
  EXPECT_TRUE(p.handoffs_unfittable.empty());
  // A pool of 6 blocks can never hold 12: it is unfittable and skipped; so is a handoff whose
  // rows + 1 pass max_model_len.
  lim.total_blocks = 6;
  in.awaiting = {{.id = 12, .rows = 100}, {.id = 13, .rows = 63}, {.id = 11, .rows = 15}};
  lim.max_model_len = 63;
  p = run(in, lim);
  EXPECT_EQ(p.handoffs_unfittable, (std::vector<int64_t>{12, 13}));
  EXPECT_EQ(p.handoffs, (std::vector<int64_t>{11}));
  // No seat: max_num_seqs sequences run already.
  in.running = {decoding(2, 10)};
  lim.max_num_seqs = 1;
  lim.total_blocks = 0;
  lim.max_model_len = 0;
  in.awaiting = {{.id = 11, .rows = 15}};
  p = run(in, lim);
  EXPECT_TRUE(p.handoffs.empty());
}

TEST(Scheduler, MaxNumSeqsAndAwaitingKvSeats) {
  SchedulerInput in;
  in.running = {decoding(1, 10),
                {.id = 2, .arrival = 2, .target = 64, .blocks_held = 4, .awaiting_kv = true}};
  in.waiting = {waiting(3, 10), waiting(4, 10), waiting(5, 10)};
  SchedulerLimits lim = limits(256, 100);
  lim.max_num_seqs = 3;
  const StepPlan p = run(in, lim);
  ASSERT_EQ(p.admitted.size(), 1u);  // 2 running (one awaiting KV) + 1 = 3
  EXPECT_EQ(p.admitted[0].seq, 3);
  for (const StepChunk& c : p.chunks) EXPECT_NE(c.seq, 2);
}

TEST(Scheduler, PreemptedComeBeforeWaitingAndPrefixHitsAttach) {
  SchedulerInput in;
  in.preempted = {{.id = 7, .arrival = 9, .target = 50, .hit_blocks = 3, .hit_evictable = 3}};
  in.waiting = {{.id = 3, .arrival = 3, .target = 48, .hit_blocks = 3, .hit_evictable = 1}};
  const StepPlan p = run(in, limits(256, 10));
  ASSERT_EQ(p.admitted.size(), 2u);
  // Seq 7: 3 hit blocks -> computed 48, 2 tokens left; its evictable hits use 3 of 10 blocks,
  // and position 49 needs a 4th block.
  EXPECT_EQ(p.admitted[0].seq, 7);
  EXPECT_EQ(p.admitted[0].hit_blocks, 3);
  EXPECT_EQ(p.chunks[0].start, 48);
  EXPECT_EQ(p.chunks[0].count, 2);
  // Seq 3: target 48 is all hits, but the last token must be computed: (48 - 1) / 16 = 2
  // blocks used, computed 32, 16 tokens into the 3rd block (1 more).
  EXPECT_EQ(p.admitted[1].seq, 3);
  EXPECT_EQ(p.admitted[1].hit_blocks, 2);
  EXPECT_EQ(p.chunks[1].start, 32);
  EXPECT_EQ(p.chunks[1].count, 16);
  EXPECT_TRUE(p.chunks[1].wants_logits);
  EXPECT_EQ(p.new_blocks, 2);
}

TEST(Scheduler, UnfittableRequestsAreReportedAndSkipped) {
  SchedulerInput in;
  in.waiting = {waiting(1, 100), waiting(2, 10)};
  SchedulerLimits lim = limits(256, 4);
  lim.total_blocks = 4;  // 64 tokens
  const StepPlan p = run(in, lim);
  EXPECT_EQ(p.unfittable, (std::vector<int64_t>{1}));
  ASSERT_EQ(p.admitted.size(), 1u);
  EXPECT_EQ(p.admitted[0].seq, 2);
}

TEST(Scheduler, BadInputIsAClearError) {
  StepPlan p;
  SchedulerInput in;
  in.waiting = {waiting(2, 10), waiting(1, 10)};  // out of arrival order
  Status st = schedule(in, limits(10, 10), &p);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("arrival"), std::string::npos);
  in.waiting = {waiting(1, 10)};
  in.running = {decoding(1, 10)};  // the same id twice
  st = schedule(in, limits(10, 10), &p);
  EXPECT_NE(st.message().find("seq 1 is listed twice"), std::string::npos) << st.message();
  in.running = {{.id = 5, .target = 10, .computed = 40, .blocks_held = 1}};
  st = schedule(in, limits(10, 10), &p);
  EXPECT_NE(st.message().find("seq 5"), std::string::npos) << st.message();
  EXPECT_FALSE(schedule({}, limits(0, 10), &p).ok());
  SchedulerLimits lim = limits(10, 10);
  lim.block_size = 0;
  EXPECT_FALSE(schedule({}, lim, &p).ok());
}

// A plain model of a DP group: requests arrive, every plan is applied to a block pool, decodes
// accept 1..k+1 tokens. Checks the plan invariants each step and that all requests finish.
TEST(Scheduler, RandomisedSimulationKeepsInvariantsAndFinishes) {
  int64_t preemptions = 0, chunks = 0, admissions = 0;
  for (uint32_t seed = 0; seed < 30; ++seed) {
    std::mt19937 gen(seed);
    auto uni = [&](int64_t lo, int64_t hi) {
      return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
    };
    SchedulerLimits lim;
    lim.max_num_seqs = uni(1, 6);
    lim.block_size = uni(1, 3) * 8;
    lim.lookahead = uni(0, 2);
    lim.max_num_batched_tokens = uni(lim.max_num_seqs * (1 + lim.lookahead), 200);
    lim.chunked_prefill = uni(0, 3) != 0;
    lim.long_prefill_chunk = uni(0, 1) * uni(8, 64);
    lim.total_blocks = uni(20, 60);
    struct Req {
      SchedSeq s;
      int64_t prompt = 0, out = 0, generated = 0;
      int where = 0;  // 0 waiting, 1 running, 2 preempted, 3 done
    };
    std::map<int64_t, Req> reqs;
    const int n = 25;
    for (int64_t i = 0; i < n; ++i) {
      Req r;
      r.prompt = uni(1, 150);
      r.out = uni(1, 40);
      r.s = waiting(i, r.prompt);
      reqs[i] = r;
    }
    int64_t free_blocks = lim.total_blocks;
    int done = 0;
    StepPlan plan;
    for (int step = 0; step < 20000 && done < n; ++step) {
      SchedulerInput in;
      for (auto& [id, r] : reqs) {
        if (id > step) continue;  // arrives at step `id`
        if (r.where == 0) in.waiting.push_back(r.s);
        if (r.where == 1) in.running.push_back(r.s);
        if (r.where == 2) in.preempted.push_back(r.s);
      }
      lim.free_blocks = free_blocks;
      ASSERT_TRUE(schedule(in, lim, &plan).ok());
      // Invariants.
      std::set<int64_t> seen;
      int64_t tokens = 0;
      for (const StepChunk& c : plan.chunks) {
        ASSERT_TRUE(seen.insert(c.seq).second) << "seq " << c.seq << " scheduled twice";
        tokens += c.count;
      }
      for (int64_t id : plan.preempted) ASSERT_FALSE(seen.count(id));
      if (lim.chunked_prefill) {
        ASSERT_LE(tokens, lim.max_num_batched_tokens);
      }
      ASSERT_EQ(tokens, plan.tokens);
      preemptions += static_cast<int64_t>(plan.preempted.size());
      chunks += static_cast<int64_t>(plan.chunks.size());
      admissions += static_cast<int64_t>(plan.admitted.size());
      // Apply: preemptions, admissions, chunks.
      for (int64_t id : plan.preempted) {
        Req& r = reqs[id];
        free_blocks += r.s.blocks_held;
        r.s = waiting(id, r.prompt + r.generated);
        r.where = 2;
      }
      for (int64_t id : plan.unfittable) {
        reqs[id].where = 3;
        ++done;
      }
      for (const StepAdmission& a : plan.admitted) {
        Req& r = reqs[a.seq];
        ASSERT_NE(r.where, 1);
        r.where = 1;
        r.s.computed = a.hit_blocks * lim.block_size;  // (the simulation has no hits: 0)
      }
      int64_t running = 0;
      for (auto& [id, r] : reqs) running += r.where == 1;
      ASSERT_LE(running, lim.max_num_seqs);
      for (const StepChunk& c : plan.chunks) {
        Req& r = reqs[c.seq];
        ASSERT_EQ(r.where, 1);
        ASSERT_EQ(c.start, r.s.computed);
        const int64_t need = blocks_for(c.start + c.count, lim.block_size) - r.s.blocks_held;
        if (need > 0) {
          free_blocks -= need;
          r.s.blocks_held += need;
        }
        ASSERT_GE(free_blocks, 0) << "seed " << seed << " step " << step;
        if (c.decode) {
          const int64_t accepted = uni(1, c.count);
          r.s.computed += accepted;
          r.generated += accepted;
        } else {
          r.s.computed += c.count;
          if (c.wants_logits) r.generated += 1;
        }
        if (r.generated >= r.out) {
          free_blocks += r.s.blocks_held;
          r.where = 3;
          ++done;
        }
      }
    }
    EXPECT_EQ(done, n) << "seed " << seed;
    EXPECT_EQ(free_blocks, lim.total_blocks) << "seed " << seed;
  }
  // The runs did exercise the policy (the pools are small: preemption happens).
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(admissions, 30 * 25 - 1);
  EXPECT_GT(chunks, admissions);
}

}  // namespace
}  // namespace xds::engine
