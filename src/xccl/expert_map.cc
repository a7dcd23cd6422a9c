#include "xccl/expert_map.h"

#include <algorithm>
#include <cstring>

namespace xds::xccl {

ExpertMap ExpertMap::identity(int n_logical, int n_devices, int slots_per_device,
                              uint64_t version) {
  ExpertMap m;
  m.version = version;
  m.n_devices = n_devices;
  m.slots_per_device = slots_per_device;
  const int per_dev = (n_logical + n_devices - 1) / n_devices;
  m.replicas.resize(static_cast<size_t>(n_logical));
  for (int e = 0; e < n_logical; ++e)
    m.replicas[size_t(e)] = {(e / per_dev) * slots_per_device + e % per_dev};
  return m;
}

Status ExpertMap::validate() const {
  if (n_devices < 1 || slots_per_device < 1 || slots_per_device > 65535)
    return invalid_argument("expert map v{}: n_devices {} and slots_per_device {} must be >= 1",
                            version, n_devices, slots_per_device);
  const int64_t n_phys = int64_t(n_devices) * slots_per_device;
  for (size_t e = 0; e < replicas.size(); ++e) {
    if (replicas[e].empty())
      return invalid_argument("expert map v{}: logical expert {} has no physical slot", version, e);
    for (int32_t p : replicas[e])
      if (p < 0 || p >= n_phys)
        return invalid_argument("expert map v{}: logical expert {} -> slot {} outside [0, {})",
                                version, e, p, n_phys);
  }
  return Status::ok_status();
}

Result<RoutePlan> plan_routes(const ExpertMap& map, std::span<const int32_t> topk_ids,
                              std::span<const float> weights, int n_tokens, int k) {
  RoutePlan plan;
  XDS_RETURN_IF_ERROR(plan_routes_into(map, topk_ids, weights, n_tokens, k, plan));
  return plan;
}

Status plan_routes_into(const ExpertMap& map, std::span<const int32_t> topk_ids,
                        std::span<const float> weights, int n_tokens, int k, RoutePlan& plan,
                        std::span<const uint32_t> spread) {
  if (k < 1 || k > kMaxTopk)
    return invalid_argument("plan_routes: top-k {} outside [1, {}]", k, kMaxTopk);
  if (n_tokens < 0) return invalid_argument("plan_routes: n_tokens {} < 0", n_tokens);
  const size_t need = size_t(n_tokens) * size_t(k);
  if (topk_ids.size() < need || weights.size() < need)
    return invalid_argument(
        "plan_routes: {} tokens x top-{} need {} ids and weights, got {} and {}", n_tokens, k, need,
        topk_ids.size(), weights.size());
  if (!spread.empty() && spread.size() < size_t(n_tokens))
    return invalid_argument("plan_routes: {} spread keys for {} tokens", spread.size(), n_tokens);
  // Every list gets room for every token, blanked in one memset (RouteEntry is trivially
  // copyable and all-zero bytes are its default value); entries are then filled in place and
  // the lists cut to what was used. This loop runs on the dispatch path, per token and expert:
  // no per-entry construction, one division per (token, expert).
  const size_t T = size_t(n_tokens);
  plan.per_device.resize(size_t(map.n_devices));
  for (auto& list : plan.per_device) {
    list.resize(T);
    if (T != 0) std::memset(static_cast<void*>(list.data()), 0, T * sizeof(RouteEntry));
  }
  std::vector<uint32_t> used(size_t(map.n_devices), 0);
  std::vector<int> last_token(size_t(map.n_devices), -1);
  const int n_logical = map.n_logical(), spd = map.slots_per_device;
  for (int t = 0; t < n_tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t e = topk_ids[size_t(t) * size_t(k) + size_t(j)];
      if (e < 0) continue;
      if (e >= n_logical)
        return invalid_argument("plan_routes: token {} expert {} outside the map's {} experts", t,
                                e, n_logical);
      const int32_t p = map.physical(e, spread.empty() ? uint32_t(t) : spread[size_t(t)]);
      const int32_t dev = p / spd, slot = p - dev * spd;
      const size_t d = size_t(dev);
      if (last_token[d] != t) {
        plan.per_device[d][used[d]++].token = uint32_t(t);
        last_token[d] = t;
      }
      RouteEntry& r = plan.per_device[d][used[d] - 1];
      r.local_expert[r.n_local] = uint16_t(slot);
      r.weight[r.n_local] = weights[size_t(t) * size_t(k) + size_t(j)];
      ++r.n_local;
    }
  }
  for (size_t d = 0; d < plan.per_device.size(); ++d) plan.per_device[d].resize(used[d]);
  return Status::ok_status();
}

RecvLayout group_by_expert(std::span<const std::span<const RouteEntry>> from_src,
                           int slots_per_device) {
  RecvLayout out;
  group_by_expert_into(from_src, slots_per_device, out);
  return out;
}

void group_by_expert_into(std::span<const std::span<const RouteEntry>> from_src,
                          int slots_per_device, RecvLayout& out) {
  out.expert_offset.assign(size_t(slots_per_device) + 1, 0);
  for (const auto& list : from_src)
    for (const RouteEntry& r : list)
      for (int j = 0; j < r.n_local; ++j) ++out.expert_offset[size_t(r.local_expert[j]) + 1];
  for (int e = 0; e < slots_per_device; ++e)
    out.expert_offset[size_t(e) + 1] += out.expert_offset[size_t(e)];
  out.rows.resize(size_t(out.expert_offset.back()));
  std::vector<int32_t> cursor(out.expert_offset.begin(), out.expert_offset.end() - 1);
  out.entry_row.resize(from_src.size());
  for (size_t s = 0; s < from_src.size(); ++s) {
    // Slots j >= n_local of an entry are never read; no need to blank them.
    out.entry_row[s].resize(from_src[s].size() * kMaxTopk);
    for (size_t i = 0; i < from_src[s].size(); ++i) {
      const RouteEntry& r = from_src[s][i];
      for (int j = 0; j < r.n_local; ++j) {
        const uint32_t row = uint32_t(cursor[r.local_expert[j]]++);
        out.rows[row] = RowOrigin{int32_t(s),        uint32_t(i),      r.token,
                                  r.local_expert[j], uint16_t(j == 0), r.weight[j]};
        out.entry_row[s][i * kMaxTopk + size_t(j)] = row;
      }
    }
  }
}

}  // namespace xds::xccl
