#include "engine/eplb_maps.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace xds::engine {

Result<std::vector<std::vector<int32_t>>> replicas_of_slots(
    const eplb::Shape& shape, const std::vector<std::vector<eplb::Slot>>& slots) {
  if (int64_t(slots.size()) != shape.n_experts)
    return invalid_argument("expert copies: {} experts given, the layer has {}", slots.size(),
                            shape.n_experts);
  std::vector<std::vector<int32_t>> out(slots.size());
  for (size_t e = 0; e < slots.size(); ++e) {
    if (slots[e].empty()) return invalid_argument("expert copies: expert {} has no copy", e);
    for (const eplb::Slot& s : slots[e]) out[e].push_back(int32_t(s.physical(shape)));
  }
  return out;
}

std::vector<std::vector<int32_t>> primary_replicas(const eplb::Shape& shape) {
  std::vector<std::vector<int32_t>> out(size_t(shape.n_experts));
  const int per = shape.experts_per_device();
  for (int e = 0; e < shape.n_experts; ++e)
    out[size_t(e)] = {int32_t(eplb::Slot{e / per, e % per}.physical(shape))};
  return out;
}

std::vector<std::vector<int32_t>> backup_replicas(const eplb::Shape& shape) {
  std::vector<std::vector<int32_t>> out = primary_replicas(shape);
  const int per = shape.experts_per_device();
  const int copies = std::min(shape.redundant_slots, per);
  if (shape.n_devices < 2) return out;
  for (int e = 0; e < shape.n_experts; ++e) {
    const int home = e / per, j = e % per;
    if (j >= copies) continue;
    const int holder = (home + 1) % shape.n_devices;
    out[size_t(e)].push_back(int32_t(eplb::Slot{holder, per + j}.physical(shape)));
  }
  return out;
}

Result<xccl::ExpertMap> scaled_down_map(const xccl::ExpertMap& map, std::span<const int> before,
                                        std::span<const int> after) {
  if (map.replicas.empty()) return map;
  if (static_cast<int>(before.size()) != map.n_devices)
    return invalid_argument("scale-down: the map has {} devices, {} are named", map.n_devices,
                            before.size());
  std::vector<int> position(before.size(), -1);  // map device -> position in `after`, or -1
  for (size_t i = 0; i < after.size(); ++i) {
    const auto it = std::find(before.begin(), before.end(), after[i]);
    if (it == before.end() || (i > 0 && after[i] <= after[i - 1]))
      return invalid_argument("scale-down: device {} is not one of the devices before, ascending",
                              after[i]);
    position[size_t(it - before.begin())] = int(i);
  }
  xccl::ExpertMap out;
  out.version = map.version;
  out.n_devices = int(after.size());
  out.slots_per_device = map.slots_per_device;
  out.replicas.resize(map.replicas.size());
  const int spd = map.slots_per_device;
  for (size_t e = 0; e < map.replicas.size(); ++e) {
    for (int32_t p : map.replicas[e]) {
      const int at = position[size_t(p / spd)];
      if (at >= 0) out.replicas[e].push_back(int32_t(at * spd + p % spd));
    }
    if (out.replicas[e].empty()) {
      std::string kept;
      for (int d : after) kept += fmt::format("{}{}", kept.empty() ? "" : ", ", d);
      return invalid_argument("scale-down: expert {} has no copy on the devices left ({})", e,
                              kept);
    }
  }
  return out;
}

Result<std::vector<xccl::ExpertMap>> layer_maps(
    const eplb::Shape& shape, int64_t n_layers, std::span<const int64_t> moe_layers,
    const std::vector<std::vector<std::vector<int32_t>>>& replicas, uint64_t version) {
  if (replicas.size() != moe_layers.size())
    return invalid_argument("expert maps: {} layers of copies for {} MoE layers", replicas.size(),
                            moe_layers.size());
  std::vector<xccl::ExpertMap> maps(size_t(std::max<int64_t>(n_layers, 0)));
  for (size_t i = 0; i < moe_layers.size(); ++i) {
    const int64_t l = moe_layers[i];
    if (l < 0 || l >= n_layers)
      return invalid_argument("expert maps: MoE layer {} outside the model's {} layers", l,
                              n_layers);
    xccl::ExpertMap& m = maps[size_t(l)];
    m.version = version;
    m.n_devices = shape.n_devices;
    m.slots_per_device = shape.slots_per_device();
    m.replicas = replicas[i];
    if (m.n_logical() != shape.n_experts)
      return invalid_argument("expert map of layer {}: {} experts, the model has {}", l,
                              m.n_logical(), shape.n_experts);
    XDS_RETURN_IF_ERROR(m.validate().with_context(fmt::format("layer {}", l)));
  }
  return maps;
}

Result<std::vector<int32_t>> redundant_slot_experts(
    const eplb::Shape& shape, int rank, const std::vector<std::vector<int32_t>>& replicas) {
  const int spd = shape.slots_per_device(), per = shape.experts_per_device();
  const int64_t n_phys = int64_t(shape.n_devices) * spd;
  std::vector<int32_t> out(size_t(shape.redundant_slots), -1);
  for (size_t e = 0; e < replicas.size(); ++e) {
    for (int32_t p : replicas[e]) {
      if (p < 0 || p >= n_phys)
        return invalid_argument("expert {}: physical slot {} outside [0, {})", e, p, n_phys);
      const int d = p / spd, s = p % spd;
      if (s < per) {
        if (d * per + s != int(e))
          return invalid_argument("expert {}: primary slot {} of device {} belongs to expert {}", e,
                                  s, d, d * per + s);
        continue;
      }
      if (d == rank) out[size_t(s - per)] = int32_t(e);
    }
  }
  return out;
}

DeviceLoad device_load(int n_devices, int slots_per_device, std::span<const double> slot_counts) {
  DeviceLoad r;
  r.load.assign(size_t(std::max(n_devices, 0)), 0.0);
  for (int d = 0; d < n_devices; ++d)
    for (int s = 0; s < slots_per_device; ++s) {
      const size_t i = size_t(d) * size_t(slots_per_device) + size_t(s);
      if (i < slot_counts.size()) r.load[size_t(d)] += slot_counts[i];
    }
  for (double v : r.load) {
    r.max = std::max(r.max, v);
    r.mean += v;
  }
  if (n_devices > 0) r.mean /= n_devices;
  return r;
}

}  // namespace xds::engine
