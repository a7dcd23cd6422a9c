// Continuous batching for one DP group as a pure function (docs/design/flowserve.md, "The DP
// group's step", step 2): the state of the group's sequences and the step's limits in, the
// step's plan out. No I/O, no clock; the caller applies the plan (preempt, admit, reserve KV,
// run the chunks).
//
// A sequence's KV length ("computed") grows towards its prefill target (the prompt; when a
// preempted sequence is recomputed, the caller's choice, e.g. every known token but the last
// sampled one); once there it decodes: each step feeds the token at position `computed`, plus
// `lookahead` MTP draft positions, and samples 1 to lookahead + 1 tokens.
//
// The step, in this order:
//   1. Decodes of running sequences, oldest first, each counting 1 + lookahead tokens of the
//      budget and the blocks for positions up to computed + 1 + lookahead. A decode that
//      cannot get its blocks preempts the newest running sequence not yet scheduled this step
//      (freeing its blocks; it is recomputed later), repeatedly; when it is itself the newest
//      it is preempted. A decode that does not fit the token budget waits (never preempted).
//   2. Prefill chunks of running sequences that are part-way through their prefill, oldest
//      first; then admissions: preempted sequences (oldest first), then waiting ones (FCFS),
//      while running + admitted < max_num_seqs. A waiting sequence first attaches its
//      prefix-cache hits (at most (target - 1) / block_size blocks: the last prompt token is
//      always computed, for its logits). A chunk is min(remaining prompt, budget left,
//      long_prefill_chunk) tokens, shrunk to the blocks available; with chunking off it is
//      the whole remaining prompt or nothing, except that the step's first prefill may exceed
//      the budget (an oversized prompt runs whole, stalling that step). Admissions stop at the
//      first sequence that cannot be scheduled (FCFS: nobody jumps the queue).
//   3. A running prefill that gets no token for lack of blocks preempts the newest running
//      sequences not yet scheduled this step, as a decode does (or waits when there are none).
// A sequence with awaiting_kv (its KV is being pulled by prefill/decode disaggregation) holds
// its blocks and a seat but is never scheduled nor preempted.
//
// Before all of that, the awaiting handoffs of prefill/decode disaggregation (decode phases
// whose KV waits on a prefill instance), in arrival order. Backpressure (P101): a handoff is
// pulled only when its blocks fit -- free_blocks holds blocks_for(rows + 1 + lookahead) and
// fewer than max_num_seqs sequences run; the first that does not fit stops the handoffs (the
// prefill side keeps its blocks meanwhile). A pulled handoff reserves blocks_for(rows) blocks
// at once, which the rest of the step then lacks. One needing more blocks than total_blocks,
// or rows + 1 > max_model_len, is unfittable (handoffs_unfittable) and skipped.
//
// Invariants of a plan: no sequence appears twice in chunks; sum of chunk counts <=
// max_num_batched_tokens except for the chunking-off oversized prompt; new blocks <=
// free_blocks plus the blocks of the preempted; running + admitted - preempted <=
// max_num_seqs (when it held before).
//
// Thread-safety: schedule() is a pure function of its arguments; `plan` is written only.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace xds::engine {

struct SchedSeq {
  int64_t id = 0;             // the caller's sequence id, unique across all lists
  int64_t arrival = 0;        // FCFS key: smaller arrived first; unique
  int64_t target = 0;         // tokens to prefill before decoding (>= 1)
  int64_t computed = 0;       // tokens with committed KV (running); 0 for waiting/preempted
  int64_t blocks_held = 0;    // KV blocks the sequence holds (running); 0 otherwise
  int64_t hit_blocks = 0;     // waiting/preempted: full blocks a prefix-cache lookup would attach
  int64_t hit_evictable = 0;  // of those, blocks held only by the cache (counted in free_blocks)
  bool awaiting_kv = false;   // running: KV being pulled from a prefill instance
};

// A decode phase whose KV waits on a prefill instance (prefill/decode disaggregation).
struct SchedHandoff {
  int64_t id = 0;    // the caller's sequence id
  int64_t rows = 0;  // KV positions the pull writes (>= 0)
};

struct SchedulerInput {
  std::vector<SchedSeq> running;    // hold KV; sorted by arrival
  std::vector<SchedSeq> preempted;  // to recompute; sorted by arrival
  std::vector<SchedSeq> waiting;    // placed, never run; sorted by arrival
  std::vector<SchedHandoff> awaiting;  // handoffs waiting for their pull; arrival order
};

struct SchedulerLimits {
  int64_t max_num_seqs = 256;             // sequences holding KV at once (>= 1)
  int64_t max_num_batched_tokens = 2048;  // tokens per step (>= 1)
  int64_t free_blocks = 0;                // blocks obtainable now: free + evictable cached
  int64_t total_blocks = 0;               // the pool (0: unchecked); larger targets are unfittable
  int64_t block_size = 16;                // tokens per block (>= 1)
  bool chunked_prefill = true;
  int64_t lookahead = 0;           // MTP draft positions per decode (k >= 0)
  int64_t long_prefill_chunk = 0;  // most prefill tokens of one sequence per step (0: off)
  int64_t max_model_len = 0;       // handoffs: rows + 1 must fit (0: unchecked)
};

struct StepChunk {
  int64_t seq = 0;
  int64_t start = 0;          // first position (the sequence's computed length)
  int64_t count = 0;          // positions [start, start + count)
  bool wants_logits = false;  // decode, or the last chunk of a prefill
  bool decode = false;
};

struct StepAdmission {
  int64_t seq = 0;
  int64_t hit_blocks = 0;  // prefix-cache blocks to attach (computed starts at hit_blocks * bs)
};

struct StepPlan {
  std::vector<StepChunk> chunks;        // decodes first, then prefills
  std::vector<StepAdmission> admitted;  // preempted/waiting sequences that start running
  std::vector<int64_t> preempted;       // running sequences to preempt, newest first
  std::vector<int64_t> unfittable;      // waiting/preempted whose target exceeds total_blocks
  std::vector<int64_t> handoffs;        // awaiting handoffs to pull now, in order
  std::vector<int64_t> handoffs_unfittable;  // awaiting handoffs that can never fit
  int64_t tokens = 0;                   // sum of chunk counts
  int64_t new_blocks = 0;               // blocks the chunks add (attached hits excluded)
  // Scratch reused across calls: per running sequence 0 idle, 1 scheduled, 2 preempted;
  // every id, sorted (the duplicate check).
  std::vector<uint8_t> state;
  std::vector<int64_t> ids;
};

// Blocks covering `tokens` positions.
inline int64_t blocks_for(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

// Fills *plan (cleared first; its vectors keep their capacity). InvalidArgument on limits out
// of range, a list not sorted by arrival, duplicate ids, or inconsistent sequence fields
// (computed > target, blocks_held < blocks for computed, negative counts), naming the
// sequence.
Status schedule(const SchedulerInput& in, const SchedulerLimits& limits, StepPlan* plan);

}  // namespace xds::engine
