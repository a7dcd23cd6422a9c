// Which instance a new request goes to when a gateway fronts several (the paper's JE, P096):
// a pure function of what the gateway knows of each candidate -- its load, how much of the
// prompt it has cached (from the instances' block-hash events), and which prompt lengths it
// is prefilling now.
//
//   1. Length-aware: a short prompt (< long_prompt_tokens) avoids instances prefilling a long
//      one, a long prompt instances prefilling short ones -- when any candidate is free of the
//      other kind (mixing them makes the short ones wait behind the long: tail latency).
//   2. Cache-aware: of those, the one with the most leading prompt blocks cached, provided its
//      load is within balance_threshold of the least loaded; ties -> lower load, then lower
//      index.
//   3. Otherwise the least loaded; ties -> the lower index.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace xds::serve {

struct InstanceCandidate {
  int32_t index = 0;           // the gateway's instance number
  double load = 0;             // requests per DP group (running + waiting + parked)
  int64_t hit_blocks = 0;      // leading full blocks of the prompt it has cached
  int32_t long_inflight = 0;   // long prompts sent to it whose first token has not come back
  int32_t short_inflight = 0;  // short ones
};

struct InstanceRoutingPolicy {
  int64_t long_prompt_tokens = 2048;
  double balance_threshold = 2.0;  // requests per group a cache hit may cost in balance
};

// The chosen candidate's position in `candidates`, -1 when there is none.
int32_t route_to_instance(std::span<const InstanceCandidate> candidates, int64_t prompt_tokens,
                          const InstanceRoutingPolicy& policy);

// The chain hashes of the prompt's full blocks (engine::PrefixCache::block_hash), in order.
std::vector<uint64_t> prompt_block_hashes(std::span<const int32_t> prompt, int64_t block_size);

// Leading hashes of `chain` present in `cached` (hash -> groups holding it).
int64_t leading_hits(std::span<const uint64_t> chain,
                     const std::unordered_map<uint64_t, int32_t>& cached);

}  // namespace xds::serve
