// mkmodel --router-skew: a tiny checkpoint written with the skew routes random hidden states
// (drawn here, apart from the fit's own samples) through its stored gate weights and bias
// with the engine's gating, and the expert histogram follows the layer's permutation
// (Spearman rank correlation, the top expert's share against the mean); the same
// checkpoint without the skew does not. The Zipf targets and the flag's parsing against
// hand-derived values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "base/bf16.h"
#include "mkmodel/mkmodel.h"
#include "mkmodel/router_skew.h"
#include "model/moe_routing.h"
#include "model/safetensors.h"
#include "test_files.h"

namespace xds {
namespace {

TEST(RouterSkew, ParsesZipfExponent) {
  auto a = parse_router_skew("zipf:1.25");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(*a, 1.25);
  for (const char* bad : {"zipf:", "zipf:0", "zipf:-1", "zipf:nan", "zipf:inf", "zipf:8.5",
                          "zipf:1x", "uniform:1", "1.0", ""}) {
    auto r = parse_router_skew(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--router-skew '" + std::string(bad) + "'"),
              std::string::npos)
        << r.status().message();
  }
  MkModelOptions o;
  o.router_skew = "zipf:x";
  auto c = mkmodel_config(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("expected zipf:A"), std::string::npos);
}

TEST(RouterSkew, TargetsAreZipfCappedAtOnePerToken) {
  const std::vector<int32_t> perm = {2, 0, 1};  // expert 2 hottest, then 0, then 1
  // top_k 1, A = 1: weights 1, 1/2, 1/3 (sum 11/6) -> ranks 6/11, 3/11, 2/11.
  const std::vector<double> one = router_skew_targets(perm, 1.0, 1);
  EXPECT_NEAR(one[2], 6.0 / 11, 1e-12);
  EXPECT_NEAR(one[0], 3.0 / 11, 1e-12);
  EXPECT_NEAR(one[1], 2.0 / 11, 1e-12);
  // top_k 2: rank 0 would get 12/11 > 1, so it is capped at 1 and ranks 1, 2 share the
  // other 1 as 1/2 : 1/3 -> 3/5, 2/5.
  const std::vector<double> two = router_skew_targets(perm, 1.0, 2);
  EXPECT_NEAR(two[2], 1.0, 1e-12);
  EXPECT_NEAR(two[0], 0.6, 1e-12);
  EXPECT_NEAR(two[1], 0.4, 1e-12);
  // A = 2, top_k 1: 1, 1/4, 1/9 (sum 49/36) -> 36/49, 9/49, 4/49.
  const std::vector<double> sq = router_skew_targets(perm, 2.0, 1);
  EXPECT_NEAR(sq[2], 36.0 / 49, 1e-12);
  EXPECT_NEAR(sq[1], 4.0 / 49, 1e-12);
}

TEST(RouterSkew, PermutationIsSeededPerLayer) {
  const std::vector<int32_t> p = router_skew_permutation(5, 1, 64);
  std::vector<int32_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> ids(64);
  std::iota(ids.begin(), ids.end(), 0);
  EXPECT_EQ(sorted, ids);
  EXPECT_EQ(p, router_skew_permutation(5, 1, 64));
  EXPECT_NE(p, router_skew_permutation(5, 2, 64));
  EXPECT_NE(p, router_skew_permutation(6, 1, 64));
  EXPECT_NE(p, ids);
}

// Spearman's rank correlation, ties given their average rank.
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> order(v.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < order.size();) {
      size_t j = i;
      while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[order[k]] = (static_cast<double>(i + j) / 2.0);
      i = j + 1;
    }
    return r;
  };
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n;
  const double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

class MkModelSkew : public xds::testing::TempDirTest {
 protected:
  static constexpr uint64_t kSkewSeed = 11;

  MkModelOptions tiny(const std::string& sub, const std::string& skew, int threads) const {
    MkModelOptions o;
    o.out_dir = path(sub);
    o.preset = "tiny";
    o.seed = 3;
    o.threads = threads;
    o.progress = false;
    o.router_skew = skew;
    o.router_skew_seed = kSkewSeed;
    return o;
  }

  static std::vector<float> read_f32(const Checkpoint& ck, const std::string& name) {
    const TensorView* t = ck.find(name);
    EXPECT_NE(t, nullptr) << name;
    if (t == nullptr) return {};
    std::vector<float> out(static_cast<size_t>(t->numel()));
    if (t->dtype == DType::kF32) {
      std::memcpy(out.data(), t->data, t->nbytes);
    } else {
      EXPECT_EQ(t->dtype, DType::kBF16) << name;
      const auto* h = reinterpret_cast<const uint16_t*>(t->data);
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(h[i]);
    }
    return out;
  }

