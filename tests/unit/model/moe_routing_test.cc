// MoE gating against hand-derived selections.
#include "model/moe_routing.h"

#include <gtest/gtest.h>

#include <cmath>

namespace xds {
namespace {

float logit(float p) {
  return std::log(p / (1.0f - p));
}  // sigmoid(logit(p)) == p

TEST(Routing, NoauxTcGroupLimitedTopK) {
  // 8 experts in 4 groups of 2, keep 2 groups, top-2.
  GatingParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  p.routed_scaling_factor = 2.0;
  // Unbiased scores:           g0: .9 .1   g1: .5 .45  g2: .6 .45  g3: .2 .3
  const float s[8] = {0.9f, 0.1f, 0.5f, 0.45f, 0.6f, 0.45f, 0.2f, 0.3f};
  // Bias lifts expert 7 to .7: alone it would beat expert 4 (.6), but group 3 loses (.9).
  const float bias[8] = {0, 0, 0, 0, 0, 0, 0, 0.4f};
  // Group scores (sum of the top 2 biased): g0 1.0, g1 .95, g2 1.05, g3 .9 -> keep g2 and g0.
  // Best biased experts among {0,1,4,5}: 0 (.9), 4 (.6).
  float logits[8];
  for (int i = 0; i < 8; ++i) logits[i] = logit(s[i]);
  int32_t ids[2];
  float w[2];
  float scratch[16];
  route_token(p, logits, bias, ids, w, scratch);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 4);
  EXPECT_NEAR(w[0], 0.9 / 1.5 * 2.0, 1e-5);
  EXPECT_NEAR(w[1], 0.6 / 1.5 * 2.0, 1e-5);
}

TEST(Routing, BiasChangesSelectionButNotWeights) {
  GatingParams p;
  p.num_experts = 4;
  p.top_k = 1;
  p.n_group = 1;
  p.topk_group = 1;
  const float s[4] = {0.7f, 0.6f, 0.1f, 0.2f};
  const float bias[4] = {0.0f, 0.2f, 0.0f, 0.0f};
  float logits[4];
  for (int i = 0; i < 4; ++i) logits[i] = logit(s[i]);
  int32_t id;
  float w;
  float scratch[8];
  route_token(p, logits, bias, &id, &w, scratch);
  EXPECT_EQ(id, 1);            // .6 + .2 beats .7
  EXPECT_NEAR(w, 0.6f, 1e-6);  // top_k 1: not normalised, the unbiased score
}

TEST(Routing, SoftmaxGreedy) {
  GatingParams p;
  p.num_experts = 3;
  p.top_k = 2;
  p.score = GatingScore::kSoftmax;
  p.method = TopkMethod::kGreedy;
  p.norm_topk_prob = false;
  const float logits[3] = {0.0f, std::log(3.0f), std::log(6.0f)};  // softmax .1 .3 .6
  int32_t ids[2];
  float w[2];
  float scratch[6];
  route_token(p, logits, nullptr, ids, w, scratch);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 1);
  EXPECT_NEAR(w[0], 0.6, 1e-6);
  EXPECT_NEAR(w[1], 0.3, 1e-6);
}

// DeepSeek-V2's group_limited_greedy ranks a group by its best score, not by V3's sum of
// its two best. Softmax scores (logits = log s, the s summing to 1):
//   g0: .30 .02   g1: .20 .19   g2: .15 .04   g3: .05 .05
// group best: g0 .30 > g1 .20 -> keep g0 (the top-2 sum would keep g1: .39 > .32).
GatingParams v2_params() {
  GatingParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 1;
  p.score = GatingScore::kSoftmax;
  p.method = TopkMethod::kGroupLimitedGreedy;
  p.norm_topk_prob = false;
  p.routed_scaling_factor = 16.0;
  p.scaling = RoutedScaling::kUnnormalizedOnly;
  return p;
}

constexpr float kV2Scores[8] = {0.30f, 0.02f, 0.20f, 0.19f, 0.15f, 0.04f, 0.05f, 0.05f};

