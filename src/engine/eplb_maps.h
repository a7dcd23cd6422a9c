// EPLB in the engine, the pure part: expert maps from a plan, the slots a device must hold
// under a map, the spread key of a token, and device loads from slot counts. No I/O.
//
// Shapes (one MoE layer; E experts, N devices, S redundant slots per device):
//   physical slot p = d · (E / N + S) + s lives on device d = p / (E / N + S) as slot s;
//   slots [0, E / N) of device d hold its primary experts d · (E / N) + s, slots
//   [E / N, E / N + S) its redundant copies (eplb/planner.h, plan_slots).
//   replicas: [E] -> physical slot ids, the primary first, then the replicas in placement
//   order; the token of row i of a step's batch meets copy replicas[e][(i + rank) mod
//   |replicas[e]|] (P078–P079, eplb::spread_slot), which ExpertMap::physical gives for the key
//   spread_key(i, rank).
//
// Thread-safety: pure functions, callable from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "eplb/planner.h"
#include "xccl/expert_map.h"

namespace xds::engine {

// The key ExpertMap::physical reduces modulo the number of copies: (row + rank) mod 2^32, row
// being the token's row in the step's batch on this device. Equal to eplb::spread_index's copy
// for every count of copies that divides 2^32 and, for rows below 2^31, for every count (a
// step's rows are bounded by its token budget).
inline uint32_t spread_key(int64_t row, int rank) {
  return static_cast<uint32_t>(static_cast<uint64_t>(row) + static_cast<uint64_t>(rank));
}

// [E] -> physical ids of the copies plan_slots gave (primary first). InvalidArgument for an
// expert without a copy.
Result<std::vector<std::vector<int32_t>>> replicas_of_slots(
    const eplb::Shape& shape, const std::vector<std::vector<eplb::Slot>>& slots);

// The map with every redundant slot disabled: each expert on its primary slot only.
std::vector<std::vector<int32_t>> primary_replicas(const eplb::Shape& shape);

// One map per layer of the model (n_layers, MTP layers included): maps[l] for l in
// moe_layers from replicas[i] (i = l's position in moe_layers), every other entry empty;
// all under `version`. InvalidArgument (naming the layer) for a count mismatch or a map that
// fails ExpertMap::validate.
Result<std::vector<xccl::ExpertMap>> layer_maps(
    const eplb::Shape& shape, int64_t n_layers, std::span<const int64_t> moe_layers,
    const std::vector<std::vector<std::vector<int32_t>>>& replicas, uint64_t version);

// What device `rank` must hold in its redundant slots under one layer's replicas:
// [S] logical expert of each redundant slot, -1 for an empty one. InvalidArgument for a
// physical id outside the N · (E / N + S) slots, or a primary slot holding another expert
// than its own (primary slots never move).
Result<std::vector<int32_t>> redundant_slot_experts(
    const eplb::Shape& shape, int rank, const std::vector<std::vector<int32_t>>& replicas);

// Backup copies for scale-down (P119): each device's redundant slots hold copies of the
// primary experts of the device before it (device d's slot E / N + j holds expert
// ((d - 1) mod N) · (E / N) + j, for j < min(S, E / N)). With S >= E / N every expert has a
// copy on another device, so any one device can be lost. [E] -> physical ids, primary first.
std::vector<std::vector<int32_t>> backup_replicas(const eplb::Shape& shape);

// One layer's map on the devices left after others were lost (scale-down, P119). Map device
// d is `before[d]` (ascending ids, e.g. the DP groups of an instance); every copy on a device
// not in `after` (a subset of `before`, ascending) is dropped and the others renumbered to
// their device's position in `after`, each keeping its slot index; version and slots per
// device stay. A map without replicas (a dense layer) is returned as it is. InvalidArgument
// naming the expert left without a copy, or for `after` not a subset of `before`.
Result<xccl::ExpertMap> scaled_down_map(const xccl::ExpertMap& map, std::span<const int> before,
                                        std::span<const int> after);

// Device loads of one layer from per-device slot counts [N, E / N + S]: load(d) = Σ_s
// counts[d][s]; ratio = max / mean (1 when nothing was counted).
struct DeviceLoad {
  std::vector<double> load;  // [N]
  double max = 0, mean = 0;
  double ratio() const { return mean > 0 ? max / mean : 1.0; }
};
DeviceLoad device_load(int n_devices, int slots_per_device, std::span<const double> slot_counts);

}  // namespace xds::engine
