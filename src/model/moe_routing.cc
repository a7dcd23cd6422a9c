#include "model/moe_routing.h"

#include <cmath>
#include <limits>

#include "base/check.h"

namespace xds {

namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// Index of the largest value not yet taken, marked taken; NaN ranks below every number
// (as the sampler ranks it), ties go to the lowest index. `taken` rather than a sentinel
// value: scores that are all -inf or NaN (a hidden state gone non-finite) still give k
// distinct experts, not an empty set.
int64_t take_max(const float* v, bool* taken, int64_t n) {
  auto above = [](float a, float b) { return !std::isnan(a) && (std::isnan(b) || a > b); };
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (taken[i]) continue;
    if (best < 0 || above(v[i], v[best])) best = i;
  }
  XDS_CHECK(best >= 0, "take_max: all {} taken", n);
  taken[best] = true;
  return best;
}

}  // namespace

void route_token(const GatingParams& p, const float* logits, const float* bias, int32_t* ids,
                 float* weights, float* scratch) {
  const int64_t e = p.num_experts;
  float* scores = scratch;      // [e] unbiased
  float* choice = scratch + e;  // [e] selection scores
  XDS_CHECK(e <= kMaxRoutedExperts, "route_token: {} experts > {}", e, kMaxRoutedExperts);
  bool taken[kMaxRoutedExperts] = {};  // chosen, or in a group that was not kept
  if (p.score == GatingScore::kSigmoid) {
    for (int64_t i = 0; i < e; ++i) scores[i] = 1.0f / (1.0f + std::exp(-logits[i]));
  } else {
    float mx = logits[0];
    for (int64_t i = 1; i < e; ++i) mx = std::max(mx, logits[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < e; ++i) sum += scores[i] = std::exp(logits[i] - mx);
    for (int64_t i = 0; i < e; ++i) scores[i] /= sum;
  }
  for (int64_t i = 0; i < e; ++i) {
    choice[i] = scores[i] + (p.method == TopkMethod::kNoauxTc && bias ? bias[i] : 0.0f);
  }

  if (p.method != TopkMethod::kGreedy && p.n_group > 1) {
    const int64_t per_group = e / p.n_group;
    float group_score[kMaxExpertGroups];
    XDS_CHECK(p.n_group <= kMaxExpertGroups, "n_group {} > {}", p.n_group, kMaxExpertGroups);
    for (int64_t g = 0; g < p.n_group; ++g) {
      const float* v = choice + g * per_group;
      if (p.method == TopkMethod::kNoauxTc) {  // sum of the two best
        float a = kMinusInf, b = kMinusInf;
        for (int64_t i = 0; i < per_group; ++i) {
          if (v[i] > a) {
            b = a;
            a = v[i];
          } else if (v[i] > b) {
            b = v[i];
          }
        }
        group_score[g] = per_group >= 2 ? a + b : a;
      } else {  // group_limited_greedy: the best
        float a = kMinusInf;
        for (int64_t i = 0; i < per_group; ++i) a = std::max(a, v[i]);
        group_score[g] = a;
      }
    }
    bool keep[kMaxExpertGroups] = {};
    for (int64_t j = 0; j < p.topk_group; ++j) take_max(group_score, keep, p.n_group);
    for (int64_t g = 0; g < p.n_group; ++g) {
      if (keep[g]) continue;
      for (int64_t i = 0; i < per_group; ++i) taken[g * per_group + i] = true;
    }
  }

  float sum = 0.0f;
  for (int64_t j = 0; j < p.top_k; ++j) {
    const int64_t id = take_max(choice, taken, e);
    ids[j] = static_cast<int32_t>(id);
    weights[j] = scores[id];
    sum += weights[j];
  }
  const bool normalize = p.norm_topk_prob && p.top_k > 1;
  const float norm = normalize ? 1.0f / (sum + 1e-20f) : 1.0f;
  const double scale =
      (normalize && p.scaling == RoutedScaling::kUnnormalizedOnly) ? 1.0 : p.routed_scaling_factor;
  for (int64_t j = 0; j < p.top_k; ++j) {
    weights[j] = static_cast<float>(weights[j] * norm * scale);
  }
}

}  // namespace xds
