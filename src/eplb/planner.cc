#include "eplb/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

namespace xds::eplb {
namespace {

size_t at_index(int t, int e, int n_experts) {
  return static_cast<size_t>(t) * static_cast<size_t>(n_experts) + static_cast<size_t>(e);
}

// sum_t max_e m[t][e] of a [n_slices, n_experts] matrix, t ascending.
double tail_of(const std::vector<double>& m, int n_slices, int n_experts) {
  double tail = 0;
  for (int t = 0; t < n_slices; ++t) {
    const double* row = m.data() + at_index(t, 0, n_experts);
    tail += *std::max_element(row, row + n_experts);
  }
  return tail;
}

// Per slice of sim: its argmax (the lowest e on ties), the max, and the largest value over
// the other experts (-inf with one expert). The max of a trial row (column c changed) is
// then max(trial[t][c], c == arg ? second : first): the same value as the max over the
// whole trial row, without building it.
struct SliceTop {
  int arg = 0;
  double first = 0;
  double second = 0;
};

void slice_tops(const std::vector<double>& sim, int n_slices, int n_experts,
                std::vector<SliceTop>& tops) {
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  tops.assign(static_cast<size_t>(n_slices), SliceTop{});
  for (int t = 0; t < n_slices; ++t) {
    const double* row = sim.data() + at_index(t, 0, n_experts);
    SliceTop top{0, row[0], kMinusInf};
    for (int e = 1; e < n_experts; ++e) {
      if (row[e] > top.first) {
        top.second = top.first;
        top.first = row[e];
        top.arg = e;
      } else {
        top.second = std::max(top.second, row[e]);
      }
    }
    tops[static_cast<size_t>(t)] = top;
  }
}

// The selection rounds (planner.h). sim: [n_slices, n_experts], counts on entry, the final
// sim on return; copies: [n_experts], all 1 on entry.
std::vector<int> select_replicas(const PlanParams& params, const LayerCounts& layer,
                                 std::vector<double>& sim, std::vector<int>& copies) {
  const int n_experts = params.shape.n_experts, n_slices = layer.n_slices;
  const int64_t budget = params.budget_or_default();
  std::vector<int> replicas;
  std::vector<SliceTop> tops;
  std::vector<int> candidates;
  for (int64_t round = 0; round < budget; ++round) {
    slice_tops(sim, n_slices, n_experts, tops);
    candidates.clear();
    for (const SliceTop& top : tops) {
      if (copies[static_cast<size_t>(top.arg)] < params.shape.n_devices) {
        candidates.push_back(top.arg);
      }
    }
    std::sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    if (candidates.empty()) break;

    int best = -1;
    double best_tail = 0;
    for (const int c : candidates) {
      const double divisor = static_cast<double>(copies[static_cast<size_t>(c)] + 1);
      double tail = 0;
      for (int t = 0; t < n_slices; ++t) {
        const SliceTop& top = tops[static_cast<size_t>(t)];
        const double others = top.arg == c ? top.second : top.first;
        tail += std::max(layer.at(t, c, n_experts) / divisor, others);
      }
      if (best < 0 || tail < best_tail) {
        best = c;
        best_tail = tail;
      }
    }
    replicas.push_back(best);
    const int n = ++copies[static_cast<size_t>(best)];
    for (int t = 0; t < n_slices; ++t) {
      sim[at_index(t, best, n_experts)] = layer.at(t, best, n_experts) / n;
    }
  }
  return replicas;
}

// The placement (planner.h); fills plan.placement and plan.dropped from plan.replicas.
void place_replicas(const Shape& shape, const LayerCounts& layer, const std::vector<int>& copies,
                    LayerPlan& plan) {
  const int n_experts = shape.n_experts, n_devices = shape.n_devices;
  std::vector<double> total(static_cast<size_t>(n_experts), 0.0);  // [n_experts]
  std::vector<double> share(static_cast<size_t>(n_experts), 0.0);  // [n_experts]
  for (int e = 0; e < n_experts; ++e) {
    for (int t = 0; t < layer.n_slices; ++t)
      total[static_cast<size_t>(e)] += layer.at(t, e, n_experts);
    share[static_cast<size_t>(e)] = total[static_cast<size_t>(e)] / copies[static_cast<size_t>(e)];
  }
  std::vector<double> load(static_cast<size_t>(n_devices), 0.0);  // [n_devices]
  std::vector<int> used(static_cast<size_t>(n_devices), 0);       // [n_devices] redundant slots
  std::vector<char> has_copy(static_cast<size_t>(n_devices) * n_experts,
                             0);         // [n_devices, n_experts]
  for (int e = 0; e < n_experts; ++e) {  // ascending e: each device's sum in ascending e
    const int d = shape.primary_device(e);
    load[static_cast<size_t>(d)] += share[static_cast<size_t>(e)];
    has_copy[static_cast<size_t>(d) * n_experts + e] = 1;
  }

  std::vector<size_t> order(plan.replicas.size());  // indices into plan.replicas
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int ea = plan.replicas[a], eb = plan.replicas[b];
    const double ta = total[static_cast<size_t>(ea)], tb = total[static_cast<size_t>(eb)];
    return ta != tb ? ta > tb : ea < eb;  // stable: then selection order
  });
  for (const size_t i : order) {
    const int e = plan.replicas[i];
    int best = -1;
    for (int d = 0; d < n_devices; ++d) {
      const size_t di = static_cast<size_t>(d);
      if (used[di] >= shape.redundant_slots || has_copy[di * n_experts + e]) continue;
      if (best < 0 || load[di] < load[static_cast<size_t>(best)]) best = d;
    }
    if (best < 0) {
      plan.dropped.push_back(e);
      continue;
    }
    const size_t bi = static_cast<size_t>(best);
    ++used[bi];
    has_copy[bi * n_experts + e] = 1;
    load[bi] += share[static_cast<size_t>(e)];
    plan.placement.push_back({e, best});
  }
}

}  // namespace

