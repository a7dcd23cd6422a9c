// EPLB: which experts get redundant copies, and on which device each copy lives. Pure
// functions: counts in, a plan out; no I/O (the JSON forms are plan_json.h).
//
// The shape of one MoE layer: E experts over N devices. Expert e's primary copy lives on
// device e / (E / N) (E divisible by N). Every device also has S redundant slots per layer;
// the planner fills at most R of the N·S slots of a layer (R, the budget, defaults to N·S).
// Device d's physical slots are its E / N primary slots (slot e % (E / N) holds expert e)
// followed by its S redundant slots; physical slot id = d · (E / N + S) + slot.
//
// The rules, exactly (so that any two implementations agree; float64 throughout, every sum
// over time slices in ascending t):
//
// Selection, per layer, at most R rounds. sim = counts, copies[e] = 1. Each round:
//   candidates = the distinct argmax_e sim[t][e] over the slices t (ties -> lowest e), then
//                those with copies[e] = N removed; none left -> stop.
//   For each candidate c in ascending id: trial = sim with column c set to
//   counts[:, c] / (copies[c] + 1); tail(c) = sum_t max_e trial[t][e].
//   The best is the smallest tail (ties -> lowest id): appended to `replicas`,
//   copies[best] += 1, sim[:, best] = counts[:, best] / copies[best].
//   tail_before = sum_t max_e counts[t][e]; tail_after = the same over the final sim.
//
// Placement. total(e) = sum_t counts[t][e]; share(e) = total(e) / copies[e] (the copies the
// selection gave). Device load starts as the sum of share(e) over its primary experts. The
// replicas, in order of total descending (ties -> lowest id, then selection order), go one
// by one to the device that has a free redundant slot and no copy of that expert, with the
// least load (ties -> lowest device id); that device's load grows by share(e). A replica
// with no such device goes to `dropped`.
//
// Thread-safety: every function here is pure and may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/check.h"
#include "base/status.h"

namespace xds::eplb {

// Where the experts of one MoE layer may live.
struct Shape {
  int n_experts = 0;        // E, divisible by n_devices
  int n_devices = 0;        // N
  int redundant_slots = 0;  // S per device per layer

  int experts_per_device() const { return n_experts / n_devices; }                 // E / N
  int slots_per_device() const { return experts_per_device() + redundant_slots; }  // E / N + S
  int primary_device(int expert) const { return expert / experts_per_device(); }
};

struct PlanParams {
  Shape shape;
  std::optional<int64_t> budget;  // R replicas per layer, in [0, N·S]; unset: N·S

  int64_t budget_or_default() const {
    return budget.value_or(int64_t{shape.n_devices} * shape.redundant_slots);
  }
};

// Tokens routed to each expert of one layer in each time slice.
struct LayerCounts {
  int layer = 0;
  int n_slices = 0;            // T >= 1
  std::vector<double> counts;  // [n_slices, n_experts], row-major; finite, >= 0

  double at(int t, int e, int n_experts) const {
    return counts[static_cast<size_t>(t) * static_cast<size_t>(n_experts) + static_cast<size_t>(e)];
  }
};

struct Placement {
  int expert = 0;
  int device = 0;
};

struct LayerPlan {
  int layer = 0;
  std::vector<int> replicas;         // [n_selected] expert ids, in selection order
  std::vector<Placement> placement;  // [n_placed] in placement order
  std::vector<int> dropped;          // [n_dropped] expert ids, in placement order
  double tail_before = 0;            // sum_t max_e counts[t][e]
  double tail_after = 0;             // the same over the final sim
};

struct Plan {
  std::vector<LayerPlan> layers;  // in the order of the input
};

// E >= 1, N >= 1, E divisible by N, S >= 0, 0 <= R <= N·S. Errors name the field.
Status validate_params(const PlanParams& params);
// T >= 1, counts.size() == T·E, every value finite and >= 0. Errors name the layer, slice
// and expert.
Status validate_counts(const Shape& shape, const LayerCounts& layer);

// One layer (validates its inputs first).
Result<LayerPlan> plan_layer(const PlanParams& params, const LayerCounts& layer);
// Every layer, in order; layer ids must be distinct.
Result<Plan> plan_layers(const PlanParams& params, std::span<const LayerCounts> layers);

// ---- the plan as the engine uses it ----

// One physical copy of an expert: slot in [0, E / N + S) of `device` (primary slots first).
struct Slot {
  int device = 0;
  int slot = 0;

  int physical(const Shape& shape) const { return device * shape.slots_per_device() + slot; }
  bool operator==(const Slot&) const = default;
};

// [n_experts] -> its copies: the primary first, then its replicas in placement order. A
// device's redundant slots are filled in placement order: the k-th replica placed on device
// d takes slot E / N + k. Errors (a plan read from a file): an expert or device out of
// range, more than S replicas on one device, two copies of one expert on one device.
Result<std::vector<std::vector<Slot>>> plan_slots(const Shape& shape, const LayerPlan& plan);

// The copy that serves a token (P078-P079): copies[(row + rank) mod |copies|]. row: the
// token's row in the step's batch on its device; rank: the device's DP rank. Consecutive rows
// of one device meet the copies in turn (a decode batch whose sequences all sit at one
// position still spreads over every copy), and the ranks of a data-parallel group start
// their round-robin at different copies; each device decides alone, with no communication.
// copies must not be empty.
inline size_t spread_index(size_t n_copies, uint64_t row, uint64_t rank) {
  return static_cast<size_t>((row % n_copies + rank % n_copies) % n_copies);
}
inline const Slot& spread_slot(std::span<const Slot> copies, uint64_t row, uint64_t rank) {
  XDS_CHECK(!copies.empty(), "spread_slot: an expert with no copy");
  return copies[spread_index(copies.size(), row, rank)];
}

// Predicted per-device load of one layer under a plan: load(d) = sum over the copies on d
// of share(e) = total(e) / copies(e), where copies(e) counts the copies actually placed
// (the primary and the placed replicas: a dropped replica serves nothing).
struct LoadPrediction {
  std::vector<double> device_load;  // [n_devices]
  double max = 0;
  double mean = 0;
};
Result<LoadPrediction> predict_load(const Shape& shape, const LayerCounts& counts,
                                    const LayerPlan& plan);

}  // namespace xds::eplb
