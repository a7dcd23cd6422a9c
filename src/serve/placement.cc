#include "serve/placement.h"

#include <cmath>

namespace xds::serve {

namespace {

// ceil(n x ratio) for n >= 0, exact at ratio 1.
int64_t scaled(int64_t n, double ratio) {
  return ratio >= 1.0 ? n : static_cast<int64_t>(std::ceil(static_cast<double>(n) * ratio));
}

}  // namespace

int64_t placement_blocks(const PlacementRequest& req, int64_t block_size, double reserve_ratio) {
  XDS_CHECK(block_size > 0, "block_size {}", block_size);
  const int64_t tokens = req.prompt_tokens + scaled(req.max_tokens, reserve_ratio);
  return (tokens + block_size - 1) / block_size;
}

Result<PlacementDecision> place_request(std::span<const engine::GroupLoad> loads,
                                        const PlacementRequest& req,
                                        const PlacementPolicy& policy) {
  if (req.prompt_tokens < 0 || req.max_tokens < 0) {
    return invalid_argument("placement: prompt_tokens {} and max_tokens {} must be >= 0",
                            req.prompt_tokens, req.max_tokens);
  }
  if (!(policy.reserve_ratio > 0.0 && policy.reserve_ratio <= 1.0)) {
    return invalid_argument("placement: reserve_ratio {} is not in (0, 1]", policy.reserve_ratio);
  }
  PlacementDecision best;
  __int128 best_num = 0, best_den = 1;  // usage of the best group so far, as a fraction
  for (size_t i = 0; i < loads.size(); ++i) {
    const engine::GroupLoad& g = loads[i];
    if (g.block_size <= 0 || g.kv_blocks_total < 0 || g.kv_blocks_used < 0 ||
        g.kv_blocks_reserved < 0) {
      return invalid_argument(
          "placement: group {} reports block_size {}, blocks total {} used {} reserved {}", g.group,
          g.block_size, g.kv_blocks_total, g.kv_blocks_used, g.kv_blocks_reserved);
    }
    if (g.max_num_seqs > 0 && g.running + g.waiting >= g.max_num_seqs) continue;
    const int64_t after = g.kv_blocks_used + scaled(g.kv_blocks_reserved, policy.reserve_ratio) +
                          placement_blocks(req, g.block_size, policy.reserve_ratio);
    if (g.kv_blocks_total == 0 || after > g.kv_blocks_total) continue;
    // after / total < best_num / best_den, cross-multiplied (no rounding).
    const __int128 lhs = static_cast<__int128>(after) * best_den;
    const __int128 rhs = best_num * g.kv_blocks_total;
    if (best.wait() || lhs < rhs || (lhs == rhs && g.group < best.group)) {
      best.index = static_cast<int32_t>(i);
      best.group = g.group;
      best_num = after;
      best_den = g.kv_blocks_total;
    }
  }
  return best;
}

void account_placement(engine::GroupLoad& load, const PlacementRequest& req) {
  load.waiting += 1;
  // Unscaled, as the groups report it: place_request scales the sum.
  load.kv_blocks_reserved += placement_blocks(req, load.block_size);
}

}  // namespace xds::serve