  // Selections per expert of `n_tokens` hidden states x ~ N(0, I) (std::normal_distribution
  // of std::mt19937: not the fit's generator) through layer l's gate and bias.
  static std::vector<double> histogram(const Checkpoint& ck, const DeepseekV3Config& c, int l,
                                       int n_tokens) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.gate.";
    const std::vector<float> gate = read_f32(ck, p + "weight");                   // [E, d]
    const std::vector<float> bias = read_f32(ck, p + "e_score_correction_bias");  // [E]
    const int64_t e = c.n_routed_experts, d = c.hidden_size;
    const GatingParams g = gating_params(c);
    std::mt19937 rng(1000 + l);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> x(static_cast<size_t>(d));  // [d]
    std::vector<float> logits(static_cast<size_t>(e)), weights(static_cast<size_t>(g.top_k)),
        scratch(static_cast<size_t>(2 * e));
    std::vector<int32_t> ids(static_cast<size_t>(g.top_k));
    std::vector<double> hist(static_cast<size_t>(e), 0.0);
    for (int t = 0; t < n_tokens; ++t) {
      for (double& v : x) v = normal(rng);
      for (int64_t i = 0; i < e; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < d; ++j)
          acc += gate[static_cast<size_t>(i * d + j)] * x[static_cast<size_t>(j)];
        logits[static_cast<size_t>(i)] = static_cast<float>(acc);
      }
      route_token(g, logits.data(), bias.data(), ids.data(), weights.data(), scratch.data());
      for (const int32_t id : ids) hist[static_cast<size_t>(id)] += 1;
    }
    return hist;
  }

  // The correlation of the histogram with the layer's permutation (rank 0 hottest), and the
  // top expert's count over the mean.
  static std::pair<double, double> skew_of(const std::vector<double>& hist, int l,
                                           int64_t n_experts) {
    const std::vector<int32_t> perm = router_skew_permutation(kSkewSeed, l, n_experts);
    std::vector<double> by_rank, hotness;
    for (size_t r = 0; r < perm.size(); ++r) {
      by_rank.push_back(hist[static_cast<size_t>(perm[r])]);
      hotness.push_back(-static_cast<double>(r));
    }
    const double mean = std::accumulate(hist.begin(), hist.end(), 0.0) / hist.size();
    return {spearman(by_rank, hotness), *std::max_element(hist.begin(), hist.end()) / mean};
  }
};

TEST_F(MkModelSkew, SelectionFollowsThePermutation) {
  const MkModelOptions skewed = tiny("skew", "zipf:1.0", 2);
  ASSERT_TRUE(write_random_checkpoint(skewed).ok());
  const MkModelOptions plain = tiny("plain", "", 2);
  ASSERT_TRUE(write_random_checkpoint(plain).ok());
  auto c = mkmodel_config(skewed);
  ASSERT_TRUE(c.ok());
  auto ck = Checkpoint::open(path("skew"));
  auto ck_plain = Checkpoint::open(path("plain"));
  ASSERT_TRUE(ck.ok() && ck_plain.ok());
  constexpr int kTokens = 3000;
  // Tiny: layer 0 dense, layers 1 and 2 MoE, layer 3 the MTP layer (MoE too).
  for (const int l : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "layer " << l);
    const auto [rho, top] = skew_of(histogram(*ck, *c, l, kTokens), l, c->n_routed_experts);
    // Zipf 1 over 16 experts, 4 per token: the top expert is capped at every token, 4x the
    // mean of 4/16; ask for 3x.
    EXPECT_GT(rho, 0.8);
    EXPECT_GE(top, 3.0);
    const auto [rho_plain, top_plain] =
        skew_of(histogram(*ck_plain, *c, l, kTokens), l, c->n_routed_experts);
    EXPECT_LT(rho_plain, 0.5);
    EXPECT_LT(top_plain, 2.0);
    // Only the bias differs: the gate weights are the same tensor.
    const std::string gate = "model.layers." + std::to_string(l) + ".mlp.gate.weight";
    EXPECT_EQ(read_f32(*ck, gate), read_f32(*ck_plain, gate));
  }
}

TEST_F(MkModelSkew, BiasDoesNotDependOnTheThreadCount) {
  ASSERT_TRUE(write_random_checkpoint(tiny("t1", "zipf:0.8", 1)).ok());
  ASSERT_TRUE(write_random_checkpoint(tiny("t3", "zipf:0.8", 3)).ok());
  auto a = Checkpoint::open(path("t1"));
  auto b = Checkpoint::open(path("t3"));
  ASSERT_TRUE(a.ok() && b.ok());
  for (const int l : {1, 2, 3}) {
    const std::string name =
        "model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias";
    const std::vector<float> ba = read_f32(*a, name), bb = read_f32(*b, name);
    EXPECT_EQ(ba, bb);
    // A bias, not the uniform +-0.05 one: some spread beyond it.
    EXPECT_GT(*std::max_element(ba.begin(), ba.end()) - *std::min_element(ba.begin(), ba.end()),
              0.2);
  }
}

}  // namespace
}  // namespace xds
