#include "engine/cooperative_prefill.h"

#include <algorithm>
#include <limits>

namespace xds::engine {

xccl::MailWords pack_pool_state(const PoolGroupState& s) {
  xccl::MailWords w{};
  w[0] = s.highest;
  const auto clamp32 = [](int64_t v) {
    return static_cast<uint64_t>(std::clamp<int64_t>(v, 0, std::numeric_limits<uint32_t>::max()));
  };
  w[1] = clamp32(s.free_blocks) | (clamp32(s.queued_tokens) << 32);
  for (int i = 0; i < kPoolWindow; ++i)
    w[2 + i / 4] |= uint64_t(s.hits[static_cast<size_t>(i)]) << (16 * (i % 4));
  return w;
}

PoolGroupState unpack_pool_state(const xccl::MailWords& w) {
  PoolGroupState s;
  s.highest = w[0];
  s.free_blocks = static_cast<int64_t>(w[1] & 0xFFFFFFFFu);
  s.queued_tokens = static_cast<int64_t>(w[1] >> 32);
  for (int i = 0; i < kPoolWindow; ++i)
    s.hits[static_cast<size_t>(i)] = static_cast<uint16_t>(w[2 + i / 4] >> (16 * (i % 4)));
  return s;
}

std::vector<int> assign_pooled(std::span<const PoolRequest> pending,
                               std::span<const PoolGroupState> groups, int64_t block_size) {
  std::vector<int> owner(pending.size(), -1);
  std::vector<int64_t> free(groups.size()), queued(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    free[g] = groups[g].free_blocks;
    queued[g] = groups[g].queued_tokens;
  }
  for (size_t i = 0; i < pending.size() && i < static_cast<size_t>(kPoolWindow); ++i) {
    const PoolRequest& r = pending[i];
    int best = -1;
    int64_t best_cost = 0, best_hit = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const int64_t hit = std::min<int64_t>(groups[g].hits[i], r.need_blocks);
      if (free[g] < r.need_blocks - hit) continue;
      const int64_t cost = queued[g] + r.prompt_tokens - std::min(hit * block_size, r.prompt_tokens);
      if (best < 0 || cost < best_cost) {
        best = static_cast<int>(g);
        best_cost = cost;
        best_hit = hit;
      }
    }
    if (best < 0) break;
    owner[i] = best;
    queued[static_cast<size_t>(best)] +=
        r.prompt_tokens - std::min(best_hit * block_size, r.prompt_tokens);
    free[static_cast<size_t>(best)] -= r.need_blocks - best_hit;
  }
  return owner;
}

}  // namespace xds::engine
