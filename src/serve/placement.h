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
#include "engine/request.h"

namespace xds::serve {

struct PlacementRequest {
  int64_t prompt_tokens = 0;  // >= 0
  int64_t max_tokens = 0;     // >= 0: the expected output counted as reserved KV
};

struct PlacementDecision {
  int32_t index = -1;  // position in the loads span; -1: wait
  int32_t group = -1;  // that load's GroupLoad::group; -1: wait
  bool wait() const { return index < 0; }
};

// KV blocks the request is expected to hold: ceil((prompt + max_tokens) / block_size).
int64_t placement_blocks(const PlacementRequest& req, int64_t block_size);

// P059's rule over `loads`. InvalidArgument for negative request lengths or a load with
// block_size <= 0 or negative block counts (naming the group).
Result<PlacementDecision> place_request(std::span<const engine::GroupLoad> loads,
                                        const PlacementRequest& req);

// What the shell adds to its copy of a group's load after placing `req` there, until the
// group's next report replaces it: waiting + 1, reserved + placement_blocks().
void account_placement(engine::GroupLoad& load, const PlacementRequest& req);

}  // namespace xds::serve
