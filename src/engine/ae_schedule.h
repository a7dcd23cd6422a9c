// Pure schedules of MoE/attention disaggregation (P105–P111, docs/design/ae_disaggregation.md):
// where each device sits, which DP domain exchanges with the expert devices when, and how an
// attention group splits one MoE layer's tokens into microbatches.
//
// Ranks of an A/E instance's fabric: attention DP groups 0 .. A-1, expert devices A .. A+X-1.
// Attention groups are split into D DP domains of consecutive ranks (sizes differ by at most
// one, the larger first); the attention group at position i of its domain is paired with the
// trampoline expert device A + i (xccl/a2e.h), so a domain holds at most X groups.
//
// Turn-taking (P110): only one domain talks to the experts at a time. Every MoE layer of a
// step is served domain by domain, and inside a domain microbatch by microbatch:
//   for layer in moe layers: for domain in 0..D-1: for microbatch in 0..M-1: A2E, experts, E2A
// so while the experts serve domain d the other domains run their attention (and domain d's
// first microbatch its dense work while its second is at the experts).
//
// Everything here is a pure function of its arguments.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "xccl/a2e.h"

namespace xds::engine {

struct AeShape {
  int attention = 1;     // A: attention DP groups
  int experts = 1;       // X: expert devices
  int domains = 1;       // D: DP domains
  int microbatches = 1;  // M: microbatches per group and MoE layer
};

// At most 16 domains and 16 microbatches (4 bits each of the exchange's key).
inline constexpr int kMaxAeDomains = 16;
inline constexpr int kMaxAeMicrobatches = 16;
// Rounds of at most max_tokens each inside one microbatch (4 bits of the key).
inline constexpr int kMaxAeRounds = 16;

// InvalidArgument naming the flag (--attention-dp, --expert-devices, --dp-domains,
// --microbatches) for a shape that cannot run: a domain with more groups than expert devices
// (one trampoline each), more domains than groups, a count out of range.
Status validate_ae_shape(const AeShape& s);

int ae_world_size(const AeShape& s);  // A + X
bool ae_is_expert_rank(const AeShape& s, int rank);
// [D] the first attention rank of each domain, then A: domain d is [first[d], first[d + 1]).
std::vector<int> ae_domain_starts(const AeShape& s);
// Domain of attention rank r (-1 for an expert rank).
int ae_domain_of(const AeShape& s, int rank);
// The topology xccl::A2e takes: domains as above, experts A .. A+X-1.
xccl::A2eTopology ae_topology(const AeShape& s);
// The trampoline expert rank attention rank r hands its rows to (A + its position).
int ae_trampoline_of(const AeShape& s, int rank);

// [m + 1] boundaries of n tokens split into m microbatches: sizes differ by at most one, the
// larger first; an empty microbatch where n < m (it still takes its turn, with no rows).
std::vector<int64_t> microbatch_bounds(int64_t n, int m);

// One turn of the expert devices: the moe_index-th MoE layer of the step (in the model's
// order), served for `domain`, microbatch `microbatch`.
struct AeTurn {
  int moe_index = 0;
  int domain = 0;
  int microbatch = 0;
  bool operator==(const AeTurn&) const = default;
};
// The expert devices' order of turns for one pass over n_moe_layers MoE layers.
std::vector<AeTurn> ae_expert_turns(int n_moe_layers, int domains, int microbatches);

// The A2E key's round field of (microbatch, round inside it): microbatch << 4 | round.
inline int ae_round_code(int microbatch, int round) { return (microbatch & 0xF) << 4 | (round & 0xF); }

}  // namespace xds::engine
