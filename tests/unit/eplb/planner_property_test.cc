// The EPLB planner over seeded random count matrices: its invariants (never two copies of an
// expert on one device, at most S replicas per device, at most N copies, at most R
// replicas, tail_after <= tail_before), and every decision re-derived from the rules in
// eplb/planner.h by a plain second derivation written here: each selection round rebuilt
// from the counts and the replicas chosen before it with whole trial matrices (the planner
// keeps per-slice maxima instead), and the placement replayed on its own loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "eplb/planner.h"

namespace xds::eplb {
namespace {

using Matrix = std::vector<std::vector<double>>;  // [n_slices][n_experts]

struct Case {
  PlanParams params;
  Matrix counts;
};

Case random_case(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t n) { return static_cast<int>(rng() % n); };
  const int experts_options[] = {1, 2, 4, 6, 8, 12, 16};
  const int e = experts_options[pick(7)];
  std::vector<int> divisors;
  for (int n = 1; n <= e; ++n) {
    if (e % n == 0) divisors.push_back(n);
  }
  Case c;
  c.params.shape = {e, divisors[static_cast<size_t>(pick(divisors.size()))], pick(4)};
  const int64_t capacity = int64_t{c.params.shape.n_devices} * c.params.shape.redundant_slots;
  if (pick(2) == 0) c.params.budget = pick(static_cast<uint64_t>(capacity) + 1);
  // Small ranges give many ties; per-expert popularity gives hot experts.
  const int range = pick(2) == 0 ? 4 : 200;
  std::vector<int> popularity(static_cast<size_t>(e));
  for (int& p : popularity) p = 1 + pick(static_cast<uint64_t>(range));
  const int n_slices = 1 + pick(6);
  c.counts.assign(static_cast<size_t>(n_slices), std::vector<double>(static_cast<size_t>(e)));
  for (auto& row : c.counts) {
    for (int x = 0; x < e; ++x)
      row[static_cast<size_t>(x)] = pick(popularity[static_cast<size_t>(x)] + 1);
  }
  return c;
}

LayerCounts to_layer(const Matrix& m) {
  LayerCounts l;
  l.n_slices = static_cast<int>(m.size());
  for (const auto& row : m) l.counts.insert(l.counts.end(), row.begin(), row.end());
  return l;
}

double plain_tail(const Matrix& m) {
  double tail = 0;
  for (const auto& row : m) tail += *std::max_element(row.begin(), row.end());
  return tail;
}

Matrix divided(const Matrix& counts, const std::vector<int>& copies) {
  Matrix sim = counts;
  for (auto& row : sim) {
    for (size_t e = 0; e < row.size(); ++e) row[e] /= copies[e];
  }
  return sim;
}

// The candidates of a round, from the rule: argmax per slice (lowest e), not yet on N devices.
std::vector<int> plain_candidates(const Matrix& sim, const std::vector<int>& copies,
                                  int n_devices) {
  std::vector<int> out;
  for (const auto& row : sim) {
    const int arg = static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
    if (copies[static_cast<size_t>(arg)] < n_devices &&
        std::find(out.begin(), out.end(), arg) == out.end()) {
      out.push_back(arg);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Re-derives every selection round and the stop from the counts and the plan's replicas.
void check_selection(const Case& c, const LayerPlan& plan) {
  const int n_experts = c.params.shape.n_experts, n_devices = c.params.shape.n_devices;
  std::vector<int> copies(static_cast<size_t>(n_experts), 1);
  double previous_tail = plain_tail(c.counts);
  EXPECT_EQ(plan.tail_before, previous_tail);
  for (const int chosen : plan.replicas) {
    const Matrix sim = divided(c.counts, copies);
    const std::vector<int> candidates = plain_candidates(sim, copies, n_devices);
    ASSERT_FALSE(candidates.empty());
    int best = -1;
    double best_tail = 0;
    for (const int cand : candidates) {
      Matrix trial = sim;
      for (size_t t = 0; t < trial.size(); ++t) {
        trial[t][static_cast<size_t>(cand)] =
            c.counts[t][static_cast<size_t>(cand)] / (copies[static_cast<size_t>(cand)] + 1);
      }
      const double tail = plain_tail(trial);
      if (best < 0 || tail < best_tail) {
        best = cand;
        best_tail = tail;
      }
    }
    ASSERT_EQ(chosen, best);
    ++copies[static_cast<size_t>(chosen)];
    // A replica never raises the tail.
    EXPECT_LE(best_tail, previous_tail);
    previous_tail = best_tail;
  }
  EXPECT_LE(static_cast<int64_t>(plan.replicas.size()), c.params.budget_or_default());
  if (static_cast<int64_t>(plan.replicas.size()) < c.params.budget_or_default()) {
    // Stopped early: no candidates were left.
    EXPECT_TRUE(plain_candidates(divided(c.counts, copies), copies, n_devices).empty());
  }
  EXPECT_EQ(plan.tail_after, plain_tail(divided(c.counts, copies)));
  EXPECT_LE(plan.tail_after, plan.tail_before);
  for (const int n : copies) EXPECT_LE(n, n_devices);
}

// Replays the placement: each replica, ordered by (total descending, id, selection order),
// goes where the rule says, or is dropped exactly when no device was eligible.
void check_placement(const Case& c, const LayerPlan& plan) {
  const Shape& s = c.params.shape;
  std::vector<int> copies(static_cast<size_t>(s.n_experts), 1);
  for (const int e : plan.replicas) ++copies[static_cast<size_t>(e)];
  std::vector<double> total(static_cast<size_t>(s.n_experts), 0.0);
  for (const auto& row : c.counts) {
    for (int e = 0; e < s.n_experts; ++e)
      total[static_cast<size_t>(e)] += row[static_cast<size_t>(e)];
  }
  auto share = [&](int e) {
    return total[static_cast<size_t>(e)] / copies[static_cast<size_t>(e)];
  };
  std::vector<double> load(static_cast<size_t>(s.n_devices), 0.0);
  std::vector<std::vector<bool>> holds(static_cast<size_t>(s.n_devices),
                                       std::vector<bool>(static_cast<size_t>(s.n_experts)));
  for (int e = 0; e < s.n_experts; ++e) {
    const int d = e / (s.n_experts / s.n_devices);
    load[static_cast<size_t>(d)] += share(e);
    holds[static_cast<size_t>(d)][static_cast<size_t>(e)] = true;
  }
  std::vector<std::tuple<double, int, size_t>> order;  // (-total, id, selection index)
  for (size_t i = 0; i < plan.replicas.size(); ++i) {
    order.emplace_back(-total[static_cast<size_t>(plan.replicas[i])], plan.replicas[i], i);
  }
  std::sort(order.begin(), order.end());
  std::vector<int> free_slots(static_cast<size_t>(s.n_devices), s.redundant_slots);
  size_t next_placed = 0, next_dropped = 0;
  for (const auto& [neg_total, e, index] : order) {
    std::vector<int> eligible;
    for (int d = 0; d < s.n_devices; ++d) {
      if (free_slots[static_cast<size_t>(d)] > 0 &&
          !holds[static_cast<size_t>(d)][static_cast<size_t>(e)]) {
        eligible.push_back(d);
      }
    }
    if (eligible.empty()) {
      ASSERT_LT(next_dropped, plan.dropped.size());
      EXPECT_EQ(plan.dropped[next_dropped++], e);
      continue;
    }
    int want = eligible[0];
    for (const int d : eligible) {
      if (load[static_cast<size_t>(d)] < load[static_cast<size_t>(want)]) want = d;
    }
    ASSERT_LT(next_placed, plan.placement.size());
    const Placement got = plan.placement[next_placed++];
    ASSERT_EQ(got.expert, e);
    ASSERT_EQ(got.device, want);
    --free_slots[static_cast<size_t>(want)];
    holds[static_cast<size_t>(want)][static_cast<size_t>(e)] = true;
    load[static_cast<size_t>(want)] += share(e);
  }
  EXPECT_EQ(next_placed, plan.placement.size());
  EXPECT_EQ(next_dropped, plan.dropped.size());
}

// The invariants, counted directly from the plan.
void check_invariants(const Case& c, const LayerPlan& plan) {
  const Shape& s = c.params.shape;
  std::vector<int> per_device(static_cast<size_t>(s.n_devices), 0);
  std::vector<std::vector<int>> on(static_cast<size_t>(s.n_devices),
                                   std::vector<int>(static_cast<size_t>(s.n_experts), 0));
  for (int e = 0; e < s.n_experts; ++e)
    ++on[static_cast<size_t>(s.primary_device(e))][static_cast<size_t>(e)];
  for (const Placement& p : plan.placement) {
    ++per_device[static_cast<size_t>(p.device)];
    ++on[static_cast<size_t>(p.device)][static_cast<size_t>(p.expert)];
  }
  for (int d = 0; d < s.n_devices; ++d) {
    EXPECT_LE(per_device[static_cast<size_t>(d)], s.redundant_slots) << "device " << d;
    for (int e = 0; e < s.n_experts; ++e) {
      EXPECT_LE(on[static_cast<size_t>(d)][static_cast<size_t>(e)], 1)
          << "expert " << e << " device " << d;
    }
  }
  EXPECT_EQ(plan.placement.size() + plan.dropped.size(), plan.replicas.size());

  // The expert map: every copy has its own physical slot; copies = 1 + placed replicas.
  auto slots = plan_slots(s, plan);
  ASSERT_TRUE(slots.ok()) << slots.status().to_string();
  std::vector<int> used(
      static_cast<size_t>(s.n_devices) * static_cast<size_t>(s.slots_per_device()), 0);
  size_t n_copies = 0;
  for (int e = 0; e < s.n_experts; ++e) {
    for (const Slot& slot : (*slots)[static_cast<size_t>(e)]) {
      ASSERT_GE(slot.slot, 0);
      ASSERT_LT(slot.slot, s.slots_per_device());
      EXPECT_EQ(++used[static_cast<size_t>(slot.physical(s))], 1);
      ++n_copies;
    }
  }
  EXPECT_EQ(n_copies, static_cast<size_t>(s.n_experts) + plan.placement.size());

  // The predicted loads add up to the tokens routed.
  auto load = predict_load(s, to_layer(c.counts), plan);
  ASSERT_TRUE(load.ok()) << load.status().to_string();
  double sum = 0, tokens = 0;
  for (const double l : load->device_load) sum += l;
  for (const auto& row : c.counts) {
    for (const double v : row) tokens += v;
  }
  EXPECT_NEAR(sum, tokens, 1e-9 * std::max(1.0, tokens));
  EXPECT_GE(load->max, load->mean);
  EXPECT_NEAR(load->mean * s.n_devices, tokens, 1e-9 * std::max(1.0, tokens));
}

TEST(PlannerProperty, RandomCountsFollowTheRules) {
  int with_replicas = 0, with_dropped = 0, stopped_early = 0;
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const Case c = random_case(seed);
    auto plan = plan_layer(c.params, to_layer(c.counts));
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    check_selection(c, *plan);
    check_placement(c, *plan);
    check_invariants(c, *plan);
    with_replicas += !plan->replicas.empty();
    with_dropped += !plan->dropped.empty();
    stopped_early += static_cast<int64_t>(plan->replicas.size()) < c.params.budget_or_default();
  }
  // The generator reaches every branch (not an assertion about the planner's quality).
  EXPECT_GT(with_replicas, 100);
  EXPECT_GT(with_dropped, 5);
  EXPECT_GT(stopped_early, 20);
}

}  // namespace
}  // namespace xds::eplb
