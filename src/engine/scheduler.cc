#include "engine/scheduler.h"

#include <algorithm>

namespace xds::engine {

namespace {

constexpr uint8_t kIdle = 0, kScheduled = 1, kPreempted = 2;

Status check_limits(const SchedulerLimits& l) {
  if (l.max_num_seqs < 1 || l.max_num_batched_tokens < 1 || l.block_size < 1 || l.free_blocks < 0 ||
      l.total_blocks < 0 || l.lookahead < 0 || l.long_prefill_chunk < 0 || l.max_model_len < 0) {
    return invalid_argument(
        "scheduler limits: max_num_seqs {} (>= 1), max_num_batched_tokens {} (>= 1), "
        "block_size {} (>= 1), free_blocks {}, total_blocks {}, lookahead {}, "
        "long_prefill_chunk {}, max_model_len {} (>= 0)",
        l.max_num_seqs, l.max_num_batched_tokens, l.block_size, l.free_blocks, l.total_blocks,
        l.lookahead, l.long_prefill_chunk, l.max_model_len);
  }
  return {};
}

Status check_list(const std::vector<SchedSeq>& list, const char* name, bool running,
                  int64_t block_size) {
  for (size_t i = 0; i < list.size(); ++i) {
    const SchedSeq& s = list[i];
    if (i > 0 && s.arrival <= list[i - 1].arrival) {
      return invalid_argument("scheduler: {}[{}] (seq {}) arrival {} not after {}", name, i, s.id,
                              s.arrival, list[i - 1].arrival);
    }
    bool ok = s.target >= 1 && s.computed >= 0 && s.blocks_held >= 0 && s.hit_blocks >= 0 &&
              s.hit_evictable >= 0 && s.hit_evictable <= s.hit_blocks;
    if (running) {
      ok = ok && s.blocks_held >= blocks_for(s.computed, block_size);
    } else {
      ok = ok && s.computed == 0 && s.blocks_held == 0 && !s.awaiting_kv;
    }
    if (!ok) {
      return invalid_argument(
          "scheduler: {} seq {}: target {}, computed {}, blocks_held {}, hit_blocks {}, "
          "hit_evictable {}, awaiting_kv {} are inconsistent",
          name, s.id, s.target, s.computed, s.blocks_held, s.hit_blocks, s.hit_evictable,
          s.awaiting_kv);
    }
  }
  return {};
}

Status check_input(const SchedulerInput& in, const SchedulerLimits& l, std::vector<int64_t>& ids) {
  XDS_RETURN_IF_ERROR(check_limits(l));
  XDS_RETURN_IF_ERROR(check_list(in.running, "running", true, l.block_size));
  XDS_RETURN_IF_ERROR(check_list(in.preempted, "preempted", false, l.block_size));
  XDS_RETURN_IF_ERROR(check_list(in.waiting, "waiting", false, l.block_size));
  ids.clear();
  for (const auto* list : {&in.running, &in.preempted, &in.waiting})
    for (const SchedSeq& s : *list) ids.push_back(s.id);
  for (const SchedHandoff& h : in.awaiting) {
    if (h.rows < 0) return invalid_argument("scheduler: awaiting seq {}: rows {} < 0", h.id, h.rows);
    ids.push_back(h.id);
  }
  std::sort(ids.begin(), ids.end());
  const auto dup = std::adjacent_find(ids.begin(), ids.end());
  if (dup != ids.end()) return invalid_argument("scheduler: seq {} is listed twice", *dup);
  return {};
}

// One step's bookkeeping while the plan is built.
struct Builder {
  const SchedulerInput& in;
  const SchedulerLimits& lim;
  StepPlan& plan;
  int64_t budget;  // tokens left
  int64_t avail;   // blocks left
  int64_t seats;   // sequences that may still hold KV
  bool first_prefill = true;

  // The newest running sequence that is neither scheduled, preempted nor awaiting KV;
  // -1 when none (`exclude` is skipped).
  int64_t newest_victim(int64_t exclude) const {
    for (int64_t j = static_cast<int64_t>(in.running.size()) - 1; j >= 0; --j) {
      if (j == exclude || plan.state[j] != kIdle || in.running[j].awaiting_kv) continue;
      return j;
    }
    return -1;
  }
  void preempt(int64_t j) {
    plan.state[j] = kPreempted;
    plan.preempted.push_back(in.running[j].id);
    avail += in.running[j].blocks_held;
    seats += 1;
  }
  void add_chunk(const SchedSeq& s, int64_t start, int64_t held, int64_t count, bool decode) {
    const int64_t need = std::max<int64_t>(0, blocks_for(start + count, lim.block_size) - held);
    plan.chunks.push_back({.seq = s.id,
                           .start = start,
                           .count = count,
                           .wants_logits = decode || start + count >= s.target,
                           .decode = decode});
    plan.tokens += count;
    plan.new_blocks += need;
    avail -= need;
    budget -= count;
  }
  // Prefill tokens of `s` from `start` this step, holding `held` blocks with `blocks` obtainable:
  // 0 when nothing can run.
  int64_t prefill_count(const SchedSeq& s, int64_t start, int64_t held, int64_t blocks) const {
    const int64_t rem = s.target - start;
    const int64_t fit = (held + blocks) * lim.block_size - start;  // positions the blocks cover
    if (!lim.chunked_prefill) {
      if (rem > budget && !first_prefill) return 0;
      return rem <= fit ? rem : 0;
    }
    int64_t c = std::min(rem, budget);
    if (lim.long_prefill_chunk > 0) c = std::min(c, lim.long_prefill_chunk);
    return std::max<int64_t>(0, std::min(c, fit));
  }

