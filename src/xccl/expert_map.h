// Experts addressed through a map, and the pure routing functions of dispatch/combine.
//
// Gating yields logical expert ids. A versioned ExpertMap says which physical slot(s) serve
// each logical expert; physical slot p lives on device p / slots_per_device as local expert
// p % slots_per_device. It is the identity (plus spare slots) until EPLB fills replicas; the
// dispatcher stamps the map version into its metadata and every receiver checks that all
// senders routed with the same version (switching is atomic at a step boundary).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace xds::xccl {

inline constexpr int kMaxTopk = 16;

struct ExpertMap {
  uint64_t version = 0;
  int n_devices = 0;
  int slots_per_device = 0;                    // local expert slots, spares included
  std::vector<std::vector<int32_t>> replicas;  // [n_logical] -> physical slot ids (>= 1 each)

  // Logical expert e on device e / ceil(n_logical / n_devices); spare slots stay empty.
  static ExpertMap identity(int n_logical, int n_devices, int slots_per_device,
                            uint64_t version = 1);
  int n_logical() const { return static_cast<int>(replicas.size()); }
  Status validate() const;
  // Which slot serves (token, logical e): replicas are used round-robin by `token`, the
  // token's spread key (its index in the batch, or what the caller chose: EPLB spreads by the
  // token's row in the step's batch + rank, see plan_routes_into). A single replica (the
  // common case, on the dispatch path per token and expert) skips the modulo.
  int32_t physical(int logical, uint32_t token) const {
    const auto& r = replicas[static_cast<size_t>(logical)];
    return r.size() == 1 ? r[0] : r[token % r.size()];
  }
};

// One token travelling to one device, with the experts it meets there. Fixed size so that a
// device can address entry i of a list in a peer's arena by formula.
struct RouteEntry {
  uint32_t token = 0;    // index in the source's batch
  uint16_t n_local = 0;  // experts of this token on the destination (1..topk)
  uint16_t pad = 0;
  uint16_t local_expert[kMaxTopk] = {};  // slot indices on the destination
  float weight[kMaxTopk] = {};           // gate weights, same order
};
static_assert(sizeof(RouteEntry) == 104);

// Per destination device, ascending token: what a source sends where. topk_ids [n_tokens, k]
// holds logical ids (< 0 = no expert); weights [n_tokens, k].
struct RoutePlan {
  std::vector<std::vector<RouteEntry>> per_device;  // [n_devices]
};
Result<RoutePlan> plan_routes(const ExpertMap& map, std::span<const int32_t> topk_ids,
                              std::span<const float> weights, int n_tokens, int k);
// Same, into `plan`, reusing its lists' storage (the per-step form: no allocation once warm).
// spread: [n_tokens] the key each token's replica is chosen by (ExpertMap::physical: copy
// key mod |copies|); empty: the token's index. On error `plan` is left in an unspecified but
// valid state.
Status plan_routes_into(const ExpertMap& map, std::span<const int32_t> topk_ids,
                        std::span<const float> weights, int n_tokens, int k, RoutePlan& plan,
                        std::span<const uint32_t> spread = {});

// Where each received (source, entry, expert) lands on the receiver: rows are grouped by local
// expert; inside a group, by source position then entry order.
struct RowOrigin {
  int32_t src = 0;      // position of the source in the sender list
  uint32_t entry = 0;   // index in that source's list
  uint32_t token = 0;   // token index at the source
  uint16_t expert = 0;  // local expert slot
  uint16_t first = 0;   // 1 for the first of the entry's rows (j == 0); all share one token row
  float weight = 0;
};
struct RecvLayout {
  std::vector<int32_t> expert_offset;  // [slots_per_device + 1], prefix sums of group sizes
  std::vector<RowOrigin> rows;         // [n_rows]
  // Row of (source, entry, j-th local expert of the entry); slots j >= n_local unspecified.
  std::vector<std::vector<uint32_t>> entry_row;  // [n_src][entries * kMaxTopk]
  int n_rows() const { return static_cast<int>(rows.size()); }
};
RecvLayout group_by_expert(std::span<const std::span<const RouteEntry>> from_src,
                           int slots_per_device);
// Same, into `out`, reusing its storage.
void group_by_expert_into(std::span<const std::span<const RouteEntry>> from_src,
                          int slots_per_device, RecvLayout& out);

// Tokens over several rounds of at most max_tokens each (pure).
inline int rounds_needed(int n_tokens, int max_tokens) {
  return n_tokens <= 0 ? 0 : (n_tokens + max_tokens - 1) / max_tokens;
}

}  // namespace xds::xccl