Status validate_params(const PlanParams& params) {
  const Shape& s = params.shape;
  if (s.n_experts < 1) return invalid_argument("n_experts must be >= 1, got {}", s.n_experts);
  if (s.n_devices < 1) return invalid_argument("devices must be >= 1, got {}", s.n_devices);
  if (s.n_experts % s.n_devices != 0) {
    return invalid_argument(
        "n_experts {} is not divisible by devices {} (each device holds n_experts / devices "
        "primary experts)",
        s.n_experts, s.n_devices);
  }
  if (s.redundant_slots < 0) {
    return invalid_argument("redundant_slots must be >= 0, got {}", s.redundant_slots);
  }
  if (params.budget.has_value()) {
    const int64_t capacity = int64_t{s.n_devices} * s.redundant_slots;
    if (*params.budget < 0) return invalid_argument("budget must be >= 0, got {}", *params.budget);
    if (*params.budget > capacity) {
      return invalid_argument("budget {} exceeds devices × redundant_slots = {} × {} = {}",
                              *params.budget, s.n_devices, s.redundant_slots, capacity);
    }
  }
  return {};
}

Status validate_counts(const Shape& shape, const LayerCounts& layer) {
  if (layer.n_slices < 1) {
    return invalid_argument("layer {}: counts has no time slices", layer.layer);
  }
  const size_t expected =
      static_cast<size_t>(layer.n_slices) * static_cast<size_t>(shape.n_experts);
  if (layer.counts.size() != expected) {
    return invalid_argument(
        "layer {}: counts holds {} values, expected {} slices × {} experts = {}", layer.layer,
        layer.counts.size(), layer.n_slices, shape.n_experts, expected);
  }
  for (int t = 0; t < layer.n_slices; ++t) {
    for (int e = 0; e < shape.n_experts; ++e) {
      const double v = layer.at(t, e, shape.n_experts);
      if (!std::isfinite(v) || v < 0) {
        return invalid_argument("layer {}: counts[{}][{}] is {}, expected a finite number >= 0",
                                layer.layer, t, e, v);
      }
    }
  }
  return {};
}

Result<LayerPlan> plan_layer(const PlanParams& params, const LayerCounts& layer) {
  XDS_RETURN_IF_ERROR(validate_params(params));
  XDS_RETURN_IF_ERROR(validate_counts(params.shape, layer));
  const int n_experts = params.shape.n_experts;
  LayerPlan plan;
  plan.layer = layer.layer;
  plan.tail_before = tail_of(layer.counts, layer.n_slices, n_experts);
  std::vector<double> sim = layer.counts;                      // [n_slices, n_experts]
  std::vector<int> copies(static_cast<size_t>(n_experts), 1);  // [n_experts]
  plan.replicas = select_replicas(params, layer, sim, copies);
  plan.tail_after = tail_of(sim, layer.n_slices, n_experts);
  place_replicas(params.shape, layer, copies, plan);
  return plan;
}