  void decodes() {
    const int64_t tokens = 1 + lim.lookahead;
    for (size_t i = 0; i < in.running.size(); ++i) {
      const SchedSeq& s = in.running[i];
      if (plan.state[i] != kIdle || s.awaiting_kv || s.computed < s.target) continue;
      if (budget < tokens) break;  // waits for the next step
      const int64_t need =
          std::max<int64_t>(0, blocks_for(s.computed + tokens, lim.block_size) - s.blocks_held);
      while (need > avail && plan.state[i] == kIdle) preempt(newest_victim(-1));
      if (plan.state[i] == kPreempted) continue;
      plan.state[i] = kScheduled;
      add_chunk(s, s.computed, s.blocks_held, tokens, /*decode=*/true);
    }
  }

  // Returns false when a running prefill is blocked (nobody younger may go first).
  bool running_prefills() {
    for (size_t i = 0; i < in.running.size(); ++i) {
      const SchedSeq& s = in.running[i];
      if (plan.state[i] != kIdle || s.awaiting_kv || s.computed >= s.target) continue;
      if (budget <= 0 && (lim.chunked_prefill || !first_prefill)) return false;
      int64_t c = prefill_count(s, s.computed, s.blocks_held, avail);
      while (c == 0) {
        const int64_t v = newest_victim(static_cast<int64_t>(i));
        if (v < 0) return false;
        preempt(v);
        c = prefill_count(s, s.computed, s.blocks_held, avail);
      }
      plan.state[i] = kScheduled;
      add_chunk(s, s.computed, s.blocks_held, c, /*decode=*/false);
      first_prefill = false;
    }
    return true;
  }

  // Returns false when admissions must stop.
  bool admit(const SchedSeq& s) {
    if (lim.total_blocks > 0 && blocks_for(s.target, lim.block_size) > lim.total_blocks) {
      plan.unfittable.push_back(s.id);
      return true;
    }
    if (seats <= 0) return false;
    if (budget <= 0 && (lim.chunked_prefill || !first_prefill)) return false;
    const int64_t hits = std::min(s.hit_blocks, (s.target - 1) / lim.block_size);
    const int64_t hit_evict = std::min(s.hit_evictable, hits);
    if (hit_evict > avail) return false;
    const int64_t start = hits * lim.block_size;
    const int64_t c = prefill_count(s, start, hits, avail - hit_evict);
    if (c == 0) return false;
    avail -= hit_evict;
    seats -= 1;
    plan.admitted.push_back({.seq = s.id, .hit_blocks = hits});
    add_chunk(s, start, hits, c, /*decode=*/false);
    first_prefill = false;
    return true;
  }
};

// The handoffs to pull (the backpressure rule in scheduler.h); returns the blocks left.
int64_t admit_handoffs(const SchedulerInput& in, const SchedulerLimits& lim, StepPlan& plan) {
  int64_t avail = lim.free_blocks;
  const bool seat = static_cast<int64_t>(in.running.size()) < lim.max_num_seqs;
  for (const SchedHandoff& h : in.awaiting) {
    const int64_t need = blocks_for(h.rows + 1 + lim.lookahead, lim.block_size);
    if ((lim.total_blocks > 0 && need > lim.total_blocks) ||
        (lim.max_model_len > 0 && h.rows + 1 > lim.max_model_len)) {
      plan.handoffs_unfittable.push_back(h.id);
      continue;
    }
    if (avail < need || !seat) break;
    plan.handoffs.push_back(h.id);
    avail -= blocks_for(h.rows, lim.block_size);
  }
  return avail;
}

}  // namespace

Status schedule(const SchedulerInput& in, const SchedulerLimits& limits, StepPlan* plan) {
  plan->chunks.clear();
  plan->admitted.clear();
  plan->preempted.clear();
  plan->unfittable.clear();
  plan->handoffs.clear();
  plan->handoffs_unfittable.clear();
  plan->tokens = 0;
  plan->new_blocks = 0;
  XDS_RETURN_IF_ERROR(check_input(in, limits, plan->ids));
  plan->state.assign(in.running.size(), kIdle);
  const int64_t avail = admit_handoffs(in, limits, *plan);
  Builder b{.in = in,
            .lim = limits,
            .plan = *plan,
            .budget = limits.max_num_batched_tokens,
            .avail = avail,
            .seats = limits.max_num_seqs - static_cast<int64_t>(in.running.size())};
  b.decodes();
  if (!b.running_prefills()) return {};
  for (const SchedSeq& s : in.preempted)
    if (!b.admit(s)) return {};
  for (const SchedSeq& s : in.waiting)
    if (!b.admit(s)) return {};
  return {};
}

}  // namespace xds::engine
