// MoE gating: from router logits to (expert id, weight) pairs per token. Pure functions.
//
// Semantics (docs/design/deepseek_v3_forward.md, "MoE"):
//   sigmoid or softmax scores s; noaux_tc selects on s + e_score_correction_bias with
//   group-limited top-k (group score = sum of the group's two best biased scores), the
//   weights are the UNBIASED scores of the chosen experts, normalised if norm_topk_prob,
//   then × routed_scaling_factor (DeepSeek-V2: × routed_scaling_factor only when they were
//   not normalised). Ties go to the lower index.
#pragma once

#include <cstdint>


namespace xds {

enum class GatingScore { kSigmoid, kSoftmax };  // the router's score: sigmoid or softmax
// How the top-k experts are chosen: kNoauxTc on the scores plus a correction bias within the
// best groups (a group ranks by its two best biased scores; DeepSeek-V3); kGreedy over every
// expert; kGroupLimitedGreedy within the best groups (a group ranks by its best score).
enum class TopkMethod { kNoauxTc, kGreedy, kGroupLimitedGreedy };
// Which weights routed_scaling_factor multiplies. kAlways: every weight, after the optional
// normalisation (DeepSeek-V3, Kimi K2). kUnnormalizedOnly: the weights are either normalised
// (norm_topk_prob with top_k > 1) or scaled, never both (DeepSeek-V2's MoEGate).
enum class RoutedScaling { kAlways, kUnnormalizedOnly };

// Limits of the router's fixed-size stack arrays (moe_routing.cc); a model's loader checks
// them. DeepSeek-V3 has 256 experts in 8 groups, Kimi K2 384 in 1.
inline constexpr int64_t kMaxRoutedExperts = 1024;
inline constexpr int64_t kMaxExpertGroups = 256;

struct GatingParams {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  GatingScore score = GatingScore::kSigmoid;
  TopkMethod method = TopkMethod::kNoauxTc;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  RoutedScaling scaling = RoutedScaling::kAlways;
};

// logits: [num_experts] router logits of one token; bias: [num_experts] or null.
// ids: [top_k] chosen logical expert ids in descending order of selection score;
// weights: [top_k]. scratch: at least 2 * num_experts floats.
void route_token(const GatingParams& p, const float* logits, const float* bias, int32_t* ids,
                 float* weights, float* scratch);

}  // namespace xds
