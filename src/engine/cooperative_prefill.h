// The prefill instance's single-level cooperative scheduler (P058). With several DP groups,
// a two-level scheme (the shell places a request on one group's queue, the group schedules
// it) leaves one group on a long batch while another idles. Instead every tokenized request
// is shared by all groups (the shell broadcasts it, numbered), and at every step the groups
// all-gather their state -- free KV blocks, prefill tokens queued, and the prefix-cache hits
// of each pending request -- and every group runs the same assignment over the same words,
// so all agree on who prefills what without a leader round trip.
//
// Wire format (one xccl::MailWords per group, after the step header):
//   w0  the highest request number the group has received (requests arrive in number order)
//   w1  bits 0-31 free KV blocks · bits 32-63 prefill tokens queued (waiting + unfinished)
//   w2..w5  the leading cached blocks of the first kPoolWindow pending requests (lowest
//       numbers), 16 bits each, request i in word 2 + i / 4 at bits 16 (i % 4)
// Only requests every group has received take part (numbers <= the minimum w0), in number
// order, at most kPoolWindow per step.
//
// Assignment (pure, assign_pooled): for each request in order, among the groups whose free
// blocks hold it, the lowest cost = queued tokens + prompt tokens - cached tokens (ties: the
// lower rank); that group's queued tokens and free blocks then count it. The first request
// no group can hold stops the step's assignment (first come, first served).
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "xccl/mailbox.h"

namespace xds::engine {

inline constexpr int kPoolWindow = 16;
// The pool state's collective key: the step header's, phase 1 (StepSync::exchange_words).
inline constexpr uint16_t kPoolStatePhase = 1;

struct PoolGroupState {
  uint64_t highest = 0;         // the highest request number received (0: none)
  int64_t free_blocks = 0;
  int64_t queued_tokens = 0;
  std::array<uint16_t, kPoolWindow> hits{};  // cached blocks of pending request i
};

struct PoolRequest {
  uint64_t number = 0;
  int64_t prompt_tokens = 0;
  int64_t need_blocks = 0;  // KV blocks the prefill needs (prompt and the first token)
};

xccl::MailWords pack_pool_state(const PoolGroupState& s);
PoolGroupState unpack_pool_state(const xccl::MailWords& w);

// `pending`: the requests every group has received, number order (at most kPoolWindow).
// Returns the rank that prefills each, or -1 for those left pending.
std::vector<int> assign_pooled(std::span<const PoolRequest> pending,
                               std::span<const PoolGroupState> groups, int64_t block_size);

}  // namespace xds::engine
