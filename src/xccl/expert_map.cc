#include "xccl/expert_map.h"

#include <algorithm>

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
  if (k < 1 || k > kMaxTopk)
    return invalid_argument("plan_routes: top-k {} outside [1, {}]", k, kMaxTopk);
  const size_t need = size_t(n_tokens) * size_t(k);
  if (topk_ids.size() < need || weights.size() < need)
    return invalid_argument(
        "plan_routes: {} tokens x top-{} need {} ids and weights, got {} and {}", n_tokens, k, need,
        topk_ids.size(), weights.size());
  RoutePlan plan;
  plan.per_device.resize(size_t(map.n_devices));
  std::vector<int> last_token(size_t(map.n_devices), -1);
  for (int t = 0; t < n_tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t e = topk_ids[size_t(t) * size_t(k) + size_t(j)];
      if (e < 0) continue;
      if (e >= map.n_logical())
        return invalid_argument("plan_routes: token {} expert {} outside the map's {} experts", t,
                                e, map.n_logical());
      const int32_t p = map.physical(e, uint32_t(t));
      const size_t d = size_t(p / map.slots_per_device);
      auto& list = plan.per_device[d];
      if (last_token[d] != t) {
        list.push_back(RouteEntry{});
        list.back().token = uint32_t(t);
        last_token[d] = t;
      }
      RouteEntry& r = list.back();
      r.local_expert[r.n_local] = uint16_t(p % map.slots_per_device);
      r.weight[r.n_local] = weights[size_t(t) * size_t(k) + size_t(j)];
      ++r.n_local;
    }
  }
  return plan;
}

RecvLayout group_by_expert(std::span<const std::span<const RouteEntry>> from_src,
                           int slots_per_device) {
  RecvLayout out;
  std::vector<int32_t> count(size_t(slots_per_device), 0);
  for (const auto& list : from_src)
    for (const RouteEntry& r : list)
      for (int j = 0; j < r.n_local; ++j) ++count[r.local_expert[j]];
  out.expert_offset.assign(size_t(slots_per_device) + 1, 0);
  for (int e = 0; e < slots_per_device; ++e)
    out.expert_offset[size_t(e) + 1] = out.expert_offset[size_t(e)] + count[size_t(e)];
  out.rows.resize(size_t(out.expert_offset.back()));
  std::vector<int32_t> cursor(out.expert_offset.begin(), out.expert_offset.end() - 1);
  out.entry_row.resize(from_src.size());
  for (size_t s = 0; s < from_src.size(); ++s) {
    out.entry_row[s].assign(from_src[s].size() * kMaxTopk, 0);
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
  return out;
}

}  // namespace xds::xccl