Result<Plan> plan_layers(const PlanParams& params, std::span<const LayerCounts> layers) {
  XDS_RETURN_IF_ERROR(validate_params(params));
  std::set<int> seen;
  Plan plan;
  for (const LayerCounts& layer : layers) {
    if (!seen.insert(layer.layer).second) {
      return invalid_argument("layer {} appears more than once", layer.layer);
    }
    XDS_ASSIGN_OR_RETURN(LayerPlan lp, plan_layer(params, layer));
    plan.layers.push_back(std::move(lp));
  }
  return plan;
}

Result<std::vector<std::vector<Slot>>> plan_slots(const Shape& shape, const LayerPlan& plan) {
  XDS_RETURN_IF_ERROR(validate_params(PlanParams{shape, std::nullopt}));
  const int n_experts = shape.n_experts, epd = shape.experts_per_device();
  std::vector<std::vector<Slot>> slots(static_cast<size_t>(n_experts));  // [n_experts][copies]
  for (int e = 0; e < n_experts; ++e) {
    slots[static_cast<size_t>(e)].push_back({shape.primary_device(e), e % epd});
  }
  std::vector<int> used(static_cast<size_t>(shape.n_devices), 0);  // [n_devices]
  std::vector<int> listed(static_cast<size_t>(n_experts), 0);      // [n_experts] in replicas
  std::vector<int> held(static_cast<size_t>(n_experts), 0);        // [n_experts] placed or dropped
  for (const int e : plan.replicas) {
    if (e < 0 || e >= n_experts) {
      return invalid_argument("layer {}: replica of expert {}, outside [0, {})", plan.layer, e,
                              n_experts);
    }
    ++listed[static_cast<size_t>(e)];
  }
  for (const Placement& p : plan.placement) {
    if (p.expert < 0 || p.expert >= n_experts) {
      return invalid_argument("layer {}: placement of expert {}, outside [0, {})", plan.layer,
                              p.expert, n_experts);
    }
    if (p.device < 0 || p.device >= shape.n_devices) {
      return invalid_argument("layer {}: expert {} placed on device {}, outside [0, {})",
                              plan.layer, p.expert, p.device, shape.n_devices);
    }
    int& n_used = used[static_cast<size_t>(p.device)];
    if (n_used >= shape.redundant_slots) {
      return invalid_argument("layer {}: device {} gets more than its {} redundant slots",
                              plan.layer, p.device, shape.redundant_slots);
    }
    std::vector<Slot>& copies = slots[static_cast<size_t>(p.expert)];
    for (const Slot& s : copies) {
      if (s.device == p.device) {
        return invalid_argument("layer {}: expert {} has two copies on device {}", plan.layer,
                                p.expert, p.device);
      }
    }
    copies.push_back({p.device, epd + n_used});
    ++n_used;
    ++held[static_cast<size_t>(p.expert)];
  }
  for (const int e : plan.dropped) {
    if (e < 0 || e >= n_experts) {
      return invalid_argument("layer {}: dropped expert {}, outside [0, {})", plan.layer, e,
                              n_experts);
    }
    ++held[static_cast<size_t>(e)];
  }
  for (int e = 0; e < n_experts; ++e) {
    const size_t i = static_cast<size_t>(e);
    if (listed[i] != held[i]) {
      return invalid_argument(
          "layer {}: 'replicas' lists expert {} {} times, 'placement' and 'dropped' together {}",
          plan.layer, e, listed[i], held[i]);
    }
  }
  return slots;
}

Result<LoadPrediction> predict_load(const Shape& shape, const LayerCounts& counts,
                                    const LayerPlan& plan) {
  XDS_ASSIGN_OR_RETURN(auto slots, plan_slots(shape, plan));
  XDS_RETURN_IF_ERROR(validate_counts(shape, counts));
  LoadPrediction out;
  out.device_load.assign(static_cast<size_t>(shape.n_devices), 0.0);
  for (int e = 0; e < shape.n_experts; ++e) {
    double total = 0;
    for (int t = 0; t < counts.n_slices; ++t) total += counts.at(t, e, shape.n_experts);
    const auto& copies = slots[static_cast<size_t>(e)];
    const double share = total / static_cast<double>(copies.size());
    for (const Slot& s : copies) out.device_load[static_cast<size_t>(s.device)] += share;
  }
  double sum = 0;
  for (const double l : out.device_load) {
    out.max = std::max(out.max, l);
    sum += l;
  }
  out.mean = sum / shape.n_devices;
  return out;
}

}  // namespace xds::eplb
