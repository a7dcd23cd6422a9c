// Router skew for random checkpoints (`mkmodel --router-skew zipf:A`): an
// e_score_correction_bias per MoE layer that makes expert selection uneven like real
// traffic, so that expert load balancing has something to balance.
//
// The shape: in each MoE layer the experts are ranked by a seeded permutation (rank 0 the
// hottest; a different permutation per layer, as real layers have different hot experts),
// and the expert of rank r is chosen by a share of tokens ~ proportional to 1 / (r + 1)^A.
//
// How: DeepSeek-V3's noaux_tc routing adds the bias to the sigmoid scores for selection only
// (model/moe_routing.h), so the bias moves who is chosen without changing the gate weights
// the chosen experts get. No closed form turns a target frequency into a bias: the scores
// saturate in (0, 1), top-k couples the experts, and the group-limited step couples the
// experts of a group. So the bias is fitted, with the update DeepSeek-V3 itself uses to
// balance load (raise the bias of an under-loaded expert, lower an over-loaded one), aimed
// at the Zipf target instead of a uniform one: over router logits of sampled hidden states,
// b[e] += step · (ln q[e] - ln f[e]) where f is the measured selection rate and q the
// target. The result is log-like in the rank (ln q is) but corrected for the routing's
// couplings. The gate weight rows are left as they are: scaling them would also change the
// gate weights of the chosen experts, i.e. the model's numerics, not only its routing.
//
// The hidden states the router sees come out of an RMSNorm with weights ~1, so the fit
// samples x ~ N(0, I) (unit RMS); real activations are correlated across tokens, so a run
// of the model follows the shape less exactly than random hidden states do.
//
// Everything is deterministic: std::mt19937_64 (its sequence is fixed by the standard) with
// our own conversions to integers and normals. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/moe_routing.h"

namespace xds {

struct RouterSkew {
  double zipf_a = 0;  // A in (0, 8]
  uint64_t seed = 0;  // of the permutations
};

// "zipf:A" -> A, a finite number in (0, 8]. Errors name the flag and the text.
Result<double> parse_router_skew(std::string_view text);

// The hot-expert order of MoE layer `layer`: perm[r] = the expert of rank r. A Fisher-Yates
// shuffle of 0..n_experts-1 seeded by (seed, layer).
std::vector<int32_t> router_skew_permutation(uint64_t seed, int64_t layer, int64_t n_experts);

// Per-token selection rates q[e] (indexed by expert id) proportional to 1 / (rank(e) + 1)^A,
// scaled so that they sum to top_k; an expert is chosen at most once per token, so rates
// above 1 are capped at 1 and the rest rescaled (water-filling).
std::vector<double> router_skew_targets(std::span<const int32_t> perm, double zipf_a,
                                        int64_t top_k);

// Fits the bias (see the top of this file). logits: [n_tokens, num_experts] router logits;
// targets: [num_experts] from router_skew_targets. Returns [num_experts], mean 0 (a constant
// added to every bias changes no selection), each within +-kRouterSkewBiasLimit.
inline constexpr int kRouterSkewFitRounds = 160;
inline constexpr double kRouterSkewFitStep = 0.05;
inline constexpr double kRouterSkewBiasLimit = 4.0;  // sigmoid scores lie in (0, 1)
std::vector<float> router_skew_fit_bias(const GatingParams& p, std::span<const float> logits,
                                        std::span<const double> targets);

// One layer end to end: samples kRouterSkewTokens hidden states x ~ N(0, I_hidden), takes
// the logits W x through gate [num_experts, hidden] (the weights as the checkpoint stores
// them, rounded), and fits the bias toward the targets of the layer's permutation.
inline constexpr int64_t kRouterSkewTokens = 4096;
std::vector<float> router_skew_bias(const GatingParams& p, std::span<const float> gate,
                                    int64_t hidden, const RouterSkew& skew, int64_t layer);

}  // namespace xds
