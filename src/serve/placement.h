// Where the shell puts a new request (P055, P059's rule): a pure function of the DP groups'
// last reported loads.
//
//   1. Skip groups at their batch limit: running + waiting >= max_num_seqs (max_num_seqs <= 0:
//      no limit).
//   2. Skip groups where the request's expected KV does not fit:
//        used + reserved + need > total,   need = ceil((prompt + max_tokens) / block_size).
//   3. Of the rest, the lowest KV usage after placing it, (used + reserved + need) / total
//      (compared exactly, in integers); ties -> the lowest GroupLoad::group.
//   None left -> wait (the request stays queued in the gateway).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "protocol/payloads.h"

namespace xds::serve {

struct PlacementRequest {
  int64_t prompt_tokens = 0;  // >= 0
  int64_t max_tokens = 0;     // >= 0: the expected output counted as reserved KV
};

// The share of the KV to come that placement counts, in (0, 1]: of the request's max_tokens,
// and of each group's reported reserve (its running requests' growth and its waiting
// requests' prompts and outputs). 1: a placed request never runs out of KV; below 1 more
// requests are placed and a DP group whose outputs run long preempts its newest one
// (recomputed later, output unchanged), as SGLang's new-token ratio does.
struct PlacementPolicy {
  double reserve_ratio = 1.0;
};

struct PlacementDecision {
  int32_t index = -1;  // position in the loads span; -1: wait
  int32_t group = -1;  // that load's GroupLoad::group; -1: wait
  bool wait() const { return index < 0; }
};

// KV blocks the request is expected to hold: ceil((prompt + ceil(max_tokens x ratio)) /
// block_size).
int64_t placement_blocks(const PlacementRequest& req, int64_t block_size,
                         double reserve_ratio = 1.0);

// P059's rule over `loads`. InvalidArgument for negative request lengths or a load with
// block_size <= 0 or negative block counts (naming the group).
Result<PlacementDecision> place_request(std::span<const engine::GroupLoad> loads,
                                        const PlacementRequest& req,
                                        const PlacementPolicy& policy = {});

// What the shell adds to its copy of a group's load after placing `req` there, until the
// group's next report replaces it: waiting + 1, reserved + placement_blocks().
void account_placement(engine::GroupLoad& load, const PlacementRequest& req);

}  // namespace xds::serve