TEST(Routing, GroupLimitedGreedyKeepsTheGroupWithTheBestExpert) {
  const GatingParams p = v2_params();
  float logits[8];
  for (int i = 0; i < 8; ++i) logits[i] = std::log(kV2Scores[i]);
  int32_t ids[2];
  float w[2];
  float scratch[16];
  route_token(p, logits, nullptr, ids, w, scratch);
  EXPECT_EQ(ids[0], 0);  // only g0's experts are allowed, although 2 and 3 score higher than 1
  EXPECT_EQ(ids[1], 1);
  EXPECT_NEAR(w[0], 0.30 * 16.0, 1e-5);  // not normalised: scaled
  EXPECT_NEAR(w[1], 0.02 * 16.0, 1e-5);
  // Keeping 2 groups (g0, g1): the best two of {0, 1, 2, 3}.
  GatingParams two = p;
  two.topk_group = 2;
  route_token(two, logits, nullptr, ids, w, scratch);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 2);
}

TEST(Routing, V2ScalesOnlyWeightsItDidNotNormalize) {
  GatingParams p = v2_params();
  p.norm_topk_prob = true;
  float logits[8];
  for (int i = 0; i < 8; ++i) logits[i] = std::log(kV2Scores[i]);
  int32_t ids[2];
  float w[2];
  float scratch[16];
  route_token(p, logits, nullptr, ids, w, scratch);
  EXPECT_NEAR(w[0], 0.30 / 0.32, 1e-5);  // normalised, not × 16
  EXPECT_NEAR(w[1], 0.02 / 0.32, 1e-5);
  // DeepSeek-V3's rule on the same choice: normalised, then × 16.
  p.scaling = RoutedScaling::kAlways;
  route_token(p, logits, nullptr, ids, w, scratch);
  EXPECT_NEAR(w[0], 0.30 / 0.32 * 16.0, 1e-4);
  // top_k 1 never normalises, so V2 scales it.
  p.scaling = RoutedScaling::kUnnormalizedOnly;
  p.top_k = 1;
  route_token(p, logits, nullptr, ids, w, scratch);
  EXPECT_EQ(ids[0], 0);
  EXPECT_NEAR(w[0], 0.30 * 16.0, 1e-5);
}

// A hidden state gone non-finite (NaN logits, or NaN through the bias) must still route to
// k distinct experts of the kept groups, not abort the process: every group score is then
// -inf (NaN never wins a comparison), and the lowest indices are kept and chosen.
TEST(Routing, NonFiniteLogitsStillGiveDistinctExperts) {
  GatingParams p;
  p.num_experts = 8;
  p.top_k = 3;
  p.n_group = 4;
  p.topk_group = 2;
  float logits[8], bias[8] = {};
  for (float& l : logits) l = NAN;
  int32_t ids[3];
  float w[3];
  float scratch[16];
  route_token(p, logits, bias, ids, w, scratch);
  // Groups 0 and 1 kept (lowest indices), experts 0, 1, 2 taken in order.
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(ids[2], 2);
  // A NaN never beats a number: experts 5 and 6 carry the only numbers.
  for (float& l : logits) l = NAN;
  logits[5] = 0.0f;
  logits[6] = 1.0f;
  p.n_group = 1;
  p.topk_group = 1;
  route_token(p, logits, bias, ids, w, scratch);
  EXPECT_EQ(ids[0], 6);
  EXPECT_EQ(ids[1], 5);
  EXPECT_EQ(ids[2], 0);
  p.n_group = 4;
  p.topk_group = 2;
  // Every selection score -inf (the old exclusion marker): finite logits, bias -inf.
  for (int i = 0; i < 8; ++i) logits[i] = 0.1f * static_cast<float>(i);
  for (float& b : bias) b = -INFINITY;
  route_token(p, logits, bias, ids, w, scratch);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(ids[2], 2);
}

}  // namespace
}  // namespace xds
