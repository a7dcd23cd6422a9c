#include "serve/instance_routing.h"

#include "engine/prefix_cache.h"

namespace xds::serve {

int32_t route_to_instance(std::span<const InstanceCandidate> candidates, int64_t prompt_tokens,
                          const InstanceRoutingPolicy& policy) {
  if (candidates.empty()) return -1;
  const bool is_long = prompt_tokens >= policy.long_prompt_tokens;
  auto other_kind = [&](const InstanceCandidate& c) {
    return is_long ? c.short_inflight : c.long_inflight;
  };
  bool any_clean = false;
  for (const InstanceCandidate& c : candidates) any_clean = any_clean || other_kind(c) == 0;
  auto kept = [&](const InstanceCandidate& c) { return !any_clean || other_kind(c) == 0; };

  int32_t least = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!kept(candidates[i])) continue;
    if (least < 0 || candidates[i].load < candidates[static_cast<size_t>(least)].load)
      least = static_cast<int32_t>(i);
  }
  const double min_load = candidates[static_cast<size_t>(least)].load;
  int32_t best = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const InstanceCandidate& c = candidates[i];
    if (!kept(c) || c.hit_blocks == 0 || c.load > min_load + policy.balance_threshold) continue;
    if (best < 0) {
      best = static_cast<int32_t>(i);
      continue;
    }
    const InstanceCandidate& b = candidates[static_cast<size_t>(best)];
    if (c.hit_blocks > b.hit_blocks || (c.hit_blocks == b.hit_blocks && c.load < b.load))
      best = static_cast<int32_t>(i);
  }
  return best >= 0 ? best : least;
}

std::vector<uint64_t> prompt_block_hashes(std::span<const int32_t> prompt, int64_t block_size) {
  std::vector<uint64_t> out;
  if (block_size <= 0) return out;
  uint64_t h = engine::PrefixCache::kRootHash;
  for (size_t i = 0; i + static_cast<size_t>(block_size) <= prompt.size();
       i += static_cast<size_t>(block_size)) {
    h = engine::PrefixCache::block_hash(h, prompt.subspan(i, static_cast<size_t>(block_size)));
    out.push_back(h);
  }
  return out;
}

int64_t leading_hits(std::span<const uint64_t> chain,
                     const std::unordered_map<uint64_t, int32_t>& cached) {
  int64_t n = 0;
  for (uint64_t h : chain) {
    auto it = cached.find(h);
    if (it == cached.end() || it->second <= 0) break;
    ++n;
  }
  return n;
}

}  // namespace xds::serve
